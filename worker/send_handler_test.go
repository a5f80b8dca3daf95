package worker

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// scriptedProvider records every message it accepts and can be told to fail particular calls. It stands
// in for the provider's network behaviour only; Postgres and Redis are real.
type scriptedProvider struct {
	mu       sync.Mutex
	accepted map[string][]string // To -> bodies
	calls    int
	fail     func(call int, m providers.Message) error
	// before runs ahead of each call, outside the lock (it may run another batch).
	before func(m providers.Message)
}

func newProvider() *scriptedProvider { return &scriptedProvider{accepted: map[string][]string{}} }

func (p *scriptedProvider) Name() string { return "test" }

func (p *scriptedProvider) Send(_ context.Context, m providers.Message) (providers.Result, error) {
	if p.before != nil {
		p.before(m)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail != nil {
		if err := p.fail(p.calls, m); err != nil {
			var pe *providers.Error
			if errors.As(err, &pe) && pe.Class == providers.Ambiguous {
				p.accepted[m.To] = append(p.accepted[m.To], m.Body) // written, accepted, answer lost
			}
			return providers.Result{}, err
		}
	}
	p.accepted[m.To] = append(p.accepted[m.To], m.Body)
	return providers.Result{MessageID: fmt.Sprintf("SM%d", p.calls), Segments: 1}, nil
}

// sentTo returns the bodies accepted for to.
func (p *scriptedProvider) sentTo(to string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.accepted[to])
}

func (p *scriptedProvider) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.accepted {
		n += len(b)
	}
	return n
}

// fixture is a planned campaign on its own database and Redis DB.
type fixture struct {
	db       *pgxpool.Pool
	rdb      *redis.Client
	store    *campaign.Store
	provider *scriptedProvider
	h        *Handler
	id       int64
	batches  int
}

// plan seeds n customers (every third has RET, every fifth has no consent row) with a code pool and
// launches one campaign in batches of 10.
func plan(t testing.TB, n int) *fixture { t.Helper(); return planWith(t, n, nil) }

// planWith is plan with the campaign spec adjusted by edit.
func planWith(t testing.TB, n int, edit func(*campaign.Spec)) *fixture {
	t.Helper()
	return planAround(t, n, edit, nil)
}

// planAround is planWith with during run once the customers and consents are in, around the launch: it
// gets the database and the launch to run (during calls it exactly once).
func planAround(t testing.TB, n int, edit func(*campaign.Spec), during func(db *pgxpool.Pool, launch func())) *fixture {
	t.Helper()
	db, _ := testdb.New(t)
	rdb, _ := testredis.New(t)
	return planOn(t, db, rdb, n, edit, during)
}

