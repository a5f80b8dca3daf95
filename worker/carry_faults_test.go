package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// Fault orders met by a recipient carried over to the next chunk of its batch (batchRun.carried): u1,
// the first recipient of the first chunk, is refused once with a 503; its back-off outlasts the rest of
// its chunk, so it goes with the second chunk, and the fault strikes between its refusal and its retry.
// Each test checks the invariants, not timings: nobody is sent twice, nobody is lost (every recipient
// ends sent, failed, skipped or unknown once the batch is run to its end), nobody is sent without
// consent, and no code is given twice.

// leaseHookStore is the fixture's faulty store with a hook run ahead of each LeaseChunk (n counts the
// calls from 1): the seam between two chunks of a batch run.
type leaseHookStore struct {
	*faults.Store
	mu     sync.Mutex
	n      int
	before func(n int, users []string)
}

func (s *leaseHookStore) LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (campaign.Chunk, error) {
	s.mu.Lock()
	s.n++
	n, hook := s.n, s.before
	s.mu.Unlock()
	if hook != nil {
		hook(n, users)
	}
	return s.Store.LeaseChunk(ctx, c, users, l)
}

// claimHookState is the fixture's faulty Redis state with a hook that may fail a ClaimWindow call
// before it reaches Redis (fail), or after it ran there (lose its reply).
type claimHookState struct {
	*faults.State
	window func(scs []state.SendClaim) faults.Kind
}

func (s *claimHookState) ClaimWindow(ctx context.Context, c *campaign.Campaign, nonce string, scs []state.SendClaim, g state.Guard, prev []state.Answer, pauseKey string, now time.Time) ([]state.Claimed, time.Duration, error) {
	kind := faults.Kind(0)
	if s.window != nil {
		kind = s.window(scs)
	}
	if kind == faults.Fail {
		return nil, 0, faults.ErrInjected
	}
	cls, pause, err := s.State.ClaimWindow(ctx, c, nonce, scs, g, prev, pauseKey, now)
	if err == nil && kind == faults.LoseReply {
		return nil, 0, faults.ErrInjected
	}
	return cls, pause, err
}

// carry is a campaign of 100 customers in one batch (54 eligible) sent in chunks of 10, windows of 8,
// with u1 refused once (503) on its first send: its back-off outlasts the rest of chunk 1, so it is
// carried into chunk 2. carried reports whether a lease after the first took u1 (it was carried).
type carry struct {
	*fixture
	h     *Handler
	fr    *faults.State
	store *leaseHookStore
	// u1Sends counts the provider calls for u1 (accepted or not).
	u1Sends atomic.Int64
	mu      sync.Mutex
	// then decides u1's sends after the first refusal (nil: accepted).
	then    func(attempt int) error
	carried atomic.Bool
}

func newCarry(t *testing.T, edit func(*Config)) *carry {
	t.Helper()
	f := planWith(t, 100, func(s *campaign.Spec) { s.BatchSize = 500 })
	h, fr, fs := f.faulty(t, func(c *Config) {
		c.SendWindow, c.ChunkSize, c.LeaseTTL = 8, 10, 300*time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	cr := &carry{fixture: f, h: h, fr: fr, store: &leaseHookStore{Store: fs}}
	h.cfg.Store = cr.store
	users := f.batchUsers(t, 0)
	if users[0] != "u1" {
		t.Fatalf("batch 0 starts with %s, want u1", users[0])
	}
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To != phone(1) {
			return nil
		}
		n := int(cr.u1Sends.Add(1))
		if n == 1 {
			// Its back-off outlasts the rest of its chunk even under load (-race, a busy machine): under a
			// bare 50–100 ms the chunk's last window could end after it, u1 went with it, and was not carried.
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, RetryAfter: 400 * time.Millisecond}
		}
		cr.mu.Lock()
		then := cr.then
		cr.mu.Unlock()
		if then != nil {
			return then(n)
		}
		return nil
	}
	cr.onLease(nil)
	return cr
}

