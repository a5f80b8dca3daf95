package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// A chaos schedule is a random order of faults drawn from one seed: every kind of fault at least once,
// some more often, shuffled, at random times and with random parameters. It is a pure function of the
// seed (a PCG seeded with it), so a seed that fails gives the same schedule again.

// chaosScheduleShortSeed is the seed the suite runs. Its schedule has every kind of step: it holds answers
// while receipts come early and resends the unknown afterwards, kills workers, freezes Redis, empties it
// after the last kill (so that the killed workers' batches come back at once, not after Asynq's lease)
// and terminates Postgres' backends. No freeze follows a kill closely.
const chaosScheduleShortSeed = 106

// chaosScheduleStream is the PCG's second word: the seed is the first.
const chaosScheduleStream = 0x6368616f73 // "chaos"

// chaosScheduleWorkers is how many worker processes a scheduled run keeps.
const chaosScheduleWorkers = 3

type chaosStepKind int

const (
	stepKill chaosStepKind = iota
	stepFreeze
	stepThaw
	stepFlush
	stepPGTerminate
	stepFaults
	stepFaultsOff
	stepReceipts
	stepReceiptsBack
	stepResume
	stepResend
)

// chaosDefaultReceiptDelay is the sandbox's receipt delay outside a receipts step.
const chaosDefaultReceiptDelay = 200 * time.Millisecond

// chaosStep is one step of a schedule, At after the launch.
type chaosStep struct {
	At   time.Duration
	Kind chaosStepKind
	// Slot is the worker a kill aims at: the slot-th of the live workers, in the order they started.
	Slot int
	// For is how long a freeze lasts (its thaw is a step of its own).
	For time.Duration
	// Faults are what a faults step switches on.
	Faults sandbox.Faults
	// Receipts are what a receipts step sets.
	Receipts sandbox.ReceiptSettings
	// Owed is, for the resume that follows a flush, the flush's offset.
	Owed time.Duration
}

func (s chaosStep) String() string {
	switch s.Kind {
	case stepKill:
		return fmt.Sprintf("SIGKILL worker slot %d, start a replacement", s.Slot)
	case stepFreeze:
		return fmt.Sprintf("freeze Redis (SIGSTOP) for %v", s.For)
	case stepThaw:
		return "thaw Redis (SIGCONT)"
	case stepFlush:
		return "empty Redis (FLUSHALL)"
	case stepPGTerminate:
		return "terminate the Postgres backends of the test database"
	case stepFaults:
		return "provider faults on: " + chaosFaultsString(s.Faults)
	case stepFaultsOff:
		return "provider faults off"
	case stepReceipts:
		if s.Receipts.Off {
			return "receipts off"
		}
		return fmt.Sprintf("receipts %dms after acceptance", s.Receipts.DelayMS)
	case stepReceiptsBack:
		return fmt.Sprintf("receipts back to %v after acceptance", chaosDefaultReceiptDelay)
	case stepResume:
		if s.Owed > 0 {
			return fmt.Sprintf("campaignctl resume ID (after the flush at +%.3fs)", s.Owed.Seconds())
		}
		return "campaignctl resume ID"
	case stepResend:
		return "campaignctl resume ID --resend-unknown"
	}
	return fmt.Sprintf("step kind %d", s.Kind)
}

func chaosFaultsString(f sandbox.Faults) string {
	var parts []string
	for _, c := range []struct {
		name string
		v    float64
	}{{"429", f.Rate429}, {"500", f.Rate500}, {"503", f.Rate503}, {"raw 503", f.RateRaw503}, {"held answer", f.RateTimeout}, {"reset", f.RateReset}} {
		if c.v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f%%", c.name, 100*c.v))
		}
	}
	return strings.Join(parts, ", ")
}