// planOn is planAround on a migrated database and a Redis of the test's choosing (a private server it may
// crash or empty).
func planOn(t testing.TB, db *pgxpool.Pool, rdb *redis.Client, n int, edit func(*campaign.Spec), during func(db *pgxpool.Pool, launch func())) *fixture {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE customers (user_id text, phone text, first_name text)`)
	exec(`GRANT SELECT ON customers TO campaignctl_audience`)
	exec(`INSERT INTO customers SELECT 'u' || i, '+90532' || lpad(i::text, 7, '0'), 'Name' || i FROM generate_series(1, $1) i`, n)
	exec(`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT '+90532' || lpad(i::text, 7, '0'), 'MESAJ', 'BIREYSEL', CASE WHEN i % 3 = 0 THEN 'RET' ELSE 'ONAY' END, 'HS_WEB', now()
		FROM generate_series(1, $1) i WHERE i % 5 <> 0`, n)
	exec(`INSERT INTO code_pools (name) VALUES ('p')`)
	exec(`INSERT INTO promo_codes (pool, code) SELECT 'p', 'C' || i FROM generate_series(1, $1) i`, 3*n)
	spec := fixtureSpec("t")
	if edit != nil {
		edit(&spec)
	}
	var rep campaign.Report
	var err error
	launch := func() { rep, err = (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, spec) }
	if during != nil {
		during(db, launch)
	} else {
		launch()
	}
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, rdb: rdb, store: campaign.NewStore(db), provider: newProvider(), id: rep.ID, batches: rep.Batches}
	f.h = f.handler(rdb)
	return f
}

func fixtureSpec(name string) campaign.Spec {
	return campaign.Spec{
		Name: name, Channel: campaign.ChannelSMS, CodePool: "p", BatchSize: 10,
		AudienceSQL: `SELECT user_id, phone, first_name FROM customers`,
		Message:     `Merhaba {{.first_name}}, kodunuz {{.code}}`,
	}
}

// handler sends one message at a time (SendWindow 1), so that tests can tell which recipient a fault
// or a crash met; the windowed path has tests of its own.
func (f *fixture) handler(rdb redis.UniversalClient) *Handler {
	return NewHandler(Config{
		Store: f.store, Redis: rdb, Owner: "test", SendWindow: 1,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider},
		ProviderRates: map[string]float64{},
	})
}

func (f *fixture) runAll(t *testing.T) {
	t.Helper()
	for b := 0; b < f.batches; b++ {
		if err := f.h.RunBatch(context.Background(), f.id, b); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
	}
}

func (f *fixture) status(t *testing.T, user string) (status, reason, code string) {
	t.Helper()
	var r, c *string
	err := f.db.QueryRow(context.Background(), `SELECT status, reason, code FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`,
		f.id, user).Scan(&status, &r, &c)
	if err != nil {
		t.Fatalf("recipient %s: %v", user, err)
	}
	if r != nil {
		reason = *r
	}
	if c != nil {
		code = *c
	}
	return
}

func (f *fixture) counts(t *testing.T) campaign.Counts {
	t.Helper()
	c, err := f.store.Counts(context.Background(), f.id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func phone(i int) string { return fmt.Sprintf("+90532%07d", i) }

func TestEveryEligibleRecipientGetsExactlyOneMessageWithItsCode(t *testing.T) {
	t.Parallel()
	f := plan(t, 150)
	f.runAll(t)

	// 150 customers: 30 without consent (i%5==0), 40 RET among the rest (i%3==0, i%5!=0): 80 eligible.
	if got := f.provider.total(); got != 80 {
		t.Fatalf("provider accepted %d messages, want 80", got)
	}
	seenCodes := map[string]string{}
	for i := 1; i <= 150; i++ {
		bodies := f.provider.accepted[phone(i)]
		eligible := i%5 != 0 && i%3 != 0
		if !eligible {
			if len(bodies) != 0 {
				t.Errorf("customer %d has no consent (or RET) but got %d messages", i, len(bodies))
			}
			continue
		}
		if len(bodies) != 1 {
			t.Fatalf("customer %d got %d messages, want 1", i, len(bodies))
		}
		st, _, code := f.status(t, fmt.Sprintf("u%d", i))
		if st != campaign.StatusSent {
			t.Errorf("u%d status %s, want sent", i, st)
		}
		if want := fmt.Sprintf("Merhaba Name%d, kodunuz %s", i, code); bodies[0] != want {
			t.Errorf("u%d got %q, want %q", i, bodies[0], want)
		}
		if other, dup := seenCodes[code]; dup {
			t.Errorf("code %s sent to u%d and %s", code, i, other)
		}
		seenCodes[code] = fmt.Sprintf("u%d", i)
	}
	c, err := f.store.Get(context.Background(), f.id)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != campaign.StateCompleted {
		t.Errorf("campaign state %s, want completed", c.State)
	}
	progress, err := f.rdb.HGetAll(context.Background(), ProgressKey(f.id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	// One SMS segment a message: the supervisor reads the segments a message takes from the counters.
	if progress["sent"] != "80" || progress[state.ProgressSegments] != "80" {
		t.Errorf("progress counters %v, want sent=80, segments=80", progress)
	}
}

func TestRedeliveredBatchSendsNothingAgain(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	f.runAll(t)
	before := f.provider.total()
	// Every batch delivered again (a lease lost, a second enqueue after success) ...
	f.runAll(t)
	// ... moves nothing into sent, and adds no segments.
	if p := f.rdb.HMGet(context.Background(), ProgressKey(f.id), "sent", state.ProgressSegments).Val(); fmt.Sprint(p) != fmt.Sprintf("[%d %d]", before, before) {
		t.Errorf("progress counters sent, segments after a redelivery: %v; want %d each", p, before)
	}
	// ... and even with Postgres forgetting the outcomes (a crash before the bulk write): the claims hold.
	if _, err := f.db.Exec(context.Background(), `UPDATE campaign_recipients SET status = 'pending' WHERE campaign_id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(context.Background(), `UPDATE campaigns SET state = 'running' WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if after := f.provider.total(); after != before {
		t.Fatalf("redelivery sent %d more messages", after-before)
	}
	if c := f.counts(t); c.Sent != int64(before) || c.Pending != 0 {
		t.Errorf("counts after redelivery %+v, want %d sent, none pending", c, before)
	}
}

func TestRedisUnreachableSendsNothing(t *testing.T) {
	t.Parallel()
	f := plan(t, 20)
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer dead.Close()
	h := f.handler(dead)
	for b := 0; b < f.batches; b++ {
		if err := h.RunBatch(context.Background(), f.id, b); err == nil {
			t.Fatalf("batch %d ran with Redis unreachable and returned no error", b)
		}
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent while Redis was unreachable", n)
	}
	if c := f.counts(t); c.Pending != c.Planned {
		t.Fatalf("counts %+v: recipients left pending state while nothing could be sent", c)
	}
}

func TestConsentRevokedAfterLaunchBlocksTheSend(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	// u1 answers RET through İYS after the launch.
	if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = $1`, phone(1)); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(1)]); n != 0 {
		t.Fatalf("u1 revoked consent but got %d messages", n)
	}
	st, reason, code := f.status(t, "u1")
	if st != campaign.StatusSkipped || reason != campaign.ReasonRevoked || code != "" {
		t.Fatalf("u1: status %s reason %s code %q, want skipped/revoked with the code released", st, reason, code)
	}
	// 30 codes, 5 eligible planned, u1's code given back.
	if free, err := codes.Free(context.Background(), f.db, "p"); err != nil || free != 26 {
		t.Fatalf("%d free codes (%v), want 26: u1's code must go back to the pool", free, err)
	}
}

