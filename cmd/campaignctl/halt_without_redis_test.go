package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// An operator who cannot reach Redis (it is down, stalled, or cut off from the operator's machine while the
// workers still reach it) can still pause and cancel: both are recorded in Postgres, say that the halt
// mark could not be written, and the workers stop at their next chunk. Both used to refuse (exit 1), and the
// campaign went on sending, or started again the moment Redis came back.
func TestPauseAndCancelWithoutRedisAreRecordedAndTheWorkersStop(t *testing.T) {
	t.Parallel()
	e, sandboxAddr, audience := smsSandboxEnv(t, 600, "0")
	id, _ := launchSMS(e, "halt-without-redis", audience, "Merhaba {{.first_name}} {{.code}}", "--rate", "40")
	e.start("worker", "worker", "--concurrency", "4")
	waitFor(t, 30*time.Second, func() bool { n, _ := chaosAccepted(sandboxAddr); return n >= 40 })

	cut := &e2eEnv{t: t, bin: e.bin, env: append(append([]string(nil), e.env...), "REDIS_URL=redis://127.0.0.1:1/0")}
	out, stderr, code := cut.run("pause", id)
	if code != 0 || !strings.Contains(out, "paused in Postgres, but the halt mark could not be written to Redis") {
		t.Fatalf("pause without Redis: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	// Repeated, still without Redis: said to be paused already, its halt mark still not written.
	if out, stderr, code := cut.run("pause", id); code != 0 || !strings.Contains(out, "is paused already; its halt mark could not be written to Redis") {
		t.Fatalf("second pause without Redis: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	// The chunk a run holds goes on (under --rate 40, about a second of sends); then nothing more.
	time.Sleep(3 * time.Second)
	after, err := chaosAccepted(sandboxAddr)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if n, _ := chaosAccepted(sandboxAddr); n != after || n >= 600 {
		t.Fatalf("paused without Redis: %d accepted 3 s after the pause, %d 3 s later (of 600); want the sends stopped", after, n)
	}
	var st struct {
		State   string `json:"state"`
		Pending int    `json:"pending"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st); err != nil || st.State != "paused" || st.Pending == 0 {
		t.Fatalf("status after the pause: %+v (%v); want paused with recipients pending", st, err)
	}

	// Cancelled without Redis: recorded, and the recipients no run holds are closed at once.
	out, stderr, code = cut.run("cancel", id)
	if code > 1 || !strings.Contains(out, "cancelled in Postgres (was paused), but the halt mark could not be written to Redis") ||
		!strings.Contains(out, "the sends the workers' runs still hold are counted once they record them") ||
		code == 1 && !strings.Contains(stderr, "run campaignctl cancel "+id+" again") {
		t.Fatalf("cancel without Redis: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	// Run again with Redis, the cancel closes what is left.
	e.mustRun("cancel", id)
	if err := json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st); err != nil || st.State != "cancelled" || st.Pending != 0 {
		t.Fatalf("status after the cancels: %+v (%v); want cancelled with nobody pending", st, err)
	}
	if n, _ := chaosAccepted(sandboxAddr); n != after {
		t.Fatalf("%d accepted after the cancels, %d at the pause: a cancelled campaign sent", n, after)
	}
}

// A pause and a cancel while Redis is frozen for everyone (SIGSTOP): each recorded in Postgres at once, the
// cancel closes the recipients no run holds, and each command returns within seconds. The cancel used to
// read, batch after batch, the claims of what runs held, each read waiting out Redis's timeouts: minutes
// for a campaign of 64 batches; then 10 s, its ping and halt mark each waiting out the client's timeouts.
//
// Not parallel: it freezes a Redis under a running worker, whose retries would take CPU from the timing of the
// package's parallel fault tests (TestChaos's sweeps before its flush); it runs before them, alone.
func TestACancelWhileRedisIsFrozenReturnsWithinSeconds(t *testing.T) {
	e, sandboxAddr, audience := smsSandboxEnv(t, 600, "0")
	srv := testredis.StartServer(t)
	e.env = append(e.env, "REDIS_URL="+srv.URL())
	id, _ := launchSMS(e, "cancel-frozen", audience, "Merhaba {{.first_name}} {{.code}}", "--rate", "40")
	e.start("worker", "worker", "--concurrency", "4")
	waitFor(t, 30*time.Second, func() bool { n, _ := chaosAccepted(sandboxAddr); return n >= 40 })

	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	// A pause first: recorded, and back within a few seconds too (it gives Redis a second for its ping and
	// a second for its halt mark; each used to wait out the client's read timeout and retries: 10 s).
	start := time.Now()
	out, stderr, code := e.run("pause", id)
	took := time.Since(start)
	if code != 0 || !strings.Contains(out, "paused in Postgres, but the halt mark could not be written to Redis") {
		t.Fatalf("pause with Redis frozen: exit %d after %v\nstdout: %s\nstderr: %s", code, took, out, stderr)
	}
	if took > 6*time.Second {
		t.Fatalf("pause with Redis frozen took %v: it waited out Redis's timeouts", took)
	}
	t.Logf("pause with Redis frozen: exit %d in %v", code, took.Round(time.Millisecond))
	start = time.Now()
	out, stderr, code = e.run("cancel", id)
	took = time.Since(start)
	if code > 1 || !strings.Contains(out, "cancelled in Postgres (was paused), but the halt mark could not be written to Redis") ||
		code == 1 && !strings.Contains(stderr, "that runs hold are not closed yet") {
		t.Fatalf("cancel with Redis frozen: exit %d after %v\nstdout: %s\nstderr: %s", code, took, out, stderr)
	}
	if took > 6*time.Second {
		t.Fatalf("cancel with Redis frozen took %v: it waited on Redis (its timeouts, or the batches runs hold)", took)
	}
	t.Logf("cancel with Redis frozen: exit %d in %v", code, took.Round(time.Millisecond))
	srv.Thaw()
	thawed = true
	// With Redis back, the cancel run again closes what is left, and nothing more was sent.
	sent, _ := chaosAccepted(sandboxAddr)
	e.mustRun("cancel", id)
	var st struct {
		State   string `json:"state"`
		Pending int    `json:"pending"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st); err != nil || st.State != "cancelled" || st.Pending != 0 {
		t.Fatalf("status after the cancels: %+v (%v); want cancelled with nobody pending", st, err)
	}
	time.Sleep(2 * time.Second)
	if n, _ := chaosAccepted(sandboxAddr); n != sent || n >= 600 {
		t.Fatalf("%d accepted after the second cancel, %d before it (of 600): a cancelled campaign sent", n, sent)
	}
}