// setThen sets what u1's sends after its first refusal answer (nil: accepted).
func (cr *carry) setThen(then func(attempt int) error) {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	cr.then = then
}

// onLease sets the hook run ahead of each lease that carries u1 (a lease after the first whose users
// include u1) while u1 has had only its refusal; it runs once, on the first such lease (nil: none).
func (cr *carry) onLease(hook func(users []string)) {
	var once sync.Once
	cr.store.mu.Lock()
	defer cr.store.mu.Unlock()
	cr.store.before = func(n int, users []string) {
		if n > 1 && slices.Contains(users, "u1") {
			cr.carried.Store(true)
			if hook != nil && cr.u1Sends.Load() == 1 {
				once.Do(func() { hook(users) })
			}
		}
	}
}

// inNextChunk runs f once, ahead of the first send to someone else than u1 after the lease of the chunk u1
// is carried into: while that chunk's first window is going out.
func (cr *carry) inNextChunk(f func()) {
	var leased, done atomic.Bool
	cr.onLease(func([]string) { leased.Store(true) })
	cr.provider.before = func(m providers.Message) {
		if leased.Load() && m.To != phone(1) && done.CompareAndSwap(false, true) {
			f()
		}
	}
}

// inHand is the users batch 0 holds in hand (leased, their fate not read yet).
func (cr *carry) inHand(t *testing.T) []string {
	t.Helper()
	var users []string
	if err := cr.db.QueryRow(context.Background(), `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, cr.id).Scan(&users); err != nil {
		t.Fatal(err)
	}
	return users
}

// assertEveryoneSentOnce checks the batch's end: everyone settled and sent, u1 accepted once, every code
// given once.
func (cr *carry) assertEveryoneSentOnce(t *testing.T) {
	t.Helper()
	c := cr.assertSettled(t)
	if c.Sent != c.Planned || cr.u1Accepted() != 1 {
		t.Fatalf("counts %+v, u1 accepted %d times; want everyone sent once", c, cr.u1Accepted())
	}
	cr.assertCodesOnce(t)
}

// mustHaveCarried fails the test unless u1 was carried into a later chunk: otherwise it did not test the
// carried path.
func (cr *carry) mustHaveCarried(t *testing.T) {
	t.Helper()
	if !cr.carried.Load() {
		t.Fatal("u1 was never carried into a later chunk: the test did not exercise the carried path")
	}
}

// runToEnd runs batch 0 with h until it is done (nil), at most tries times, waiting out what a RetryError
// asks for (capped at 1 s).
func (cr *carry) runToEnd(t *testing.T, h *Handler, tries int) {
	t.Helper()
	var err error
	for range tries {
		if err = h.RunBatch(context.Background(), cr.id, 0); err == nil {
			return
		}
		var re *RetryError
		if !errors.As(err, &re) {
			t.Fatalf("RunBatch: %v", err)
		}
		time.Sleep(min(max(re.After, 50*time.Millisecond), time.Second))
	}
	t.Fatalf("batch 0 not done after %d runs: %v (counts %+v)", tries, err, cr.counts(t))
}

// assertSettled checks that nobody is left pending, nobody got two messages, and every sent recipient's
// status is sent or unknown.
func (cr *carry) assertSettled(t *testing.T) campaign.Counts {
	t.Helper()
	cr.assertOnce(t)
	c := cr.counts(t)
	if c.Pending != 0 || c.Sent+c.Failed+c.Skipped+c.Unknown != c.Planned {
		t.Fatalf("counts %+v: every planned recipient must end sent, failed, skipped or unknown", c)
	}
	cr.provider.mu.Lock()
	defer cr.provider.mu.Unlock()
	for i := 1; i <= 100; i++ {
		if len(cr.provider.accepted[phone(i)]) == 0 {
			continue
		}
		if st, _, _ := cr.status(t, fmt.Sprintf("u%d", i)); st != campaign.StatusSent && st != campaign.StatusUnknown {
			t.Errorf("u%d reached the provider but is %s", i, st)
		}
	}
	return c
}

// assertCodesOnce checks that no code went to two people: every message carries its recipient's code,
// no two messages carry the same one, no two recipients hold the same one, and no code a recipient holds
// is back in the pool.
func (cr *carry) assertCodesOnce(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cr.provider.mu.Lock()
	seen := map[string]string{}
	for i := 1; i <= 100; i++ {
		for _, body := range cr.provider.accepted[phone(i)] {
			_, code, ok := strings.Cut(body, "kodunuz ")
			if !ok {
				t.Errorf("u%d's message %q carries no code", i, body)
				continue
			}
			if other, dup := seen[code]; dup && other != fmt.Sprintf("u%d", i) {
				t.Errorf("code %s went to %s and u%d", code, other, i)
			}
			seen[code] = fmt.Sprintf("u%d", i)
		}
	}
	cr.provider.mu.Unlock()
	for code, u := range seen {
		if _, _, held := cr.status(t, u); held != code {
			t.Errorf("%s got code %s in its message but holds %q", u, code, held)
		}
	}
	if n := count(t, cr.fixture, `SELECT count(*) FROM (SELECT code FROM campaign_recipients WHERE code IS NOT NULL GROUP BY code HAVING count(*) > 1) x`); n != 0 {
		t.Errorf("%d codes are held by two recipients", n)
	}
	var back int
	if err := cr.db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients r JOIN released_codes x ON x.code_id = r.code_id
		WHERE r.campaign_id = $1`, cr.id).Scan(&back); err != nil {
		t.Fatal(err)
	}
	if back != 0 {
		t.Errorf("%d codes held by recipients are back in the pool", back)
	}
}