func TestTransientErrorsRetryAndKeepTheCode(t *testing.T) {
	t.Parallel()
	f := plan(t, 4) // eligible: u1, u2, u4
	failures := 0
	f.provider.fail = func(call int, m providers.Message) error {
		if m.To == phone(2) && failures < 2 {
			failures++
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(2)]); n != 1 {
		t.Fatalf("u2 got %d messages after two 503s, want exactly 1", n)
	}
	_, _, code := f.status(t, "u2")
	if !strings.HasSuffix(f.provider.accepted[phone(2)][0], code) {
		t.Errorf("u2's message %q does not carry its reserved code %s", f.provider.accepted[phone(2)][0], code)
	}
}

func TestTransientErrorsExhaustedLeaveThePendingForTheQueue(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 429, Code: 20429, RetryAfter: 10 * time.Millisecond, Class: providers.Transient}
	}
	err := f.h.RunBatch(context.Background(), f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || !re.Failure {
		t.Fatalf("err = %v, want a RetryError counted as failure", err)
	}
	if c := f.counts(t); c.Pending != c.Planned {
		t.Fatalf("counts %+v, want all pending", c)
	}
	// The claims were released: once the provider recovers, the recipients are sent.
	f.provider.fail = nil
	f.runAll(t)
	if got := f.provider.total(); got != 3 {
		t.Fatalf("sent %d after recovery, want 3", got)
	}
}

func TestPermanentErrorFailsTheRecipientAndReleasesItsCode(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(1) {
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Message: "opted out", Class: providers.Permanent}
		}
		return nil
	}
	f.runAll(t)
	st, reason, code := f.status(t, "u1")
	if st != campaign.StatusFailed || !strings.Contains(reason, "21610") || code != "" {
		t.Fatalf("u1: %s %q code %q; want failed with 21610 and no code", st, reason, code)
	}
	// 12 codes, 3 reserved at plan, 1 released
	if free, err := codes.Free(context.Background(), f.db, "p"); err != nil || free != 10 {
		t.Errorf("%d free codes (%v), want 10", free, err)
	}
	// A rerun never retries the permanent failure.
	calls := f.provider.calls
	f.h.RunBatch(context.Background(), f.id, 0) //nolint:errcheck
	if f.provider.calls != calls {
		t.Errorf("permanent failure was retried")
	}
}

func TestAccountLevelRejectionFailsNobody(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "twilio", Status: 401, Code: 20003, Message: "Authenticate", Class: providers.Permanent}
	}
	if err := f.h.RunBatch(context.Background(), f.id, 0); err == nil {
		t.Fatal("bad credentials: want an error that keeps the batch for retry")
	}
	if c := f.counts(t); c.Failed != 0 || c.Pending != c.Planned {
		t.Fatalf("counts %+v: recipients must stay pending when the account is refused", c)
	}
}

func TestAmbiguousTimeoutIsUnknownAndNotResent(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(2) {
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		}
		return nil
	}
	f.runAll(t)
	if st, _, _ := f.status(t, "u2"); st != campaign.StatusUnknown {
		t.Fatalf("u2 status %s, want unknown", st)
	}
	f.provider.fail = nil
	if _, err := f.db.Exec(context.Background(), `UPDATE campaign_recipients SET status = 'pending' WHERE user_id = 'u2'`); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(2)]); n != 1 {
		t.Fatalf("u2 reached the provider %d times; an ambiguous send must not be repeated", n)
	}
}

