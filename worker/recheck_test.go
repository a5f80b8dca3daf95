package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// A chunk leased with its consents waits for its provider (its first requests refused with a 429 asking
// for 2 s) while u8 refuses: when the chunk's messages go, more than a second after its consents were
// read, they are read again, and u8 is not sent. Before, the consents read with the lease stood however
// long the chunk waited (a provider outage held one for 15 s, a pace stuck low for minutes). One send at
// a time (a provider with a fallback) and windows of 8 (the SMS path), whose first window is refused whole.
func TestAChunkThatWaitedForItsProviderReadsItsConsentsAgain(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 8, nil) // eligible: u1, u2, u4, u7, u8, one chunk
			h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = window })
			refused := 1 // one at a time: u1, which is tried again in place
			if window > 1 {
				refused = 5 // the whole first window
			}
			var once sync.Once
			f.provider.before = func(providers.Message) {
				once.Do(func() {
					if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET', source = 'IYS_MOBIL' WHERE recipient = $1`, phone(8)); err != nil {
						t.Error(err)
					}
				})
			}
			f.provider.fail = func(call int, _ providers.Message) error {
				if call <= refused {
					return &providers.Error{Provider: "test", Status: 429, Throttled: true, RetryAfter: 2 * time.Second, Class: providers.Transient}
				}
				return nil
			}
			start := time.Now()
			if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(start); waited < 2*time.Second {
				t.Fatalf("the batch took %v: the refusal did not make the chunk wait, so this tests nothing", waited)
			}
			if n := len(f.provider.accepted[phone(8)]); n != 0 {
				t.Fatalf("u8 refused while its chunk waited 2 s for the provider, and got %d messages", n)
			}
			if st, reason, code := f.status(t, "u8"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked || code != "" {
				t.Fatalf("u8: %s/%s code %q, want skipped/revoked with its code given back", st, reason, code)
			}
			for _, u := range []int{1, 2, 4, 7} {
				if n := len(f.provider.accepted[phone(u)]); n != 1 {
					t.Errorf("u%d got %d messages, want 1", u, n)
				}
			}
			if c := f.counts(t); c.Sent != 4 || c.Skipped != 1 {
				t.Fatalf("counts %+v, want 4 sent and u8 skipped", c)
			}
		})
	}
}

// The same on the e-mail path: a request of 4 refused with a 429 asking for 2 s, user3 refusing
// meanwhile; the request sent after the wait leaves user3 out.
func TestAnEmailRequestThatWaitedForItsProviderReadsItsConsentsAgain(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, _, id, p, h := planEmailDB(t, 4, 10, rdb)
	ctx := context.Background()
	p.before = func(n int) {
		if n == 1 {
			if _, err := db.Exec(ctx, `UPDATE iys_consents SET status = 'RET', updated_at = now() WHERE recipient = 'user3@example.com'`); err != nil {
				t.Error(err)
			}
		}
	}
	p.fail = func(n int) error {
		if n == 1 {
			return &providers.Error{Provider: "batch", Status: 429, Throttled: true, RetryAfter: 2 * time.Second, Class: providers.Transient}
		}
		return nil
	}
	start := time.Now()
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 2*time.Second {
		t.Fatalf("the batch took %v: the refusal did not make the request wait, so this tests nothing", waited)
	}
	if n := len(p.accepted["user3@example.com"]); n != 0 {
		t.Fatalf("user3 refused while the request waited 2 s for the provider, and got %d e-mails", n)
	}
	if len(p.accepted) != 3 {
		t.Fatalf("%d addresses e-mailed, want the other 3", len(p.accepted))
	}
	var st, reason string
	if err := db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u3'`, id).Scan(&st, &reason); err != nil {
		t.Fatal(err)
	}
	if st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("u3: %s (%s), want skipped (revoked)", st, reason)
	}
}

