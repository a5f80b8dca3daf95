package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Observer looks at the queue and the rate caps.
type Observer interface {
	Observe(ctx context.Context) (Observation, error)
}

// ObserverFunc is an Observer made of a function.
type ObserverFunc func(ctx context.Context) (Observation, error)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context) (Observation, error) { return f(ctx) }

// ErrWorkerUsage is returned by Run when a worker exited with status 2 (bad usage or bad configuration):
// starting it again would only fail again, so the supervisor stops.
var ErrWorkerUsage = errors.New("a worker refused its flags or configuration (exit status 2)")

// Config configures a Supervisor. The zero value of a duration means its default.
type Config struct {
	// Policy sizes the pool.
	Policy Policy
	// Interval is the time between two looks at the queue; default 5 s.
	Interval time.Duration
	// ShutdownTimeout is the workers' own --shutdown-timeout: after a SIGTERM, a worker that is still
	// running ShutdownTimeout + KillMargin later is SIGKILLed. Default 30 s.
	ShutdownTimeout time.Duration
	// KillMargin is added to ShutdownTimeout before the SIGKILL; default 10 s.
	KillMargin time.Duration
	// Path and Args are the worker command (Args without the program name); Env is its environment (nil:
	// the supervisor's own).
	Path string
	Args []string
	Env  []string
	// Stdout and Stderr receive the workers' output as is. An *os.File is handed to the worker itself;
	// anything else is written through a lock (see LockWriter), so that lines of several workers do not
	// interleave.
	Stdout, Stderr io.Writer
	// Observer is asked every Interval.
	Observer Observer
	// Logger receives one line per decision, start, stop and crash.
	Logger *slog.Logger
	// HungAfter: a worker that has run this long and whose heartbeat no look has found live
	// (Observation.Beating) for this long is hung (frozen by SIGSTOP or a paused container, deadlocked, cut
	// off from Redis while the supervisor is not): it is killed and another started in its place. Default
	// 30 s (a heartbeat lives 30 s after its beat: a minute without a beat); negative: never.
	HungAfter time.Duration
	// RestartBackoff is the wait before a crashed worker is started again; it doubles, up to
	// MaxRestartBackoff, while workers keep crashing within StableAfter of their start. Defaults 1 s, 30 s,
	// 30 s.
	RestartBackoff, MaxRestartBackoff, StableAfter time.Duration
}

// Status is a snapshot of the pool.
type Status struct {
	// Target is the number of workers the pool is kept at.
	Target int
	// PIDs are the workers running and not asked to stop.
	PIDs []int
	// Stopping is how many workers were asked to stop and have not exited yet.
	Stopping int
	// Restarts counts the crashed workers started again.
	Restarts int
	// Decisions counts the looks at the queue that led to a decision.
	Decisions int
}

// Supervisor runs worker processes and keeps their number at what the backlog and the rate caps call for.
type Supervisor struct {
	cfg Config
	log *slog.Logger

	exited chan *child

	// owned by Run's goroutine
	children    []*child
	nextID      int
	restartsDue []time.Time
	backoff     time.Duration
	state       State
	// history holds the recent observations' times and counters, oldest first (see rateBase).
	history         []Observation
	lastReason      string
	lastSupervisors int
	observeErr      bool

	mu     sync.Mutex
	status Status
}

type child struct {
	id       int
	pid      int
	cmd      *exec.Cmd
	started  time.Time
	beat     time.Time // when a look last found its heartbeat live
	stopping bool
	stopAt   time.Time
	killer   *time.Timer
	killDone chan struct{} // closed once a fired killer has killed (and logged it)
	err      error         // from Wait
}