func TestClaimLeftByACrashedWorker(t *testing.T) {
	t.Parallel()
	f := plan(t, 7) // eligible: u1, u2, u4, u7
	ctx := context.Background()
	now := time.Now()
	c, err := f.store.Get(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}
	n := Nonce(c) + "/"
	// u1: a dead worker claimed it long ago and never recorded an answer: maybe sent, so unknown.
	f.rdb.Set(ctx, ClaimKey(f.id, "u1"), n+state.InFlightValue(now.Add(-10*time.Minute), "dead:1"), 0)
	// u2: the provider answered, the worker died before the bulk write: sent, not resent.
	f.rdb.Set(ctx, ClaimKey(f.id, "u2"), n+state.SentValue("SMabc", 1), 0)
	// u4: a live worker is sending it right now: leave it alone, come back later.
	f.rdb.Set(ctx, ClaimKey(f.id, "u4"), n+state.InFlightValue(now, "live:2"), 0)
	// u5 is not eligible; u7 has a claim left by an earlier campaign of the same ID, of a database since
	// re-created.
	f.rdb.Set(ctx, ClaimKey(f.id, "u7"), "oldnonce/"+state.SentValue("SMstale", 1), 0)

	err = f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("err = %v, want a RetryError that is not a failure (u4 is in flight elsewhere)", err)
	}
	if f.provider.total() != 1 || len(f.provider.accepted[phone(7)]) != 1 {
		t.Fatalf("sent %v; want exactly one message, to u7, whose claim was an earlier campaign's", f.provider.accepted)
	}
	for user, want := range map[string]string{"u1": campaign.StatusUnknown, "u2": campaign.StatusSent, "u4": campaign.StatusPending, "u7": campaign.StatusSent} {
		if st, _, _ := f.status(t, user); st != want {
			t.Errorf("%s: status %s, want %s", user, st, want)
		}
	}
}

