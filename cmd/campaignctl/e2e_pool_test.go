package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/worker"
)

// A worker with more sends in flight than the default connection pool keeps (--concurrency 64: 64 batch
// runs, each a window of worker.DefaultSendWindow sends) opens each of its connections to the provider
// about once. With the pool at its default size (128), the sends beyond it close their connections on
// return and dial again for the next window: 7,046 connections for 32,000 sends when this test was
// written (against Twilio, a TLS handshake each).
func TestWorkerKeepsAConnectionPerSendInFlight(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	const concurrency, n = 64, 64 * 500 // a batch of 500 for every batch run
	inFlight := concurrency * worker.DefaultSendWindow
	_, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	sandboxAddr := freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"TWILIO_ACCOUNT_SID=ACpool000000000000000000000000000", "TWILIO_AUTH_TOKEN=pooltoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, "TWILIO_RATE=0", "SENDER_IDENTITY="+testSender,
	)}
	e.mustRun("migrate")
	e.mustRun("demo", "seed", "--users", strconv.Itoa(chaosUsersFor(n)), "--pool", "demo")
	audience := filepath.Join(t.TempDir(), "audience.sql")
	if err := os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600); err != nil {
		t.Fatal(err)
	}
	// 30 ms an answer: every batch run has its window out at once most of the time.
	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--latency", "30ms")
	waitFor(t, 10*time.Second, func() bool { _, err := chaosAccepted(sandboxAddr); return err == nil })
	out := e.mustRun("launch", "--name", "pool", "--channel", "sms", "--audience", audience, "--code-pool", "demo",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--frequency-cap", "0", "--yes", "--json")
	var rep struct {
		ID       int64 `json:"id"`
		Enqueued int   `json:"enqueued"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	if rep.Enqueued < concurrency {
		t.Fatalf("%d batches enqueued, want at least %d (one a batch run)", rep.Enqueued, concurrency)
	}
	e.start("worker", "worker", "--concurrency", strconv.Itoa(concurrency))
	id := strconv.FormatInt(rep.ID, 10)
	var st chaosStatus
	waitFor(t, 2*time.Minute, func() bool {
		s, err := chaosStatusOf(e, id)
		st = s
		return err == nil && s.Pending == 0
	})
	if st.Sent != n {
		t.Fatalf("status %+v: want all %d sent", st, n)
	}
	stats := sandboxStats(t, sandboxAddr)
	t.Logf("%d sends, %d connections opened to the provider", stats.Accepted, stats.Connections)
	// A send may dial while another's connection is on its way back to the pool: a few more than in flight.
	if stats.Connections > int64(inFlight+inFlight/10) {
		t.Errorf("the worker opened %d connections for %d sends with at most %d in flight: its pool closes connections it needs again", stats.Connections, n, inFlight)
	}
	if stats.Connections < int64(inFlight)/2 {
		t.Errorf("only %d connections for up to %d sends in flight: the test did not fill the windows", stats.Connections, inFlight)
	}
}