// New returns a Supervisor; Run starts it.
func New(cfg Config) *Supervisor {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.KillMargin <= 0 {
		cfg.KillMargin = 10 * time.Second
	}
	if cfg.HungAfter == 0 {
		cfg.HungAfter = 30 * time.Second
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.MaxRestartBackoff <= 0 {
		cfg.MaxRestartBackoff = 30 * time.Second
	}
	if cfg.StableAfter <= 0 {
		cfg.StableAfter = 30 * time.Second
	}
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	same := sameWriter(cfg.Stdout, cfg.Stderr)
	cfg.Stderr = LockWriter(cfg.Stderr)
	if same {
		cfg.Stdout = cfg.Stderr
	} else {
		cfg.Stdout = LockWriter(cfg.Stdout)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Supervisor{cfg: cfg, log: log, exited: make(chan *child, 16), backoff: cfg.RestartBackoff}
}

// Status returns a snapshot of the pool; it is safe to call while Run runs.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.PIDs = append([]int(nil), st.PIDs...)
	return st
}

// Run starts Policy.Min workers, then looks at the queue every Interval and scales the pool, restarting
// workers that crash, until ctx is done. Then it sends SIGTERM to every worker, waits for them (SIGKILL
// after ShutdownTimeout + KillMargin) and returns nil. It returns ErrWorkerUsage, after stopping the
// others, when a worker exits with status 2.
func (s *Supervisor) Run(ctx context.Context) error {
	p := s.cfg.Policy
	if p.Min < 0 || p.Max < 1 || p.Min > p.Max {
		return fmt.Errorf("supervisor: min %d, max %d: want 0 ≤ min ≤ max and max ≥ 1", p.Min, p.Max)
	}
	if s.cfg.Path == "" || s.cfg.Observer == nil {
		return errors.New("supervisor: Path and Observer are required")
	}
	s.log.Info("supervisor started", "min", p.Min, "max", p.Max, "concurrency", p.Concurrency,
		"interval", s.cfg.Interval.String(), "cooldown", p.Cooldown.String())
	s.state = State{Workers: p.Min, LastChange: time.Now()}
	s.apply()

	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	var restartTimer *time.Timer
	defer func() {
		if restartTimer != nil {
			restartTimer.Stop()
		}
	}()
	var fatal error
	s.tick(ctx)
loop:
	for {
		var restartC <-chan time.Time
		if len(s.restartsDue) > 0 {
			if restartTimer != nil {
				restartTimer.Stop()
			}
			restartTimer = time.NewTimer(time.Until(s.restartsDue[0]))
			restartC = restartTimer.C
		}
		select {
		case <-ctx.Done():
			break loop
		case c := <-s.exited:
			if err := s.reap(c); err != nil {
				fatal = err
				break loop
			}
			s.apply()
		case <-restartC:
			s.apply()
		case <-ticker.C:
			s.tick(ctx)
		}
	}
	s.shutdown()
	return fatal
}

// tick observes, decides and applies the decision.
// RateWindow is the least time a send rate is measured over. The counters move when a run records its
// chunk, up to a hundred messages at once: over one interval the rate swings between nothing and a chunk's
// worth, and a per-worker rate taken at such a swing is far above what a worker sends, so that the rate
// caps would seem to need fewer workers than they do.
const RateWindow = 10 * time.Second

// rateBase records o and returns the newest earlier observation at least RateWindow older than o, or nil
// while there is none: the send rate is not known yet.
func (s *Supervisor) rateBase(o Observation) *Observation {
	var base *Observation
	keep := 0
	for i := range s.history {
		if o.At.Sub(s.history[i].At) < RateWindow {
			break
		}
		base, keep = &s.history[i], i
	}
	if base != nil {
		b := *base
		base = &b
	}
	s.history = append(s.history[keep:], Observation{At: o.At, Sends: o.Sends})
	return base
}

func (s *Supervisor) tick(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, max(s.cfg.Interval, 5*time.Second))
	o, err := s.cfg.Observer.Observe(octx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		// The pool is left as it is: without a view of the queue, neither direction is safe.
		if !s.observeErr {
			s.log.Warn("cannot see the queue; the pool stays as it is", "workers", s.state.Workers, "err", err)
		}
		s.observeErr = true
		return
	}
	if s.observeErr {
		s.log.Info("the queue is visible again")
		s.observeErr = false
		// While the supervisor could not look, no look could find a heartbeat: a worker's silence is
		// counted from now. Redis back after an outage of HungAfter or more made every worker look hung at
		// the first look, and each healthy worker was killed.
		for _, c := range s.children {
			c.beat = o.At
		}
	}
	if base := s.rateBase(o); base != nil {
		o.SendRate, o.RateSince = SendRate(*base, o), base.At
	}
	s.killHung(o)

	d, next := s.cfg.Policy.Decide(s.state, o)
	if d.To < d.From && s.stoppingCount() > 0 {
		// One at a time: the next scale down waits for the previous worker to be gone; the cooldown
		// clock keeps running meanwhile.
		d.To, d.Reason = d.From, ReasonStillStopping
		next.Workers, next.LastChange = s.state.Workers, s.state.LastChange
	}
	s.state = next
	s.logDecision(d, o)
	s.mu.Lock()
	s.status.Decisions++
	s.mu.Unlock()
	s.apply()
}

