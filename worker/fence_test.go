package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// countingProvider counts the messages one worker sends through a provider others share.
type countingProvider struct {
	providers.Provider
	n atomic.Int32
}

func (p *countingProvider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	p.n.Add(1)
	return p.Provider.Send(ctx, m)
}

// A run stops for longer than its lease just before its claim reaches Redis (its process paused, its
// connection stalled). Meanwhile its lease runs out and the sweep takes its chunk over: the recipient
// being claimed has no claim yet, so the sweep frees it. When the run goes on, its claim must be refused.
// Were it taken, the message would go out while Postgres has the recipient pending and free again; had the
// run then died before recording it, and Redis lost its data, the follow-up run would send it a second
// time. Both send paths: one claim a send, and one claim call a window of sends. And the same when a run
// of the batch, not the sweep, takes the chunk over, and is slow to claim: were the paused run's claim
// taken first, the run that took over would find it in flight, leave that recipient to it, and a Redis
// loss after the paused run died would have it sent again.
func TestAClaimThatReachesRedisAfterTheChunkWasTakenOverIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		method string
		window int
		byRun  bool
	}{
		{"swept, one send a claim", "ClaimSend", 1, false},
		{"swept, a window of sends", "ClaimWindow", 2, false},
		{"taken by a run, one send a claim", "ClaimSend", 1, true},
		{"taken by a run, a window of sends", "ClaimWindow", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			w1Sends := &countingProvider{Provider: f.provider}
			w1, w1State, w1Store := f.faulty(t, func(c *Config) {
				c.Owner, c.SendWindow, c.ChunkSize, c.LeaseTTL = "w1", tc.window, 10, 300*time.Millisecond
				c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: w1Sends}
			})
			stall := w1State.Add(&faults.Rule{Match: faults.Method(tc.method), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 2 * time.Second})
			done := make(chan error, 1)
			go func() { done <- w1.RunBatch(ctx, f.id, 0) }()
			waitUntil(t, 5*time.Second, "W1's second claim held", func() bool { return stall.Hits() > 0 })
			f.leaseExpired(t)
			w2done := make(chan error, 1)
			if tc.byRun {
				// W2 takes the batch over, and its first claim is held until after W1's.
				w2, w2State, _ := f.faulty(t, func(c *Config) { c.Owner, c.SendWindow, c.ChunkSize = "w2", tc.window, 10 })
				held := w2State.Add(&faults.Rule{Match: faults.Method(tc.method), Times: 1, Kind: faults.Stall, Delay: 3 * time.Second})
				go func() { w2done <- w2.RunBatch(ctx, f.id, 0) }()
				waitUntil(t, 5*time.Second, "W2's first claim held", func() bool { return held.Hits() > 0 })
			} else {
				if n, err := f.h.Sweep(ctx); err != nil || n == 0 {
					t.Fatalf("the sweep did not take W1's chunk (settled %d, %v)", n, err)
				}
				w2done <- nil
			}
			// From here on W1 writes nothing to Postgres: it dies after whatever it sends next.
			w1Store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
			err := <-done
			var re *RetryError
			if !errors.As(err, &re) {
				t.Fatalf("W1's run: %v, want it handed back (its chunk taken over)", err)
			}
			if n, want := int(w1Sends.n.Load()), tc.window; n != want {
				t.Errorf("W1 sent %d messages, want the %d claimed before it stopped", n, want)
			}
			notFailure(t, <-w2done)
			// Redis loses its data; the batch runs again.
			if err := f.rdb.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			f.runAll(t)
			f.assertOnce(t)
			if c := f.counts(t); c.Pending != 0 || c.Sent+c.Unknown != 5 {
				t.Fatalf("counts %+v, want all 5 settled", c)
			}
		})
	}
}

