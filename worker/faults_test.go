package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/twilio"
)

// faulty returns a handler of the fixture's campaign whose calls to the Redis state and to Postgres go
// through fault rules (the fixture's own client and store stay clean, for the test's own reads and writes).
func (f *fixture) faulty(t *testing.T, edit func(*Config)) (*Handler, *faults.State, *faults.Store) {
	t.Helper()
	fr := faults.NewState(state.New(f.rdb, DefaultClaimTTL))
	fs := faults.NewStore(f.store)
	cfg := Config{Store: fs, Redis: f.rdb, State: fr, Owner: "faulty", SendWindow: 1,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider},
		ProviderRates: map[string]float64{}}
	if edit != nil {
		edit(&cfg)
	}
	return NewHandler(cfg), fr, fs
}

// notFailure fails the test unless err is nil or a RetryError that does not use up the batch's retries
// (Redis or Postgres trouble is not the batch's fault).
func notFailure(t *testing.T, err error) {
	t.Helper()
	var re *RetryError
	if err != nil && (!errors.As(err, &re) || re.Failure) {
		t.Fatalf("err = %v, want nil or a RetryError that is not a failure", err)
	}
}

// waitUntil polls cond until it holds, failing the test after d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leaseExpired waits until the batch's lease has expired.
func (f *fixture) leaseExpired(t *testing.T) {
	t.Helper()
	waitUntil(t, 10*time.Second, "the batch lease to expire", func() bool {
		var n int
		err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM campaign_batches
			WHERE campaign_id = $1 AND lease_token IS NOT NULL AND lease_until > now()`, f.id).Scan(&n)
		return err == nil && n == 0
	})
}

// ageUnknown makes the unknown recipients of the campaign look recorded an hour ago: the operator resends
// them past ResendGrace, as `resume --resend-unknown` holds back those recorded less than that ago.
func (f *fixture) ageUnknown(t *testing.T) {
	t.Helper()
	if _, err := f.db.Exec(context.Background(), `UPDATE campaign_recipients SET updated_at = updated_at - interval '1 hour'
		WHERE campaign_id = $1 AND status = 'unknown'`, f.id); err != nil {
		t.Fatal(err)
	}
}

// A claim that fails in the middle of a batch (Redis gone before the call reached it, or the call ran
// and its reply was lost) sends nothing for that recipient nor for anyone after it, and the batch waits
// without using up its retries; once Redis answers, every recipient is sent exactly once.
func TestClaimFailureMidBatchSendsNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range []faults.Kind{faults.Fail, faults.LoseReply} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			h, fr, _ := f.faulty(t, nil)
			rule := fr.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Skip: 2, Times: 1, Kind: kind})
			notFailure(t, h.RunBatch(context.Background(), f.id, 0))
			if rule.Hits() != 1 {
				t.Fatalf("the fault hit %d claims, want 1", rule.Hits())
			}
			if got := f.provider.total(); got != 2 {
				t.Fatalf("provider got %d messages, want 2 (u1 and u2, claimed before the failed claim of u4)", got)
			}
			if len(f.provider.accepted[phone(4)]) != 0 {
				t.Fatal("u4 was sent although its claim failed")
			}
			// A claim whose reply was lost may be in Redis: it holds no answer and is released once Redis
			// answers again.
			waitUntil(t, 5*time.Second, "u4's orphan claim to be released", func() bool {
				return f.rdb.Exists(context.Background(), ClaimKey(f.id, "u4")).Val() == 0
			})
			notFailure(t, h.RunBatch(context.Background(), f.id, 0))
			f.assertOnce(t)
			if c := f.counts(t); c.Sent != 5 || c.Pending != 0 || c.Unknown != 0 {
				t.Fatalf("counts %+v, want the 5 eligible sent once each", c)
			}
		})
	}
}

// The same for the multi-recipient path: a request whose claims fail (all at once, in one script call)
// is not sent, and is sent once later.
func TestEmailClaimFailureSendsNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range []faults.Kind{faults.Fail, faults.LoseReply} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			shared, _ := testredis.New(t)
			store, id, p, h := planEmail(t, 6, 3, shared)
			fr := faults.NewState(state.New(shared, DefaultClaimTTL))
			h.state = fr
			rule := fr.Add(&faults.Rule{Match: faults.Method("ClaimWindow"), Skip: 1, Times: 1, Kind: kind})
			notFailure(t, h.RunBatch(context.Background(), id, 0))
			if rule.Hits() != 1 || len(p.requests) != 1 || len(p.accepted) != 3 {
				t.Fatalf("fault hits %d, %d requests, %d accepted; want the first request only (3)", rule.Hits(), len(p.requests), len(p.accepted))
			}
			waitUntil(t, 5*time.Second, "the orphan claims to be released", func() bool {
				n := 0
				for i := 4; i <= 6; i++ {
					n += int(shared.Exists(context.Background(), ClaimKey(id, "u"+string(rune('0'+i)))).Val())
				}
				return n == 0
			})
			notFailure(t, h.RunBatch(context.Background(), id, 0))
			for to, ms := range p.accepted {
				if len(ms) != 1 {
					t.Errorf("%s got %d messages", to, len(ms))
				}
			}
			if c, _ := store.Counts(context.Background(), id); c.Sent != 6 || c.Pending != 0 {
				t.Fatalf("counts %+v, want 6 sent", c)
			}
		})
	}
}

// The provider accepts a message, and then neither Redis nor Postgres takes its answer: the run dies with
// the recipient claimed but unanswered. Once the run's lease expires, the recipient is unknown (the
// message may have gone out) and is never sent again; the ones it had not reached are sent once.
func TestAnswerLostAfterTheProviderCallIsUnknownNeverResent(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	h, fr, fs := f.faulty(t, func(c *Config) { c.LeaseTTL = 300 * time.Millisecond })
	f.provider.before = func(m providers.Message) {
		if m.To == phone(2) {
			// From u2's send on, Redis and Postgres take nothing more from this run.
			fr.Add(&faults.Rule{Kind: faults.Fail})
			fs.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
		}
	}
	notFailure(t, h.RunBatch(context.Background(), f.id, 0))
	f.provider.before = nil
	if f.provider.total() != 2 {
		t.Fatalf("provider got %d, want u1 and u2", f.provider.total())
	}
	f.leaseExpired(t)
	if _, err := f.h.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	f.assertOnce(t)
	for u, want := range map[string]string{"u1": campaign.StatusSent, "u2": campaign.StatusUnknown, "u4": campaign.StatusSent, "u8": campaign.StatusSent} {
		if st, _, _ := f.status(t, u); st != want {
			t.Errorf("%s: %s, want %s", u, st, want)
		}
	}
	if got := f.provider.total(); got != 5 {
		t.Fatalf("provider got %d messages, want 5 (each eligible once)", got)
	}
}

// deadRun leases batch 0's pending users for a run that then "dies" (its lease expires at once), under
// the current Redis epoch, after the provider accepted u1 (answered in its claim) and u2 (claimed, no
// answer yet).
func (f *fixture) deadRun(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	users := f.batchUsers(t, 0)
	n := f.leaseDead(t, users)
	f.rdb.Set(ctx, ClaimKey(f.id, "u1"), n+state.SentValue("SMdead1", 1), 0)
	f.rdb.Set(ctx, ClaimKey(f.id, "u2"), n+state.InFlightValue(time.Now(), "dead"), 0)
	f.provider.mu.Lock()
	f.provider.accepted[phone(1)] = []string{"sent by the dead run"}
	f.provider.accepted[phone(2)] = []string{"sent by the dead run"}
	f.provider.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	return users
}

// leaseDead leases users of batch 0, under the current Redis epoch, for a run whose lease expires at once
// (a run that died), and returns the campaign's claim value prefix ("<nonce>/") for the claims it left.
func (f *fixture) leaseDead(t *testing.T, users []string) string {
	t.Helper()
	ctx := context.Background()
	c := f.campaign(t)
	epoch, err := Epoch(ctx, f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.LeaseChunk(ctx, c, users, campaign.Lease{Token: "dead", Epoch: epoch, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	return Nonce(c) + "/"
}

// deadChunkOneSent is leaseDead for the first k users of batch 0, the first of them sent by the dead run
// (its claim holds the provider's answer), the others claimed by nobody; the dead run's lease has expired
// when it returns.
func (f *fixture) deadChunkOneSent(t *testing.T, k int) {
	t.Helper()
	users := f.batchUsers(t, 0)
	n := f.leaseDead(t, users[:k])
	if err := f.rdb.Set(context.Background(), ClaimKey(f.id, users[0]), n+state.SentValue("SM1", 1), 0).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
}

// The sweeper leases a dead run's chunk and cannot read its claims (Redis fails the read): it records
// nothing and lets nothing go. Redis then loses its data; the chunk, still in hand under the old epoch,
// becomes unknown, and nobody the dead run sent is sent again.
func TestSweepThatCannotReadTheClaimsLetsNothingGo(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.deadRun(t)
	h, fr, _ := f.faulty(t, func(c *Config) { c.LeaseTTL = 200 * time.Millisecond })
	rule := fr.Add(&faults.Rule{Match: faults.Method("ReadClaims"), Kind: faults.Fail})
	if _, err := h.Sweep(context.Background()); err == nil || rule.Hits() == 0 {
		t.Fatalf("sweep: err %v after %d failed reads, want the read's error", err, rule.Hits())
	}
	var inHand int
	f.db.QueryRow(context.Background(), `SELECT cardinality(lease_users) FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&inHand) //nolint:errcheck
	if inHand != 5 {
		t.Fatalf("%d users in hand after the failed sweep, want the 5 of the dead run's chunk", inHand)
	}
	if err := f.rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	fr.Clear()
	f.leaseExpired(t)
	if _, err := h.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	f.assertOnce(t)
	if got := f.provider.total(); got != 2 {
		t.Fatalf("provider got %d messages, want only the dead run's 2", got)
	}
	if c := f.counts(t); c.Unknown != 5 || c.Pending != 0 {
		t.Fatalf("counts %+v, want the dead run's chunk of 5 unknown (a missing claim proves nothing once Redis lost its data)", c)
	}
}

// A run takes over a dead run's chunk and cannot read the claims there either (its first claim fails):
// it leaves the dead run's users in its chunk in hand instead of letting them go, so a Redis loss that
// follows makes them unknown rather than sends them again.
func TestRunThatCannotReadTakenOverClaimsKeepsThemInHand(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.deadRun(t)
	h, fr, _ := f.faulty(t, func(c *Config) { c.LeaseTTL = 200 * time.Millisecond })
	fr.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Kind: faults.Fail})
	notFailure(t, h.RunBatch(context.Background(), f.id, 0))
	if got := f.provider.total(); got != 2 {
		t.Fatalf("provider got %d, want the dead run's 2 only", got)
	}
	if err := f.rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	fr.Clear()
	f.leaseExpired(t)
	notFailure(t, h.RunBatch(context.Background(), f.id, 0))
	f.assertOnce(t)
	if c := f.counts(t); c.Unknown != 5 || c.Pending != 0 || f.provider.total() != 2 {
		t.Fatalf("counts %+v, %d messages; want the taken-over chunk unknown and nothing resent", c, f.provider.total())
	}
}

