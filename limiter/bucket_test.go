package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// Three processes' worth of clients share one cap: the total stays within the cap (plus the burst), and
// the cap is actually used.
func TestWaitSharedAcrossClients(t *testing.T) {
	t.Parallel()
	_, url := testredis.New(t)
	const rate = 200.0
	const run = 2 * time.Second

	var sent atomic.Int64
	var mu sync.Mutex
	perWindow := map[int64]int{}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()

	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		b := New(newClient(t, url))
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if err := b.Wait(ctx, Limit{Key: "provider:test", Rate: rate}); err != nil {
						return
					}
					sent.Add(1)
					mu.Lock()
					perWindow[int64(time.Since(start)/(250*time.Millisecond))]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()

	total := float64(sent.Load())
	max := rate*run.Seconds() + gcraBurst(rate)
	if total > max {
		t.Fatalf("sent %v in %v, cap allows at most %v", total, run, max)
	}
	// The cap must be used, not only respected. On a quiet machine this run sends about 98 % of it; the bar
	// is lower so that a machine busy with other tests (the race detector, parallel packages) does not
	// fail it. scripts/bench.sh measures the steady rate properly.
	if total < 0.6*rate*run.Seconds() {
		t.Fatalf("sent %v in %v, want at least 60%% of the cap (%v)", total, run, rate*run.Seconds())
	}
	for w, n := range perWindow {
		// a quarter-second window may hold its share plus the burst
		if float64(n) > rate/4+gcraBurst(rate)+1 {
			t.Errorf("window %d: %d events, cap %v per quarter second", w, n, rate/4)
		}
	}
}

func gcraBurst(rate float64) float64 { return float64(gcra(rate).Burst) }

func TestFractionalRate(t *testing.T) {
	l := gcra(0.5)
	if got := l.Period / time.Duration(l.Rate); got != 2*time.Second {
		t.Fatalf("0.5/s: emission interval %v, want 2s", got)
	}
	if l.Burst != 1 {
		t.Fatalf("burst %d, want 1", l.Burst)
	}
}