func (cr *carry) u1Accepted() int {
	cr.provider.mu.Lock()
	defer cr.provider.mu.Unlock()
	return len(cr.provider.accepted[phone(1)])
}

// Baseline: nothing else goes wrong; u1 is carried and sent once in a later chunk, with its code.
func TestCarriedRecipientIsSentOnceWithItsCode(t *testing.T) {
	t.Parallel()
	cr := newCarry(t, nil)
	if err := cr.h.RunBatch(context.Background(), cr.id, 0); err != nil {
		t.Fatal(err)
	}
	cr.mustHaveCarried(t)
	cr.assertEveryoneSentOnce(t)
}

// u1 answers RET between its refusal and its retry (recorded while its chunk is still sending): the
// lease of the chunk it is carried into reads the RET, and u1 is skipped (revoked), its code given back.
func TestCarriedRecipientIsSkippedWhenItsConsentIsRevokedBeforeItsRetry(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"at the refusal", "just before the next lease"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, nil)
			revoke := func() {
				if _, err := cr.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET', source = 'IYS_MOBIL' WHERE recipient = $1`, phone(1)); err != nil {
					t.Error(err)
				}
			}
			if when == "at the refusal" {
				cr.provider.before = func(m providers.Message) {
					if m.To == phone(1) && cr.u1Sends.Load() == 0 {
						// The 503 for u1 is on its way: the RET lands between the refusal and any retry.
						revoke()
					}
				}
			} else {
				cr.onLease(func([]string) { revoke() })
			}
			if err := cr.h.RunBatch(context.Background(), cr.id, 0); err != nil {
				t.Fatal(err)
			}
			cr.mustHaveCarried(t)
			if n := cr.u1Accepted(); n != 0 {
				t.Fatalf("u1 revoked its consent before its retry but got %d messages", n)
			}
			if st, reason, code := cr.status(t, "u1"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked || code != "" {
				t.Fatalf("u1: %s/%s code %q, want skipped/revoked with its code given back", st, reason, code)
			}
			c := cr.assertSettled(t)
			if c.Sent != c.Planned-1 || c.Skipped != 1 {
				t.Fatalf("counts %+v, want everyone but u1 sent", c)
			}
			cr.assertCodesOnce(t)
		})
	}
}