// chaosScheduleFor draws the schedule of seed.
//
// Every kind appears: 2–5 worker kills, 1–2 Redis freezes of 1–4 s, 0–2 flushes (each followed 1–4 s
// later by a resume), 1–2 terminations of Postgres' backends, 2–3 windows of 2–8 s of provider faults
// (the first always holds answers), 0–1 window of changed receipts (off, or at another delay), 1–2 plain
// resumes and 1–2 with --resend-unknown, in a random order 0.5–3 s apart. A freeze never covers a flush, a
// resend or a flush's resume (they need Redis to answer); a kill, a termination, provider faults and a
// plain resume may come while Redis is frozen.
func chaosScheduleFor(seed uint64) []chaosStep {
	r := rand.New(rand.NewPCG(seed, chaosScheduleStream))
	var bag []chaosStepKind
	add := func(k chaosStepKind, n int) {
		for range n {
			bag = append(bag, k)
		}
	}
	add(stepKill, 2+r.IntN(4))
	add(stepFreeze, 1+r.IntN(2))
	add(stepFlush, r.IntN(3))
	add(stepPGTerminate, 1+r.IntN(2))
	add(stepFaults, 2+r.IntN(2))
	add(stepReceipts, r.IntN(2))
	add(stepResume, 1+r.IntN(2))
	add(stepResend, 1+r.IntN(2))
	r.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })

	const settle = 300 * time.Millisecond
	var steps []chaosStep
	var frozenUntil, faultsUntil, receiptsUntil time.Duration
	windows := 0
	t := 1500*time.Millisecond + chaosDur(r, time.Second)
	for i, k := range bag {
		if i > 0 {
			t += 500*time.Millisecond + chaosDur(r, 2500*time.Millisecond)
		}
		switch k {
		case stepFreeze, stepFlush, stepResend:
			t = max(t, frozenUntil+settle)
		case stepFaults:
			t = max(t, faultsUntil+settle)
		case stepReceipts:
			t = max(t, receiptsUntil+settle)
		}
		step := chaosStep{At: t.Round(time.Millisecond), Kind: k}
		switch k {
		case stepKill:
			step.Slot = r.IntN(chaosScheduleWorkers)
		case stepFreeze:
			d := (time.Second + chaosDur(r, 3*time.Second)).Round(10 * time.Millisecond)
			// No flush's resume inside the freeze: it would wait for Redis.
			slices.SortStableFunc(steps, func(a, b chaosStep) int { return int(a.At - b.At) })
			for _, o := range steps {
				if o.Kind == stepResume && o.Owed > 0 && o.At+settle >= t && o.At <= t+d+settle {
					t = o.At + settle
				}
			}
			step.At, step.For = t.Round(time.Millisecond), d
			frozenUntil = step.At + d
			steps = append(steps, chaosStep{At: frozenUntil, Kind: stepThaw})
		case stepFlush:
			steps = append(steps, chaosStep{At: (t + time.Second + chaosDur(r, 3*time.Second)).Round(time.Millisecond), Kind: stepResume, Owed: step.At})
		case stepFaults:
			step.Faults = chaosDrawFaults(r, windows == 0)
			windows++
			faultsUntil = (t + 2*time.Second + chaosDur(r, 6*time.Second)).Round(time.Millisecond)
			steps = append(steps, chaosStep{At: faultsUntil, Kind: stepFaultsOff})
		case stepReceipts:
			switch r.IntN(5) {
			case 0:
				step.Receipts.Off = true
			case 1:
				step.Receipts.DelayMS = 0
			case 2:
				step.Receipts.DelayMS = 50
			case 3:
				step.Receipts.DelayMS = 1500 // after the provider timeout: on a row already unknown
			default:
				step.Receipts.DelayMS = 3000
			}
			receiptsUntil = (t + 2*time.Second + chaosDur(r, 6*time.Second)).Round(time.Millisecond)
			steps = append(steps, chaosStep{At: receiptsUntil, Kind: stepReceiptsBack})
		}
		steps = append(steps, step)
	}
	slices.SortStableFunc(steps, func(a, b chaosStep) int { return int(a.At - b.At) })
	return steps
}