func TestRETRecordedMidBatchBlocksTheNextChunk(t *testing.T) {
	t.Parallel()
	f := plan(t, 4) // eligible u1, u2, u4 in one batch
	f.h.cfg.ChunkSize = 1
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(1) {
			// While u1 is being sent, u2 answers RET through İYS.
			if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = $1`, phone(2)); err != nil {
				t.Error(err)
			}
		}
		return nil
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(2)]); n != 0 {
		t.Fatalf("u2 revoked consent during the batch but got %d messages", n)
	}
	if st, reason, _ := f.status(t, "u2"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("u2: %s/%s, want skipped/revoked", st, reason)
	}
	if n := len(f.provider.accepted[phone(4)]); n != 1 {
		t.Fatalf("u4 got %d messages, want 1", n)
	}
}

func TestPauseAndStopHandTheRestBack(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"pause", "stop"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := plan(t, 4)
			f.h.cfg.ChunkSize = 1
			f.provider.fail = func(call int, _ providers.Message) error {
				if call == 1 {
					if how == "pause" {
						f.db.Exec(context.Background(), `UPDATE campaigns SET state = 'paused' WHERE id = $1`, f.id) //nolint:errcheck
					} else {
						f.h.Stop()
					}
				}
				return nil
			}
			err := f.h.RunBatch(context.Background(), f.id, 0)
			var re *RetryError
			if !errors.As(err, &re) || re.Failure {
				t.Fatalf("err = %v, want a RetryError that is not a failure", err)
			}
			c := f.counts(t)
			if f.provider.total() != 1 || c.Sent != 1 || c.Pending != 2 {
				t.Fatalf("after %s: provider %d, counts %+v; want the message in flight finished and recorded, 2 pending", how, f.provider.total(), c)
			}
		})
	}
}

// Two campaigns reach the same people within the frequency cap: the second one's sends are skipped
// (frequency_cap), while a redelivered batch of the first is not stopped by its own mark.
func TestFrequencyCapAcrossCampaignsAtSendTime(t *testing.T) {
	t.Parallel()
	// The second campaign is planned before the first sends, so the plan-time exclusion cannot see it.
	f, second := sentByTheFirstOfTwo(t)
	f.runAll(t) // redelivered: nothing more, and nothing skipped by its own mark
	if got := f.provider.total(); got != 3 {
		t.Fatalf("first campaign: %d messages, want 3", got)
	}
	if c := f.counts(t); c.Sent != 3 || c.Skipped != 0 {
		t.Fatalf("first campaign counts %+v", c)
	}
	if err := f.h.RunBatch(context.Background(), second, 0); err != nil {
		t.Fatal(err)
	}
	f.secondKeptTheCap(t, second)
	// And a third campaign, planned now, excludes them at plan time.
	third, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(context.Background(),
		func() campaign.Spec { s := fixtureSpec("third"); s.FrequencyCap = time.Hour; s.DryRun = true; return s }())
	if err != nil {
		t.Fatal(err)
	}
	if third.Excluded[campaign.ReasonFrequencyCap] != 3 || third.Eligible != 0 {
		t.Fatalf("third campaign: eligible %d, excluded %v; want all 3 excluded by the frequency cap", third.Eligible, third.Excluded)
	}
}

// The frequency cap holds across a Redis data loss: the marks of the sends before it are written back from
// the audit log before anything is claimed under the new epoch. Before, a second campaign planned side by
// side with the first reached again, after a FLUSHALL and a resume, everyone the first had reached.
func TestFrequencyCapHoldsAfterRedisLosesItsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, second := sentByTheFirstOfTwo(t)
	if err := f.rdb.FlushDB(ctx).Err(); err != nil { // the test's own Redis DB
		t.Fatal(err)
	}
	if err := f.h.RunBatch(ctx, second, 0); err != nil {
		t.Fatal(err)
	}
	f.secondKeptTheCap(t, second)
	// Written back once for the epoch: a later run does not write them again.
	epoch, err := f.rdb.Get(ctx, state.EpochKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	if done, err := f.rdb.Get(ctx, state.MarksKey).Result(); err != nil || done != epoch {
		t.Fatalf("marks written back for %q (%v), want the epoch %q", done, err, epoch)
	}
}

// The marks are written back only once no chunk is in hand under the epoch before the loss: a run that
// leased before it records its answered sends in the audit log when its chunk ends (slow provider calls
// can make that seconds later), and a rebuild read before would miss them. An outside check found 1,915
// people reached twice that way.
func TestTheMarksWaitForTheChunksLeasedBeforeTheLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, second := sentByTheFirstOfTwo(t)
	// A run of the first campaign still has a chunk in hand, leased before the loss.
	if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET lease_token = 'alive', lease_epoch = 'before-the-loss',
		lease_until = now() + interval '1 minute', lease_users = '{u1}' WHERE campaign_id = $1 AND batch = 0`, f.id); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	err := f.h.RunBatch(ctx, second, 0)
	if !errors.Is(err, state.ErrMarksPending) {
		t.Fatalf("RunBatch while a chunk of the epoch before is in hand: %v, want a wait for it", err)
	}
	notFailure(t, err)
	if got := f.provider.total(); got != 3 {
		t.Fatalf("the second campaign sent %d messages before the marks were back", got-3)
	}
	// That run records its chunk and lets it go: the marks are written back, and the cap holds.
	if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET lease_token = NULL, lease_epoch = NULL, lease_until = NULL,
		lease_users = '{}' WHERE campaign_id = $1 AND batch = 0`, f.id); err != nil {
		t.Fatal(err)
	}
	if err := f.h.RunBatch(ctx, second, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.provider.total(); got != 3 {
		t.Fatalf("the second campaign sent %d messages within the frequency cap", got-3)
	}
}

// Postgres failing while the marks are written back (the audit log's stream broken after a first send, or
// the count of chunks still in hand refused) leaves the epoch without its marks: the run claims nothing,
// sends nothing, waits without using up its retries, and leaves the lock to the next run, which writes
// them all and keeps the cap.
func TestMarksBackFailsClosedWhenPostgresFails(t *testing.T) {
	t.Parallel()
	for name, rule := range map[string]*faults.Rule{
		"the audit log's stream breaks":      {Match: faults.Method("RecentSends/row"), Skip: 1, Kind: faults.Fail},
		"the chunks in hand are not counted": {Match: faults.Method("ChunksInHand"), Kind: faults.Fail},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f, second := sentByTheFirstOfTwo(t)
			if err := f.rdb.FlushDB(ctx).Err(); err != nil { // the test's own Redis DB
				t.Fatal(err)
			}
			h, _, fs := f.faulty(t, nil)
			r := fs.Add(rule)
			err := h.RunBatch(ctx, second, 0)
			if err == nil || r.Hits() == 0 {
				t.Fatalf("RunBatch with Postgres failing under the marks: %v (%d faults), want an error", err, r.Hits())
			}
			notFailure(t, err)
			if got := f.provider.total(); got != 3 {
				t.Fatalf("%d messages sent while the marks could not be written back", got-3)
			}
			if n := f.rdb.Keys(ctx, "sent:*").Val(); len(n) != 0 {
				t.Fatalf("claims taken while the marks could not be written back: %v", n)
			}
			if done := f.rdb.Get(ctx, state.MarksKey).Val(); done != "" {
				t.Fatalf("the marks recorded as written back for %q after a failure", done)
			}
			if f.rdb.Exists(ctx, "campaignctl:epoch:marks:lock").Val() != 0 {
				t.Fatal("the failed writer kept the lock")
			}
			fs.Clear()
			if err := h.RunBatch(ctx, second, 0); err != nil {
				t.Fatal(err)
			}
			f.secondKeptTheCap(t, second)
		})
	}
}

// While another worker writes the marks back, a batch run sends nothing and comes back soon.
func TestABatchWaitsWhileTheMarksAreWrittenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 4)
	if err := f.rdb.Set(ctx, "campaignctl:epoch:marks:lock", "another worker", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	err := f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !errors.Is(err, state.ErrMarksPending) {
		t.Fatalf("RunBatch: %v; want a retry that says the marks are being written back", err)
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent before the marks were back", n)
	}
}

func TestSendWindowAndScheduleHoldTheBatch(t *testing.T) {
	t.Parallel()
	ist, _ := time.LoadLocation(campaign.DefaultZone)
	window, _ := campaign.ParseWindow("09:00-20:00", ist)
	start := time.Now().Add(time.Hour)
	f := planWith(t, 4, func(s *campaign.Spec) { s.Window = window; s.StartAt = start })
	c, err := f.store.Get(context.Background(), f.id)
	if err != nil || c.State != campaign.StateScheduled {
		t.Fatalf("campaign %+v, %v; want scheduled", c, err)
	}
	// Before the start time: handed back until then, not counted as a failure.
	err = f.h.RunBatch(context.Background(), f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || re.After < 50*time.Minute {
		t.Fatalf("before the start: err %v, want a retry in about an hour", err)
	}
	// Started, but at 21:00 Istanbul: outside the window, handed back until 09:00.
	if _, err := f.db.Exec(context.Background(), `UPDATE campaigns SET start_at = now() - interval '1 minute' WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	evening := time.Date(2026, 12, 1, 21, 0, 0, 0, ist)
	f.h.cfg.Now = func() time.Time { return evening }
	err = f.h.RunBatch(context.Background(), f.id, 0)
	if !errors.As(err, &re) || re.Failure || re.After != 12*time.Hour {
		t.Fatalf("outside the window: err %v, want a retry in 12h", err)
	}
	if f.provider.total() != 0 {
		t.Fatalf("sent %d messages outside the schedule", f.provider.total())
	}
	// In the window: sent.
	f.h.cfg.Now = func() time.Time { return time.Date(2026, 12, 2, 10, 0, 0, 0, ist) }
	f.runAll(t)
	if f.provider.total() != 3 {
		t.Fatalf("sent %d in the window, want 3", f.provider.total())
	}
}