// A delivery receipt that arrives while the send's answer is held (the recipient still pending) proves the
// provider accepted the message: the unknown the worker then records becomes sent, and `resume
// --resend-unknown` leaves it alone. A receipt that comes only after the resend made a recipient pending
// again stops that send too. Only recipients with no evidence are sent again.
func TestReceiptsProveASendWhateverTheWorkerSaw(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	ctx := context.Background()
	ambiguous := &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
	f.provider.fail = func(_ int, m providers.Message) error {
		switch m.To {
		case phone(2):
			// The receipt overtakes the answer, which never comes.
			if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u2",
				MessageID: "SMu2", Status: campaign.DeliveryDelivered}}); err != nil {
				t.Error(err)
			}
			return ambiguous
		case phone(4), phone(7):
			return ambiguous
		}
		return nil
	}
	f.runAll(t)
	f.provider.fail = nil
	var msgID, lastErr string
	if err := f.db.QueryRow(ctx, `SELECT coalesce(provider_message_id, ''), coalesce(last_error, '') FROM campaign_recipients
		WHERE campaign_id = $1 AND user_id = 'u2'`, f.id).Scan(&msgID, &lastErr); err != nil {
		t.Fatal(err)
	}
	if st, _, code := f.status(t, "u2"); st != campaign.StatusSent || code == "" || msgID != "SMu2" || lastErr == "" {
		t.Fatalf("u2: %s, code %q, message %q, last error %q; want sent with its code and the receipt's message ID, the lost answer kept as its last error",
			st, code, msgID, lastErr)
	}
	// The operator resends the unknown (resume --resend-unknown); u7's receipt comes in between.
	unknown, err := f.store.Unknown(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(unknown)
	if len(unknown) != 2 || unknown[0] != "u4" || unknown[1] != "u7" {
		t.Fatalf("unknown %v, want u4 and u7 (u2's receipt proved its send)", unknown)
	}
	if _, err := ForgetUnanswered(ctx, f.rdb, f.campaign(t), unknown, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.Resend(ctx, f.id, unknown); err != nil || n != 2 {
		t.Fatalf("resend moved %d (%v), want 2", n, err)
	}
	// The campaign had completed: the resend runs it again.
	if c := f.campaign(t); c.State != campaign.StateRunning {
		t.Fatalf("campaign %s after the resend, want running", c.State)
	}
	if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u7",
		MessageID: "SMu7", Status: campaign.DeliverySent}}); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	for to, want := range map[string]int{phone(1): 1, phone(2): 1, phone(4): 2, phone(7): 1, phone(8): 1} {
		if got := len(f.provider.accepted[to]); got != want {
			t.Errorf("%s reached the provider %d times, want %d", to, got, want)
		}
	}
	for u, want := range map[string]string{"u2": campaign.StatusSent, "u4": campaign.StatusSent, "u7": campaign.StatusSent} {
		if st, _, _ := f.status(t, u); st != want {
			t.Errorf("%s: %s, want %s", u, st, want)
		}
	}
	if released := count(t, f, `SELECT count(*) FROM released_codes`); released != 0 {
		t.Errorf("%d codes went back to the pool; every recipient here was (maybe) sent", released)
	}
}