// A chunk waiting out a provider that is down keeps its lease: the wait renews it every third of its TTL,
// so the sweeper never takes a live run's chunk in hand for a dead run's (it did once an outage lasted
// three provider timeouts: "settled the chunks of batch runs that died", then "lease lost to another run").
func TestAChunkWaitingForADownProviderKeepsItsLease(t *testing.T) {
	t.Parallel()
	f := planWith(t, 8, nil) // eligible: u1, u2, u4, u7, u8, one window
	const ttl = 600 * time.Millisecond
	h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = 8; c.LeaseTTL = ttl })
	downUntil := time.Now().Add(3 * time.Second)
	f.provider.fail = func(int, providers.Message) error {
		if time.Now().Before(downUntil) {
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	runKeepingTheLease(t, f, h, time.Until(downUntil), "the provider came back")
}

// An outage costs nobody an attempt, even when a recipient's back-offs are the shortest the jitter gives:
// its five attempts are spent within 0.75 s, before the provider's window of answers is a second old, with
// no other recipient's failures to fill it. The provider is called down on its first five failures, so the
// recipient waits for it and goes once it is back, in the same run, instead of being given up as failing.
// On each path: one message at a time, a window of sends, a request of several recipients.
func TestAnOutageIsSeenBeforeTheShortestBackOffsRunOut(t *testing.T) {
	t.Parallel()
	const outage = 1200 * time.Millisecond
	shortest := func(time.Duration) time.Duration { return 0 }
	down := func(until time.Time) error {
		if time.Now().Before(until) {
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	for _, window := range []int{1, 8} {
		t.Run(fmt.Sprintf("a window of %d", window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 1, nil)
			h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = window })
			h.jitter = shortest
			until := time.Now().Add(outage)
			f.provider.fail = func(int, providers.Message) error { return down(until) }
			if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
				t.Fatalf("RunBatch: %v; want the recipients to wait out the outage, their attempts kept", err)
			}
			if time.Now().Before(until) {
				t.Fatal("the batch ended inside the outage: this tests nothing")
			}
			f.assertOnce(t)
			if c := f.counts(t); c.Sent != 1 {
				t.Fatalf("counts %+v, want u1 sent", c)
			}
		})
	}
	t.Run("a request of the e-mail path, five attempts", func(t *testing.T) {
		t.Parallel()
		rdb, _ := testredis.New(t)
		_, _, id, p, h := planEmailDB(t, 1, 10, rdb)
		h.jitter = shortest
		until := time.Now().Add(outage)
		p.fail = func(int) error { return down(until) }
		if err := h.RunBatch(context.Background(), id, 0); err != nil {
			t.Fatalf("RunBatch: %v; want the request to wait out the outage, its attempts kept", err)
		}
		if time.Now().Before(until) {
			t.Fatal("the batch ended inside the outage: this tests nothing")
		}
		if n := len(p.accepted["user1@example.com"]); n != 1 {
			t.Fatalf("user1 got %d e-mails, want 1", n)
		}
	})
}

// runKeepingTheLease runs batch 0 of f (5 eligible) through h, which must take at least took (the wait
// the test makes, for what), and checks that the chunk's lease never lapsed meanwhile and that each of
// the 5 was sent once.
func runKeepingTheLease(t *testing.T, f *fixture, h *Handler, took time.Duration, what string) {
	t.Helper()
	start := time.Now()
	lapsed, err := leaseLapses(t, f.db, f.id, func() error { return h.RunBatch(context.Background(), f.id, 0) })
	if err != nil {
		t.Fatalf("RunBatch: %v", err)
	}
	if time.Since(start) < took {
		t.Fatalf("the batch took %v, less than the %v until %s: this tests nothing", time.Since(start), took, what)
	}
	if lapsed > 0 {
		t.Fatalf("the chunk's lease had expired at %d of the checks while its run waited until %s", lapsed, what)
	}
	f.assertOnce(t)
	if c := f.counts(t); c.Sent != 5 {
		t.Fatalf("counts %+v, want all 5 sent", c)
	}
}

// Fail closed on the new paths. A chunk that waited for its provider and cannot read its consents again
// (Postgres unreachable just then) sends nothing more: the batch comes back later, its recipients pending.
func TestAWaitingChunkThatCannotReadItsConsentsSendsNothing(t *testing.T) {
	t.Parallel()
	f := planWith(t, 8, nil) // eligible: u1, u2, u4, u7, u8, one window
	h, _, fs := f.faulty(t, func(c *Config) { c.SendWindow = 8 })
	f.provider.fail = func(call int, _ providers.Message) error {
		if call <= 5 {
			return &providers.Error{Provider: "test", Status: 429, Throttled: true, RetryAfter: 1500 * time.Millisecond, Class: providers.Transient}
		}
		return nil
	}
	// The first lease is the gate's; the next is the re-read after the wait.
	rule := fs.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Skip: 1, Kind: faults.Fail})
	err := h.RunBatch(context.Background(), f.id, 0)
	notFailure(t, err)
	if err == nil || rule.Hits() == 0 {
		t.Fatalf("RunBatch: %v after %d failed re-reads; want the batch handed back", err, rule.Hits())
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages accepted after the consents could not be read again", n)
	}
	if c := f.counts(t); c.Pending != 5 {
		t.Fatalf("counts %+v, want all 5 still pending", c)
	}
}