// Every send leaves a mark, even from a campaign without a cap, and each campaign judges the marks by its
// own cap.
func TestFrequencyMarksAreJudgedByEachCampaignsOwnCap(t *testing.T) {
	t.Parallel()
	f := planWith(t, 4, func(s *campaign.Spec) { s.FrequencyCap = 0 })
	planner := &campaign.Planner{Engine: f.db, Audience: f.db}
	capped := func(name string, cap time.Duration) int64 {
		s := fixtureSpec(name)
		s.FrequencyCap = cap
		rep, err := planner.Plan(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		return rep.ID
	}
	hour, longAgo := capped("one-hour cap", time.Hour), capped("one-minute cap", time.Minute)
	now := time.Now()
	f.h.cfg.Now = func() time.Time { return now }
	f.runAll(t) // the uncapped campaign sends to u1, u2, u4
	if f.provider.total() != 3 {
		t.Fatalf("uncapped campaign sent %d, want 3", f.provider.total())
	}
	f.h.cfg.Now = func() time.Time { return now.Add(10 * time.Minute) }
	if err := f.h.RunBatch(context.Background(), hour, 0); err != nil {
		t.Fatal(err)
	}
	if f.provider.total() != 3 {
		t.Fatalf("a campaign with a one-hour cap sent %d messages ten minutes after another campaign", f.provider.total()-3)
	}
	if err := f.h.RunBatch(context.Background(), longAgo, 0); err != nil {
		t.Fatal(err)
	}
	if f.provider.total() != 6 {
		t.Fatalf("a campaign with a one-minute cap sent %d messages, want 3 (the last send was ten minutes ago)", f.provider.total()-3)
	}
}

// 429s with Retry-After that are most of a second's answers pause every worker, not only the one that saw
// them: once the second is judged (at the next flush of any worker's answers after it), the provider's
// shared pause is set, and any other process's bucket waits it out.
func TestRateLimitedAnswerPausesEveryWorker(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	f.h.cfg.SendAttempts = 1
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 429, Code: 20429, RetryAfter: 3 * time.Second, Class: providers.Transient}
	}
	if err := f.h.RunBatch(context.Background(), f.id, 0); err == nil {
		t.Fatal("a 429 with no attempts left must hand the batch back")
	}
	other := limiter.New(f.rdb) // another worker process's bucket on the same Redis
	// A second after the window began (it began with the batch's first answers, before RunBatch
	// returned): another worker flushes its own answers (none), and the window is judged.
	time.Sleep(1100 * time.Millisecond)
	if err := other.Pace("provider:test", 0).Observe(context.Background(), limiter.Taken, 0); err != nil {
		t.Fatal(err)
	}
	paused, err := other.Paused(context.Background(), "provider:test")
	if err != nil {
		t.Fatal(err)
	}
	if paused < 2*time.Second {
		t.Fatalf("provider pause seen by another worker: %v, want about the 3 s Retry-After", paused)
	}
}

// Postgres unreachable: no send either, since outcomes could not be recorded; the batch waits without
// using up its retries.
func TestPostgresUnreachableSendsNothing(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	dead, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	h := NewHandler(Config{Store: campaign.NewStore(dead), Redis: f.rdb, Owner: "test",
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider}})
	err = h.RunBatch(context.Background(), f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("err = %v, want a RetryError that waits without using retries", err)
	}
	if f.provider.total() != 0 {
		t.Fatalf("%d messages sent while Postgres was unreachable", f.provider.total())
	}
}