func count(t *testing.T, f *fixture, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A provider's cap binds through the handler, over two handlers (two workers) sending at once: the
// sandbox never accepts more than the cap in any second.
func TestProviderCapBindsThroughTheHandler(t *testing.T) {
	t.Parallel()
	const rate = 20
	f := planWith(t, 90, func(s *campaign.Spec) { s.BatchSize = 30 }) // 48 eligible in 3 batches
	sb := sandbox.New(sandbox.Options{TwilioAccountSID: "ACcap0000000000000000000000000000", TwilioAuthToken: "captoken"})
	srv := httptest.NewServer(sb)
	defer srv.Close()
	p, err := twilio.New(twilio.Config{AccountSID: "ACcap0000000000000000000000000000", AuthToken: "captoken", From: "+905550000000",
		BaseURL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	handler := func() *Handler {
		return NewHandler(Config{Store: f.store, Redis: f.rdb, Owner: "cap",
			Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p},
			ProviderRates: map[string]float64{"twilio": rate}})
	}
	errs := make(chan error, f.batches)
	for b := 0; b < f.batches; b++ {
		h := handler()
		go func() { errs <- h.RunBatch(context.Background(), f.id, b) }()
	}
	for range f.batches {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	msgs := sb.Messages()
	c := f.counts(t)
	if len(msgs) != int(c.Sent) || c.Pending != 0 || c.Sent < 40 {
		t.Fatalf("sandbox accepted %d, counts %+v", len(msgs), c)
	}
	at := make([]time.Time, len(msgs))
	for i, m := range msgs {
		at[i] = m.At
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	// In any one-second window: the cap plus its burst (one token), and a token of slack for the time
	// between a token and its request's arrival.
	for i := range at {
		j := i
		for j < len(at) && at[j].Sub(at[i]) < time.Second {
			j++
		}
		if n := j - i; n > rate+2 {
			t.Fatalf("%d messages accepted within a second from %s, cap %d/s", n, at[i].Format("15:04:05.000"), rate)
		}
	}
	if span := at[len(at)-1].Sub(at[0]); span < time.Duration(float64(len(at)-rate-2)/rate*float64(time.Second)) {
		t.Fatalf("%d messages in %v at a cap of %d/s", len(at), span, rate)
	}
}

// Tokens held through a stall are not spent after it: workers under a cap of 100/s each find their claim
// stalled once for 600 ms on Redis (their tokens taken), while the others go on taking the bucket's. The
// held sends take their tokens again before they leave, so no second holds more than the cap, its burst
// (5) and two tokens of slack. Sent with the tokens of before the stall, each stalled window landed on top
// of the others' (115 in a second with three workers sending windows, 1.15 times the cap); so did each
// stalled message of six workers sending one at a time (110).
func TestTokensHeldThroughAStallAreTakenAgain(t *testing.T) {
	t.Parallel()
	const rate = 100
	for _, tc := range []struct {
		window, workers int
		claim           string
	}{{8, 3, "ClaimWindow"}, {1, 6, "ClaimSend"}} {
		t.Run(fmt.Sprintf("%d workers sending %d at a time", tc.workers, tc.window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 600, func(s *campaign.Spec) { s.BatchSize = 330 / tc.workers })
			if f.batches < tc.workers {
				t.Fatalf("%d batches for %d workers", f.batches, tc.workers)
			}
			at := f.sendTimes()
			rules := make([]*faults.Rule, 0, tc.workers)
			errs := make(chan error, tc.workers)
			m := metrics.New(nil)
			for b := range tc.workers {
				h, fr, _ := f.faulty(t, func(c *Config) {
					c.SendWindow, c.ProviderRates, c.Metrics = tc.window, map[string]float64{"test": rate}, m
				})
				// Each worker's fourth claim (or so) stalls; they take turns at the bucket, so the stalls overlap.
				rules = append(rules, fr.Add(&faults.Rule{Match: faults.Method(tc.claim), Skip: 3 + b, Times: 1, Kind: faults.Stall, Delay: 600 * time.Millisecond}))
				go func() { errs <- h.RunBatch(context.Background(), f.id, b) }()
			}
			for range tc.workers {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for i, r := range rules {
				if r.Hits() != 1 {
					t.Fatalf("worker %d: its claim stalled %d times, want once: this tests nothing", i, r.Hits())
				}
			}
			f.assertOnce(t)
			sent := at()
			if len(sent) < 2*rate {
				t.Fatalf("%d messages sent, want over two seconds' worth", len(sent))
			}
			busiest, from := busiestSecond(sent)
			// The bucket's burst, and the tokens of the 25 ms a send may hold them (staleTokens).
			if busiest > rate+limiter.Burst(rate)+2 {
				t.Fatalf("%d messages within a second from %s, cap %d/s (burst %d)", busiest, from.Format("15:04:05.000"), rate, limiter.Burst(rate))
			}
			// A send's wait for its limit is observed once, however many times it took its tokens.
			if n, _ := histogram(t, m.Registry(), "campaignctl_limiter_wait_seconds", map[string]string{"key_kind": "provider", "provider": "test"}); n != uint64(len(sent)) {
				t.Fatalf("%d waits for the provider's limit observed for %d sends", n, len(sent))
			}
		})
	}
}

// A send whose claim stalled, and which then cannot take its tokens again (its chunk's lease was taken
// over meanwhile), sends nothing and gives back what the claim took: the claim, and the frequency mark
// that would cap the address for other campaigns.
func TestASendThatCannotTakeItsTokensAgainGivesBackItsClaimAndMark(t *testing.T) {
	t.Parallel()
	f := planWith(t, 4, func(s *campaign.Spec) { s.FrequencyCap = time.Hour }) // eligible: u1 u2 u4
	h, fr, _ := f.faulty(t, func(c *Config) {
		c.SendWindow, c.ProviderRates, c.LeaseTTL = 1, map[string]float64{"test": 100}, 300*time.Millisecond
	})
	rule := fr.Add(&faults.Rule{Match: faults.Method("ClaimSend"), Times: 1, Kind: faults.Stall, Delay: 400 * time.Millisecond})
	go func() {
		// Once u1's claim is stalled (its chunk leased, its tokens taken), another run takes the chunk over.
		for end := time.Now().Add(10 * time.Second); rule.Hits() == 0 && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := f.db.Exec(context.Background(), `UPDATE campaign_batches SET lease_token = 'other run', lease_until = now() + interval '1 minute'
			WHERE campaign_id = $1 AND batch = 0`, f.id); err != nil {
			t.Error(err)
		}
	}()
	err := h.RunBatch(context.Background(), f.id, 0)
	if err == nil || !strings.Contains(err.Error(), "lost to another run") || rule.Hits() != 1 {
		t.Fatalf("RunBatch: %v after %d stalled claims; want it to stop on the lease lost while the claim stalled", err, rule.Hits())
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent by a run whose tokens went stale and whose lease was lost", n)
	}
	ctx := context.Background()
	waitUntil(t, 5*time.Second, "u1's claim given back", func() bool {
		n, err := f.rdb.Exists(ctx, ClaimKey(f.id, "u1")).Result()
		return err == nil && n == 0
	})
	keys, err := f.rdb.Keys(ctx, "freq:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ok, _ := f.rdb.HExists(ctx, k, phone(1)).Result(); ok {
			t.Fatalf("u1's frequency mark kept in %s although nothing was sent", k)
		}
	}
}

// A RET recorded after the launch blocks the e-mail path as it does the SMS one: the person is skipped
// (revoked), the others of the request are sent.
func TestRETAfterLaunchBlocksTheEmailPath(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, _, id, p, h := planEmailDB(t, 4, 10, rdb)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `UPDATE iys_consents SET status = 'RET', updated_at = now() WHERE recipient = 'user3@example.com'`); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.accepted["user3@example.com"]) != 0 {
		t.Fatal("user3 revoked consent after the launch and was e-mailed")
	}
	if len(p.accepted) != 3 {
		t.Fatalf("%d addresses e-mailed, want the 3 with consent", len(p.accepted))
	}
	var st, reason string
	if err := db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u3'`, id).Scan(&st, &reason); err != nil {
		t.Fatal(err)
	}
	if st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("u3: %s (%s), want skipped (revoked)", st, reason)
	}
}