// The campaign is paused between u1's refusal and the chunk it is carried into: the run stops (not a
// failure) with u1 pending, unsent; after a resume, the batch runs to its end and u1 is sent once.
func TestCarriedRecipientWaitsOutAPauseBetweenChunks(t *testing.T) {
	t.Parallel()
	cr := newCarry(t, nil)
	ctx := context.Background()
	cr.onLease(func([]string) {
		if _, err := Pause(ctx, PauseOptions{Store: cr.store.Store.Store, Redis: cr.rdb, CampaignID: cr.id}); err != nil {
			t.Error(err)
		}
	})
	err := cr.h.RunBatch(ctx, cr.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("err = %v, want a RetryError (not a failure) saying the campaign is paused", err)
	}
	cr.mustHaveCarried(t)
	if st, _, _ := cr.status(t, "u1"); st != campaign.StatusPending || cr.u1Accepted() != 0 {
		t.Fatalf("u1 is %s with %d messages while paused, want pending and unsent", st, cr.u1Accepted())
	}
	if c := cr.counts(t); c.Sent != 9 || c.Pending != c.Planned-9 {
		t.Fatalf("counts %+v while paused, want chunk 1 but u1 (9) sent, the rest pending", c)
	}
	if _, err := cr.store.Transition(ctx, cr.id, []campaign.State{campaign.StatePaused}, campaign.StateRunning); err != nil {
		t.Fatal(err)
	}
	if err := Unhalt(ctx, cr.rdb, cr.id); err != nil {
		t.Fatal(err)
	}
	cr.runToEnd(t, cr.h, 5)
	cr.assertEveryoneSentOnce(t)
	if st := cr.campaign(t).State; st != campaign.StateCompleted {
		t.Fatalf("campaign %s, want completed", st)
	}
}

// The campaign is cancelled (campaignctl cancel, which closes what no run holds) while u1 is carried:
// either between chunks (u1 is in no chunk in hand then) or once u1's next chunk is leased, before its
// retry. u1 is never sent, ends skipped (cancelled) with its code back, and nothing stays pending.
func TestCarriedRecipientIsClosedByACancel(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"between chunks", "in the next chunk before its retry"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, nil)
			ctx := context.Background()
			var once sync.Once
			cancel := func() {
				once.Do(func() {
					if _, err := Cancel(ctx, CancelOptions{Store: cr.store.Store.Store, Redis: cr.rdb, CampaignID: cr.id}); err != nil {
						t.Error(err)
					}
				})
			}
			if when == "between chunks" {
				cr.onLease(func([]string) { cancel() })
			} else {
				// u1's retry comes after its back-off (400 ms); the first send of its next chunk is now.
				cr.inNextChunk(cancel)
			}
			err := cr.h.RunBatch(ctx, cr.id, 0)
			if err != nil {
				t.Fatalf("RunBatch: %v, want the cancelled batch closed", err)
			}
			cr.mustHaveCarried(t)
			if n := cr.u1Accepted(); n != 0 {
				t.Fatalf("u1 was sent %d times after the cancel", n)
			}
			if st, reason, code := cr.status(t, "u1"); st != campaign.StatusSkipped || reason != campaign.ReasonCancelled || code != "" {
				t.Fatalf("u1: %s/%s code %q, want skipped/cancelled with its code given back", st, reason, code)
			}
			c := cr.assertSettled(t)
			if c.Sent != int64(cr.provider.total()) || c.Skipped != c.Planned-c.Sent {
				t.Fatalf("counts %+v with %d messages sent: want every message recorded sent and the rest skipped", c, cr.provider.total())
			}
			cr.assertCodesOnce(t)
			// Running the batch again changes nothing.
			if err := cr.h.RunBatch(ctx, cr.id, 0); err != nil {
				t.Fatal(err)
			}
			if c2 := cr.counts(t); c2 != c {
				t.Fatalf("counts %+v after running the batch again, were %+v", c2, c)
			}
		})
	}
}