// A worker without the campaign's channel (an e-mail-only worker of a mixed fleet picking an SMS batch)
// hands the batch back to the queue without using one of its retries: an outside run saw an SMS batch
// retried 4 times in 15 s by such a worker, on its way to the DLQ while no SMS worker ran. Nothing is sent,
// claimed or leased, and a worker that has the channel sends the batch afterwards.
func TestAWorkerWithoutTheChannelHandsTheBatchBack(t *testing.T) {
	t.Parallel()
	f := plan(t, 4)
	ctx := context.Background()
	emailOnly := NewHandler(Config{Store: f.store, Redis: f.rdb, Owner: "email-only",
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: f.provider}})
	err := emailOnly.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || re.After <= 0 || !strings.Contains(err.Error(), "sms") {
		t.Fatalf("err = %v, want a RetryError naming the channel that waits without using retries", err)
	}
	if isFailure(err) {
		t.Fatal("the queue would count the hand-back as a failure")
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent by a worker without the channel", n)
	}
	if keys := f.rdb.Keys(ctx, "sent:*").Val(); len(keys) != 0 {
		t.Fatalf("claims taken by a worker without the channel: %v", keys)
	}
	var leased int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND lease_token IS NOT NULL`, f.id).Scan(&leased); err != nil || leased != 0 {
		t.Fatalf("%d batches leased (%v) by a worker without the channel", leased, err)
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if f.provider.total() == 0 {
		t.Fatal("the worker with the channel sent nothing")
	}
}

// A provider paused by another worker (a 429 it saw) holds this worker's sends back until the pause ends,
// with or without a cap on the provider (the claim script reads the pause in both cases).
func TestPausedProviderHoldsSendsBack(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0, 1000} {
		t.Run(fmt.Sprintf("cap %g", rate), func(t *testing.T) {
			t.Parallel()
			f := plan(t, 4)
			f.h.cfg.ProviderRates = map[string]float64{"test": rate}
			const pause = 400 * time.Millisecond
			if err := limiter.New(f.rdb).Pause(context.Background(), "provider:test", pause); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var first time.Duration
			f.provider.before = func(providers.Message) {
				if first == 0 {
					first = time.Since(start)
				}
			}
			if err := f.h.RunBatch(context.Background(), f.id, 0); err != nil {
				t.Fatal(err)
			}
			if f.provider.total() == 0 || first < pause-50*time.Millisecond {
				t.Fatalf("first send %v after a pause of %v was set (%d sent)", first, pause, f.provider.total())
			}
		})
	}
}

// The provider's answer is in the recipient's claim before the next provider call (written with the next
// claim when nothing is capped, at once under a cap): a worker killed mid-chunk leaves at most the message
// in flight without an answer, never the ones before it.
func TestAnswerIsInTheClaimBeforeTheNextSend(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0, 1000} {
		t.Run(fmt.Sprintf("cap %g", rate), func(t *testing.T) {
			t.Parallel()
			f := plan(t, 30)
			f.h.cfg.ProviderRates = map[string]float64{"test": rate}
			nonce := Nonce(f.campaign(t))
			prev, checked := "", 0
			f.provider.before = func(m providers.Message) {
				if prev != "" {
					i, _ := strconv.Atoi(prev[len(prev)-7:])
					v := f.rdb.Get(context.Background(), ClaimKey(f.id, fmt.Sprint("u", i))).Val()
					if !strings.HasPrefix(v, nonce+"/s|") {
						t.Errorf("before the send to %s, the claim of the previous recipient (%s) is %q, not its answer", m.To, prev, v)
					}
					checked++
				}
				prev = m.To
			}
			f.runAll(t)
			if checked < 10 {
				t.Fatalf("only %d sends checked", checked)
			}
		})
	}
}

// Under a low --rate a chunk is a second's worth of it: a RET recorded while the campaign sends blocks a
// recipient whose message is more than about a second away, however low the rate.
func TestLowRateRETTakesEffectWithinASecond(t *testing.T) {
	t.Parallel()
	f := planWith(t, 8, func(s *campaign.Spec) { s.Rate = 2 }) // eligible: u1, u2, u4, u7, u8
	var once sync.Once
	f.provider.before = func(providers.Message) {
		once.Do(func() {
			if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = $1`, phone(8)); err != nil {
				t.Error(err)
			}
		})
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(8)]); n != 0 {
		t.Fatalf("u8 refused while the campaign sent at 2/s, some 2 s before its turn, and got %d messages", n)
	}
	if st, reason, _ := f.status(t, "u8"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("u8: %s/%s, want skipped/revoked", st, reason)
	}
}