func (s *Supervisor) logDecision(d Decision, o Observation) {
	attrs := []any{
		"from", d.From, "to", d.To,
		"pending", o.Pending, "active", o.Active, "due", o.Due,
		"latency", o.Latency.Round(time.Millisecond).String(),
		"need", d.Need,
	}
	if d.Supervisors > 1 {
		attrs = append(attrs, "supervisors", d.Supervisors)
	}
	if o.Paused {
		attrs = append(attrs, "queue_paused", true)
	}
	if o.RateCap > 0 {
		attrs = append(attrs, "rate_cap", round2(o.RateCap), "send_rate", round2(o.SendRate))
	}
	if s.state.PerWorker > 0 {
		attrs = append(attrs, "per_worker", round2(s.state.PerWorker))
	}
	if d.RateLimit > 0 {
		attrs = append(attrs, "rate_limit", d.RateLimit)
	}
	attrs = append(attrs, "reason", d.Reason)
	switch {
	case d.To != d.From:
		s.log.Info(d.Action(), attrs...)
	case d.Reason != s.lastReason || d.Supervisors != s.lastSupervisors:
		// A hold is news once, when its reason or the number of pools sharing the queue changes.
		s.log.Info("hold", attrs...)
	default:
		s.log.Debug("hold", attrs...)
	}
	s.lastReason, s.lastSupervisors = d.Reason, d.Supervisors
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// apply starts or stops workers until the running ones, plus the restarts due, match the target.
func (s *Supervisor) apply() {
	now := time.Now()
	// Restarts whose backoff is over.
	for len(s.restartsDue) > 0 && !s.restartsDue[0].After(now) {
		if !s.roomForOne() {
			break // due again at the next look
		}
		s.restartsDue = s.restartsDue[1:]
		if s.live()+len(s.restartsDue) >= s.state.Workers {
			continue
		}
		if c := s.start(); c != nil {
			s.mu.Lock()
			s.status.Restarts++
			restarts := s.status.Restarts
			s.mu.Unlock()
			s.log.Info("worker restarted", "worker", c.id, "pid", c.pid, "restarts", restarts)
		}
	}
	for s.live()+len(s.restartsDue) < s.state.Workers && s.roomForOne() {
		if s.start() == nil {
			break
		}
	}
	for s.live()+len(s.restartsDue) > s.state.Workers {
		if n := len(s.restartsDue); n > 0 {
			s.restartsDue = s.restartsDue[:n-1]
			continue
		}
		s.stop(s.newestLive(), "scale down")
	}
	s.publish()
}

func (s *Supervisor) live() int {
	n := 0
	for _, c := range s.children {
		if !c.stopping {
			n++
		}
	}
	return n
}

func (s *Supervisor) stoppingCount() int { return len(s.children) - s.live() }

// roomForOne says whether one more worker process keeps the pool within --max, the workers still stopping
// counted: one asked to stop may take its shutdown timeout and more to exit (a request held by its
// provider), holding its Postgres connections meanwhile, and a scale up right after a scale down ran
// --max + 1 processes for as long.
func (s *Supervisor) roomForOne() bool { return len(s.children) < s.cfg.Policy.Max }

func (s *Supervisor) newestLive() *child {
	var newest *child
	for _, c := range s.children {
		if !c.stopping && (newest == nil || c.id > newest.id) {
			newest = c
		}
	}
	return newest
}

// start runs one worker. A worker that cannot even be started counts as a crash.
func (s *Supervisor) start() *child {
	s.nextID++
	c := &child{id: s.nextID, started: time.Now()}
	c.cmd = exec.Command(s.cfg.Path, s.cfg.Args...)
	c.cmd.Env = s.cfg.Env
	c.cmd.Stdout, c.cmd.Stderr = s.cfg.Stdout, s.cfg.Stderr
	c.cmd.SysProcAttr = sysProcAttr()
	if err := c.cmd.Start(); err != nil {
		s.log.Error("cannot start a worker", "worker", c.id, "err", err)
		s.scheduleRestart(0)
		return nil
	}
	c.pid = c.cmd.Process.Pid
	s.children = append(s.children, c)
	s.log.Info("worker started", "worker", c.id, "pid", c.pid)
	go func() {
		c.err = c.cmd.Wait()
		s.exited <- c
	}()
	return c
}

// stop asks a worker to stop with SIGTERM (it hands its batches back) and SIGKILLs it if it is still there
// ShutdownTimeout + KillMargin later.
func (s *Supervisor) stop(c *child, why string) {
	if c == nil || c.stopping {
		return
	}
	c.stopping, c.stopAt = true, time.Now()
	s.log.Info("stopping worker", "worker", c.id, "pid", c.pid, "why", why)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.log.Warn("cannot signal worker", "worker", c.id, "pid", c.pid, "err", err)
	}
	s.killAfter(c, s.cfg.ShutdownTimeout+s.cfg.KillMargin)
}

