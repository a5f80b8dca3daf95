package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// TestEndToEndSMSFailover runs the built binary with Twilio and Netgsm both configured, against a sandbox
// whose Twilio API answers every request with a 503 (--fail-only twilio): the campaign goes out through
// Netgsm, every eligible number gets exactly one message over the two providers, and the outcomes say which
// provider sent them. With 3 % of Twilio's answers 503s (sporadic), Twilio keeps the campaign and only the
// messages it refused go through Netgsm: before, each 503 moved its worker to Netgsm for 30 s, and an
// outside run sent 97.6 % of a campaign there.
func TestEndToEndSMSFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	t.Run("outage", func(t *testing.T) {
		t.Parallel()
		byProvider := smsFailoverRun(t, "1")
		if byProvider["netgsm"] != failoverEligible || byProvider["twilio"] != 0 {
			t.Fatalf("accepted by provider %v; want all %d through netgsm (twilio answers 503)", byProvider, failoverEligible)
		}
	})
	t.Run("sporadic 503s", func(t *testing.T) {
		t.Parallel()
		byProvider := smsFailoverRun(t, "0.03")
		if byProvider["netgsm"] > failoverEligible/5 || byProvider["twilio"] < failoverEligible*4/5 {
			t.Fatalf("accepted by provider %v; want Twilio to keep the campaign, Netgsm only the few Twilio refused", byProvider)
		}
	})
}

// failoverEligible is the recipients of smsFailoverRun's campaign.
const failoverEligible = 600

// smsFailoverRun runs a campaign of failoverEligible SMS through the built binary, with Twilio and Netgsm
// configured and the sandbox answering that share (fail503) of Twilio's requests with a 503. It checks
// that the campaign completes with everyone sent once over the two providers, and that the outcomes
// through Netgsm say so, and returns the messages the sandbox accepted by provider.
func smsFailoverRun(t *testing.T, fail503 string) map[string]int {
	t.Helper()
	const eligible = failoverEligible
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	sandboxAddr := freeAddr(t)
	env := append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender,
		"TWILIO_ACCOUNT_SID=ACe2e0000000000000000000000000000", "TWILIO_AUTH_TOKEN=e2etoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, "TWILIO_RATE=0",
		"NETGSM_USERCODE=8503000000", "NETGSM_PASSWORD=netgsmpass", "NETGSM_HEADER=KAMPANYA",
		"NETGSM_BASE_URL=http://"+sandboxAddr, "NETGSM_RATE=0",
	)
	e := &e2eEnv{t: t, bin: binary(t), env: env}
	e.mustRun("migrate")
	for _, sql := range []string{
		fmt.Sprintf(`CREATE TABLE customers AS SELECT 'f' || i AS user_id, '+90532' || lpad(i::text, 7, '0') AS phone, 'Ad' || i AS first_name
			FROM generate_series(1, %d) i`, eligible),
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
		`INSERT INTO iys_sync_state (source, last_success_at) VALUES ('import', now())`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	e.mustRun("codes", "generate", "--pool", "fo", "--count", fmt.Sprint(eligible))
	audience := filepath.Join(t.TempDir(), "audience.sql")
	os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600) //nolint:errcheck

	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--fail-503", fail503, "--fail-only", "twilio")
	waitFor(t, 10*time.Second, func() bool { return listening(sandboxAddr) })
	e.start("worker", "worker", "--concurrency", "4")
	out := e.mustRun("launch", "--name", "failover", "--channel", "sms", "--audience", audience, "--code-pool", "fo",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--yes", "--json")
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int64 `json:"eligible"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Eligible != eligible {
		t.Fatalf("launch report %s (%v)", out, err)
	}
	var st map[string]any
	waitFor(t, 60*time.Second, func() bool {
		st = map[string]any{}
		json.Unmarshal([]byte(e.mustRun("status", fmt.Sprint(rep.ID), "--json")), &st) //nolint:errcheck
		return st["state"] == "completed"
	})
	if st["sent"] != float64(eligible) || st["unknown"] != float64(0) || st["failed"] != float64(0) {
		t.Fatalf("status %v", st)
	}
	stats := sandboxStats(t, sandboxAddr)
	if stats.Accepted != eligible || stats.Recipients != eligible || stats.Duplicates != 0 {
		t.Fatalf("sandbox: %d accepted for %d numbers, %d duplicates; want %d each, none twice", stats.Accepted, stats.Recipients, stats.Duplicates, eligible)
	}
	byProvider := map[string]int{}
	for _, m := range sandboxMessages(t, sandboxAddr) {
		byProvider[m.Provider]++
		if m.Provider == "netgsm" && (m.IYSFilter != "11" || m.From != "KAMPANYA") {
			t.Fatalf("netgsm message with İYS filter %q, header %q; want 11 (commercial, individuals) and KAMPANYA", m.IYSFilter, m.From)
		}
	}
	var viaFallback int
	db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE status = 'sent' AND reason LIKE 'sent through netgsm%'`).Scan(&viaFallback) //nolint:errcheck
	if viaFallback != byProvider["netgsm"] {
		t.Fatalf("%d outcomes say they went through netgsm, which accepted %d", viaFallback, byProvider["netgsm"])
	}
	return byProvider
}