// The run stops while u1 is carried (the worker is told to stop, or the task's soft deadline passes):
// it hands the batch back (not a failure) with u1 pending and unsent; a later run sends everyone once.
func TestCarriedRecipientIsHandedBackWhenTheRunStops(t *testing.T) {
	t.Parallel()
	for _, why := range []string{"stop", "soft deadline"} {
		t.Run(why, func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, func(c *Config) { c.DeadlineMargin = time.Minute })
			ctx := context.Background()
			var cancel context.CancelFunc = func() {}
			if why == "stop" {
				cr.onLease(func([]string) {
					cr.h.Stop()
					time.Sleep(50 * time.Millisecond) // the run's wait context ends on its own goroutine
				})
			} else {
				// The soft deadline is a minute before the task's: 400 ms from now.
				ctx, cancel = context.WithTimeout(ctx, time.Minute+400*time.Millisecond)
				deadline, _ := ctx.Deadline()
				cr.onLease(func([]string) { time.Sleep(time.Until(deadline.Add(-time.Minute)) + 20*time.Millisecond) })
			}
			defer cancel()
			err := cr.h.RunBatch(ctx, cr.id, 0)
			cr.mustHaveCarried(t)
			var re *RetryError
			if !errors.As(err, &re) || re.Failure {
				t.Fatalf("err = %v, want the batch handed back (a RetryError, not a failure)", err)
			}
			if st, _, _ := cr.status(t, "u1"); st != campaign.StatusPending || cr.u1Accepted() != 0 {
				t.Fatalf("u1 is %s with %d messages, want pending and unsent", st, cr.u1Accepted())
			}
			if inHand := len(cr.inHand(t)); inHand != 0 {
				t.Fatalf("%d users left in hand by a run that stopped cleanly", inHand)
			}
			cr.runToEnd(t, cr.h2(), 5)
			cr.assertEveryoneSentOnce(t)
		})
	}
}

// The run dies (Redis and Postgres take nothing more from it) while the chunk u1 was carried into is
// being sent, before u1's retry. Once its lease expires, the sweeper settles that chunk from the claims:
// the window in flight is unknown, u1 (whose claim was released at its refusal) is pending again, and
// the next runs send it, and everyone else, once.
func TestCarriedRecipientOfARunThatDiesIsSentOnceLater(t *testing.T) {
	t.Parallel()
	cr := newCarry(t, nil)
	var died atomic.Bool
	cr.inNextChunk(func() {
		died.Store(true)
		cr.fr.Add(&faults.Rule{Kind: faults.Fail})
		cr.store.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
	})
	notFailure(t, cr.h.RunBatch(context.Background(), cr.id, 0))
	cr.provider.before = nil
	cr.mustHaveCarried(t)
	if !died.Load() || cr.u1Accepted() != 0 {
		t.Fatalf("died %v, u1 accepted %d times: want the run dead before u1's retry", died.Load(), cr.u1Accepted())
	}
	if inHand := cr.inHand(t); !slices.Contains(inHand, "u1") {
		t.Fatalf("chunk in hand %v of the dead run does not hold u1, which it carried", inHand)
	}
	cr.leaseExpired(t)
	if _, err := cr.h2().Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := cr.status(t, "u1"); st != campaign.StatusPending {
		t.Fatalf("u1 after the sweep: %s, want pending (its claim was released at its refusal)", st)
	}
	cr.runToEnd(t, cr.h2(), 5)
	c := cr.assertSettled(t)
	if cr.u1Accepted() != 1 || c.Unknown == 0 || c.Unknown > 8 || c.Sent+c.Unknown != c.Planned {
		t.Fatalf("counts %+v, u1 accepted %d times; want u1 sent once, the window in flight (at most 8) unknown, everyone else sent", c, cr.u1Accepted())
	}
	cr.assertCodesOnce(t)
}

