package worker

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testpg"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/twilio"
)

// crashAfterRecord is the campaign.Store of a worker whose Postgres crashes right after the nth Record of
// outcomes has returned: the outcomes' commit (synchronous_commit off) is the last thing the server did, no
// durable commit comes after it, and the crash takes it back.
type crashAfterRecord struct {
	*campaign.Store
	n     int
	crash func()
	// beforeLease, when set, runs before each LeaseChunk with how many came before it.
	beforeLease func(n int)
	// beforeRecord, when set, runs before the nth Record with its outcomes.
	beforeRecord func(outcomes []campaign.Outcome)

	mu       sync.Mutex
	calls    int
	leases   int
	recorded []string // the users whose outcomes the crash took back
}

func (s *crashAfterRecord) LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (campaign.Chunk, error) {
	s.mu.Lock()
	n := s.leases
	s.leases++
	s.mu.Unlock()
	if s.beforeLease != nil {
		s.beforeLease(n)
	}
	return s.Store.LeaseChunk(ctx, c, users, l)
}

func (s *crashAfterRecord) Record(ctx context.Context, id int64, outcomes []campaign.Outcome, l campaign.Lease, inHand []string) (map[string]int64, error) {
	s.mu.Lock()
	nth := len(outcomes) > 0 && s.calls+1 == s.n
	s.mu.Unlock()
	if nth && s.beforeRecord != nil {
		s.beforeRecord(outcomes)
	}
	moved, err := s.Store.Record(ctx, id, outcomes, l, inHand)
	if err != nil || len(outcomes) == 0 {
		return moved, err
	}
	s.mu.Lock()
	s.calls++
	crash := s.calls == s.n
	if crash {
		for _, o := range outcomes {
			s.recorded = append(s.recorded, o.UserID)
		}
	}
	s.mu.Unlock()
	if crash {
		s.crash()
	}
	return moved, err
}

func (s *crashAfterRecord) lost() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.recorded))
}

// pgCrash is a campaign on a private Postgres and a private Redis, sent through the Twilio adapter to the
// sandbox by a worker whose Postgres crashes after its second chunk's outcomes.
type pgCrash struct {
	*fixture
	pg      *testpg.Server
	redis   *testredis.Server
	sandbox *sandbox.Server
	store   *crashAfterRecord
	rdb     *redis.Client
}