func TestPauseIsSharedAndNeverShortened(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	a, b := New(rdb), New(rdb)
	if err := a.Pause(ctx, "provider:x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Pause(ctx, "provider:x", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d, err := b.Paused(ctx, "provider:x")
	if err != nil {
		t.Fatal(err)
	}
	if d < time.Second {
		t.Fatalf("pause shortened to %v", d)
	}
	var slept time.Duration
	b.sleep = func(ctx context.Context, d time.Duration) error {
		slept += d
		rdb.Del(ctx, pauseKey("provider:x"))
		return nil
	}
	if err := b.Wait(ctx, Limit{Key: "provider:x", Rate: 0, Pausable: true}); err != nil {
		t.Fatal(err)
	}
	if slept < time.Second {
		t.Fatalf("Wait slept %v during a 2s pause", slept)
	}
}

func TestRedisDownFailsClosed(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	err := New(rdb).Wait(context.Background(), Limit{Key: "provider:x", Rate: 10})
	if err == nil {
		t.Fatal("Wait with Redis unreachable returned nil: a send would have gone out unmetered")
	}
}

// A lone 5xx pauses nobody; a burst of them within a second pauses every process.
func TestBurstOfErrorsPausesEveryone(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	a, b := New(rdb), New(rdb)
	for i := 1; i <= 4; i++ {
		paused, err := a.Strike(ctx, "provider:x", 5, 2*time.Second)
		if err != nil || paused {
			t.Fatalf("strike %d: paused %v, err %v; want no pause below the threshold", i, paused, err)
		}
	}
	if d, err := b.Paused(ctx, "provider:x"); err != nil || d != 0 {
		t.Fatalf("paused %v after 4 errors, err %v", d, err)
	}
	before := time.Now().Truncate(time.Millisecond)
	if paused, err := b.Strike(ctx, "provider:x", 5, 2*time.Second); err != nil || !paused {
		t.Fatalf("fifth strike (another process): paused %v, err %v", paused, err)
	}
	if d, err := a.Paused(ctx, "provider:x"); err != nil || d < time.Second {
		t.Fatalf("paused %v, err %v; want about 2 s for everyone", d, err)
	}
	// The pause says when it began (status's since), and a sixth strike extending it keeps that.
	began, err := rdb.Get(ctx, PauseKey("provider:x")).Int64()
	if err != nil || began < before.UnixMilli() || began > time.Now().UnixMilli() {
		t.Fatalf("pause began at %d (%v), want between %d and now", began, err, before.UnixMilli())
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := a.Strike(ctx, "provider:x", 5, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if again, err := rdb.Get(ctx, PauseKey("provider:x")).Int64(); err != nil || again != began {
		t.Fatalf("the extended pause began at %d (%v), want %d still", again, err, began)
	}
}

// A request of many messages takes as many tokens, in pieces no larger than the burst, and keeps the rate.
func TestWaitNKeepsTheRate(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	b := New(rdb)
	ctx := context.Background()
	l := Limit{Key: "provider:n", Rate: 200} // burst 5
	start := time.Now()
	for i := 0; i < 3; i++ {
		if err := b.WaitN(ctx, 50, l); err != nil {
			t.Fatal(err)
		}
	}
	// 150 tokens at 200/s with a burst of 5: at least (150-5)/200 s.
	if d := time.Since(start); d < 650*time.Millisecond || d > 2*time.Second {
		t.Fatalf("150 tokens at 200/s took %v", d)
	}
}

// countCalls counts the commands a client sends (a script call counts once).
type countCalls struct{ n atomic.Int64 }

func (c *countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// Many goroutines of one process behind one cap take turns asking Redis: the asks stay close to the
// tokens taken instead of every waiter polling the bucket.
func TestWaitersOfOneProcessTakeTurns(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	calls := &countCalls{}
	rdb.AddHook(calls)
	b := New(rdb)
	const waiters, each = 40, 5
	l := Limit{Key: "turns", Rate: 200}
	start := time.Now()
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := b.Wait(context.Background(), l); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	tokens := waiters * each
	if took := time.Since(start); took < 800*time.Millisecond {
		t.Fatalf("%d tokens at 200/s took %v: the cap was not kept", tokens, took)
	}
	// One ask per token, plus about one refused ask per wait (every 5 ms at 200/s with a burst of 5).
	if n := calls.n.Load(); n > int64(2*tokens) {
		t.Fatalf("%d Redis calls for %d tokens: waiters poll the bucket instead of taking turns", n, tokens)
	}
}

// A key's turn lives only while someone waits on it: a worker that serves campaign after campaign does not
// keep one per campaign it ever capped, and waiters of one key still take turns while it lives.
func TestTurnsGoWithTheirLastWaiter(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	b := New(rdb)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := Limit{Key: "campaign:" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Rate: 1000}
			for range 3 {
				if err := b.Wait(context.Background(), l); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := b.keys(); n != 0 {
		t.Fatalf("%d limit keys still held after every wait returned, want 0", n)
	}
	// A wait that gives up (its context ends while another holds the turn) leaves nothing behind either.
	l := Limit{Key: "slow", Rate: 0.5}
	if err := b.Wait(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx, l); err == nil {
		t.Fatal("a second token at 0.5/s came at once")
	}
	if n := b.keys(); n != 0 {
		t.Fatalf("%d limit keys held after a wait gave up, want 0", n)
	}
}

// Requests larger than the burst from several processes go out one after the other, a request's worth of
// time apart: none of them collects its tokens in pieces alongside the others and fires together with
// them, which kept the mean rate but put several requests into one second.
func TestLargeRequestsOfSeveralProcessesGoOutOneAfterTheOther(t *testing.T) {
	t.Parallel()
	_, url := testredis.New(t)
	const rate, n, procs = 400.0, 200, 3 // a request is worth 500 ms, the burst (10 tokens) 25 ms
	l := Limit{Key: "provider:large", Rate: rate}
	var mu sync.Mutex
	var out []time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for range procs {
		b := New(newClient(t, url)) // a process of its own: its own client and turns
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.WaitN(context.Background(), n, l); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			out = append(out, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(out) != procs {
		t.Fatalf("%d of %d requests got their tokens", len(out), procs)
	}
	slices.Sort(out)
	for i := 1; i < len(out); i++ {
		// 500 ms less the burst's 25 ms, with room for scheduling
		if gap := out[i] - out[i-1]; gap < 350*time.Millisecond {
			t.Fatalf("requests of %d tokens at %v/s went out at %v: two within %v of each other", n, rate, out, gap)
		}
	}
	if last := out[len(out)-1]; last < 1300*time.Millisecond {
		t.Fatalf("%d requests of %d tokens at %v/s all went out by %v", procs, n, rate, last)
	}
}

// A limit's Hold spends its waits: the wait for a large request's tokens goes through it, and so does
// the wait of another goroutine of the process for its turn at a bucket another waits for (every
// HoldEvery, with 0); an error of Hold ends the wait with that error.
func TestHoldSpendsTheWaits(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	b := New(rdb)
	var mu sync.Mutex
	var first, second []time.Duration
	hold := func(calls *[]time.Duration) func(context.Context, time.Duration) error {
		return func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			*calls = append(*calls, d)
			mu.Unlock()
			return Sleep(ctx, d)
		}
	}
	l := Limit{Key: "provider:held", Rate: 20} // burst 1: 30 tokens are worth 1.5 s
	l1 := l
	l1.Hold = hold(&first)
	if err := b.WaitN(context.Background(), 30, l1); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	var held time.Duration
	for _, d := range first {
		held += d
	}
	mu.Unlock()
	if held < time.Second {
		t.Fatalf("the large request's Hold was given %v (%v); want its wait of about 1.45 s", held, first)
	}

	// Two goroutines behind a slow campaign's bucket (one token every 2 s) and a provider's: the first
	// waits for the campaign's bucket in its turn, the second for that turn.
	slow, prov := Limit{Key: "campaign:held", Rate: 0.5}, Limit{Key: "provider:held-shared", Rate: 1000}
	if err := b.WaitN(context.Background(), 1, slow, prov); err != nil { // the campaign's bucket is empty now
		t.Fatal(err)
	}
	s1, s2 := slow, slow
	s1.Hold, s2.Hold = hold(&first), hold(&second)
	first = nil
	done := make(chan error, 1)
	go func() { done <- b.WaitN(context.Background(), 1, s1, prov) }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(first) > 0 })
	if err := b.WaitN(context.Background(), 1, s2, prov); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(second, 0) {
		t.Fatalf("the goroutine waiting for its turn for over a second was never held (%v)", second)
	}

	// An error of Hold ends the wait.
	stop := errors.New("lease lost")
	l3 := l
	l3.Hold = func(context.Context, time.Duration) error { return stop }
	if err := b.WaitN(context.Background(), 30, l3); !errors.Is(err, stop) {
		t.Fatalf("WaitN with a Hold that fails: %v, want %v", err, stop)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5 s")
}

// newClient is a client of its own on the Redis at url, closed at the end of the test.
func newClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Two campaigns on one worker share a provider's cap of 30/s (a burst of 1): a slow one at --rate 1 and
// an uncapped one whose windows of 8 take 8 of the provider's tokens each (reserved: more than its
// burst). Each goes at its own pace: the slow one at 1/s, the other at the rest of the provider's cap.
// Before, the slow one's run held the provider's turn through its wait (the other went at 1 message a
// second), or, with messages of 2 segments, reserved the provider's bucket for its campaign's moment (the
// same); and, once turns were held only around the script, the slow one asked for tokens that the
// other's reservations always took first, and sent nothing until the other was done.
func TestASlowCampaignAndAFastOneShareTheProvidersCap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ window, segments int }{{1, 1}, {1, 2}, {8, 1}, {8, 2}} {
		t.Run(fmt.Sprintf("windows of %d, %d segments", tc.window, tc.segments), func(t *testing.T) {
			t.Parallel()
			rdb, _ := testredis.New(t)
			b := New(rdb)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			prov := Limit{Key: "provider:shared", Rate: 30, Pausable: true}
			slow := Limit{Key: "campaign:slow", Rate: 1}
			slowProv := prov
			slowProv.Cost = tc.segments
			var fastTokens, slowSends atomic.Int64
			var wg sync.WaitGroup
			takeUntilDone(&wg, 4, &fastTokens, int64(tc.window), func() error { return b.WaitN(ctx, tc.window, prov) })
			takeUntilDone(&wg, 1, &slowSends, 1, func() error { return b.WaitN(ctx, 1, slow, slowProv) })
			wg.Wait()
			// 3 s at 30 tokens a second, the burst and the windows in flight at the end besides; the slow
			// campaign's 3 sends take 3 or 6 of them.
			used := fastTokens.Load() + slowSends.Load()*int64(tc.segments)
			if s := slowSends.Load(); s < 2 || s > 4 {
				t.Errorf("the campaign at 1/s sent %d in 3 s; want 2 to 4", s)
			}
			// About 84 on a quiet machine; 54 was seen under the whole suite with the race detector. The
			// faults this guards against left it 3 to 10.
			if f := fastTokens.Load(); f < 45 {
				t.Errorf("the uncapped campaign took %d of the provider's tokens in 3 s at 30/s beside one at 1/s; want 45 or more", f)
			}
			if used > int64(30*3+1+4*tc.window) {
				t.Errorf("%d tokens taken in 3 s from a cap of 30/s", used)
			}
		})
	}
}

// A run behind a campaign's low cap waits in its turn at the campaign's bucket only: the other runs of the
// process that share the provider's bucket go at the provider's pace meanwhile. Before, it held the
// provider's turn through its wait, and every campaign of the worker went at the slowest one's rate (an
// outside run: a campaign at --rate 1 held another, uncapped, to 1 message a second).
func TestASlowCampaignDoesNotHoldOthersOfTheProcessToItsRate(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	b := New(rdb)
	ctx := context.Background()
	slow, prov := Limit{Key: "campaign:slow", Rate: 1}, Limit{Key: "provider:shared", Rate: 1000}
	if err := b.WaitN(ctx, 1, slow, prov); err != nil { // the slow campaign's bucket is empty now
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.WaitN(ctx, 1, slow, prov) }() // waits about a second
	time.Sleep(50 * time.Millisecond)
	other := Limit{Key: "campaign:other", Rate: 2000}
	start := time.Now()
	for range 100 { // 100 tokens at 1,000/s with a burst of 25: about 77 ms
		if err := b.WaitN(ctx, 1, other, prov); err != nil {
			t.Fatal(err)
		}
	}
	// A token a Redis round trip under the whole suite with the race detector (707 ms seen); held to the
	// slow campaign's 1/s, the 100 would take 100 s.
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("100 sends of another campaign at the provider's 1,000/s took %v behind a campaign at 1/s", took)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Four batch runs of one campaign at --rate 50 on one worker, under a provider's cap of 200 segments a
// second, messages of 1 or 2 segments: the campaign goes at its rate. An outside run found campaigns at
// 35-65 % of their --rate after a change that made a run wait in the fullest bucket's turn and then queue
// again for every turn (here: 74 in 3 s).
func TestACampaignsRunsOnOneWorkerKeepItsRate(t *testing.T) {
	t.Parallel()
	for _, segments := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d segments", segments), func(t *testing.T) {
			t.Parallel()
			rdb, _ := testredis.New(t)
			b := New(rdb)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			prov := Limit{Key: "provider:twilio", Rate: 200, Pausable: true, Cost: segments}
			camp := Limit{Key: "campaign:1", Rate: 50}
			var n atomic.Int64
			var wg sync.WaitGroup
			takeUntilDone(&wg, 4, &n, 1, func() error { return b.WaitN(ctx, 1, camp, prov) })
			wg.Wait()
			// The bucket emits 49 a second after its burst of 2 (no second above the cap): 149 in 3 s. Under
			// the whole suite with the race detector a run wakes late now and then (121 seen); the fault
			// this guards against made 74.
			if got := n.Load(); got < 110 || got > 50*3 {
				t.Fatalf("%d sends in 3 s at --rate 50; want about 149, never above 150", got)
			}
		})
	}
}

// takeUntilDone starts runs goroutines (counted in wg) that each call take until it fails (its context
// ends), adding per to count for each call that succeeded.
func takeUntilDone(wg *sync.WaitGroup, runs int, count *atomic.Int64, per int64, take func() error) {
	for range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for take() == nil {
				count.Add(per)
			}
		}()
	}
}

// No second holds more than the cap: a bucket hands out its burst at once and then one token every 1/r,
// so it must emit the cap less the burst (less one). Before, a cap of 1,000 let 1,049 out in a second
// (outside runs counted 1,008–1,056 at the provider, 2,136 in a second at a cap of 2,000), and a
// provider counting over its own second refuses what goes over, or blocks the sender.
func TestNoSecondHoldsMoreThanTheCap(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{1, 1.5, 10, 39, 40, 100, 500, 1000, 1999, 2000, 15000} {
		l := gcra(rate)
		perSecond := float64(l.Rate) / l.Period.Seconds()
		if most := float64(l.Burst) + perSecond - 1; most > rate+1e-9 {
			t.Errorf("cap %v: burst %d and %v a second hand out up to %v in a second", rate, l.Burst, perSecond, most)
		}
		if rate >= 40 && perSecond < 0.97*rate {
			t.Errorf("cap %v: %v a second uses less than 97 %% of it", rate, perSecond)
		}
	}
}