// chaosDur draws a duration in [0, d) from r.
func chaosDur(r *rand.Rand, d time.Duration) time.Duration { return time.Duration(r.Int64N(int64(d))) }

// chaosDrawFaults draws one window's provider faults: one or two kinds, holding answers when held is set.
func chaosDrawFaults(r *rand.Rand, held bool) sandbox.Faults {
	var f sandbox.Faults
	kinds := []int{0, 1, 2, 3, 4, 5} // 429, 500, 503, raw 503, held answer, reset
	r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	picked := kinds[:1+r.IntN(2)]
	if held && !slices.Contains(picked, 4) {
		picked = append(picked[:1], 4)
	}
	round := func(v float64) float64 { return math.Round(v*1000) / 1000 }
	for _, k := range picked {
		switch k {
		case 0:
			f.Rate429 = round(0.005 + 0.025*r.Float64())
		case 1:
			f.Rate500 = round(0.01 + 0.07*r.Float64())
		case 2:
			f.Rate503 = round(0.01 + 0.07*r.Float64())
		case 3:
			f.RateRaw503 = round(0.01 + 0.07*r.Float64())
		case 4:
			f.RateTimeout = round(0.02 + 0.08*r.Float64())
		case 5:
			f.RateReset = round(0.01 + 0.04*r.Float64())
		}
	}
	return f
}

// chaosScheduleSeed reads CHAOS_SCHEDULE and CHAOS_SEED: unset, the suite's fixed seed; CHAOS_SEED=N
// that seed; CHAOS_SCHEDULE=random without CHAOS_SEED a seed drawn now (and logged).
func chaosScheduleSeed(t *testing.T) uint64 {
	switch v := os.Getenv("CHAOS_SCHEDULE"); v {
	case "", "random":
	default:
		t.Fatalf("CHAOS_SCHEDULE=%q: the only schedule is \"random\" (drawn from CHAOS_SEED)", v)
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: give a seed, a number from 0 to 2^64-1", v)
		}
		return seed
	}
	if os.Getenv("CHAOS_SCHEDULE") == "random" {
		return rand.Uint64() % 1_000_000
	}
	return chaosScheduleShortSeed
}

// The schedule is a pure function of the seed, and it keeps its own rules whatever the seed.
func TestChaosScheduleIsAFunctionOfTheSeed(t *testing.T) {
	t.Parallel()
	if a, b := chaosScheduleFor(42), chaosScheduleFor(42); !slices.Equal(a, b) {
		t.Fatalf("seed 42 gave two schedules:\n%v\n%v", a, b)
	}
	if slices.Equal(chaosScheduleFor(1), chaosScheduleFor(2)) {
		t.Error("seeds 1 and 2 gave the same schedule")
	}
	for seed := range uint64(300) {
		steps := chaosScheduleFor(seed)
		kinds := map[chaosStepKind]int{}
		var frozen []chaosStep
		var lastFlush time.Duration = -1
		heldFirst := false
		for i, s := range steps {
			kinds[s.Kind]++
			if i > 0 && s.At < steps[i-1].At {
				t.Fatalf("seed %d: step %d (%v) at %v before the one before it (%v)", seed, i, s, s.At, steps[i-1].At)
			}
			switch s.Kind {
			case stepFreeze:
				if s.For < time.Second || s.For > 4*time.Second {
					t.Errorf("seed %d: freeze of %v, want 1–4 s", seed, s.For)
				}
				frozen = append(frozen, s)
			case stepFlush:
				lastFlush = s.At
			case stepResume:
				if s.Owed > 0 && s.Owed == lastFlush {
					lastFlush = -1
				}
			case stepFaults:
				if kinds[stepFaults] == 1 {
					heldFirst = s.Faults.RateTimeout > 0
				}
				if err := s.Faults.Validate(); err != nil || chaosFaultsString(s.Faults) == "" {
					t.Errorf("seed %d: faults %+v (%v)", seed, s.Faults, err)
				}
			}
		}
		for _, k := range []chaosStepKind{stepKill, stepFreeze, stepPGTerminate, stepFaults, stepResume, stepResend} {
			if kinds[k] == 0 {
				t.Errorf("seed %d: no step of kind %v", seed, chaosStep{Kind: k})
			}
		}
		if kinds[stepFreeze] != kinds[stepThaw] || kinds[stepFaults] != kinds[stepFaultsOff] || kinds[stepReceipts] != kinds[stepReceiptsBack] {
			t.Errorf("seed %d: unbalanced steps %v", seed, kinds)
		}
		if lastFlush >= 0 && kinds[stepFlush] > 0 {
			t.Errorf("seed %d: the flush at %v has no resume after it", seed, lastFlush)
		}
		if !heldFirst {
			t.Errorf("seed %d: the first provider faults do not hold answers", seed)
		}
		for _, f := range frozen {
			for _, s := range steps {
				needsRedis := s.Kind == stepFlush || s.Kind == stepResend || (s.Kind == stepResume && s.Owed > 0) || (s.Kind == stepFreeze && s != f)
				if needsRedis && s.At >= f.At && s.At <= f.At+f.For {
					t.Errorf("seed %d: %v at %v while Redis is frozen (%v for %v)", seed, s, s.At, f.At, f.For)
				}
			}
		}
	}
}