// A run is held in a provider call past its lease (a provider slow to answer), and another run takes its
// chunk over: the recipient being sent has a claim in flight, so the run that took over leaves it to the
// claim's owner, but keeps it in its own chunk in hand until the claim is read again. The held run's send
// is then accepted and it dies before recording it, and Redis loses its data: the recipient must not be
// sent again. Let go from the chunk in hand, it would be pending and free after the loss.
func TestAClaimInFlightFoundByTheRunThatTookOverStaysInHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	w1, _, w1Store := f.faulty(t, func(c *Config) { c.Owner, c.ChunkSize, c.LeaseTTL = "w1", 10, 300*time.Millisecond })
	// W2 counts a claim in flight as live for 5 s (in production the grace and the lease are both 3 ×
	// the provider timeout): under load, the time from u2's claim to W2's reading it may pass the 300 ms
	// lease.
	w2, _, _ := f.faulty(t, func(c *Config) {
		c.Owner, c.ChunkSize, c.LeaseTTL, c.InFlightGrace = "w2", 10, 300*time.Millisecond, 5*time.Second
	})
	release, done := f.heldAtU2(w1, func(m providers.Message) {
		if m.To == phone(1) {
			// u2 is claimed late in the lease (a renewal is due only after a third of it): when the lease
			// runs out, u2's claim is younger than a lease, and may still be answered.
			time.Sleep(80 * time.Millisecond)
		}
	})
	f.leaseExpired(t)
	// W2 takes the batch over while W1 is still in its call for u2.
	if err := w2.RunBatch(ctx, f.id, 0); err == nil {
		t.Fatal("W2's run ended done, want it to wait for u2's claim in flight")
	}
	w1Store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
	release() // the provider accepts u2 for W1, which dies before recording it
	<-done
	if err := f.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.leaseExpired(t)
	f.runAll(t)
	f.assertOnce(t)
	if st, _, _ := f.status(t, "u2"); st != campaign.StatusUnknown {
		t.Fatalf("u2 is %s, want unknown (its claim was lost with Redis, and its message may have gone out)", st)
	}
	if c := f.counts(t); c.Pending != 0 {
		t.Fatalf("counts %+v, want everyone settled", c)
	}
}

// heldLease holds the at-th LeaseChunk call of a run until release is closed.
type heldLease struct {
	Store
	at      int32
	n       atomic.Int32
	reached chan struct{}
	release chan struct{}
}

func (s *heldLease) LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (campaign.Chunk, error) {
	if s.n.Add(1) == s.at {
		close(s.reached)
		<-s.release
	}
	return s.Store.LeaseChunk(ctx, c, users, l)
}

// W1 waits so long for its provider that its chunk's consents are read again before its next send, and
// that read (which renews the lease in the same statement) is held until W1's lease has run out. W2 takes
// the batch over, sends the rest and dies before recording it; W2's lease runs out too. W1's read then
// takes the batch back, with W2's chunk in hand, whose claims say W2 sent them. W1 must keep that chunk in
// hand (and stop: its own lease was fenced when W2 took it), not let it go as if nobody had been sent:
// after a Redis loss, the next run would send W2's recipients again.
func TestARecheckThatTakesTheBatchBackKeepsTheOtherRunsChunkInHand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window int
		paused bool // W2 is paused before its second claim instead of finishing
	}{{"one send a claim", 1, false}, {"a window of sends", 2, false}, {"W2 paused before a claim", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			w1, _, w1Store := f.faulty(t, func(c *Config) {
				c.Owner, c.SendWindow, c.ChunkSize, c.LeaseTTL = "w1", tc.window, 10, 1500*time.Millisecond
			})
			// W1's second LeaseChunk is the read of the consents again.
			held := &heldLease{Store: w1Store, at: 2, reached: make(chan struct{}), release: make(chan struct{})}
			w1.cfg.Store = held
			var once sync.Once
			f.provider.before = func(m providers.Message) {
				if m.To == phone(1) {
					once.Do(func() { time.Sleep(consentMaxAge + 100*time.Millisecond) })
				}
			}
			done := make(chan error, 1)
			go func() { done <- w1.RunBatch(ctx, f.id, 0) }()
			select {
			case <-held.reached:
			case <-time.After(10 * time.Second):
				t.Fatal("W1 never read its chunk's consents again")
			}
			f.leaseExpired(t)
			w2, w2State, w2Store := f.faulty(t, func(c *Config) { c.Owner, c.ChunkSize, c.LeaseTTL = "w2", 10, 300*time.Millisecond })
			w2Store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
			w2done := make(chan struct{})
			if tc.paused {
				pause := w2State.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 3 * time.Second})
				go func() { defer close(w2done); _ = w2.RunBatch(ctx, f.id, 0) }()
				waitUntil(t, 5*time.Second, "W2 paused before its second claim", func() bool { return pause.Hits() > 0 })
			} else {
				_ = w2.RunBatch(ctx, f.id, 0) // sends the rest, records nothing
				close(w2done)
			}
			f.leaseExpired(t)
			close(held.release)
			var re *RetryError
			if err := <-done; !errors.As(err, &re) {
				t.Fatalf("W1's run: %v, want it handed back (its lease lost)", err)
			}
			f.provider.before = nil
			var inHand []string
			if err := f.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&inHand); err != nil {
				t.Fatal(err)
			}
			if len(inHand) == 0 {
				t.Error("W1 let the batch go with nothing in hand: W2's unrecorded sends are free again")
			}
			if tc.paused {
				// The sweep settles the chunk W1 kept while W2 is still paused: W1 fenced W2 when it took
				// the batch back, so nobody W2 claims from now on is sent.
				f.leaseExpired(t)
				if _, err := f.h.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			}
			<-w2done // W2, if paused, goes on, sends what it may and dies
			f.afterRedisLossSentOnce(t)
		})
	}
}