func newPGCrash(t *testing.T, edit ...func(*Config)) *pgCrash {
	t.Helper()
	// 30 customers: 16 eligible (no RET, a consent row), all in batch 0.
	pg, red, f := privateServers(t, 30)
	rdb := f.rdb

	const sid, token = "ACcrash0000000000000000000000001", "crashTestToken01"
	sb := sandbox.New(sandbox.Options{TwilioAccountSID: sid, TwilioAuthToken: token})
	hs := httptest.NewServer(sb)
	t.Cleanup(hs.Close)
	p, err := twilio.New(twilio.Config{AccountSID: sid, AuthToken: token, From: "+14155550100", BaseURL: hs.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCrash{fixture: f, pg: pg, redis: red, sandbox: sb, rdb: rdb,
		store: &crashAfterRecord{Store: f.store, n: 2, crash: pg.Crash}}
	// The worker as it runs in production (a window of sends, no cap, the answers written into the claims
	// with the next claims or before the outcomes), in chunks of 4, with a short lease so that the run after
	// the crash takes the chunk in hand over soon.
	cfg := Config{Store: c.store, Redis: rdb, Owner: "crash-test", ChunkSize: 4, LeaseTTL: 2 * time.Second,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p},
		ProviderRates: map[string]float64{}}
	for _, e := range edit {
		e(&cfg)
	}
	f.h = NewHandler(cfg)
	return c
}

// firstRun sends the batch until Postgres crashes after the second chunk's outcomes, and returns the users
// of that chunk.
func (c *pgCrash) firstRun(t *testing.T) []string {
	t.Helper()
	// From here on an asynchronous commit stays in the server's memory until a durable one writes it.
	c.pg.HoldWAL()
	if err := c.h.RunBatch(context.Background(), c.id, 0); err == nil {
		t.Fatal("the batch run went through a Postgres crash without an error")
	}
	lost := c.store.lost()
	if len(lost) != 4 {
		t.Fatalf("Postgres crashed after the outcomes of %v, want a chunk of 4", lost)
	}
	return lost
}

// afterRestart checks that the crash did take back the last chunk's outcomes (else the test proves
// nothing): its users are pending again, still in the batch's chunk in hand, while the chunk before (whose
// outcomes the next durable lease wrote out) stayed sent. The sandbox accepted both chunks.
func (c *pgCrash) afterRestart(t *testing.T, lost []string) {
	t.Helper()
	ctx := context.Background()
	for _, u := range lost {
		if st, _, _ := c.status(t, u); st != campaign.StatusPending {
			t.Fatalf("%s is %s after the crash: the crash did not take back its outcome (the WAL was written out), so the test proves nothing\n%s",
				u, st, c.pg.Log())
		}
	}
	if n := len(c.sandbox.Messages()); n != 8 {
		t.Fatalf("the sandbox accepted %d messages before the crash, want two chunks of 4", n)
	}
	// What the claim stands on; the test goes on to what comes of it when either is broken.
	var inHand []string
	if err := c.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, c.id).Scan(&inHand); err != nil {
		t.Fatal(err)
	}
	sort.Strings(inHand)
	if !slices.Equal(inHand, lost) {
		t.Errorf("after the crash the batch's chunk in hand is %v, want the chunk whose outcomes were taken back %v", inHand, lost)
	}
	if n := count(t, c.fixture, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = 'sent'`, c.id); n != 4 {
		t.Errorf("%d recipients sent after the crash, want the first chunk's 4 (the lease of the second wrote their outcomes out)", n)
	}
}

// runToEnd runs the batch again until it goes through, as the queue would after the crash.
func (c *pgCrash) runToEnd(t *testing.T) {
	t.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		err := c.h.RunBatch(context.Background(), c.id, 0)
		if err == nil {
			return
		}
		var re *RetryError
		if !errors.As(err, &re) || time.Now().After(end) {
			t.Fatalf("batch after the restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// recipient is one row as the test checks it, with what the sandbox accepted for its number.
type recipient struct {
	user, phone, status, code, msgID string
	everUnknown                      bool
	messages                         []sandbox.Message
}

func (c *pgCrash) recipients(t *testing.T) map[string]*recipient {
	t.Helper()
	rows, err := c.db.Query(context.Background(), `SELECT user_id, address, status, coalesce(code, ''), coalesce(provider_message_id, ''), ever_unknown
		FROM campaign_recipients WHERE campaign_id = $1`, c.id)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*recipient, error) {
		var r recipient
		err := row.Scan(&r.user, &r.phone, &r.status, &r.code, &r.msgID, &r.everUnknown)
		return &r, err
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*recipient{}
	byPhone := map[string]*recipient{}
	for _, r := range rs {
		out[r.user], byPhone[r.phone] = r, r
	}
	for _, m := range c.sandbox.Messages() {
		r := byPhone[m.To]
		if r == nil {
			t.Errorf("the sandbox accepted a message to %s, who is no recipient: %q", m.To, m.Body)
			continue
		}
		r.messages = append(r.messages, m)
	}
	if len(out) != 16 {
		t.Fatalf("%d recipients planned, want 16", len(out))
	}
	return out
}

// checkOnce checks what holds whatever the crash cost: nobody got two messages, every message carried its
// recipient's own code, no code is held twice, and no code of a recipient who got a message (or may have)
// went back to the pool.
func (c *pgCrash) checkOnce(t *testing.T, rs map[string]*recipient) {
	t.Helper()
	codes := map[string]string{}
	for _, r := range rs {
		if len(r.messages) > 1 {
			t.Errorf("%s got %d messages: %q and %q", r.user, len(r.messages), r.messages[0].Body, r.messages[1].Body)
		}
		if r.code == "" {
			t.Errorf("%s (%s) holds no code", r.user, r.status)
		} else if other, ok := codes[r.code]; ok {
			t.Errorf("code %s is held by %s and %s", r.code, other, r.user)
		}
		codes[r.code] = r.user
		for _, m := range r.messages {
			if !strings.HasSuffix(m.Body, "kodunuz "+r.code) {
				t.Errorf("%s's message %q does not carry its code %s", r.user, m.Body, r.code)
			}
		}
	}
	if n := count(t, c.fixture, `SELECT count(*) FROM released_codes`); n != 0 {
		t.Errorf("%d codes went back to the pool; every recipient here got a message or may have", n)
	}
}

// Claim 1 of "Durability of outcomes" (docs/operations.md), with a real crash: a chunk's outcomes are
// committed with synchronous_commit off, Postgres crashes right after (before any durable commit), and
// the crash takes them back. Nothing is lost and nobody is sent twice: the rows are pending again, the
// chunk is still in hand (its lease was durable), and each outcome is in its recipient's claim, which the
// next run reads. Every recipient ends sent, with the message ID the sandbox gave, once.
func TestPostgresCrashAfterAsyncOutcomesLosesNothing(t *testing.T) {
	t.Parallel()
	c := newPGCrash(t)
	lost := c.firstRun(t)
	c.pg.Restart()
	c.afterRestart(t, lost)
	c.runToEnd(t)
	for _, r := range c.allSentOnce(t) {
		if len(r.messages) == 1 && r.msgID != r.messages[0].SID {
			t.Errorf("%s: message ID %q, want the sandbox's %q (its claim's answer)", r.user, r.msgID, r.messages[0].SID)
		}
	}
}

// The double fault: the same crash, and Redis loses its data before the batch runs again (the machine
// lost, Redis without persistence). The chunk whose outcomes the crash took back is still in hand, under
// an epoch Redis no longer has: its recipients become unknown, and none is sent again. The others end sent,
// once. The unknown keep their codes for good.
func TestPostgresCrashAndRedisLossMakeTheChunkInHandUnknown(t *testing.T) {
	t.Parallel()
	c := newPGCrash(t)
	lost := c.firstRun(t)
	if err := c.redis.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.pg.Restart()
	c.afterRestart(t, lost)
	c.runToEnd(t)

	rs := c.recipients(t)
	c.checkOnce(t, rs)
	for _, r := range rs {
		want := campaign.StatusSent
		if slices.Contains(lost, r.user) {
			want = campaign.StatusUnknown
			if r.status == want && !r.everUnknown {
				t.Errorf("%s is unknown without the mark that keeps its code out of the pool", r.user)
			}
		}
		if r.status != want || len(r.messages) != 1 {
			t.Errorf("%s: %s with %d messages, want %s and one message", r.user, r.status, len(r.messages), want)
		}
	}
	if counts := c.counts(t); counts.Sent != 12 || counts.Unknown != 4 || counts.Pending != 0 {
		t.Fatalf("counts %+v, want 12 sent and the chunk in hand's 4 unknown", counts)
	}
}

// A delivery receipt that came in while the chunk's outcomes were on their way (the row still pending) is
// committed durably on its own. The crash takes the outcomes back and Redis loses the claims: the chunk in
// hand is settled as unknown, except the recipient whose receipt proves the send, which ends sent. Nobody
// is sent again.
func TestReceiptBeforeLostOutcomesProvesTheSendAfterADoubleFault(t *testing.T) {
	t.Parallel()
	c := newPGCrash(t)
	ctx := context.Background()
	var proved string
	c.store.beforeRecord = func(outcomes []campaign.Outcome) {
		o := outcomes[0]
		proved = o.UserID
		if _, err := c.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "twilio", CampaignID: c.id, UserID: o.UserID,
			MessageID: o.MessageID, Status: campaign.DeliveryDelivered}}); err != nil {
			t.Error(err)
		}
	}
	lost := c.firstRun(t)
	if err := c.redis.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.pg.Restart()
	c.afterRestart(t, lost)
	c.runToEnd(t)

	rs := c.recipients(t)
	c.checkOnce(t, rs)
	for _, r := range rs {
		want := campaign.StatusSent
		if slices.Contains(lost, r.user) && r.user != proved {
			want = campaign.StatusUnknown
		}
		if r.status != want || len(r.messages) != 1 {
			t.Errorf("%s: %s with %d messages, want %s and one message", r.user, r.status, len(r.messages), want)
		}
		if r.user == proved && r.msgID != r.messages[0].SID {
			t.Errorf("%s: message ID %q, want its receipt's %q", r.user, r.msgID, r.messages[0].SID)
		}
	}
	if counts := c.counts(t); counts.Sent != 13 || counts.Unknown != 3 || counts.Pending != 0 {
		t.Fatalf("counts %+v, want 13 sent and 3 unknown", counts)
	}
}

// `resume --resend-unknown` reads the unknown recipients and forgets their claims before it makes them
// pending again. When what it read is an outcome committed without waiting for the WAL flush (a chunk's
// outcomes, a moment old), and Postgres crashes after the claims are forgotten and before the resend is
// committed, the crash takes the unknown back: the recipients are pending again, in the chunk in hand,
// with nothing left in Redis to say their messages may have gone out. The resume failed (Postgres went
// away); nobody asked for them to be sent again, and they must not be.
func TestResendUnknownCrashingBeforeItsCommitResendsNobody(t *testing.T) {
	t.Parallel()
	c := newPGCrash(t)
	ctx := context.Background()
	// The second chunk's answers are held until the worker gives up: its four recipients become unknown
	// (the sandbox accepted their messages).
	c.store.beforeLease = func(n int) {
		if n == 1 {
			c.sandbox.SetFaults(sandbox.Faults{RateTimeout: 1})
		} else {
			c.sandbox.SetFaults(sandbox.Faults{})
		}
	}
	var forgotten []string
	c.store.crash = func() {
		// resume --resend-unknown, up to the resend's commit.
		users, err := c.store.Unknown(ctx, c.id)
		if err != nil {
			t.Error(err)
		}
		if _, err := ForgetUnanswered(ctx, c.rdb, c.campaign(t), users, 0); err != nil {
			t.Error(err)
		}
		forgotten = users
		c.pg.Crash()
	}
	lost := c.firstRun(t)
	c.sandbox.SetFaults(sandbox.Faults{})
	if sort.Strings(forgotten); !slices.Equal(forgotten, lost) {
		t.Fatalf("the resume read %v as unknown, want the second chunk %v", forgotten, lost)
	}
	c.pg.Restart()
	c.runToEnd(t)

	rs := c.recipients(t)
	c.checkOnce(t, rs)
	for _, r := range rs {
		want := campaign.StatusSent
		if slices.Contains(lost, r.user) {
			want = campaign.StatusUnknown
			if r.status == want && !r.everUnknown {
				t.Errorf("%s is unknown without the mark that keeps its code out of the pool", r.user)
			}
		}
		if r.status != want || len(r.messages) != 1 {
			t.Errorf("%s: %s with %d messages, want %s and one message", r.user, r.status, len(r.messages), want)
		}
	}
}

// The claims are where a chunk's outcomes survive a Postgres crash that takes their commit back. When the
// provider's answers could not be written into the claims (Redis did not answer that one call), Postgres
// holds the only record of them, and the outcomes must not be committed without waiting for the WAL: the
// same crash would otherwise turn four recipients the provider accepted, and the worker knew it, into
// unknown ones (their claims say only that a send was in flight).
func TestOutcomesWhoseClaimsMissedTheirAnswersSurviveACrash(t *testing.T) {
	t.Parallel()
	var rules *faults.State
	c := newPGCrash(t, func(cfg *Config) {
		rules = faults.NewState(state.New(cfg.Redis, DefaultClaimTTL))
		cfg.State = rules
	})
	// The first chunk's answers go into their claims; the second chunk's do not.
	miss := rules.Add(&faults.Rule{Match: faults.Method("SettleMany"), Skip: 1, Times: 1, Kind: faults.Fail})
	lost := c.firstRun(t)
	if miss.Hits() != 1 {
		t.Fatalf("the answers' write failed %d times, want once (the second chunk's)", miss.Hits())
	}
	c.pg.Restart()
	for _, u := range lost {
		if st, _, _ := c.status(t, u); st != campaign.StatusSent {
			t.Errorf("%s is %s after the crash, want sent: its outcome was in no claim and had to survive the crash", u, st)
		}
	}
	c.runToEnd(t)

	rs := c.recipients(t)
	c.checkOnce(t, rs)
	for _, r := range rs {
		if r.status != campaign.StatusSent || len(r.messages) != 1 {
			t.Errorf("%s: %s with %d messages, want sent once (in the crashed chunk: %v)", r.user, r.status, len(r.messages), slices.Contains(lost, r.user))
		}
	}
}

// The sweeper, rather than the batch's next run, may be the one to find the chunk a crash took back (the
// batch's task waits for its retry): once the dead run's lease has expired it reads the claims and records
// what they say, sending nothing.
func TestSweepSettlesTheChunkACrashTookBack(t *testing.T) {
	t.Parallel()
	c := newPGCrash(t)
	lost := c.firstRun(t)
	c.pg.Restart()
	c.afterRestart(t, lost)
	ctx := context.Background()
	end := time.Now().Add(30 * time.Second)
	for {
		n, err := c.h.Sweep(ctx)
		if err == nil && n > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the sweep never settled the chunk in hand (last: %d, %v)", n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := len(c.sandbox.Messages()); n != 8 {
		t.Fatalf("the sandbox has %d messages after the sweep, want the 8 sent before the crash (a sweep sends nothing)", n)
	}
	rs := c.recipients(t)
	for _, u := range lost {
		r := rs[u]
		if r.status != campaign.StatusSent || len(r.messages) != 1 || r.msgID != r.messages[0].SID {
			t.Errorf("%s after the sweep: %s, message ID %q, %d messages; want sent with the sandbox's ID from its claim", u, r.status, r.msgID, len(r.messages))
		}
	}
	if n := count(t, c.fixture, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND lease_users <> '{}'`, c.id); n != 0 {
		t.Errorf("%d batches still hold a chunk in hand after the sweep", n)
	}
	c.runToEnd(t)
	rs = c.recipients(t)
	c.checkOnce(t, rs)
	if counts := c.counts(t); counts.Sent != 16 || counts.Unknown != 0 || counts.Pending != 0 {
		t.Fatalf("counts %+v, want the 16 sent", counts)
	}
}

