package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// TestLateRETInIYSBlocksTheNextSend: consents come from the (fake) İYS API through `iys sync`; a campaign
// is launched; then a citizen answers RET in İYS itself; the next sync records it, and the worker does
// not send to that person (skipped, revoked) while the others get their message.
func TestLateRETInIYSBlocksTheNextSend(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	addr := freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender,
		"TWILIO_ACCOUNT_SID=ACiys00000000000000000000000000000", "TWILIO_AUTH_TOKEN=iystoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+addr, "TWILIO_RATE=0",
		"IYS_BASE_URL=http://"+addr, "IYS_USERNAME=api-user", "IYS_PASSWORD=s3cret-pass", "IYS_CODE=123456", "IYS_BRAND_CODE=654321",
	)}
	e.mustRun("migrate")
	if _, err := db.Exec(ctx, `CREATE TABLE customers AS SELECT 'c' || i AS user_id, '+90532100000' || i AS phone, 'Ad' || i AS first_name
		FROM generate_series(1, 3) i; GRANT SELECT ON customers TO campaignctl_audience`); err != nil {
		t.Fatal(err)
	}
	e.start("sandbox", "sandbox", "--addr", addr, "--iys-pull-lag", "0")
	waitFor(t, 10*time.Second, func() bool { return listening(addr) })
	citizen := func(phone, status string) {
		body, _ := json.Marshal(map[string]string{"recipient": phone, "type": "MESAJ", "recipientType": "BIREYSEL", "status": status, "source": "IYS_MESAJ"})
		resp, err := http.Post("http://"+addr+"/_sandbox/iys/consents", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("citizen %s %s: %d", phone, status, resp.StatusCode)
		}
	}
	for i := 1; i <= 3; i++ {
		citizen(fmt.Sprintf("+90532100000%d", i), "ONAY")
	}
	if out := e.mustRun("iys", "sync"); !strings.Contains(out, "pulled 3 changes") {
		t.Fatalf("first sync: %s", out)
	}
	audience := filepath.Join(t.TempDir(), "a.sql")
	os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600) //nolint:errcheck
	out := e.mustRun("launch", "--name", "late-ret", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int64 `json:"eligible"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Eligible != 3 {
		t.Fatalf("launch: %v %s", err, out)
	}
	// After the launch, before any send, c2 answers RET through İYS.
	citizen("+905321000002", "RET")
	if out := e.mustRun("iys", "sync"); !strings.Contains(out, "pulled 1 changes") || !strings.Contains(out, "citizens 1") {
		t.Fatalf("second sync: %s", out)
	}
	e.start("worker", "worker", "--concurrency", "2")
	id := fmt.Sprint(rep.ID)
	waitFor(t, 30*time.Second, func() bool {
		var st map[string]any
		json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st) //nolint:errcheck
		return st["state"] == "completed"
	})
	got := map[string]int{}
	for _, m := range sandboxMessages(t, addr) {
		got[m.To]++
	}
	if got["+905321000001"] != 1 || got["+905321000003"] != 1 || got["+905321000002"] != 0 {
		t.Fatalf("messages %v; want c1 and c3 once, nothing to c2 who refused in İYS", got)
	}
	var st, reason, auditConsent string
	db.QueryRow(ctx, `SELECT status, reason FROM campaign_recipients WHERE user_id = 'c2'`).Scan(&st, &reason)              //nolint:errcheck
	db.QueryRow(ctx, `SELECT consent_status FROM send_log WHERE user_id = 'c2' AND status = 'skipped'`).Scan(&auditConsent) //nolint:errcheck
	if st != "skipped" || reason != "revoked" || auditConsent != "RET" {
		t.Fatalf("c2: %s/%s, audit consent %q; want skipped/revoked on a RET", st, reason, auditConsent)
	}
	// iys check shows it, here and in İYS, with its history.
	out = e.mustRun("iys", "check", "+90 532 100 0002", "--json")
	var chk struct {
		Local struct {
			Status        string `json:"status"`
			RecipientType string `json:"recipient_type"`
		} `json:"local"`
		IYS struct {
			Status        string `json:"status"`
			TransactionID string `json:"transaction_id"`
		} `json:"iys"`
		History []struct {
			Status, Origin string
		} `json:"history"`
	}
	// The fields are spelled as everywhere else in the JSON (snake_case), not as the Go fields.
	if err := json.Unmarshal([]byte(out), &chk); err != nil || chk.Local.Status != "RET" || chk.Local.RecipientType != "BIREYSEL" ||
		chk.IYS.Status != "RET" || chk.IYS.TransactionID == "" || len(chk.History) != 2 || chk.History[0].Status != "RET" ||
		strings.Contains(out, `"Recipient"`) {
		t.Fatalf("iys check: %v %s", err, out)
	}
	if strings.Contains(out+e.mustRun("iys", "sync"), "s3cret-pass") {
		t.Fatal("the İYS password was printed")
	}
}