// killAfter SIGKILLs c after grace (at once for 0), unless it has exited by then (see reap).
func (s *Supervisor) killAfter(c *child, grace time.Duration) {
	proc, id, pid, done := c.cmd.Process, c.id, c.pid, make(chan struct{})
	c.killDone = done
	c.killer = time.AfterFunc(grace, func() {
		defer close(done)
		if err := proc.Kill(); err == nil && grace > 0 {
			s.log.Warn("worker still running after SIGTERM; killed it", "worker", id, "pid", pid, "waited", grace.String())
		}
	})
}

// killHung kills the workers that have run for HungAfter and whose heartbeat no look has found live for
// HungAfter. Such a worker sends nothing but counts as running, so the pool would stay at its size with
// nobody sending (a campaign sat two minutes behind one frozen worker, its waiting reason no_worker, the
// supervisor holding "steady"). It is killed at once, not asked: a frozen process takes no SIGTERM, and its death lets its liveness lock
// go, so that its chunks are taken over (what it had in flight becomes unknown, as after any kill). apply
// then starts another in its place.
func (s *Supervisor) killHung(o Observation) {
	if o.Beating == nil || s.cfg.HungAfter < 0 {
		return
	}
	for _, c := range s.children {
		if o.Beating[c.pid] {
			c.beat = o.At
		}
		// Silent for HungAfter since its start or its last heartbeat seen: not at one look only (after Redis
		// lost its data, every heartbeat is gone until the next beat).
		if c.stopping || o.At.Sub(c.started) < s.cfg.HungAfter || o.At.Sub(c.beat) < s.cfg.HungAfter {
			continue
		}
		c.stopping, c.stopAt = true, time.Now()
		s.log.Warn("worker has no heartbeat (frozen, hung, or cut off from Redis); killing it and starting another",
			"worker", c.id, "pid", c.pid, "ran", time.Since(c.started).Round(time.Second).String())
		s.killAfter(c, 0)
	}
}