// A run is paused before a claim past its lease, and the first to take its chunk over fails to fence it in
// Redis (Redis errs, or the taker dies at that moment). The lease must not change hands unfenced: were it
// taken, the next takeover would fence only the taker's token, and the paused run, going on, would claim
// and send a recipient the next sweep had freed, to be sent again after a Redis loss.
func TestALeaseIsTakenOnlyOnceItsRunIsFenced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method string
		byRun        bool
	}{
		{"a run's fence fails", "Fence", true},
		{"a sweep's fence fails", "Fence", false},
		{"a sweep's read of the claims fails", "ReadClaims", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			w1, w1Sends, w1State, w1Store := f.countedW1(t, 10)
			pause := w1State.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 4 * time.Second})
			done := make(chan error, 1)
			go func() { done <- w1.RunBatch(ctx, f.id, 0) }()
			waitUntil(t, 5*time.Second, "W1 paused before its second claim", func() bool { return pause.Hits() > 0 })
			f.leaseExpired(t)
			taker, takerState, _ := f.faulty(t, func(c *Config) { c.Owner, c.ChunkSize, c.LeaseTTL = "w2", 10, 300*time.Millisecond })
			failed := takerState.Add(&faults.Rule{Match: faults.Method(tc.method), Kind: faults.Fail})
			if tc.byRun {
				_ = taker.RunBatch(ctx, f.id, 0)
			} else {
				_, _ = taker.Sweep(ctx)
			}
			if failed.Hits() == 0 {
				t.Fatalf("the taker never called %s", tc.method)
			}
			f.leaseExpired(t)
			if _, err := f.h.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			w1Store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
			<-done // W1 goes on, sends what it may and dies
			if n := w1Sends.n.Load(); n != 1 {
				t.Errorf("W1 sent %d messages, want only the one before its pause", n)
			}
			f.afterRedisLossSentOnce(t)
		})
	}
}

// The sweep lists a run's expired lease with its chunk in hand, and is slow to take it. Meanwhile the run
// goes on: it renews its lease, records that chunk and leases its next one, sends from it, and stalls
// before its next claim until the lease runs out again. The sweep then fences the run and takes the lease
// with the chunk in hand now: it must settle that chunk, not the one it listed, and not let the rest go
// unread; the run dies unrecorded, and after a Redis loss its sends of the new chunk would go out again.
func TestTheSweepSettlesTheChunkInHandWhenItTakesTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10) // batch 0 in user_id order: u1 u10 u2 | u3 u4 u5 | u6 u7 u8 | u9 (eligible u1 u2 u4 u7 u8)
	w1, w1Sends, w1State, w1Store := f.countedW1(t, 3)
	// W1's claim of u8 (its fifth, after u7 was sent) is held 3 s, and its claim of u1 (its first) 1 s.
	w1State.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Skip: 4, Times: 1, Kind: faults.Stall, Delay: 3 * time.Second})
	first := w1State.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Times: 1, Kind: faults.Stall, Delay: time.Second})
	done := make(chan error, 1)
	go func() { done <- w1.RunBatch(ctx, f.id, 0) }()
	waitUntil(t, 5*time.Second, "W1's first claim held", func() bool { return first.Hits() > 0 })
	f.leaseExpired(t)
	sweeper, _, sweepStore := f.faulty(t, func(c *Config) { c.Owner = "sweeper" })
	slow := sweepStore.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Times: 1, Kind: faults.Stall, Delay: 2500 * time.Millisecond})
	swept := make(chan error, 1)
	go func() { _, err := sweeper.Sweep(ctx); swept <- err }()
	waitUntil(t, 5*time.Second, "the sweep's lease held", func() bool { return slow.Hits() > 0 })
	if err := <-swept; err != nil {
		t.Fatalf("sweep: %v", err)
	}
	w1Store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail}) // W1 dies
	<-done
	if n := w1Sends.n.Load(); n < 3 {
		t.Fatalf("W1 sent %d messages, want u1 and u2, and u4 or u7 from a later chunk", n)
	}
	f.afterRedisLossSentOnce(t)
}