// The parsed template of a campaign is never used for another campaign with the same ID (the engine
// database re-created while the worker runs: IDs start again at 1), and a finished campaign's is dropped.
func TestTemplateCacheNeverServesAnotherCampaignOfTheSameID(t *testing.T) {
	t.Parallel()
	f := plan(t, 20) // two batches of 10
	ctx := context.Background()
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if f.h.cachedTemplates() != 1 {
		t.Fatalf("%d templates cached while the campaign runs, want 1", f.h.cachedTemplates())
	}
	// Campaign f.id is now another campaign: created later, with another text.
	if _, err := f.db.Exec(ctx, `UPDATE campaigns SET message = 'Yeni metin {{.code}}', created_at = created_at + interval '1 hour' WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	if err := f.h.RunBatch(ctx, f.id, 1); err != nil {
		t.Fatal(err)
	}
	for _, u := range f.batchUsersOf(t, 1) {
		bodies := f.provider.accepted[u]
		if len(bodies) != 1 || bodies[0][:10] != "Yeni metin" {
			t.Fatalf("%s got %q, want the campaign's text as it is now", u, bodies)
		}
	}
	if c := f.counts(t); c.Pending != 0 {
		t.Fatalf("counts %+v", c)
	}
	if n := f.h.cachedTemplates(); n != 0 {
		t.Fatalf("%d templates cached after the campaign completed, want 0", n)
	}
}

// batchUsersOf returns the addresses of the sent recipients of one batch.
func (f *fixture) batchUsersOf(t *testing.T, batch int) (addrs []string) {
	t.Helper()
	rows, err := f.db.Query(context.Background(), `SELECT address FROM campaign_recipients WHERE campaign_id = $1 AND batch = $2 AND status = 'sent'`, f.id, batch)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		t.Fatalf("batch %d sent nobody", batch)
	}
	return addrs
}

// A message that renders longer than the campaign's --max-segments (a long value for one recipient) is
// not sent: the recipient fails with the reason, its code goes back to the pool, the others go out.
func TestSMSLongerThanMaxSegmentsFailsAtSendTime(t *testing.T) {
	t.Parallel()
	f := planWith(t, 4, func(s *campaign.Spec) { s.MaxSegments = 1 }) // eligible u1 u2 u4
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `UPDATE campaign_recipients SET vars = jsonb_set(vars, '{first_name}', to_jsonb(repeat('ı', 80)))
		WHERE campaign_id = $1 AND user_id = 'u2'`, f.id); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if len(f.provider.accepted[phone(2)]) != 0 {
		t.Fatal("u2's two-segment message was sent under --max-segments 1")
	}
	st, reason, code := f.status(t, "u2")
	if st != campaign.StatusFailed || !strings.Contains(reason, "2 SMS segments") || code != "" {
		t.Fatalf("u2: %s (%s), code %q; want failed naming the segments, code released", st, reason, code)
	}
	if f.provider.total() != 2 {
		t.Fatalf("provider got %d, want u1 and u4", f.provider.total())
	}
}

// A subject that would hold a line break once rendered (a value changed after the launch) is not sent:
// the recipient fails as invalid_value, the others of the request go out.
func TestEmailSubjectWithALineBreakIsNotSent(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, _, id, p, h := planEmailDB(t, 3, 10, rdb)
	ctx := context.Background()
	// The worker renders the subject over the values the plan stored: one of them now holds a line break.
	if _, err := db.Exec(ctx, `UPDATE campaigns SET subject = 'Merhaba {{.first}}' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET vars = jsonb_build_object('first', CASE user_id WHEN 'u2' THEN E'Ali\r\nBcc: all@example.com' ELSE 'Ada' END)
		WHERE campaign_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.accepted["user2@example.com"]) != 0 || len(p.accepted) != 2 {
		t.Fatalf("accepted %d addresses (user2: %d), want the two others only", len(p.accepted), len(p.accepted["user2@example.com"]))
	}
	var st, reason string
	if err := db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2'`, id).Scan(&st, &reason); err != nil {
		t.Fatal(err)
	}
	if st != campaign.StatusFailed || !strings.Contains(reason, campaign.ReasonInvalidValue) {
		t.Fatalf("u2: %s (%s), want failed as invalid_value", st, reason)
	}
}