// A chunk whose lease another run took over while it waited for a down provider sends nothing once the
// provider is back: the wait's renewal finds the lease gone and the run stops (the other run holds the
// chunk now).
func TestAChunkWhoseLeaseWasTakenWhileItWaitedSendsNothing(t *testing.T) {
	t.Parallel()
	f := planWith(t, 8, nil)
	h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = 8; c.LeaseTTL = 600 * time.Millisecond })
	downUntil := time.Now().Add(2 * time.Second)
	var mu sync.Mutex
	after := 0 // requests after the takeover
	taken := false
	f.provider.fail = func(int, providers.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if taken {
			after++
		}
		if time.Now().Before(downUntil) {
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	go func() {
		time.Sleep(800 * time.Millisecond) // the provider is down by now; the run waits for it
		mu.Lock()
		defer mu.Unlock()
		if _, err := f.db.Exec(context.Background(), `UPDATE campaign_batches SET lease_token = 'other run', lease_until = now() + interval '1 minute'
			WHERE campaign_id = $1 AND batch = 0`, f.id); err != nil {
			t.Error(err)
		}
		taken = true
	}()
	err := h.RunBatch(context.Background(), f.id, 0)
	notFailure(t, err)
	if err == nil || !strings.Contains(err.Error(), "lost to another run") {
		t.Fatalf("RunBatch: %v, want it to stop because its lease was lost", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if after > 1 || f.provider.total() != 0 {
		t.Fatalf("%d requests after another run took the chunk over (%d accepted); want at most a probe already under way, none accepted", after, f.provider.total())
	}
}

// leaseLapses runs run (a run of batch 0 of campaign id) and counts the checks, every 50 ms meanwhile, that
// found the batch's lease expired while a run held it.
func leaseLapses(t *testing.T, db *pgxpool.Pool, id int64, run func() error) (int, error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- run() }()
	lapsed := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return lapsed, err
		case <-tick.C:
			var expired bool
			if err := db.QueryRow(context.Background(), `SELECT coalesce(lease_until < now(), false) FROM campaign_batches
				WHERE campaign_id = $1 AND batch = 0 AND lease_token IS NOT NULL`, id).Scan(&expired); err == nil && expired {
				lapsed++
			}
		}
	}
}

// reserveAhead has another worker take n tokens of provider's bucket at rate, so that the next send
// through it waits about n/rate; it returns once they are taken (the other worker waits on meanwhile).
func reserveAhead(t *testing.T, rdb redis.UniversalClient, provider string, rate float64, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	key := state.ProviderBucket(provider)
	go limiter.New(rdb).WaitN(ctx, n, limiter.Limit{Key: key, Rate: rate}) //nolint:errcheck // cancelled at the end
	waitUntil(t, 5*time.Second, "the other worker's reservation", func() bool {
		ok, err := rdb.Exists(ctx, state.RateKey(key)).Result()
		return err == nil && ok == 1
	})
}

// A chunk waiting for its provider's tokens keeps its lease, however long the wait: with other workers
// ahead of it in a low cap's bucket (here 2 s of tokens), the wait renews the lease every third of its TTL.
// It did not before: a wait longer than the lease (3 × --provider-timeout) let the sweeper settle a live
// run's chunk as a dead run's, and after a Redis data loss made its never-sent recipients unknown.
func TestAChunkWaitingForItsTokensKeepsItsLease(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 8, nil) // eligible: u1, u2, u4, u7, u8
			h, _, _ := f.faulty(t, func(c *Config) {
				c.SendWindow = window
				c.LeaseTTL = 600 * time.Millisecond
				c.ProviderRates = map[string]float64{"test": 50}
			})
			reserveAhead(t, f.rdb, "test", 50, 100)
			runKeepingTheLease(t, f, h, 1500*time.Millisecond, "the tokens ahead of it were used")
		})
	}
}

// The same for an e-mail request, whose tokens (one a recipient, more than the bucket's burst) are
// reserved at once and waited for.
func TestAnEmailRequestWaitingForItsTokensKeepsItsLease(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, _, id, p, h := planEmailDB(t, 4, 10, rdb)
	h.cfg.LeaseTTL = 600 * time.Millisecond
	h.cfg.ProviderRates["batch"] = 20 // burst 1, requests of 2 (a tenth of a second's worth), after 2 s of tokens ahead
	reserveAhead(t, rdb, "batch", 20, 40)
	start := time.Now()
	lapsed, err := leaseLapses(t, db, id, func() error { return h.RunBatch(context.Background(), id, 0) })
	if err != nil {
		t.Fatalf("RunBatch: %v", err)
	}
	if took := time.Since(start); took < 1800*time.Millisecond {
		t.Fatalf("the batch took %v: it did not wait for its tokens, so this tests nothing", took)
	}
	if lapsed > 0 {
		t.Fatalf("the request's lease had expired at %d of the checks while its run waited for tokens", lapsed)
	}
	if len(p.accepted) != 4 {
		t.Fatalf("%d addresses e-mailed, want 4", len(p.accepted))
	}
}