// h2 is a clean windowed handler of the fixture's campaign (another worker).
func (cr *carry) h2() *Handler {
	return NewHandler(Config{Store: cr.fixture.store, Redis: cr.rdb, Owner: "second", SendWindow: 8, ChunkSize: 10,
		LeaseTTL:      300 * time.Millisecond,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: cr.provider},
		ProviderRates: map[string]float64{}})
}

// Redis loses its data (a new epoch) while u1 is carried: between chunks, or once its next chunk is
// leased with another run starting on the batch at once (as resume does). Nothing is claimed under the
// old epoch, the runs stop without failing, and the batch then sends everyone once.
func TestCarriedRecipientAcrossAnEpochChange(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"between chunks", "in the next chunk, with a second run"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, nil)
			ctx := context.Background()
			flush := func() {
				if err := cr.rdb.FlushDB(ctx).Err(); err != nil {
					t.Error(err)
				}
			}
			var secondErr error
			if when == "between chunks" {
				cr.onLease(func([]string) { flush() })
			} else {
				cr.inNextChunk(func() {
					flush()
					secondErr = cr.h2().RunBatch(ctx, cr.id, 0)
				})
			}
			notFailure(t, cr.h.RunBatch(ctx, cr.id, 0))
			cr.provider.before = nil
			cr.mustHaveCarried(t)
			notFailure(t, secondErr)
			cr.assertOnce(t)
			cr.runToEnd(t, cr.h2(), 10)
			cr.assertEveryoneSentOnce(t)
		})
	}
}

// The run's lease expires while u1 is carried and another worker takes the batch over and runs it to its
// end: the first run stalls either in the lease of the chunk u1 is carried into, or in writing the
// outcomes of u1's chunk (so the run that takes over inherits that chunk, u1 with it, as the chunk in
// hand). The first run then finds nothing left to send.
func TestCarriedRecipientUnderATakeover(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"next lease", "outcomes of its chunk"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, nil)
			ctx := context.Background()
			var secondErr error
			takeOver := func() {
				cr.leaseExpired(t)
				for range 5 {
					if secondErr = cr.h2().RunBatch(ctx, cr.id, 0); secondErr == nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			if where == "next lease" {
				cr.onLease(func([]string) { takeOver() })
				notFailure(t, cr.h.RunBatch(ctx, cr.id, 0))
			} else {
				rule := cr.store.Add(&faults.Rule{Match: faults.Method("Record"), Times: 1, Kind: faults.Stall, Delay: 2 * time.Second})
				done := make(chan struct{})
				go func() {
					defer close(done)
					waitUntil(t, 5*time.Second, "the first chunk's outcomes to stall", func() bool { return rule.Hits() == 1 })
					takeOver()
				}()
				notFailure(t, cr.h.RunBatch(ctx, cr.id, 0))
				<-done
			}
			cr.mustHaveCarried(t)
			if secondErr != nil {
				t.Fatalf("the run that took the batch over: %v", secondErr)
			}
			cr.assertEveryoneSentOnce(t)
		})
	}
}

// The lease of the run expires while it sends the chunk u1 was carried into (a send stalls past the TTL)
// and another worker takes the batch over meanwhile: each recipient is sent by one of them only.
func TestCarriedRecipientWhoseChunkIsTakenOver(t *testing.T) {
	t.Parallel()
	cr := newCarry(t, nil)
	ctx := context.Background()
	var secondErr error
	cr.inNextChunk(func() {
		cr.leaseExpired(t)
		secondErr = cr.h2().RunBatch(ctx, cr.id, 0)
	})
	err := cr.h.RunBatch(ctx, cr.id, 0)
	cr.provider.before = nil
	cr.mustHaveCarried(t)
	notFailure(t, err)
	notFailure(t, secondErr)
	cr.assertOnce(t)
	cr.runToEnd(t, cr.h2(), 10)
	c := cr.assertSettled(t)
	// The window the stalled run had in flight may be unknown to the run that took over (its claims were
	// older than the grace); everyone else is sent.
	if cr.u1Accepted() != 1 || c.Sent+c.Unknown != c.Planned || c.Unknown > 8 {
		t.Fatalf("counts %+v, u1 accepted %d times; want u1 sent once, at most the stalled window unknown", c, cr.u1Accepted())
	}
	cr.assertCodesOnce(t)
}