// afterSends is a provider that runs then once its nth send has returned.
type afterSends struct {
	providers.Provider
	n    int32
	sent atomic.Int32
	then func()
}

func (p *afterSends) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	res, err := p.Provider.Send(ctx, m)
	if p.sent.Add(1) == p.n {
		p.then()
	}
	return res, err
}

// The exception of "Durability of outcomes": Redis goes away while the second chunk's window is out, so
// the answers cannot be written into their claims and Postgres alone holds the chunk's outcomes. They are
// committed durably, and the crash right after takes none of them back: the chunk's recipients stay sent,
// each with the message ID the sandbox gave. (Committed like the others, the crash would take them back,
// and with the claims gone nothing would say they were sent.)
func TestOutcomesOnlyPostgresHoldsSurviveAPostgresCrash(t *testing.T) {
	t.Parallel()
	var kill func()
	c := newPGCrash(t, func(cfg *Config) {
		// The second chunk is the fifth to eighth sends, one window: Redis dies as its last one returns.
		p := &afterSends{Provider: cfg.Providers[campaign.ChannelSMS], n: 8, then: func() { kill() }}
		cfg.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}
	})
	kill = c.redis.Kill
	held := c.firstRun(t)
	c.pg.Restart()
	rs := c.recipients(t)
	for _, u := range held {
		r := rs[u]
		if r.status != campaign.StatusSent || len(r.messages) != 1 || r.msgID != r.messages[0].SID {
			t.Errorf("%s after the crash: %s, message ID %q, %d messages, want sent once with the sandbox's ID\n%s",
				u, r.status, r.msgID, len(r.messages), c.pg.Log())
		}
	}
	c.checkOnce(t, rs)
}