// Under a low cap shared by several runs of a worker, a chunk is a second's worth of one run's share, not
// of the whole cap: each run's outcomes (and so the campaign's progress) are written about once a second
// (with chunks of the whole cap, three runs sharing 4/s leased chunks of 4, written every 3 s or so).
func TestASharedLowCapKeepsChunksASecondOfEachRunsShare(t *testing.T) {
	t.Parallel()
	f := planWith(t, 45, func(s *campaign.Spec) { s.Rate = 4; s.BatchSize = 8 }) // 24 eligible, 3 batches
	if f.batches != 3 {
		t.Fatalf("%d batches, want 3", f.batches)
	}
	h, _, fs := f.faulty(t, nil)
	_, campaignKey := capKeys(f.id, f.provider.Name()) // the campaign's --rate is the cap here
	var mu sync.Mutex
	leased := map[string]bool{}
	largest, chunks := 0, 0 // of the chunks leased while the 3 runs shared the cap
	h.cfg.Store = &leaseHookStore{Store: fs, before: func(n int, users []string) {
		if n <= 3 {
			// The first leases wait until the three runs are under way: a run's later chunks are sized
			// with all three counted (its first may have been sized before the others came).
			deadline := time.Now().Add(5 * time.Second)
			for h.sharers(campaignKey) < 3 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		fresh := 0
		for _, u := range users {
			if !leased[u] {
				fresh++
			}
			leased[u] = true
		}
		if n <= 3 || h.sharers(campaignKey) < 3 {
			return
		}
		if fresh == 0 {
			return // a chunk's consents read again (recheck), not a chunk
		}
		chunks++
		largest = max(largest, len(users))
	}}
	var wg sync.WaitGroup
	for b := range f.batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.RunBatch(context.Background(), f.id, b); err != nil {
				t.Errorf("batch %d: %v", b, err)
			}
		}()
	}
	wg.Wait()
	if got := f.provider.total(); got != 24 {
		t.Fatalf("%d messages, want the 24 eligible", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if chunks < 3 {
		t.Fatalf("only %d chunks leased while the 3 runs shared the cap", chunks)
	}
	// A second's worth of a third of 4/s is one recipient.
	if largest != 1 {
		t.Errorf("while 3 runs shared a cap of 4/s, the largest of %d chunks held %d recipients, want 1", chunks, largest)
	}
}

// secondKeptTheCap checks, once the second campaign of sentByTheFirstOfTwo has run, that it sent nothing
// more and skipped its 3 recipients for the frequency cap.
func (f *fixture) secondKeptTheCap(t *testing.T, second int64) {
	t.Helper()
	if got := f.provider.total(); got != 3 {
		t.Fatalf("the second campaign sent %d messages within the frequency cap", got-3)
	}
	c, err := f.store.Counts(context.Background(), second)
	if err != nil {
		t.Fatal(err)
	}
	if c.Skipped != 3 || c.Pending != 0 {
		t.Fatalf("second campaign counts %+v, want its 3 skipped by the cap", c)
	}
}

// sentByTheFirstOfTwo plans two campaigns with a cap of an hour on the same 3 eligible people, the second
// before the first sends (so its plan excludes nobody), and runs the first: everyone has its message.
func sentByTheFirstOfTwo(t *testing.T) (f *fixture, second int64) {
	t.Helper()
	f = planWith(t, 4, func(s *campaign.Spec) { s.FrequencyCap = time.Hour })
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(context.Background(),
		func() campaign.Spec { s := fixtureSpec("second"); s.FrequencyCap = time.Hour; return s }())
	if err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if got := f.provider.total(); got != 3 {
		t.Fatalf("first campaign: %d messages, want 3", got)
	}
	return f, rep.ID
}

// A provider (or a gateway before it) whose error echoes the request quotes the recipient's message: its
// name and code would be stored as the recipient's reason, which status, report and dlq show. The reason
// keeps the provider's own words and masks what it quotes of the message, one message at a time and in a
// window of several.
func TestAnErrorThatEchoesTheRequestKeepsTheMessageOut(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		f := plan(t, 4)
		f.h.cfg.SendWindow = window
		var body string
		f.provider.fail = func(_ int, m providers.Message) error {
			if m.To == phone(1) {
				body = m.Body
				// The body as sent, form-encoded, upper-cased, and the name alone.
				return &providers.Error{Provider: "twilio", Status: 400, Code: 21211,
					Message: "invalid parameter; you sent To=" + m.To + "&Body=" + url.QueryEscape(m.Body) + " (" + m.Body + ") " +
						strings.ToUpper(m.Body) + " words: Name1|", Class: providers.Permanent}
			}
			return nil
		}
		f.runAll(t)
		st, reason, _ := f.status(t, "u1")
		if body == "" {
			t.Fatal("the provider never saw u1's message")
		}
		if st != campaign.StatusFailed || !strings.Contains(reason, "21211") || !strings.Contains(reason, "invalid parameter") {
			t.Fatalf("window %d: u1 %s %q; want failed, with the provider's code and words", window, st, reason)
		}
		for _, s := range []string{"Name1", "NAME1", strings.TrimPrefix(body, "Merhaba Name1, kodunuz ")} {
			if strings.Contains(reason, s) {
				t.Errorf("window %d: u1's reason quotes its message (%q): %s", window, s, reason)
			}
		}
	}
}