// u1's retry in the chunk it was carried into is accepted, and the answer is lost (a timeout after the
// request was written): u1 is unknown, keeps its code, and is never sent again, however often the batch
// runs.
func TestCarriedRecipientAcceptedWithItsAnswerLostIsNeverResent(t *testing.T) {
	t.Parallel()
	cr := newCarry(t, nil)
	cr.setThen(func(int) error {
		return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
	})
	if err := cr.h.RunBatch(context.Background(), cr.id, 0); err != nil {
		t.Fatal(err)
	}
	cr.mustHaveCarried(t)
	cr.setThen(nil)
	for range 2 {
		if err := cr.h2().RunBatch(context.Background(), cr.id, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := cr.u1Sends.Load(); n != 2 {
		t.Fatalf("u1 reached the provider %d times, want 2 (the 503, then the send whose answer was lost)", n)
	}
	st, _, code := cr.status(t, "u1")
	if st != campaign.StatusUnknown || code == "" {
		t.Fatalf("u1: %s, code %q; want unknown, keeping its code", st, code)
	}
	c := cr.assertSettled(t)
	if c.Unknown != 1 || c.Sent != c.Planned-1 {
		t.Fatalf("counts %+v", c)
	}
	cr.assertCodesOnce(t)
}

// Redis fails the claim of the window that holds u1's retry (before Redis, or with the reply lost after
// the claims were written): nobody of that window is sent, the run waits for Redis without failing, and
// once Redis answers everyone is sent once.
func TestCarriedRecipientWhoseRetryClaimFails(t *testing.T) {
	t.Parallel()
	for _, kind := range []faults.Kind{faults.Fail, faults.LoseReply} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, nil)
			var hit atomic.Bool
			u1 := ClaimKey(cr.id, "u1")
			st := &claimHookState{State: cr.fr, window: func(scs []state.SendClaim) faults.Kind {
				if cr.u1Sends.Load() == 1 && slices.ContainsFunc(scs, func(sc state.SendClaim) bool { return sc.Key == u1 }) && hit.CompareAndSwap(false, true) {
					return kind
				}
				return 0
			}}
			cr.h.state = st
			notFailure(t, cr.h.RunBatch(context.Background(), cr.id, 0))
			cr.mustHaveCarried(t)
			if !hit.Load() || cr.u1Accepted() != 0 {
				t.Fatalf("fault hit %v, u1 accepted %d times; want u1's retry claim failed and u1 unsent", hit.Load(), cr.u1Accepted())
			}
			waitUntil(t, 5*time.Second, "u1's orphan claim to be released", func() bool {
				return cr.rdb.Exists(context.Background(), u1).Val() == 0
			})
			cr.runToEnd(t, cr.h, 5)
			cr.assertEveryoneSentOnce(t)
		})
	}
}