// A run is held in a provider call past its lease (its worker slow, or judged dead while it was only cut
// off from Postgres), and the sweep makes its recipient unknown. The operator resumes with
// --resend-unknown at once: the recipient's claim, taken moments ago, may still be answered, so it stays
// unknown and is not sent again; the run's call is then accepted, and the recipient got one message.
func TestAResendLeavesAClaimThatMayStillBeAnswered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	w1, _, _ := f.faulty(t, func(c *Config) { c.Owner, c.ChunkSize, c.LeaseTTL = "w1", 10, 300*time.Millisecond })
	release, done := f.heldAtU2(w1, nil)
	f.leaseExpired(t)
	if _, err := f.h.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := f.status(t, "u2"); st != campaign.StatusUnknown {
		t.Fatalf("u2 is %s after the sweep, want unknown (its call was in flight)", st)
	}
	rep, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resent != 0 || rep.StillInFlight != 1 {
		t.Fatalf("resume resent %d, left %d in flight; want u2 left (its claim is moments old)", rep.Resent, rep.StillInFlight)
	}
	for b := 0; b < f.batches; b++ {
		_ = f.h.RunBatch(ctx, f.id, b) // the follow-up: sends the others, not u2
	}
	release() // W1's call for u2 is accepted
	<-done
	f.assertOnce(t)
	if got := len(f.provider.accepted[phone(2)]); got != 1 {
		t.Fatalf("u2 got %d messages, want 1", got)
	}
}

// countedW1 is a worker "w1" on f's campaign, chunks of chunk, leases of 300 ms, its Redis state and
// Postgres store open to fault rules, and the count of the messages it sent.
func (f *fixture) countedW1(t *testing.T, chunk int) (*Handler, *countingProvider, *faults.State, *faults.Store) {
	t.Helper()
	sends := &countingProvider{Provider: f.provider}
	w1, st, store := f.faulty(t, func(c *Config) {
		c.Owner, c.ChunkSize, c.LeaseTTL = "w1", chunk, 300*time.Millisecond
		c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: sends}
	})
	return w1, sends, st, store
}

// afterRedisLossSentOnce empties f's Redis, lets the batch's lease run out, sweeps and runs every batch:
// nobody may then have been sent twice, and nobody is left pending.
func (f *fixture) afterRedisLossSentOnce(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := f.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.leaseExpired(t)
	if _, err := f.h.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	f.assertOnce(t)
	if c := f.counts(t); c.Pending != 0 {
		t.Fatalf("counts %+v, want everyone settled", c)
	}
}

