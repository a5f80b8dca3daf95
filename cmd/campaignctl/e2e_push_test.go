package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// TestEndToEndPushAndWebhook runs the built binary against the sandbox's FCM and webhook fakes. Push:
// only recipients whose audience row opts in get a notification; an unregistered token fails and is
// excluded from the next launch. Webhook: each message reaches the in-house receiver with a signature it
// verifies.
func TestEndToEndPushAndWebhook(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	db, dbURL := testdb.New(t)
	ctx := context.Background()
	e, sandboxAddr, dir := pushE2E(t, "DATABASE_URL="+dbURL)
	e.env = append(e.env, "WEBHOOK_URL=http://"+sandboxAddr+"/webhook", "WEBHOOK_SECRET=in-house-secret", "WEBHOOK_RATE=0")
	e.mustRun("migrate")
	for _, sql := range []string{
		// 40 opted in (2 of them with tokens FCM no longer knows), 10 not.
		`CREATE TABLE devices AS SELECT 'd' || i AS user_id,
			CASE WHEN i IN (3, 4) THEN 'unregistered-' || i ELSE 'tok-' || i END AS push_token,
			i <= 40 AS push_opt_in, i <= 40 AS webhook_opt_in, 'Ad' || i AS first_name FROM generate_series(1, 50) i`,
		`GRANT SELECT ON devices TO campaignctl_audience`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	pushSQL, hookSQL := filepath.Join(dir, "push.sql"), filepath.Join(dir, "hook.sql")
	os.WriteFile(pushSQL, []byte("SELECT user_id, push_token, push_opt_in, first_name FROM devices"), 0o600) //nolint:errcheck
	os.WriteFile(hookSQL, []byte("SELECT user_id, webhook_opt_in, first_name FROM devices"), 0o600)          //nolint:errcheck

	e.start("sandbox", "sandbox", "--addr", sandboxAddr)
	waitFor(t, 10*time.Second, func() bool { return listening(sandboxAddr) })
	e.start("worker", "worker", "--concurrency", "4")

	launch := func(name, ch, audience string) (id string, excluded map[string]int64) {
		out := e.mustRun("launch", "--name", name, "--channel", ch, "--audience", audience, "--subject", "Merhaba {{.first_name}}",
			"--message", "Size özel bir fırsat", "--frequency-cap", "0", "--yes", "--json")
		var rep struct {
			ID       int64            `json:"id"`
			Excluded map[string]int64 `json:"excluded"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("launch: %v\n%s", err, out)
		}
		id = fmt.Sprint(rep.ID)
		waitFor(t, 60*time.Second, func() bool {
			var st map[string]any
			json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st) //nolint:errcheck
			return st["state"] == "completed"
		})
		return id, rep.Excluded
	}
	id, excl := launch("push-1", "push", pushSQL)
	if excl["no_opt_in"] != 10 {
		t.Fatalf("push excluded %v, want 10 no_opt_in", excl)
	}
	var sent, failed int
	db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'failed' AND reason LIKE '%UNREGISTERED%')
		FROM campaign_recipients WHERE campaign_id = $1`, id).Scan(&sent, &failed) //nolint:errcheck
	if sent != 38 || failed != 2 {
		t.Fatalf("push: %d sent, %d failed as unregistered; want 38 and 2", sent, failed)
	}
	fcm := 0
	for _, m := range sandboxMessages(t, sandboxAddr) {
		if m.Provider == "fcm" {
			fcm++
			if !strings.HasPrefix(m.Subject, "Merhaba Ad") || m.Body != "Size özel bir fırsat" {
				t.Fatalf("notification %+v", m)
			}
		}
	}
	if fcm != 38 {
		t.Fatalf("FCM accepted %d notifications, want 38", fcm)
	}
	// The next launch leaves the unregistered tokens out.
	if _, excl = launch("push-2", "push", pushSQL); excl["invalid_address"] != 2 {
		t.Fatalf("second push excluded %v, want the 2 unregistered tokens as invalid_address", excl)
	}

	// Webhook: 40 signed posts, all verified by the receiver.
	launch("hook-1", "webhook", hookSQL)
	var ws sandbox.WebhookStats
	if err := json.Unmarshal([]byte(httpGetBody(t, "http://"+sandboxAddr+"/_sandbox/webhook/stats")), &ws); err != nil {
		t.Fatal(err)
	}
	if ws.Accepted != 40 || ws.BadSignature != 0 || ws.MissingSignature != 0 {
		t.Fatalf("webhook receiver: %+v; want 40 accepted, none refused", ws)
	}
}

// pushE2E is an end-to-end environment for push: the built binary with env (the engine's DATABASE_URL
// at least), a Redis DB of the test's, and a service account whose FCM is the sandbox at sandboxAddr
// (not started yet). dir is the test's directory for its files.
func pushE2E(t *testing.T, env ...string) (e *e2eEnv, sandboxAddr, dir string) {
	t.Helper()
	_, redisURL := testredis.New(t)
	sandboxAddr = freeAddr(t)
	dir = t.TempDir()
	creds := filepath.Join(dir, "service-account.json")
	if err := sandbox.WriteServiceAccount(creds, "http://"+sandboxAddr, "demo-project"); err != nil {
		t.Fatal(err)
	}
	e = &e2eEnv{t: t, bin: binary(t), env: append(append(os.Environ(), env...),
		"REDIS_URL="+redisURL, "GOOGLE_APPLICATION_CREDENTIALS="+creds, "FCM_BASE_URL=http://"+sandboxAddr, "FCM_RATE=0")}
	return e, sandboxAddr, dir
}