// The task's context ends (the worker is killed off the task: asynq cancels it) while u1 is carried:
// just before the lease of its next chunk, or while the first window of that chunk is out. The run
// returns an error with u1 pending and unsent, writes what was answered, leaves nothing in hand, and a
// later run sends everyone once.
func TestCarriedRecipientSurvivesTheTaskContextEnding(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"before the next lease", "in the next chunk"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			cr := newCarry(t, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if when == "before the next lease" {
				cr.onLease(func([]string) { cancel() })
			} else {
				cr.inNextChunk(cancel)
			}
			err := cr.h.RunBatch(ctx, cr.id, 0)
			cr.provider.before = nil
			cr.mustHaveCarried(t)
			if err == nil {
				t.Fatal("RunBatch returned nil after its context ended with recipients left")
			}
			if st, _, _ := cr.status(t, "u1"); st != campaign.StatusPending || cr.u1Accepted() != 0 {
				t.Fatalf("u1 is %s with %d messages, want pending and unsent", st, cr.u1Accepted())
			}
			if c := cr.counts(t); c.Sent != int64(cr.provider.total()) {
				t.Fatalf("counts %+v with %d messages accepted: every answer must be recorded", c, cr.provider.total())
			}
			if inHand := len(cr.inHand(t)); inHand != 0 {
				t.Fatalf("%d users left in hand", inHand)
			}
			cr.runToEnd(t, cr.h2(), 5)
			cr.assertEveryoneSentOnce(t)
		})
	}
}

// haltOnceState refuses one ClaimWindow call as halted (state.ErrHalted, nothing claimed), the first for
// which when says so, as the claim script does while a campaign is paused: the batch then reads the
// campaign's state again (running: the pause was taken back) and goes on with the same recipients.
type haltOnceState struct {
	*faults.State
	when func() bool
	hit  atomic.Bool
}

func (s *haltOnceState) ClaimWindow(ctx context.Context, c *campaign.Campaign, nonce string, scs []state.SendClaim, g state.Guard, prev []state.Answer, pauseKey string, now time.Time) ([]state.Claimed, time.Duration, error) {
	if s.when() && s.hit.CompareAndSwap(false, true) {
		return nil, 0, state.ErrHalted
	}
	return s.State.ClaimWindow(ctx, c, nonce, scs, g, prev, pauseKey, now)
}

// u1 is refused with a 503 that asks for 600 ms (Retry-After), and the next window's claim is refused as
// halted (a pause taken back at once): the batch goes through the gate again with u1 still waiting. u1's
// next send still waits out the provider's Retry-After. (Mutation: the
// recipients left when a window is refused as halted go back without their back-offs, and u1 is sent
// again a few milliseconds after its refusal.)
func TestAHaltKeepsTheBackOffsOfTheRecipientsItHandsBack(t *testing.T) {
	t.Parallel()
	cr := newCarry(t, func(c *Config) { c.ChunkSize = 500 }) // u1's back-off within its chunk, not carried
	const retryAfter = 600 * time.Millisecond
	var mu sync.Mutex
	var u1At []time.Time
	refuse := cr.provider.fail
	cr.provider.fail = func(i int, m providers.Message) error {
		err := refuse(i, m)
		if m.To == phone(1) {
			mu.Lock()
			u1At = append(u1At, time.Now())
			mu.Unlock()
			var pe *providers.Error
			if errors.As(err, &pe) {
				pe.RetryAfter = retryAfter
			}
		}
		return err
	}
	st := &haltOnceState{State: cr.fr, when: func() bool { return cr.u1Sends.Load() == 1 }}
	cr.h.state = st
	notFailure(t, cr.h.RunBatch(context.Background(), cr.id, 0))
	if !st.hit.Load() {
		t.Fatal("no window was refused as halted after u1's refusal: the test proves nothing")
	}
	cr.runToEnd(t, cr.h, 5)
	cr.assertEveryoneSentOnce(t)
	mu.Lock()
	defer mu.Unlock()
	if len(u1At) != 2 {
		t.Fatalf("u1 was tried %d times, want 2 (its refusal, then its send)", len(u1At))
	}
	if gap := u1At[1].Sub(u1At[0]); gap < retryAfter-50*time.Millisecond {
		t.Errorf("u1 was sent again %v after its refusal, before the %v its provider asked for", gap.Round(time.Millisecond), retryAfter)
	}
	t.Logf("u1 sent again %v after its refusal", u1At[1].Sub(u1At[0]).Round(time.Millisecond))
}