// reap handles a worker that exited: expected after stop, a crash otherwise.
func (s *Supervisor) reap(c *child) error {
	for i, x := range s.children {
		if x == c {
			s.children = append(s.children[:i], s.children[i+1:]...)
			break
		}
	}
	defer s.publish()
	exit := exitText(c.cmd.ProcessState, c.err)
	if c.stopping {
		if !c.killer.Stop() {
			// The killer fired: the worker's end is logged after the kill's, not before it.
			<-c.killDone
		}
		s.log.Info("worker stopped", "worker", c.id, "pid", c.pid, "exit", exit, "took", time.Since(c.stopAt).Round(time.Millisecond).String())
		return nil
	}
	ran := time.Since(c.started)
	if c.cmd.ProcessState != nil && c.cmd.ProcessState.ExitCode() == 2 {
		s.log.Error("worker refused its flags or configuration; stopping (its own message is above)", "worker", c.id, "pid", c.pid, "exit", exit)
		return ErrWorkerUsage
	}
	delay := s.scheduleRestart(ran)
	s.mu.Lock()
	restarts := s.status.Restarts
	s.mu.Unlock()
	s.log.Warn("worker exited without being asked; restarting it", "worker", c.id, "pid", c.pid, "exit", exit,
		"ran", ran.Round(time.Millisecond).String(), "restart_in", delay.String(), "restarts_so_far", restarts)
	return nil
}

// scheduleRestart queues a restart after the backoff, which doubles while workers die young.
func (s *Supervisor) scheduleRestart(ran time.Duration) time.Duration {
	if ran >= s.cfg.StableAfter {
		s.backoff = s.cfg.RestartBackoff
	}
	d := s.backoff
	s.backoff = min(2*s.backoff, s.cfg.MaxRestartBackoff)
	at := time.Now().Add(d)
	i, _ := slices.BinarySearchFunc(s.restartsDue, at, time.Time.Compare)
	s.restartsDue = slices.Insert(s.restartsDue, i, at)
	return d
}

// shutdown stops every worker and waits for all of them.
func (s *Supervisor) shutdown() {
	s.restartsDue = nil
	if n := len(s.children); n > 0 {
		s.log.Info("stopping every worker", "workers", n)
	}
	for _, c := range s.children {
		s.stop(c, "supervisor stopping")
	}
	s.publish()
	for len(s.children) > 0 {
		c := <-s.exited
		s.reap(c) //nolint:errcheck // every exit is expected now
	}
	s.mu.Lock()
	s.status.Target = 0
	s.mu.Unlock()
	s.log.Info("supervisor stopped")
}

func (s *Supervisor) publish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.Target = s.state.Workers
	s.status.PIDs = s.status.PIDs[:0]
	s.status.Stopping = 0
	for _, c := range s.children {
		if c.stopping {
			s.status.Stopping++
		} else {
			s.status.PIDs = append(s.status.PIDs, c.pid)
		}
	}
}

func exitText(ps *os.ProcessState, err error) string {
	if ps != nil {
		return ps.String()
	}
	if err != nil {
		return err.Error()
	}
	return "unknown"
}

// LockWriter returns w when it is an *os.File (the workers write to the file themselves, a line at a time)
// or already locked, and otherwise w behind a lock, so that the supervisor's logger and the copiers of
// several workers' output can share it. Give the supervisor's logger the writer it returns.
func LockWriter(w io.Writer) io.Writer {
	switch w.(type) {
	case *os.File, *lockedWriter:
		return w
	}
	return &lockedWriter{w: w}
}

// lockedWriter serialises the writes of several workers' output copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// sameWriter says whether a and b are the same writer (then one lock must cover both).
func sameWriter(a, b io.Writer) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}