// A run waiting for its tokens lets its batch go as soon as the Redis epoch changes (Redis lost its data
// or failed over): its claims would be refused anyway. It held the batch until its wait ended, and the
// resumed runs of the new epoch were turned away meanwhile ("being sent by another run").
func TestAWaitingRunLetsItsBatchGoWhenTheEpochChanges(t *testing.T) {
	t.Parallel()
	f := planWith(t, 8, nil)
	h, _, _ := f.faulty(t, func(c *Config) {
		c.SendWindow = 8
		c.LeaseTTL = 600 * time.Millisecond
		c.ProviderRates = map[string]float64{"test": 50}
	})
	reserveAhead(t, f.rdb, "test", 50, 150) // 3 s of tokens ahead
	go func() {
		time.Sleep(500 * time.Millisecond)
		f.rdb.Set(context.Background(), state.EpochKey, "after-a-failover", 0) //nolint:errcheck // checked by the run's outcome
	}()
	start := time.Now()
	err := h.RunBatch(context.Background(), f.id, 0)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the run let its batch go %v after it started, with the epoch changed at 0.5 s", took)
	}
	if !errors.Is(err, state.ErrEpoch) {
		t.Fatalf("RunBatch: %v, want the epoch change", err)
	}
	notFailure(t, err)
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent under the changed epoch", n)
	}
	if c := f.counts(t); c.Pending != 5 {
		t.Fatalf("counts %+v, want all 5 still pending", c)
	}
}

// Under a low cap, a send's claim stalls (Redis slow) past its tokens' freshness, and the send waits for
// tokens a second time, seconds at that cap. The recipient replies STOP during that wait. The consents
// were read before the claim, seconds ago by the time the send would leave: they are read again, and the
// send does not leave; the recipient's claim is settled as revoked, and the others go on.
func TestARefusalDuringASecondTokenWaitStopsTheSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		claim  string
		window int
	}{{"ClaimSend", 1}, {"ClaimWindow", 8}} {
		t.Run(tc.claim, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 8) // eligible in batch 0: u1 u2 u4 u7 u8
			h, fr, _ := f.faulty(t, func(c *Config) {
				c.ProviderRates, c.SendWindow, c.LeaseTTL = map[string]float64{"test": 0.2}, tc.window, 300*time.Millisecond
			})
			stall := fr.Add(&faults.Rule{Match: faults.Method(tc.claim), Times: 1, Kind: faults.Stall, Delay: 300 * time.Millisecond})
			refused := make(chan struct{})
			go func() {
				defer close(refused)
				// The refusal comes once u1 is claimed: during the second wait for its tokens.
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
					if n, _ := f.rdb.Exists(ctx, ClaimKey(f.id, "u1")).Result(); n == 1 {
						rep, err := iys.RecordRefusals(ctx, f.db, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SMstop-u1",
							Kind: "inbound", Recipient: phone(1), Type: "MESAJ", At: time.Now(), Evidence: "STOP"}})
						if err != nil || rep.Revoked != 1 {
							t.Errorf("refusal: %+v %v", rep, err)
						}
						return
					}
				}
				t.Error("u1 was never claimed")
			}()
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- h.RunBatch(rctx, f.id, 0) }()
			<-refused
			nonce := Nonce(f.campaign(t))
			waitUntil(t, 15*time.Second, "u1's claim settled or its message sent", func() bool {
				v, _ := f.rdb.Get(ctx, ClaimKey(f.id, "u1")).Result()
				return state.ParseValue(strings.TrimPrefix(v, nonce+"/")).Kind == state.Skipped || len(f.provider.sentTo(phone(1))) > 0
			})
			stop() // the rest would take 20 s at this cap: the batch is handed back, and run without one
			<-done
			if stall.Hits() != 1 {
				t.Fatalf("the claim never stalled: this tests nothing")
			}
			if n := len(f.provider.sentTo(phone(1))); n != 0 {
				t.Fatalf("u1 got %d messages after replying STOP during the wait, want none", n)
			}
			// The stopped run gives back the claims it took and did not send under (once Redis answers).
			waitUntil(t, 5*time.Second, "the stopped run's claims given back", func() bool {
				for _, u := range []string{"u2", "u4", "u7", "u8"} {
					v, _ := f.rdb.Get(ctx, ClaimKey(f.id, u)).Result()
					if v != "" && state.ParseValue(strings.TrimPrefix(v, nonce+"/")).Kind == state.InFlight {
						return false
					}
				}
				return true
			})
			// Its chunk in hand, if it left one, is settled once its lease has run out.
			f.leaseExpired(t)
			if _, err := f.h.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			f.runAll(t)
			if st, reason, _ := f.status(t, "u1"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
				t.Errorf("u1 is %s (%s), want skipped (%s)", st, reason, campaign.ReasonRevoked)
			}
			f.assertOnce(t)
			if c := f.counts(t); c.Sent != 4 || c.Pending != 0 {
				t.Errorf("counts %+v, want the other 4 sent", c)
			}
		})
	}
}
