package main

import (
	"strconv"
	"testing"
	"time"

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
	// 30 ms an answer: every batch run has its window out at once most of the time.
	e, sandboxAddr, audience := smsSandboxEnv(t, n, "0", "--latency", "30ms")
	id, enqueued := launchSMS(e, "pool", audience, "Merhaba {{.first_name}}, kodunuz {{.code}}")
	if enqueued < concurrency {
		t.Fatalf("%d batches enqueued, want at least %d (one a batch run)", enqueued, concurrency)
	}
	e.start("worker", "worker", "--concurrency", strconv.Itoa(concurrency))
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
