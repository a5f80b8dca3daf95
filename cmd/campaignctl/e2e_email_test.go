package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// TestEndToEndEmailCampaign runs the built binary: an e-mail campaign of 6,000 recipients goes out through
// the SendGrid sandbox in 6 requests of 1000 personalizations, each with its own subject, text, HTML and
// code; the sandbox then posts signed delivery events to `campaignctl webhooks`, which records them
// (bounces included), a drop of an address on SendGrid's unsubscribe list whose refusal never reached the
// webhooks becomes that refusal (the consent RET, queued for İYS), and a forged event is refused.
func TestEndToEndEmailCampaign(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	const eligible, bounces, unsubscribed = 6000, 20, 5
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	sandboxAddr, hooksAddr := freeAddr(t), freeAddr(t)
	env := append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"SENDGRID_API_KEY=SG.e2e-key", "SENDGRID_FROM=kampanya@example.com", "SENDGRID_BASE_URL=http://"+sandboxAddr,
		"SENDGRID_RATE=0", "WEBHOOKS_PUBLIC_URL=http://"+hooksAddr, "UNSUBSCRIBE_SECRET=e2e-email-secret-0123456789",
	)
	e := &e2eEnv{t: t, bin: binary(t), env: env}
	e.mustRun("migrate")
	for _, sql := range []string{
		// 6,000 with consent (the last 20 of them at addresses that bounce, the 5 before on SendGrid's
		// unsubscribe list), 300 without.
		`CREATE TABLE customers AS
			SELECT 'm' || i AS user_id,
				CASE WHEN i > 5980 AND i <= 6000 THEN 'bounce+' || i || '@example.com'
					WHEN i > 5975 AND i <= 5980 THEN 'unsubscribed+' || i || '@example.com'
					ELSE 'Musteri' || i || '@Example.com' END AS email,
				'Müşteri' || i AS first_name
			FROM generate_series(1, 6300) i`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT lower(email), 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() - interval '1 day' FROM customers WHERE substr(user_id, 2)::int <= 6000`,
		`INSERT INTO iys_sync_state (source, last_success_at) VALUES ('import', now())`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	e.mustRun("codes", "generate", "--pool", "mail", "--count", "6000", "--prefix", "MAIL-")
	dir := t.TempDir()
	audience, html := filepath.Join(dir, "audience.sql"), filepath.Join(dir, "mail.html")
	os.WriteFile(audience, []byte("SELECT user_id, email, first_name FROM customers"), 0o600)     //nolint:errcheck
	os.WriteFile(html, []byte(`<p>Merhaba {{.first_name}}, kodunuz <b>{{.code}}</b></p>`), 0o600) //nolint:errcheck

	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--sendgrid-event-url", "http://"+hooksAddr+sendgridReceiptPath, "--receipt-delay", "100ms")
	var key struct {
		PublicKey string `json:"public_key"`
	}
	waitFor(t, 10*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+sandboxAddr+"/v3/user/webhooks/event/settings/signed", nil)
		req.Header.Set("Authorization", "Bearer SG.e2e-key") // as SendGrid, the sandbox wants the API key
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&key) == nil && key.PublicKey != ""
	})
	hooks := &e2eEnv{t: t, bin: e.bin, env: append(append([]string(nil), env...), "SENDGRID_WEBHOOK_PUBLIC_KEY="+key.PublicKey)}
	hooks.start("webhooks", "webhooks", "--addr", hooksAddr)
	e.start("worker", "worker", "--concurrency", "4")

	out := e.mustRun("launch", "--name", "mail", "--channel", "email", "--audience", audience, "--code-pool", "mail",
		"--subject", "{{.first_name}}, size özel", "--message", "Merhaba {{.first_name}}, kodunuz {{.code}}", "--html", html, "--yes", "--json")
	var rep struct {
		ID       int64            `json:"id"`
		Eligible int64            `json:"eligible"`
		Excluded map[string]int64 `json:"excluded"`
		Enqueued int              `json:"enqueued"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	if rep.Eligible != eligible || rep.Excluded["no_consent"] != 300 || rep.Enqueued != 6 {
		t.Fatalf("launch report %+v; want 6000 eligible in 6 batches, 300 without consent", rep)
	}
	id := fmt.Sprint(rep.ID)
	status := func() map[string]any {
		st := map[string]any{}
		if err := json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	var st map[string]any
	waitFor(t, 60*time.Second, func() bool { st = status(); return st["state"] == "completed" })
	if st["sent"] != float64(eligible) || st["failed"] != float64(0) || st["unknown"] != float64(0) {
		t.Fatalf("status %v", st)
	}

	stats := sandboxStats(t, sandboxAddr)
	if stats.Requests != 6 {
		t.Errorf("%d requests to SendGrid for 6,000 e-mails, want 6", stats.Requests)
	}
	msgs := sandboxMessages(t, sandboxAddr)
	perTo, codes := map[string]int{}, map[string]bool{}
	codeRE := regexp.MustCompile(`kodunuz (MAIL-[A-Z0-9]+)$`)
	for _, m := range msgs {
		perTo[m.To]++
		c := codeRE.FindStringSubmatch(m.Body)
		if c == nil || codes[c[1]] || !strings.Contains(m.HTML, "<b>"+c[1]+"</b>") || !strings.HasSuffix(m.Subject, ", size özel") {
			t.Fatalf("message to %s: subject %q text %q html %q (code missing, repeated or not in the HTML)", m.To, m.Subject, m.Body, m.HTML)
		}
		codes[c[1]] = true
	}
	if len(msgs) != eligible || len(perTo) != eligible {
		t.Fatalf("sandbox accepted %d e-mails to %d addresses, want %d each", len(msgs), len(perTo), eligible)
	}
	if perTo["musteri1@example.com"] != 1 || perTo["musteri6001@example.com"] != 0 {
		t.Fatalf("addresses not canonical or consent ignored: %d, %d", perTo["musteri1@example.com"], perTo["musteri6001@example.com"])
	}

	// Receipts: every e-mail delivered but the bounces and the drops.
	deadline := time.Now().Add(30 * time.Second)
	for st = status(); st["delivered"] != float64(eligible-bounces-unsubscribed) || st["undelivered"] != float64(bounces+unsubscribed); st = status() {
		if time.Now().After(deadline) {
			var byDelivery []string
			rows, _ := db.Query(ctx, `SELECT coalesce(delivery, 'none') || ' ' || count(*) || ' (batch ' || min(batch) || '-' || max(batch) || ')' FROM campaign_recipients GROUP BY delivery`)
			for rows != nil && rows.Next() {
				var s string
				rows.Scan(&s) //nolint:errcheck
				byDelivery = append(byDelivery, s)
			}
			t.Fatalf("receipts not recorded: status %v\nby delivery: %v\nwebhooks: %s\nsandbox events: %s", st, byDelivery,
				httpGetBody(t, "http://"+hooksAddr+"/stats"), httpGetBody(t, "http://"+sandboxAddr+"/_sandbox/sendgrid/events/stats"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The drops as unsubscribed: their consents are RET and queued for İYS (the refusals were recorded
	// before the receipts, in the same posts).
	var ret, queued int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM iys_consents WHERE recipient LIKE 'unsubscribed+%' AND status = 'RET'`).Scan(&ret); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE recipient LIKE 'unsubscribed+%'`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if ret != unsubscribed || queued != unsubscribed {
		t.Fatalf("addresses SendGrid dropped as unsubscribed: %d consents RET and %d queued for İYS, want %d each", ret, queued, unsubscribed)
	}
	// A forged event is refused and changes nothing.
	req, _ := http.NewRequest(http.MethodPost, "http://"+hooksAddr+sendgridReceiptPath,
		strings.NewReader(`[{"email":"musteri1@example.com","event":"bounce","campaign_id":"`+id+`","user_id":"m1","sg_event_id":"forged","timestamp":`+fmt.Sprint(time.Now().Unix())+`}]`))
	req.Header.Set("X-Twilio-Email-Event-Webhook-Signature", "MEUCIQDforged")
	req.Header.Set("X-Twilio-Email-Event-Webhook-Timestamp", fmt.Sprint(time.Now().Unix()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("forged event answered %d, want 403", resp.StatusCode)
	}
	if st = status(); st["undelivered"] != float64(bounces+unsubscribed) {
		t.Fatalf("a forged event changed the status: %v", st)
	}
	t.Logf("6,000 e-mails in %d requests; %v delivered, %v bounced", stats.Requests, st["delivered"], st["undelivered"])
}

func sandboxStats(t *testing.T, addr string) sandbox.Stats {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/_sandbox/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s sandbox.Stats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func sandboxMessages(t *testing.T, addr string) []sandbox.Message {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/_sandbox/messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ms []sandbox.Message
	if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil {
		t.Fatal(err)
	}
	return ms
}

func httpGetBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// listening reports whether an HTTP server answers at addr.
func listening(addr string) bool {
	resp, err := http.Get("http://" + addr + "/_sandbox/stats")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}