// TestChaosSchedule sends a campaign through a random order of faults drawn from one seed (CHAOS_SEED,
// default chaosScheduleShortSeed; CHAOS_RECIPIENTS recipients, default 1500), with the built binary: three
// worker processes, the sandbox, `campaignctl webhooks` receiving the sandbox's Twilio status callbacks,
// the test's own redis-server and database. The schedule is logged first, one step a line; each step is
// applied at its time after the launch. Then it waits until nothing is pending (another resume when
// nothing moves for 30 s; no --resend-unknown that the schedule did not draw) and checks, from the
// provider's log and Postgres, what chaosCheck checks: nobody accepted twice, except the documented cost
// of --resend-unknown, which is told apart by the evidence that existed when the recipient was resent
// (a receipt answered by the receiver, a sent outcome in the audit, a sent claim in Redis); everyone
// never accepted unknown or failed with the provider's reason; nobody pending; no code on two numbers;
// nothing accepted while Redis was frozen; every sent recipient accepted with its code.
// scripts/chaos.sh --schedule random --seed N runs it at 20,000.
func TestChaosSchedule(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	n := chaosRecipients(t)
	seed := chaosScheduleSeed(t)
	steps := chaosScheduleFor(seed)
	end := steps[len(steps)-1].At
	// The cap spreads the send over the schedule and a little more, so that the faults meet messages.
	rate := max(20, int(math.Ceil(float64(n)/(end+5*time.Second).Seconds())))
	reproduce := fmt.Sprintf("CHAOS_SCHEDULE=random CHAOS_SEED=%d CHAOS_RECIPIENTS=%d go test -count=1 -run '^TestChaosSchedule$' -v -timeout 30m ./cmd/campaignctl   (or: scripts/chaos.sh --schedule random --seed %d --recipients %d)",
		seed, n, seed, n)
	var lines []string
	for i, s := range steps {
		lines = append(lines, fmt.Sprintf("  %2d  +%7.3fs  %s", i+1, s.At.Seconds(), s))
	}
	t.Logf("chaos schedule, seed %d (%d recipients, TWILIO_RATE=%d/s, %d workers):\n%s\nreproduce with: %s",
		seed, n, rate, chaosScheduleWorkers, strings.Join(lines, "\n"), reproduce)
	began := time.Now()
	t.Cleanup(func() {
		verdict := "PASS"
		if t.Failed() {
			verdict = "FAIL"
		}
		t.Logf("chaos schedule seed %d, %d recipients: %s in %v; reproduce with: %s", seed, n, verdict, time.Since(began).Round(time.Second), reproduce)
	})

	db, dbURL := testdb.New(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	datname := strings.TrimPrefix(u.Path, "/")
	rs := testredis.StartServer(t)
	sandboxAddr, hooksAddr := freeAddr(t), freeAddr(t)
	concurrency := 4
	if n > 2000 {
		concurrency = 8
	}
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+rs.URL(),
		"TWILIO_ACCOUNT_SID=ACchaos000000000000000000000000000", "TWILIO_AUTH_TOKEN=chaostoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, fmt.Sprintf("TWILIO_RATE=%d", rate), "SENDER_IDENTITY="+testSender,
		"TWILIO_STATUS_CALLBACK=http://"+hooksAddr+twilioReceiptPath,
	)}
	e.mustRun("migrate")
	users := chaosUsersFor(n)
	e.mustRun("demo", "seed", "--users", strconv.Itoa(users), "--pool", "demo")
	audience := filepath.Join(t.TempDir(), "audience.sql")
	if err := os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600); err != nil {
		t.Fatal(err)
	}

	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--receipt-delay", chaosDefaultReceiptDelay.String())
	e.start("webhooks", "webhooks", "--addr", hooksAddr)
	waitFor(t, 10*time.Second, func() bool {
		for _, u := range []string{"http://" + sandboxAddr + "/_sandbox/stats", "http://" + hooksAddr + "/stats"} {
			resp, err := http.Get(u)
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		return true
	})

	workerArgs := []string{"worker", "--concurrency", strconv.Itoa(concurrency), "--provider-timeout", "1s"}
	workers := newChaosWorkers(t, e, workerArgs)
	workers.tolerateRefusals = true
	for range chaosScheduleWorkers {
		workers.start()
	}

	out := e.mustRun("launch", "--name", "chaos-schedule", "--channel", "sms", "--audience", audience, "--code-pool", "demo",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--frequency-cap", "0", "--yes", "--json")
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int64 `json:"eligible"`
		Enqueued int   `json:"enqueued"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	id := strconv.FormatInt(rep.ID, 10)
	t.Logf("campaign %s: %d eligible, %d batches enqueued; workers %v", id, rep.Eligible, rep.Enqueued, workerArgs[1:])

	x := &chaosExecutor{t: t, e: e, id: rep.ID, rs: rs, workers: workers, sandbox: "http://" + sandboxAddr, datname: datname}
	x.run(steps)

	// Drain: nothing pending. A stall gets another plain resume; nothing is resent that the schedule did
	// not draw.
	hardStop := chaosDeadline(t, 4*time.Minute+time.Duration(n)*5*time.Millisecond)
	const stallAfter = 30 * time.Second
	var st chaosStatus
	lastPending, lastChange, resumes := int64(-1), time.Now(), x.resumes
	for {
		workers.reap()
		s, err := chaosStatusOf(e, id)
		if err == nil {
			st = s
			if st.Pending == 0 {
				break
			}
			if st.Pending != lastPending {
				lastPending, lastChange = st.Pending, time.Now()
			}
		}
		if time.Now().After(hardStop) {
			t.Errorf("still %d of %d pending at the deadline (%v after the start); last status: %+v (err %v)",
				st.Pending, st.Planned, time.Since(began).Round(time.Second), st, err)
			break
		}
		if time.Since(lastChange) >= stallAfter {
			t.Logf("no progress for %v (%d pending): resume again", stallAfter, st.Pending)
			chaosResume(t, e, id)
			resumes++
			lastChange = time.Now()
		}
		time.Sleep(time.Second)
	}
	t.Logf("drained %v after the launch", time.Since(x.began).Round(time.Second))
	// The last receipts land before the log is read.
	waitFor(t, 30*time.Second, func() bool {
		var rst sandbox.ReceiptStats
		return chaosGetJSON(x.sandbox+"/_sandbox/receipts/stats", &rst) == nil && rst.Pending == 0
	})
	workers.stop()
	if out, errs, code, err := chaosExec(e, 30*time.Second, "status", id, "--json"); err == nil {
		t.Logf("final status (exit %d): %s%s", code, strings.TrimSpace(out), strings.TrimSpace(errs))
	}
	var rst sandbox.ReceiptStats
	if err := chaosGetJSON(x.sandbox+"/_sandbox/receipts/stats", &rst); err == nil {
		t.Logf("receipts: %+v", rst)
	}

	msgs := chaosSandboxMessages(t, sandboxAddr)
	recips := chaosRecipientsOf(t, db, rep.ID)
	if len(workers.refusals) > 0 {
		t.Logf("%d replacement workers refused to start (Redis or Postgres out at that moment) and were started again: %v", len(workers.refusals), workers.refusals)
	}
	chaosCheck(t, chaosRun{n: n, msgs: msgs, recips: recips, freezes: x.freezes,
		history: chaosHistoryOf(t, db, rep.ID, chaosDuplicateUsers(msgs, recips)),
		resends: x.resends, steps: x.applied,
		kills: workers.kills, selfExits: len(workers.exits), resumes: resumes, began: began})
}

// chaosExecutor applies a schedule. Its methods run on the test's goroutine, except the campaignctl
// commands, which run on their own (a resume may wait for a frozen Redis while the schedule goes on).
type chaosExecutor struct {
	t       *testing.T
	e       *e2eEnv
	id      int64
	rs      *testredis.Server
	workers *chaosWorkers
	sandbox string
	datname string

	began    time.Time
	frozenAt time.Time
	freezes  []chaosWindow
	resends  []*chaosResend
	applied  []chaosApplied
	resumes  int
	cmds     sync.WaitGroup
	mu       sync.Mutex // guards the resends' end and out, written by their commands
}

func (x *chaosExecutor) run(steps []chaosStep) {
	t := x.t
	x.began = time.Now()
	for i, s := range steps {
		for {
			wait := time.Until(x.began.Add(s.At))
			if wait <= 0 {
				break
			}
			x.workers.reap()
			time.Sleep(min(wait, 100*time.Millisecond))
		}
		late := time.Since(x.began.Add(s.At))
		what := x.apply(s)
		accepted, _ := chaosAccepted(strings.TrimPrefix(x.sandbox, "http://"))
		x.applied = append(x.applied, chaosApplied{at: time.Now(), what: fmt.Sprintf("%d %s", i+1, what)})
		t.Logf("step %2d at +%.3fs (%v late): %s; %d accepted so far", i+1, s.At.Seconds(), late.Round(time.Millisecond), what, accepted)
	}
	if !x.frozenAt.IsZero() {
		t.Fatal("harness: the schedule ended with Redis frozen")
	}
	x.cmds.Wait()
}

// apply applies one step and says what it did.
func (x *chaosExecutor) apply(s chaosStep) string {
	t := x.t
	id := strconv.FormatInt(x.id, 10)
	switch s.Kind {
	case stepKill:
		return fmt.Sprintf("%s: %s", s, x.workers.kill(s.Slot))
	case stepFreeze:
		x.workers.holdReplacements()
		x.rs.Freeze()
		x.frozenAt = time.Now() // the first instant Redis is known frozen
		return s.String()
	case stepThaw:
		to := time.Now() // the last instant Redis is known frozen
		x.rs.Thaw()
		x.freezes = append(x.freezes, chaosWindow{from: x.frozenAt, to: to})
		x.frozenAt = time.Time{}
		x.workers.releaseReplacements()
		return s.String()
	case stepFlush:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := x.rs.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		return s.String()
	case stepPGTerminate:
		n, err := chaosTerminateBackends(x.datname)
		if err != nil {
			t.Errorf("harness: %v", err)
			return fmt.Sprintf("%s: %v", s, err)
		}
		return fmt.Sprintf("%s: %d terminated", s, n)
	case stepFaults, stepFaultsOff:
		if err := chaosPostJSON(x.sandbox+"/_sandbox/faults", s.Faults); err != nil {
			t.Fatalf("harness: set the sandbox's faults: %v", err)
		}
		return s.String()
	case stepReceipts, stepReceiptsBack:
		rs := s.Receipts
		if s.Kind == stepReceiptsBack {
			rs = sandbox.ReceiptSettings{DelayMS: chaosDefaultReceiptDelay.Milliseconds()}
		}
		if err := chaosPostJSON(x.sandbox+"/_sandbox/receipts", rs); err != nil {
			t.Fatalf("harness: set the sandbox's receipts: %v", err)
		}
		return s.String()
	case stepResume:
		x.resumes++
		x.command(s.String(), []string{"resume", id}, s.Owed > 0, nil)
		return s.String() + " (started)"
	case stepResend:
		x.resumes++
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		claims, err := chaosClaims(ctx, x.rs.Addr(), x.id)
		cancel()
		if err != nil {
			t.Errorf("harness: read the claims before the resend: %v", err)
		}
		rsd := &chaosResend{start: time.Now(), claims: claims}
		x.resends = append(x.resends, rsd)
		x.command(s.String(), []string{"resume", id, "--resend-unknown"}, false, rsd)
		return fmt.Sprintf("%s (started; %d claims read just before)", s, len(claims))
	}
	t.Fatalf("harness: unknown step %+v", s)
	return ""
}

// command runs a campaignctl lifecycle command on its own goroutine. One that must succeed (the resume
// owed to a flush) is tried again, up to five times, while it fails; a resume refused because the
// campaign is completed has nothing to do, which is a success.
func (x *chaosExecutor) command(label string, args []string, mustSucceed bool, rsd *chaosResend) {
	x.cmds.Add(1)
	go func() {
		defer x.cmds.Done()
		for attempt := 1; ; attempt++ {
			began := time.Now()
			out, errs, code, err := chaosExec(x.e, 90*time.Second, args...)
			ok := err == nil && (code == 0 || (code == 2 && strings.Contains(errs, "is completed")))
			failure := ""
			if !ok {
				failure = fmt.Sprintf(", err %v: %s", err, strings.TrimSpace(tail(errs, 400)))
			}
			x.t.Logf("%s: exit %d after %v (attempt %d)%s\n    %s", label, code, time.Since(began).Round(time.Millisecond), attempt,
				failure, strings.ReplaceAll(strings.TrimSpace(out), "\n", "\n    "))
			if rsd != nil {
				x.mu.Lock()
				rsd.end, rsd.out = time.Now(), out
				x.mu.Unlock()
			}
			if ok || !mustSucceed {
				return
			}
			if attempt == 5 {
				x.t.Errorf("harness: %s failed five times; the flush before it is never followed by a resume", label)
				return
			}
			time.Sleep(time.Second)
		}
	}()
}

// chaosTerminateBackends terminates every backend of the database datname, from a connection of its own
// to the admin database, and returns how many it terminated.
func chaosTerminateBackends(datname string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testdb.AdminURL())
	if err != nil {
		return 0, fmt.Errorf("connect to the admin database: %w", err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = $1 AND pid <> pg_backend_pid()`, datname).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("terminate the backends of %s: %w", datname, err)
	}
	return n, nil
}

// chaosClaims reads every claim of campaign id on the test's Redis: user → value without its nonce.
func chaosClaims(ctx context.Context, addr string, id int64) (map[string]string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second})
	defer rdb.Close()
	prefix := fmt.Sprintf("sent:%d:", id)
	var keys []string
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(keys))
	for start := 0; start < len(keys); start += 1000 {
		page := keys[start:min(start+1000, len(keys))]
		vals, err := rdb.MGet(ctx, page...).Result()
		if err != nil {
			return nil, err
		}
		for i, v := range vals {
			s, ok := v.(string)
			if !ok {
				continue
			}
			if _, after, found := strings.Cut(s, "/"); found {
				s = after
			}
			out[strings.TrimPrefix(page[i], prefix)] = s
		}
	}
	return out, nil
}

func chaosPostJSON(url string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body) //nolint:errcheck // for the message only
		return fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, strings.TrimSpace(buf.String()))
	}
	return nil
}

func chaosGetJSON(url string, v any) error {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
