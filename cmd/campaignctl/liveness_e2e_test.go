package main

import (
	"bytes"
	"os/exec"
	"testing"
	"time"
)

// A worker process killed outright (kill -9) while it sends three batches: the other worker, with free
// slots, sends them within seconds, long before the dead worker's chunk leases (3 × --provider-timeout,
// 30 s) run out. This is the binary's own wiring: each worker holds its liveness lock in Postgres and
// sweeps for the chunks of the workers whose lock is gone. Nobody is sent twice, nobody is left.
func TestAKilledWorkersBatchesAreSentAgainWithinSeconds(t *testing.T) {
	t.Parallel()
	const n, rate = 3000, 150 // six batches of 500, 20 s at the provider's rate
	e, sandboxAddr, audience := smsSandboxEnv(t, n, "150")
	a := exec.Command(e.bin, "worker", "--concurrency", "3")
	a.Env = e.env
	var aLogs bytes.Buffer
	a.Stdout, a.Stderr = &aLogs, &aLogs
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			a.Process.Kill() //nolint:errcheck
			a.Wait()         //nolint:errcheck
		}
	})
	id, enqueued := launchSMS(e, "kill-mid-batch", audience, "Merhaba {{.first_name}}, kodunuz {{.code}}", "--batch-size", "500")
	if enqueued != 6 {
		t.Fatalf("%d batches enqueued, want 6", enqueued)
	}
	// A takes three batches as they are queued; B, started a moment later, the other three, with three
	// slots to spare.
	time.Sleep(time.Second)
	e.start("worker B", "worker", "--concurrency", "6")
	waitFor(t, 20*time.Second, func() bool { got, err := chaosAccepted(sandboxAddr); return err == nil && got >= 600 })
	if err := a.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.Wait() //nolint:errcheck
	killed = true
	kill := time.Now()
	accepted, _ := chaosAccepted(sandboxAddr)
	var st chaosStatus
	waitFor(t, 60*time.Second, func() bool {
		var err error
		st, err = chaosStatusOf(e, id)
		return err == nil && st.State == "completed"
	})
	took := time.Since(kill)
	// What was left at the kill takes (n - accepted) / rate at the provider's rate; a dead worker's chunks
	// found only when their leases run out would add about 30 s.
	left := time.Duration(float64(n-accepted) / rate * float64(time.Second))
	t.Logf("killed worker A after %d accepted; the campaign completed %.1f s later (%.1f s of sending left at the rate)", accepted, took.Seconds(), left.Seconds())
	if took > left+10*time.Second {
		t.Errorf("the campaign completed %.1f s after A was killed, want within %.1f s: A's batches waited (for their leases?)\nA's log:\n%s",
			took.Seconds(), (left + 10*time.Second).Seconds(), tail(aLogs.String(), 2000))
	}
	if st.Pending != 0 || st.Sent+st.Unknown != n || st.DLQ != 0 {
		t.Errorf("status %+v, want all %d sent or unknown, none pending or in the DLQ", st, n)
	}
	seen := map[string]int{}
	for _, m := range chaosSandboxMessages(t, sandboxAddr) {
		if seen[m.To]++; seen[m.To] == 2 {
			t.Errorf("%s got two messages", m.To)
		}
	}
}
