package worker

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// growingRun plans n customers in one batch and gives a handler whose chunks adapt (ChunkSize left at 0),
// in windows of 8, with a short lease. most reports the largest chunk leased so far, carried recipients
// included: what a kill together with a loss of Redis's data would leave unknown.
func growingRun(t *testing.T, n int) (f *fixture, h *Handler, most func() int) {
	t.Helper()
	f = planWith(t, n, func(s *campaign.Spec) { s.BatchSize = n })
	h, _, fs := f.faulty(t, func(c *Config) { c.SendWindow, c.LeaseTTL = 8, 300*time.Millisecond })
	var largest atomic.Int64
	h.cfg.Store = &leaseHookStore{Store: fs, before: func(_ int, users []string) {
		n := int64(len(users))
		for cur := largest.Load(); n > cur && !largest.CompareAndSwap(cur, n); cur = largest.Load() {
		}
	}}
	return f, h, func() int { return int(largest.Load()) }
}

// refuseEveryFifthOnce makes the provider refuse a fifth of the recipients once, at once, with a
// transient 503 (while refusing is true): they wait out a back-off and are carried to the next chunk.
func (f *fixture) refuseEveryFifthOnce(refusing func() bool) {
	f.refuseFirstTries(func(nth int) bool { return refusing() && nth%5 == 0 }, 0)
}

// refuseFirstTries makes the provider refuse, with a transient 503 asking for retryAfter, the first try of
// the nth address it is sent to when refuse(n) says so; it returns how many times each address was tried.
func (f *fixture) refuseFirstTries(refuse func(nth int) bool, retryAfter time.Duration) (tries func() map[string]int) {
	var mu sync.Mutex
	tried := map[string]int{}
	f.provider.fail = func(_ int, m providers.Message) error {
		mu.Lock()
		defer mu.Unlock()
		tried[m.To]++
		if tried[m.To] == 1 && refuse(len(tried)) {
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, RetryAfter: retryAfter}
		}
		return nil
	}
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(tried)
	}
}

// A run whose provider answers at once grows its chunks to MaxChunk, and a fifth of its recipients are
// refused once and carried from chunk to chunk: the chunk in hand, carried ones included, stays within
// MaxChunk. (It reached 330 when the carried ones came on top of a full chunk.)
func TestCarriedRecipientsCountInTheChunkInHand(t *testing.T) {
	t.Parallel()
	f, h, most := growingRun(t, 2000)
	f.refuseEveryFifthOnce(func() bool { return true })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.RunBatch(ctx, f.id, 0); err != nil {
		t.Logf("run: %v", err)
	}
	f.assertOnce(t)
	c := f.counts(t)
	t.Logf("counts %+v; largest chunk in hand %d", c, most())
	if most() > MaxChunk {
		t.Errorf("chunk in hand reached %d, more than MaxChunk (%d): a kill plus a loss of Redis's data would leave that many unknown", most(), MaxChunk)
	}
	if most() < MaxChunk*9/10 {
		t.Errorf("chunk in hand never above %d: the run did not grow its chunks, so this test proves nothing", most())
	}
	if c.Sent != c.Planned || c.Pending != 0 {
		t.Errorf("counts %+v, want all %d sent once", c, c.Planned)
	}
}

