package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testlog"
)

// fakeWorkerEnv makes the test binary, started by a supervisor under test, act as a worker process.
const fakeWorkerEnv = "SUPERVISOR_TEST_WORKER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeWorkerEnv); mode != "" {
		os.Exit(fakeWorker(mode))
	}
	os.Exit(m.Run())
}

// fakeWorker is a worker process: "graceful" exits 0 on SIGTERM, "stubborn" ignores SIGTERM, "usage" exits
// 2 at once (a bad flag), "crash" exits 1 after 50 ms.
func fakeWorker(mode string) int {
	switch mode {
	case "usage":
		fmt.Fprintln(os.Stderr, "Error: unknown flag: --nope")
		return 2
	case "crash":
		time.Sleep(50 * time.Millisecond)
		return 1
	case "stubborn":
		// (Notify would undo the Ignore: a stubborn worker never listens.)
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintf(os.Stderr, "fake worker %d started\n", os.Getpid())
		time.Sleep(2 * time.Minute) // never outlive a test that lost track of us
		return 3
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	fmt.Fprintf(os.Stderr, "fake worker %d started\n", os.Getpid())
	select {
	case <-term:
		fmt.Fprintf(os.Stderr, "fake worker %d stopping\n", os.Getpid())
		return 0
	case <-time.After(2 * time.Minute):
		// never outlive a test that lost track of us
		return 3
	}
}

// syncBuffer is a log sink safe for the supervisor's logger and the workers' output together.
type syncBuffer struct{ testlog.Buffer }

// logLines are the supervisor's JSON log lines with the given message.
func (s *syncBuffer) logLines(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(s.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

type harness struct {
	t    *testing.T
	sup  *Supervisor
	out  *syncBuffer
	stop context.CancelFunc
	done chan error
}

func startSupervisor(t *testing.T, mode string, cfg Config) *harness {
	t.Helper()
	out := &syncBuffer{}
	cfg.Path = os.Args[0]
	cfg.Env = append(os.Environ(), fakeWorkerEnv+"="+mode)
	cfg.Stdout, cfg.Stderr = out, out
	cfg.Logger = slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.Interval == 0 {
		cfg.Interval = 50 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, sup: New(cfg), out: out, stop: cancel, done: make(chan error, 1)}
	go func() { h.done <- h.sup.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(20 * time.Second):
			t.Errorf("supervisor still running 20s after its context ended")
			for _, pid := range h.sup.Status().PIDs {
				syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // last resort
			}
		}
		if t.Failed() {
			t.Logf("supervisor and worker output:\n%s", out.String())
		}
	})
	return h
}

// wait polls cond until it holds, failing the test after d.
func (h *harness) wait(d time.Duration, what string, cond func(Status) bool) Status {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := h.sup.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: not within %v; status %+v", what, d, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shutdown ends the supervisor's context and waits for Run.
func (h *harness) shutdown(d time.Duration) error {
	h.t.Helper()
	h.stop()
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		return err
	case <-time.After(d):
		h.t.Fatalf("Run did not return within %v of the context's end", d)
		return nil
	}
}

// waitStarted waits until each of the fake workers has said it handles SIGTERM.
func (h *harness) waitStarted(pids []int) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, pid := range pids {
		for !strings.Contains(h.out.String(), fmt.Sprintf("fake worker %d started", pid)) {
			if time.Now().After(deadline) {
				h.t.Fatalf("fake worker %d did not start within 20s", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func scripted(pending *atomic.Int64) Observer {
	return ObserverFunc(func(context.Context) (Observation, error) {
		n := int(pending.Load())
		return Observation{At: time.Now(), Pending: n, Latency: time.Duration(n) * time.Second}, nil
	})
}

// The whole life of a pool, with real processes: min at start, up at once under a backlog, a SIGKILLed
// worker started again and counted, down one at a time after the cooldown with SIGTERM, and every worker
// stopped and waited for when the supervisor stops.
func TestSupervisorScalesRestartsAndStops(t *testing.T) {
	t.Parallel()
	var pending atomic.Int64
	h := startSupervisor(t, "graceful", Config{
		Policy:          Policy{Min: 1, Max: 3, Concurrency: 2, Cooldown: 300 * time.Millisecond},
		Observer:        scripted(&pending),
		ShutdownTimeout: 5 * time.Second,
		RestartBackoff:  100 * time.Millisecond,
	})
	first := h.wait(10*time.Second, "one worker at start", func(s Status) bool { return len(s.PIDs) == 1 && s.Decisions > 0 })

	pending.Store(40)
	up := h.wait(10*time.Second, "scale up to --max", func(s Status) bool { return len(s.PIDs) == 3 })
	if !slices.Contains(up.PIDs, first.PIDs[0]) {
		t.Errorf("the first worker %d was replaced while scaling up: %v", first.PIDs[0], up.PIDs)
	}
	lines := h.out.logLines("scale up")
	if len(lines) != 1 || lines[0]["from"] != 1.0 || lines[0]["to"] != 3.0 || lines[0]["reason"] != ReasonBacklog ||
		lines[0]["pending"] != 40.0 || lines[0]["latency"] != "40s" {
		t.Errorf("scale up logged as %v; want one line from=1 to=3 pending=40 latency=40s reason=backlog", lines)
	}

	victim := up.PIDs[1]
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	back := h.wait(10*time.Second, "the SIGKILLed worker started again", func(s Status) bool {
		return s.Restarts == 1 && len(s.PIDs) == 3 && !slices.Contains(s.PIDs, victim)
	})
	if crashed := h.out.logLines("worker exited without being asked; restarting it"); len(crashed) != 1 || crashed[0]["pid"] != float64(victim) ||
		!strings.Contains(fmt.Sprint(crashed[0]["exit"]), "killed") {
		t.Errorf("crash logged as %v", crashed)
	}
	if restarted := h.out.logLines("worker restarted"); len(restarted) != 1 || restarted[0]["restarts"] != 1.0 {
		t.Errorf("restart logged as %v", restarted)
	}

	// A fake worker handles SIGTERM once it has said so (under -race, starting takes a while).
	h.waitStarted(back.PIDs)
	pending.Store(0)
	began := time.Now()
	h.wait(10*time.Second, "scale down to --min", func(s Status) bool { return len(s.PIDs) == 1 && s.Stopping == 0 })
	if took := time.Since(began); took < 2*300*time.Millisecond {
		t.Errorf("down from 3 to 1 in %v: two cooldowns of 300ms at least", took)
	}
	downs := h.out.logLines("scale down")
	if len(downs) != 2 || downs[0]["from"] != 3.0 || downs[0]["to"] != 2.0 || downs[1]["to"] != 1.0 || downs[0]["reason"] != ReasonIdle {
		t.Errorf("scale down logged as %v; want 3→2 and 2→1, reason idle", downs)
	}
	stopped := h.out.logLines("worker stopped")
	if len(stopped) != 2 {
		t.Errorf("%d workers stopped, want 2: %v", len(stopped), stopped)
	}
	for _, s := range stopped {
		if s["exit"] != "exit status 0" {
			t.Errorf("a worker stopped with SIGTERM exited with %v, want exit status 0 (graceful)", s["exit"])
		}
	}
	if n := strings.Count(h.out.String(), "stopping\n"); n != 2 {
		t.Errorf("the workers' own output shows %d graceful stops, want 2 (output passed through)", n)
	}

	last := h.sup.Status().PIDs
	if err := h.shutdown(10 * time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	for _, pid := range append(append(last, up.PIDs...), back.PIDs...) {
		if alive(pid) {
			t.Errorf("worker %d still alive after the supervisor returned", pid)
		}
	}
	if st := h.sup.Status(); len(st.PIDs) != 0 || st.Stopping != 0 || st.Restarts != 1 {
		t.Errorf("status after stop %+v", st)
	}
}

// --max caps the worker processes, those still stopping included: a scale up right after a scale down
// waits for the stopped worker to be gone. Before, a worker stuck in a held provider call while it stopped
// ran beside its replacement: 3 processes under --max 2 for 7 s in an outside run.
func TestSupervisorNeverRunsMoreThanMax(t *testing.T) {
	t.Parallel()
	var pending atomic.Int64
	pending.Store(40)
	h := startSupervisor(t, "stubborn", Config{
		Policy:          Policy{Min: 1, Max: 2, Concurrency: 1, Cooldown: 200 * time.Millisecond},
		Observer:        scripted(&pending),
		Interval:        50 * time.Millisecond,
		ShutdownTimeout: 1500 * time.Millisecond,
		KillMargin:      200 * time.Millisecond,
	})
	up := h.wait(10*time.Second, "two workers", func(s Status) bool { return len(s.PIDs) == 2 })
	h.waitStarted(up.PIDs)
	pending.Store(0)
	h.wait(10*time.Second, "one worker stopping", func(s Status) bool { return s.Stopping == 1 })
	pending.Store(40) // the backlog is back while the stopped worker (ignoring SIGTERM) is still there
	most := 0
	back := h.wait(10*time.Second, "two workers again", func(s Status) bool {
		most = max(most, len(s.PIDs)+s.Stopping)
		return len(s.PIDs) == 2 && s.Stopping == 0
	})
	if most > 2 {
		t.Fatalf("%d worker processes at once under --max 2 (then %+v)", most, back)
	}
}

// A worker that ignores SIGTERM is SIGKILLed after the shutdown timeout plus the margin.
func TestSupervisorKillsAWorkerThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	var pending atomic.Int64
	h := startSupervisor(t, "stubborn", Config{
		Policy:          Policy{Min: 1, Max: 1, Concurrency: 1},
		Observer:        scripted(&pending),
		ShutdownTimeout: 300 * time.Millisecond,
		KillMargin:      200 * time.Millisecond,
	})
	st := h.wait(10*time.Second, "one worker", func(s Status) bool { return len(s.PIDs) == 1 })
	h.waitStarted(st.PIDs)
	began := time.Now()
	if err := h.shutdown(10 * time.Second); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if took := time.Since(began); took < 500*time.Millisecond {
		t.Errorf("stopped in %v, before the shutdown timeout and margin (500ms)", took)
	}
	if alive(st.PIDs[0]) {
		t.Errorf("worker %d still alive", st.PIDs[0])
	}
	if len(h.out.logLines("worker still running after SIGTERM; killed it")) != 1 {
		t.Errorf("the SIGKILL was not logged")
	}
}

// A worker that exits with status 2 refused its flags: the supervisor stops instead of restarting it
// forever.
func TestSupervisorStopsWhenAWorkerRefusesItsConfiguration(t *testing.T) {
	t.Parallel()
	var pending atomic.Int64
	h := startSupervisor(t, "usage", Config{
		Policy:   Policy{Min: 2, Max: 2, Concurrency: 1},
		Observer: scripted(&pending),
	})
	select {
	case err := <-h.done:
		h.done <- err
		if !errors.Is(err, ErrWorkerUsage) {
			t.Fatalf("Run = %v, want ErrWorkerUsage", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after a worker exited with status 2")
	}
	if st := h.sup.Status(); st.Restarts != 0 || len(st.PIDs) != 0 {
		t.Errorf("status %+v: no restart and no worker left expected", st)
	}
	if !strings.Contains(h.out.String(), "unknown flag: --nope") {
		t.Errorf("the worker's own message was not passed through")
	}
}

// Workers that keep crashing are started again with a growing backoff.
func TestSupervisorRestartBackoffGrows(t *testing.T) {
	t.Parallel()
	var pending atomic.Int64
	h := startSupervisor(t, "crash", Config{
		Policy:            Policy{Min: 1, Max: 1, Concurrency: 1},
		Observer:          scripted(&pending),
		RestartBackoff:    50 * time.Millisecond,
		MaxRestartBackoff: 200 * time.Millisecond,
	})
	h.wait(20*time.Second, "four restarts", func(s Status) bool { return s.Restarts >= 4 })
	var delays []string
	for _, l := range h.out.logLines("worker exited without being asked; restarting it") {
		delays = append(delays, fmt.Sprint(l["restart_in"]))
	}
	if want := []string{"50ms", "100ms", "200ms", "200ms"}; len(delays) < 4 || !slices.Equal(delays[:4], want) {
		t.Errorf("restart delays %v, want %v first", delays, want)
	}
	if err := h.shutdown(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// Without a view of the queue the pool is left as it is, and the problem is logged once.
func TestSupervisorHoldsWhenTheQueueCannotBeSeen(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	var pending atomic.Int64
	obs := ObserverFunc(func(ctx context.Context) (Observation, error) {
		if failing.Load() {
			return Observation{}, errors.New("redis: connection refused")
		}
		return scripted(&pending).Observe(ctx)
	})
	pending.Store(100)
	h := startSupervisor(t, "graceful", Config{
		Policy:   Policy{Min: 1, Max: 3, Concurrency: 1},
		Observer: obs,
	})
	h.wait(10*time.Second, "one worker", func(s Status) bool { return len(s.PIDs) == 1 })
	time.Sleep(300 * time.Millisecond) // several intervals without a view
	if st := h.sup.Status(); len(st.PIDs) != 1 || st.Decisions != 0 {
		t.Fatalf("status %+v while the queue cannot be seen; want 1 worker, no decision", st)
	}
	if n := len(h.out.logLines("cannot see the queue; the pool stays as it is")); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	failing.Store(false)
	h.wait(10*time.Second, "scale up once the queue is visible", func(s Status) bool { return len(s.PIDs) == 3 })
	if err := h.shutdown(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// A worker frozen (SIGSTOP: a paused container, a debugger) sends nothing and stops heartbeating, but its
// process lives on: the supervisor counted it as running and held the pool "steady" while a campaign waited
// minutes. Once it has run HungAfter with no live heartbeat, it is killed and another started in its
// place; a worker that beats is left alone.
func TestSupervisorReplacesAWorkerThatStoppedHeartbeating(t *testing.T) {
	t.Parallel()
	var frozen sync.Map   // pid → true once SIGSTOPped: its heartbeat stops
	var blank atomic.Bool // every heartbeat gone (Redis lost its data) until the next beats
	var hp atomic.Pointer[harness]
	h := startSupervisor(t, "graceful", Config{
		Policy:    Policy{Min: 2, Max: 2, Concurrency: 1},
		HungAfter: 300 * time.Millisecond,
		Observer: ObserverFunc(func(context.Context) (Observation, error) {
			o := Observation{At: time.Now()}
			if h := hp.Load(); h != nil {
				o.Beating = map[int]bool{}
				for _, pid := range h.sup.Status().PIDs {
					if _, ok := frozen.Load(pid); !ok && !blank.Load() {
						o.Beating[pid] = true
					}
				}
			}
			return o, nil
		}),
	})
	hp.Store(h)
	st := h.wait(10*time.Second, "two workers", func(s Status) bool { return len(s.PIDs) == 2 })
	h.waitStarted(st.PIDs)
	time.Sleep(500 * time.Millisecond) // past HungAfter: both beat, neither is touched
	if now := h.sup.Status(); !slices.Equal(now.PIDs, st.PIDs) || now.Restarts != 0 {
		t.Fatalf("workers %v (restarts %d) while both beat, want %v left alone", now.PIDs, now.Restarts, st.PIDs)
	}
	// Every heartbeat gone for a moment shorter than HungAfter: nobody is killed.
	blank.Store(true)
	time.Sleep(200 * time.Millisecond)
	blank.Store(false)
	time.Sleep(200 * time.Millisecond)
	if now := h.sup.Status(); !slices.Equal(now.PIDs, st.PIDs) || now.Restarts != 0 {
		t.Fatalf("workers %v (restarts %d) after every heartbeat was gone for 200 ms, want %v left alone", now.PIDs, now.Restarts, st.PIDs)
	}
	stuck := st.PIDs[0]
	frozen.Store(stuck, true)
	if err := syscall.Kill(stuck, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	now := h.wait(10*time.Second, "the frozen worker replaced", func(s Status) bool {
		return len(s.PIDs) == 2 && !slices.Contains(s.PIDs, stuck) && s.Stopping == 0
	})
	if !slices.Contains(now.PIDs, st.PIDs[1]) {
		t.Errorf("workers %v: the one that beats (%d) was replaced too", now.PIDs, st.PIDs[1])
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(stuck) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(stuck) {
		syscall.Kill(stuck, syscall.SIGKILL) //nolint:errcheck
		t.Fatalf("the frozen worker %d is still alive", stuck)
	}
	if n := len(h.out.logLines("worker has no heartbeat (frozen, hung, or cut off from Redis); killing it and starting another")); n != 1 {
		t.Errorf("%d kills of a hung worker logged, want 1", n)
	}
}

// Redis away for longer than HungAfter, then back: no look could find a heartbeat while the queue could
// not be seen, so no worker is judged hung at the first looks after it is back, while the workers beat
// again. Before, every healthy worker was killed in the millisecond the queue was visible again.
func TestSupervisorKillsNoWorkerWhenRedisIsBackAfterALongOutage(t *testing.T) {
	t.Parallel()
	var phase atomic.Int32 // 0 beating, 1 the queue cannot be seen, 2 visible with no heartbeat yet
	var hp atomic.Pointer[harness]
	h := startSupervisor(t, "graceful", Config{
		Policy:    Policy{Min: 2, Max: 2, Concurrency: 1},
		HungAfter: 300 * time.Millisecond,
		Observer: ObserverFunc(func(context.Context) (Observation, error) {
			o := Observation{At: time.Now(), Beating: map[int]bool{}}
			switch phase.Load() {
			case 1:
				return Observation{}, errors.New("redis: connection refused")
			case 0:
				if h := hp.Load(); h != nil {
					for _, pid := range h.sup.Status().PIDs {
						o.Beating[pid] = true
					}
				}
			}
			return o, nil
		}),
	})
	hp.Store(h)
	st := h.wait(10*time.Second, "two workers", func(s Status) bool { return len(s.PIDs) == 2 })
	h.waitStarted(st.PIDs)
	phase.Store(1)
	time.Sleep(900 * time.Millisecond) // three times HungAfter without a view
	phase.Store(2)
	time.Sleep(200 * time.Millisecond) // back, the heartbeats not yet written again
	phase.Store(0)
	time.Sleep(400 * time.Millisecond)
	if now := h.sup.Status(); !slices.Equal(now.PIDs, st.PIDs) || now.Restarts != 0 {
		t.Fatalf("workers %v (restarts %d) after Redis came back, want %v left alone", now.PIDs, now.Restarts, st.PIDs)
	}
	if n := len(h.out.logLines("worker has no heartbeat (frozen, hung, or cut off from Redis); killing it and starting another")); n != 0 {
		t.Errorf("%d healthy workers killed when the queue was visible again", n)
	}
	if err := h.shutdown(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}
