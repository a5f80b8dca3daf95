package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// The provider holds some answers past --provider-timeout (it did accept those messages): their
// recipients are unknown to the workers. For part of the run the receipts endpoint is down, so some of
// them never get a receipt; for the rest, the receipt arrives while the send is still waiting for its
// answer. `resume --resend-unknown` must then send again exactly the recipients with no evidence of
// acceptance: nobody with a receipt gets a second message.
func TestResendUnknownAfterHeldAnswersAndReceipts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	const n = 1500
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	sandboxAddr, hooksAddr := freeAddr(t), freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"TWILIO_ACCOUNT_SID=ACheld000000000000000000000000000", "TWILIO_AUTH_TOKEN=heldtoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, "TWILIO_RATE=300", "SENDER_IDENTITY="+testSender,
		"TWILIO_STATUS_CALLBACK=http://"+hooksAddr+"/twilio/status",
	)}
	e.mustRun("migrate")
	e.mustRun("demo", "seed", "--users", strconv.Itoa(chaosUsersFor(n)), "--pool", "demo")
	audience := filepath.Join(t.TempDir(), "audience.sql")
	if err := os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--fail-timeout", "0.1", "--receipt-delay", "100ms")
	waitFor(t, 10*time.Second, func() bool { _, err := chaosAccepted(sandboxAddr); return err == nil })
	e.start("worker 1", "worker", "--concurrency", "8", "--provider-timeout", "1s")
	e.start("worker 2", "worker", "--concurrency", "8", "--provider-timeout", "1s")

	out := e.mustRun("launch", "--name", "held", "--channel", "sms", "--audience", audience, "--code-pool", "demo",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--frequency-cap", "0", "--yes", "--json")
	var rep struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	id := strconv.FormatInt(rep.ID, 10)
	// The receipts endpoint comes up once a third of the messages were accepted: the held sends before
	// then get no receipt.
	waitFor(t, time.Minute, func() bool { a, _ := chaosAccepted(sandboxAddr); return a >= n/3 })
	e.start("webhooks", "webhooks", "--addr", hooksAddr)
	waitFor(t, 2*time.Minute, func() bool { st, err := chaosStatusOf(e, id); return err == nil && st.Pending == 0 })
	// Receipts of the last sends may still be on their way: wait until the sandbox has none pending.
	waitFor(t, 30*time.Second, func() bool { return sandboxReceiptsPending(t, sandboxAddr) == 0 })

	ctx := context.Background()
	type row struct {
		phone, status string
		receipt       bool
	}
	before := map[string]row{}
	rows, err := db.Query(ctx, `SELECT user_id, address, status, delivery IS NOT NULL FROM campaign_recipients WHERE campaign_id = $1`, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var u string
		var r row
		if err := rows.Scan(&u, &r.phone, &r.status, &r.receipt); err != nil {
			t.Fatal(err)
		}
		before[u] = r
	}
	rows.Close()
	var unknown, heldWithReceipt int
	for u, r := range before {
		switch {
		case r.status == "unknown" && r.receipt:
			t.Errorf("%s is unknown although its receipt says the provider accepted it", u)
		case r.status == "unknown":
			unknown++
		}
	}
	// A held send whose receipt came in is sent, with the lost answer as its last error.
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = 'sent' AND last_error IS NOT NULL`, rep.ID).Scan(&heldWithReceipt); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sends held past the timeout: %d without a receipt (unknown), %d with one (sent)", unknown+heldWithReceipt, unknown, heldWithReceipt)
	if unknown == 0 || heldWithReceipt == 0 {
		t.Fatalf("the run did not produce both kinds of held sends (%d unknown, %d held with a receipt): the test proves nothing", unknown, heldWithReceipt)
	}

	// The operator resends past the grace (30 s) that holds back a recipient recorded unknown moments ago
	// (its provider may still take the request and send the receipt): the run ended seconds ago.
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET updated_at = updated_at - interval '1 hour' WHERE campaign_id = $1 AND status = 'unknown'`, rep.ID); err != nil {
		t.Fatal(err)
	}
	out = e.mustRun("resume", id, "--resend-unknown")
	if want := fmt.Sprintf("%d unknown recipients will be sent again", unknown); !strings.Contains(out, want) {
		t.Fatalf("resume --resend-unknown said:\n%s\nwant %q", out, want)
	}
	waitFor(t, 2*time.Minute, func() bool { st, err := chaosStatusOf(e, id); return err == nil && st.Pending == 0 })

	perTo := map[string]int{}
	for _, m := range chaosSandboxMessages(t, sandboxAddr) {
		perTo[m.To]++
	}
	for u, r := range before {
		want := 1
		if r.status == "unknown" {
			want = 2 // the explicit override: sent again, with the same code
		}
		if got := perTo[r.phone]; got != want {
			t.Errorf("%s (%s before the resend, receipt %v) was accepted %d times, want %d", u, r.status, r.receipt, got, want)
		}
	}
}

// sandboxReceiptsPending is the number of messages whose Twilio status callbacks are not all sent yet.
func sandboxReceiptsPending(t *testing.T, addr string) int64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/_sandbox/receipts/stats")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var st struct {
		Pending int64 `json:"pending"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return -1
	}
	return st.Pending
}

// A worker notes how long its provider calls may still be answered (3 × --provider-timeout) for
// `resume --resend-unknown`, and notes it again after Redis lost it, while the worker runs on.
func TestAWorkerNotesItsInFlightGraceAgainAfterRedisLostIt(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.New(t)
	rdb, redisURL := testredis.New(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"TWILIO_ACCOUNT_SID=ACgrace00000000000000000000000000", "TWILIO_AUTH_TOKEN=gracetoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+freeAddr(t), "SENDER_IDENTITY="+testSender,
	)}
	e.mustRun("migrate")
	e.start("worker", "worker", "--concurrency", "2", "--provider-timeout", "50s")
	ctx := context.Background()
	noted := func() bool {
		ms, err := rdb.Get(ctx, state.InFlightGraceKey).Int64()
		return err == nil && ms == (150*time.Second).Milliseconds()
	}
	waitFor(t, 20*time.Second, noted)
	// Redis loses its data (this test's own database); the worker runs on.
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 20*time.Second, noted)
	t.Logf("the grace was noted again %v after the loss", time.Since(start).Round(100*time.Millisecond))
}