// The same refusals, and the worker is killed once its chunk in hand has grown (the recipients carried
// from its first chunk in it); Redis loses its data before the chunk is swept, and another worker takes the
// batch over. At most MaxChunk become unknown (the bound docs/operations.md gives a run), nobody is sent
// twice and nobody is left pending.
func TestAKillAndARedisLossWithRecipientsCarriedLeaveAtMostAChunk(t *testing.T) {
	t.Parallel()
	f, h, most := growingRun(t, 2000)
	second, _, _ := f.faulty(t, func(c *Config) {
		c.SendWindow, c.LeaseTTL, c.Owner, c.ChunkSize = 8, 300*time.Millisecond, "second", MinChunk
	})
	var killed, secondDone atomic.Bool
	f.refuseEveryFifthOnce(func() bool { return !killed.Load() })
	dead := make(chan struct{})
	finished := make(chan struct{})
	var inHand int
	f.provider.before = func(providers.Message) {
		if killed.Load() {
			if !secondDone.Load() {
				return // the second worker's sends
			}
			<-dead
			return
		}
		n := most()
		if n < MaxChunk*9/10 || !killed.CompareAndSwap(false, true) {
			return
		}
		// The first worker dies here, in a send: nothing of it runs again. Redis loses its data, the lease
		// runs out, and the second worker runs the batch.
		inHand = n
		if err := f.rdb.FlushDB(context.Background()).Err(); err != nil {
			t.Error(err)
		}
		f.leaseExpired(t)
		t.Logf("second run: %v", second.RunBatch(context.Background(), f.id, 0))
		secondDone.Store(true)
		close(finished)
		<-dead
	}
	ctx, cancel := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() { firstDone <- h.RunBatch(ctx, f.id, 0) }()
	select {
	case err := <-firstDone:
		t.Fatalf("first run ended (%v) before its chunk in hand grew to %d", err, MaxChunk*9/10)
	case <-time.After(60 * time.Second):
		t.Fatal("no kill within 60 s")
	case <-finished:
	}
	cancel()
	close(dead)
	<-firstDone
	for i := 0; i < 5 && f.counts(t).Pending > 0; i++ {
		time.Sleep(400 * time.Millisecond)
		t.Logf("again: %v", second.RunBatch(context.Background(), f.id, 0))
	}
	f.assertOnce(t)
	c := f.counts(t)
	t.Logf("chunk in hand at the kill %d; counts %+v", inHand, c)
	if c.Unknown > MaxChunk {
		t.Errorf("%d unknown after a kill and a loss of Redis's data (chunk in hand %d), more than the bound of %d a run", c.Unknown, inHand, MaxChunk)
	}
	if c.Unknown == 0 {
		t.Errorf("nobody unknown: the kill and the loss did not happen with a chunk in hand")
	}
	if c.Pending != 0 {
		t.Errorf("%d left pending", c.Pending)
	}
}

// Recipients carried from a chunk can fill the next one by themselves (the chunk's size is no more than
// they are): that chunk has none of its own, so it waits out their back-offs in place and then sends them,
// rather than carry them on again at once, which would lease and write a chunk a turn, with nothing sent,
// until their back-offs end. (Mutation: `more` without its len(chunk) > 0 makes this run lease hundreds
// of chunks of nobody new.)
func TestACarriedOnlyChunkWaitsInPlace(t *testing.T) {
	t.Parallel()
	const customers, size = 12, 2
	f := planWith(t, customers, func(s *campaign.Spec) { s.BatchSize = customers })
	n := int(f.counts(t).Planned) // about half the customers are eligible
	if n < 2*size+1 {
		t.Fatalf("%d planned: too few to carry a chunk's worth past the first chunk", n)
	}
	h, _, fs := f.faulty(t, func(c *Config) { c.SendWindow, c.ChunkSize = 8, size })
	hook := &leaseHookStore{Store: fs}
	h.cfg.Store = hook
	// The first chunk's two are refused once, for a moment: carried to the next chunk, which they fill.
	tries := f.refuseFirstTries(func(nth int) bool { return nth <= size }, 400*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatalf("run: %v", err)
	}
	f.assertOnce(t)
	if c := f.counts(t); c.Sent != int64(n) {
		t.Fatalf("counts %+v, want all %d sent", c, n)
	}
	refused := 0
	for _, k := range tries() {
		if k > 1 {
			refused++
		}
	}
	if refused != size {
		t.Fatalf("%d recipients tried again, want the %d refused: the test did not carry anybody", refused, size)
	}
	hook.mu.Lock()
	leases := hook.n
	hook.mu.Unlock()
	// The chunks of the planned ones, and the one the carried ones fill: one or two more with the order the
	// waits take; hundreds when the carried ones go round without a wait.
	if leases > (n+size-1)/size+3 {
		t.Errorf("%d chunks leased for %d recipients in chunks of %d: the carried ones were carried on without waiting", leases, n, size)
	}
	t.Logf("%d chunks leased", leases)
}