// `resume --resend-unknown` waits for claims in flight as long as the slowest worker may: a worker with a
// long --provider-timeout notes its grace in Redis, and a claim younger than that is not resent.
func TestAResendWaitsForTheLongestGraceAWorkerNoted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		noted  time.Duration
		resent int64
	}{{"no worker noted one: 30 s", 0, 1}, {"a worker noted 90 s", 90 * time.Second, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10)
			f.deadRun(t) // u2 claimed by a run that died, its call unanswered
			f.leaseExpired(t)
			if _, err := f.h.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if st, _, _ := f.status(t, "u2"); st != campaign.StatusUnknown {
				t.Fatalf("u2 is %s after the sweep, want unknown", st)
			}
			// The claim was taken 45 s ago.
			f.rdb.Set(ctx, ClaimKey(f.id, "u2"), Nonce(f.campaign(t))+"/"+state.InFlightValue(time.Now().Add(-45*time.Second), "dead"), 0)
			if tc.noted > 0 {
				if err := state.NoteInFlightGrace(ctx, f.rdb, tc.noted); err != nil {
					t.Fatal(err)
				}
			}
			f.ageUnknown(t) // recorded long ago: the claim's age alone holds it back
			rep, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Resent != tc.resent || rep.StillInFlight != 1-int(tc.resent) {
				t.Fatalf("resent %d, left %d in flight (grace %v); want %d resent", rep.Resent, rep.StillInFlight, rep.Grace, tc.resent)
			}
		})
	}
}

// heldAtU2 runs w's batch 0 in the background and returns once w is in its provider call for u2, which is
// held until release is called (the provider's hook is then cleared); other runs w's calls for the other
// recipients (nil: none). done has the run's result.
func (f *fixture) heldAtU2(w *Handler, other func(providers.Message)) (release func(), done <-chan error) {
	held, free := make(chan struct{}), make(chan struct{})
	f.provider.before = func(m providers.Message) {
		if m.To != phone(2) {
			if other != nil {
				other(m)
			}
			return
		}
		close(held)
		<-free
	}
	result := make(chan error, 1)
	go func() { result <- w.RunBatch(context.Background(), f.id, 0) }()
	<-held
	return func() { f.provider.before = nil; close(free) }, result
}