// A run takes over a dead run's chunk whose users come in its third chunk, and dies (its outcomes never
// recorded) while sending its second: the dead run's users must still be in hand, so that when Redis then
// loses its data they become unknown instead of being sent again.
func TestTakenOverUsersStayInHandUntilTheirClaimsAreRead(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	ctx := context.Background()
	c := f.campaign(t)
	users := f.batchUsers(t, 0)
	dead := users[len(users)-1:]
	epoch, err := Epoch(ctx, f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.LeaseChunk(ctx, c, dead, campaign.Lease{Token: "dead", Epoch: epoch, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	f.rdb.Set(ctx, ClaimKey(f.id, dead[0]), Nonce(c)+"/"+state.SentValue("SMdead", 1), 0)
	var deadPhone string
	if err := f.db.QueryRow(ctx, `SELECT address FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, f.id, dead[0]).Scan(&deadPhone); err != nil {
		t.Fatal(err)
	}
	f.provider.mu.Lock()
	f.provider.accepted[deadPhone] = []string{"sent by the dead run"}
	f.provider.mu.Unlock()
	time.Sleep(5 * time.Millisecond)

	h, _, fs := f.faulty(t, func(c *Config) { c.ChunkSize = 2; c.LeaseTTL = 200 * time.Millisecond })
	// The first chunk is recorded; then the run's writes to Postgres fail: it dies with its second chunk.
	fs.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Skip: 1, Kind: faults.Fail})
	notFailure(t, h.RunBatch(ctx, f.id, 0))
	var inHand []string
	if err := f.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&inHand); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(inHand, dead[0]) {
		t.Fatalf("chunk in hand %v after the run died: the dead run's %s is not in it", inHand, dead[0])
	}
	if err := f.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f.leaseExpired(t)
	f.runAll(t)
	f.assertOnce(t)
	if st, _, _ := f.status(t, dead[0]); st != campaign.StatusUnknown {
		t.Fatalf("%s: %s, want unknown (sent by the dead run, its claim lost with Redis)", dead[0], st)
	}
}

// sendTimes records when each message of f's provider is sent (its before hook); the function it returns
// gives those times, in order.
func (f *fixture) sendTimes() func() []time.Time {
	var mu sync.Mutex
	var at []time.Time
	f.provider.before = func(providers.Message) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
	}
	return func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		sorted := slices.Clone(at)
		slices.SortFunc(sorted, func(a, b time.Time) int { return a.Compare(b) })
		return sorted
	}
}

// busiestSecond returns the most of the times at (in order) within one second, whatever second, and the
// first of them.
func busiestSecond(at []time.Time) (int, time.Time) {
	most, from := 0, time.Time{}
	for i := range at {
		j := i
		for j < len(at) && at[j].Sub(at[i]) < time.Second {
			j++
		}
		if j-i > most {
			most, from = j-i, at[i]
		}
	}
	return most, from
}

// A claim whose reply was lost may still be written later: a Redis frozen (SIGSTOP, a stalled VM) runs
// the command from the given-up connection when it resumes, however long it was frozen. The background
// release passes again after its first success, and undoes such a claim. Before, the tries stopped a
// minute after the failure: an outside run froze Redis 72 s and more, and 40 to 248 recipients, never
// sent, were recorded unknown (4 of 5 runs).
func TestAClaimWrittenAfterItsReleaseSucceededIsReleasedToo(t *testing.T) {
	t.Parallel()
	f := plan(t, 3)
	ctx := context.Background()
	key, nonce, inflight := ClaimKey(f.id, "u1"), "n1", state.InFlightValue(time.Now(), "w")
	f.h.releaseLater(key, nonce, inflight) // Redis answers at once: nothing to release yet
	time.Sleep(200 * time.Millisecond)
	// The claim command, run late by the resumed Redis.
	if err := f.rdb.Set(ctx, key, nonce+"/"+inflight, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(backgroundAgain + 3*time.Second)
	for f.rdb.Exists(ctx, key).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the claim %s written after its release's first success is still there %v later", key, backgroundAgain+3*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