// A live worker outlasts a Postgres outage in which Redis loses its data: the run waits for Postgres with
// its chunk's outcomes in hand (RecordWait) and records them when it is back, so nothing becomes unknown.
// Postgres goes down just before the second chunk's outcomes are written, Redis is wiped while it is away,
// and it comes back 7 s later. Every recipient ends sent, once; none unknown. Before, the run gave up
// after 5 s and left the outcomes to the claims, which the wipe had taken: the chunk's 4 recipients became
// unknown (and `resume --resend-unknown` would have sent them again), though the worker never stopped.
func TestALiveWorkerHoldsItsOutcomesThroughAPostgresOutageAndARedisWipe(t *testing.T) {
	t.Parallel()
	c := newPGCrash(t, func(cfg *Config) { cfg.RecordWait = DefaultRecordWait })
	c.store.crash = func() {} // no crash after a Record: the outage comes before it
	var once sync.Once
	back := make(chan struct{})
	c.store.beforeRecord = func([]campaign.Outcome) {
		once.Do(func() {
			c.pg.Crash()
			if err := c.redis.Flush(context.Background()); err != nil {
				t.Error(err)
			}
			go func() {
				defer close(back)
				time.Sleep(7 * time.Second)
				c.pg.Restart()
			}()
		})
	}
	err := c.h.RunBatch(context.Background(), c.id, 0)
	<-back
	if n := count(t, c.fixture, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = 'unknown'`, c.id); n != 0 {
		t.Fatalf("after the run (%v): %d recipients unknown, want none: the live run held their outcomes", err, n)
	}
	c.runToEnd(t)
	c.allSentOnce(t)
}

// allSentOnce checks what checkOnce does, and that every recipient ended sent with the one message the
// sandbox accepted for it: none unknown, none pending.
func (c *pgCrash) allSentOnce(t *testing.T) map[string]*recipient {
	t.Helper()
	rs := c.recipients(t)
	c.checkOnce(t, rs)
	for _, r := range rs {
		if r.status != campaign.StatusSent || len(r.messages) != 1 {
			t.Errorf("%s: %s with %d messages, want sent once", r.user, r.status, len(r.messages))
		}
	}
	if counts := c.counts(t); counts.Sent != 16 || counts.Unknown != 0 || counts.Pending != 0 {
		t.Fatalf("counts %+v, want the 16 sent", counts)
	}
	return rs
}