// The e-mail path, one claim call a request: a run stalls before claiming its second request past its
// lease, the sweep fences it and takes its chunk, and the run, going on, claims and sends nothing; it dies,
// Redis loses its data, and everyone still gets one message.
func TestAnEmailRequestClaimedAfterTheTakeoverIsNotSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, _ := testredis.New(t)
	db, store, id, p, sweeper := planEmailDB(t, 6, 2, rdb)
	w1State, w1Store := faults.NewState(state.New(rdb, DefaultClaimTTL)), faults.NewStore(store)
	w1 := NewHandler(Config{Store: w1Store, State: w1State, Redis: rdb, Owner: "w1", Unsubscribe: testSigner, LeaseTTL: 300 * time.Millisecond,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p}, ProviderRates: map[string]float64{}})
	stall := w1State.Add(&faults.Rule{Match: faults.Method("ClaimWindow"), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 2 * time.Second})
	done := make(chan error, 1)
	go func() { done <- w1.RunBatch(ctx, id, 0) }()
	waitUntil(t, 5*time.Second, "W1's second claim held", func() bool { return stall.Hits() > 0 })
	waitUntil(t, 5*time.Second, "W1's lease to run out", func() bool {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND lease_until > now()`, id).Scan(&n)
		return err == nil && n == 0
	})
	if n, err := sweeper.Sweep(ctx); err != nil || n == 0 {
		t.Fatalf("the sweep did not take W1's chunk (settled %d, %v)", n, err)
	}
	w1Store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail}) // W1 dies
	<-done
	if len(p.requests) != 1 {
		t.Fatalf("%d requests, want only W1's first: its second was claimed after the takeover", len(p.requests))
	}
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for try := 0; try < 5; try++ {
		if sweeper.RunBatch(ctx, id, 0) == nil {
			break
		}
		time.Sleep(400 * time.Millisecond)
	}
	for to, ms := range p.accepted {
		if len(ms) != 1 {
			t.Errorf("%s got %d messages", to, len(ms))
		}
	}
	if c, _ := store.Counts(ctx, id); c.Pending != 0 {
		t.Fatalf("counts %+v, want everyone settled", c)
	}
}

// A run finds the batch's lease held by another run whose lease ran out, fences that run, and finds the
// lease in yet another run's hands by the time it leases again, and again. It fences each token it would
// take before anything could be taken, takes nothing, and after three lease statements (two fences)
// reports the chunk busy: the batch comes back later, with nothing sent. Once the lease stops changing hands, the batch is sent once.
func TestALeaseThatKeepsChangingHandsIsLeftBusyAfterThreeTries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	churn := func(n int) {
		t.Helper()
		if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET lease_token = $3, lease_epoch = 'another',
				lease_until = now() - interval '1 second', lease_users = '{}'
			WHERE campaign_id = $1 AND batch = $2`, f.id, 0, fmt.Sprint("churn-", n)); err != nil {
			t.Fatal(err)
		}
	}
	churn(0)
	w1, sends, w1State, _ := f.countedW1(t, 10)
	var fences atomic.Int32
	var churning atomic.Bool
	churning.Store(true)
	// Each time the run fences a token, yet another run takes the lease (before the run leases again); a
	// run that would go on fencing stops finding new ones after 6.
	w1State.Add(&faults.Rule{Match: func(c faults.Call) bool {
		if c.Name == "Fence" && churning.Load() {
			if n := fences.Add(1); n < 6 {
				churn(int(n))
			}
		}
		return false
	}})
	err := w1.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("RunBatch under a lease that keeps changing hands: %v, want a RetryError that is not a failure", err)
	}
	if n := fences.Load(); n != 2 {
		t.Errorf("the run fenced %d tokens, want 2 (its third lease statement finds a third token: busy)", n)
	}
	if n := sends.n.Load(); n != 0 {
		t.Errorf("the run sent %d messages under a lease it never took", n)
	}
	var token string
	if err := f.db.QueryRow(ctx, `SELECT lease_token FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&token); err != nil {
		t.Fatal(err)
	}
	if token != "churn-2" {
		t.Errorf("the lease is %q, want churn-2 still (the run took nothing)", token)
	}
	for i := 0; i < 2; i++ {
		if n, err := f.rdb.Exists(ctx, state.FenceKey(fmt.Sprint("churn-", i))).Result(); err != nil || n != 1 {
			t.Errorf("churn-%d was replaced but not fenced (%d, %v)", i, n, err)
		}
	}
	// The lease stops changing hands: the run fences the last token, takes the lease and sends everyone once.
	churning.Store(false)
	notFailure(t, w1.RunBatch(ctx, f.id, 0))
	f.runAll(t)
	f.assertOnce(t)
	if c := f.counts(t); c.Pending != 0 || c.Sent != 5 {
		t.Fatalf("counts %+v, want the 5 eligible sent", c)
	}
}

// Without a cap the answer of a send is written with the next claim (one Redis call a message). When a
// Postgres call comes first (the lease's renewal, the consents' re-read) and stalls (a Postgres restart),
// the answer must already be in the claim: were the worker killed during the stall, the sweep would find
// the claim in flight, make the recipient unknown, and `resume --resend-unknown` would send it again
// although the provider had accepted it.
func TestAnAnswerIsWrittenBeforeAPostgresCallThatMayStall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method string
		skip         int
		ttl, hold    time.Duration
	}{
		// The lease (300 ms) is due for renewal by the next send.
		{"the lease's renewal", "RenewLease", 0, 300 * time.Millisecond, 150 * time.Millisecond},
		// The consents (read with the chunk) are more than a second old by the next send.
		{"the consents' re-read", "LeaseChunk", 1, 30 * time.Second, 1100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			w1, _, store := f.faulty(t, func(c *Config) { c.Owner, c.LeaseTTL = "w1", tc.ttl })
			stall := store.Add(&faults.Rule{Match: faults.Method(tc.method), Skip: tc.skip, Times: 1, Kind: faults.Stall, Delay: 10 * time.Minute})
			f.provider.before = func(m providers.Message) {
				if m.To == phone(1) {
					time.Sleep(tc.hold)
				}
			}
			wctx, kill := context.WithCancel(ctx)
			defer kill()
			done := make(chan error, 1)
			go func() { done <- w1.RunBatch(wctx, f.id, 0) }()
			waitUntil(t, 10*time.Second, "u1 accepted and the Postgres call stalled", func() bool {
				return len(f.provider.sentTo(phone(1))) == 1 && stall.Hits() == 1
			})
			v, err := f.rdb.Get(ctx, ClaimKey(f.id, "u1")).Result()
			if st := state.ParseValue(strings.TrimPrefix(v, Nonce(f.campaign(t))+"/")); err != nil || st.Kind != state.Sent {
				t.Fatalf("u1 was accepted, and while %s stalls its claim says %q (%v): the answer is not in it", tc.method, v, err)
			}
			if tc.method != "RenewLease" {
				return
			}
			// The worker dies during the stall, recording nothing; the sweep settles its chunk, and the
			// operator resends the unknown.
			store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
			kill()
			<-done
			f.leaseExpired(t)
			if _, err := f.h.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if st, reason, _ := f.status(t, "u1"); st != campaign.StatusSent {
				t.Errorf("u1 is %s (%s) after the sweep, want sent (its claim says so)", st, reason)
			}
			if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true}); err != nil {
				t.Fatal(err)
			}
			f.runAll(t)
			f.assertOnce(t)
		})
	}
}

// The same before a wait: a window's sends are accepted but u2's is refused with a 503 asking for 8 s, and
// the run holds for it (the lease, 30 s, is not due for renewal). The accepted answers must be in their
// claims during the wait, which may last a whole provider outage: a worker killed during it would leave
// them in flight, unknown, and resent by `resume --resend-unknown`.
func TestAnAnswerIsWrittenBeforeABackOffWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 8) // eligible in batch 0: u1 u2 u4 u7 u8, one chunk
	w1, _, _ := f.faulty(t, func(c *Config) { c.Owner, c.SendWindow = "w1", 8 })
	var once sync.Once
	f.provider.fail = func(_ int, m providers.Message) error {
		var err error
		if m.To == phone(2) {
			once.Do(func() {
				err = &providers.Error{Provider: "test", Status: 503, RetryAfter: 8 * time.Second, Class: providers.Transient}
			})
		}
		return err
	}
	wctx, kill := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w1.RunBatch(wctx, f.id, 0) }()
	defer func() { kill(); <-done }()
	waitUntil(t, 5*time.Second, "u1 accepted", func() bool { return len(f.provider.sentTo(phone(1))) == 1 })
	time.Sleep(500 * time.Millisecond) // the run now holds for u2's Retry-After
	nonce := Nonce(f.campaign(t))
	for _, u := range []string{"u1", "u4", "u7", "u8"} {
		v, err := f.rdb.Get(ctx, ClaimKey(f.id, u)).Result()
		if st := state.ParseValue(strings.TrimPrefix(v, nonce+"/")); err != nil || st.Kind != state.Sent {
			t.Errorf("%s was accepted, and while the run waits for u2's back-off its claim says %q (%v): the answer is not in it", u, v, err)
		}
	}
}

// A run that finds a claim without an answer judges it by the longest in-flight grace of the fleet, not
// only its own: a worker with a longer --provider-timeout noted its grace in Redis, and its call may still
// be under way. Order: another worker claimed u2 10 s ago and waits for the provider; this worker (grace
// 5 s) runs the batch. With the fleet's 90 s noted, u2 is left to that call (pending, in hand), not
// recorded unknown.
func TestAClaimInFlightIsJudgedByTheFleetsLongestGrace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		noted time.Duration
		want  string
	}{{"no worker noted one", 0, campaign.StatusUnknown}, {"a worker noted 90 s", 90 * time.Second, campaign.StatusPending}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 10)
			f.rdb.Set(ctx, ClaimKey(f.id, "u2"), Nonce(f.campaign(t))+"/"+state.InFlightValue(time.Now().Add(-10*time.Second), "other"), 0)
			w := NewHandler(Config{Store: f.store, Redis: f.rdb, Owner: "w2", SendWindow: 1, InFlightGrace: 5 * time.Second,
				Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider},
				ProviderRates: map[string]float64{}})
			w.inFlightGrace(ctx, false) // read before the slower worker noted its own: not trusted for a verdict
			if tc.noted > 0 {
				if err := state.NoteInFlightGrace(ctx, f.rdb, tc.noted); err != nil {
					t.Fatal(err)
				}
			}
			for b := 0; b < f.batches; b++ {
				w.RunBatch(ctx, f.id, b) //nolint:errcheck // a batch with u2 in flight elsewhere comes back later
			}
			if st, reason, _ := f.status(t, "u2"); st != tc.want {
				t.Fatalf("u2 is %s (%q); want %s", st, reason, tc.want)
			}
			if n := len(f.provider.sentTo(phone(2))); n != 0 {
				t.Fatalf("u2, claimed by another worker's call, was sent %d more messages", n)
			}
		})
	}
}
