package worker

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// namedProvider is a scriptedProvider under another name (a second SMS provider).
type namedProvider struct {
	*scriptedProvider
	name string
}

func (p namedProvider) Name() string { return p.name }

// failoverFixture plans 150 customers (80 eligible) whose first provider answers with fail, and gives the
// handler a fallback that accepts everything.
func failoverFixture(t *testing.T, window time.Duration, fail func(call int, m providers.Message) error) (*fixture, *scriptedProvider) {
	t.Helper()
	f := plan(t, 150)
	f.provider.fail = fail
	fb := newProvider()
	f.h.cfg.Fallback = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: namedProvider{fb, "second"}}
	f.h.cfg.FailoverWindow = window
	return f, fb
}

// bothOnce checks that nobody got two messages over the two providers together.
func bothOnce(t *testing.T, a, b *scriptedProvider) int {
	t.Helper()
	seen := map[string]int{}
	for _, p := range []*scriptedProvider{a, b} {
		p.mu.Lock()
		for to, bodies := range p.accepted {
			seen[to] += len(bodies)
		}
		p.mu.Unlock()
	}
	for to, n := range seen {
		if n > 1 {
			t.Errorf("%s got %d messages over the two providers", to, n)
		}
	}
	return len(seen)
}

// The first SMS provider is down (every call a 503): each recipient whose send it refused goes through the
// second at once, after failoverAfter refusals in a row the first is left alone for the failover window, and
// everyone gets exactly one message.
func TestFailoverWhenTheFirstProviderIsDown(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Hour, func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, Message: "unavailable"}
	})
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	if f.provider.calls != failoverAfter || fb.total() != 80 {
		t.Fatalf("first provider called %d times (want %d: then it is skipped), fallback accepted %d (want 80)", f.provider.calls, failoverAfter, fb.total())
	}
	if c := f.counts(t); c.Sent != 80 || c.Pending != 0 {
		t.Fatalf("counts %+v", c)
	}
	// The messages refused before the first was taken for down say so; the rest, that it was down.
	n, err := f.store.CountReason(context.Background(), f.id, campaign.StatusSent, "sent through second, the fallback (test was down)")
	alone, err2 := f.store.CountReason(context.Background(), f.id, campaign.StatusSent, "sent through second, the fallback (test refused this message without accepting it)")
	if err != nil || err2 != nil || n != 80-(failoverAfter-1) || alone != failoverAfter-1 {
		t.Fatalf("%d sent recipients say the first was down and %d that it refused them (%v, %v); want %d and %d", n, alone, err, err2, 80-(failoverAfter-1), failoverAfter-1)
	}
	// Each claim names the fallback that accepted its message: a run that records a send from its claim
	// alone (its worker died) gives it to the right provider.
	keys := f.rdb.Keys(context.Background(), ClaimKey(f.id, "*")).Val()
	for _, k := range keys {
		v := f.rdb.Get(context.Background(), k).Val()
		if _, after, _ := strings.Cut(v, "/"); state.ParseValue(after).Kind == state.Sent && state.ParseValue(after).Provider != "second" {
			t.Fatalf("claim %s = %q: a message the fallback accepted, not named as the fallback's", k, v)
		}
	}
	if len(keys) != 80 {
		t.Fatalf("%d claims, want the 80 sent", len(keys))
	}
}

// A provider that now and then asks to slow down (a sporadic 429) is not down: it keeps the campaign,
// at the pace the shared pace gives it, and the fallback sends nothing. Before, each 429 moved the worker to
// the fallback for the failover window: 8 refusals in an outside run sent 95 % through the second provider.
func TestASporadic429DoesNotFailOver(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Hour, func(call int, _ providers.Message) error {
		if call == 3 || call == 20 {
			return &providers.Error{Provider: "test", Status: 429, Code: 20429, Class: providers.Transient, Message: "Too Many Requests", Throttled: true}
		}
		return nil
	})
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	if fb.calls != 0 || f.provider.total() != 80 {
		t.Fatalf("the fallback was called %d times and the first provider sent %d; want 0 and 80: a 429 is no outage", fb.calls, f.provider.total())
	}
}

// A provider that fails now and then (a sporadic 503 among acceptances) is not down: the message it
// refused goes through the fallback, and the next goes to the first again. Before, each 503 moved the
// worker to the fallback for the failover window: 3 sporadic 503s in an outside run sent 9,763 of 10,000
// through the second provider.
func TestASporadic5xxFailsOverItsOwnMessageOnly(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Hour, func(call int, _ providers.Message) error {
		if call == 3 || call == 4 || call == 20 || call == 41 {
			return &providers.Error{Provider: "test", Status: 503, Code: 20503, Class: providers.Transient, Message: "Service Unavailable"}
		}
		return nil
	})
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	if fb.total() != 4 || f.provider.total() != 76 {
		t.Fatalf("the fallback sent %d and the first provider %d; want the 4 the first refused, and 76", fb.total(), f.provider.total())
	}
	// Their outcomes say why they went through the fallback: the first was not down.
	var refusedAlone int
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND reason = $2`,
		f.id, "sent through second, the fallback (test refused this message without accepting it)").Scan(&refusedAlone); err != nil || refusedAlone != 4 {
		t.Fatalf("%d outcomes (%v) say the first refused them; want the 4", refusedAlone, err)
	}
}

// A first provider that refused a few sends in a row (a short outage the shared pace did not call, since the
// fallback carried the sends that would have told it) is tried again once its next probe is due, not at the
// end of the whole failover window: an outside run came back to Twilio 15 s after a 15 s outage.
func TestAFirstProviderBackAfterAShortOutageIsTriedAgainSoon(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Hour, func(call int, _ providers.Message) error {
		if call <= failoverAfter {
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, Message: "unavailable"}
		}
		return nil
	})
	f.h.cfg.FailoverProbeEvery = 100 * time.Millisecond
	fb.before = func(providers.Message) { time.Sleep(10 * time.Millisecond) }
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	if f.provider.total() < 40 {
		t.Fatalf("the first provider sent %d, the fallback %d: want the first back within its probe interval, not after the hour's window",
			f.provider.total(), fb.total())
	}
}

// An ambiguous answer never fails over: the first provider may have sent the message.
func TestNoFailoverAfterAnAmbiguousAnswer(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Hour, func(call int, _ providers.Message) error {
		if call == 1 {
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Message: "request sent, no answer"}
		}
		return nil
	})
	f.runAll(t)
	bothOnce(t, f.provider, fb)
	if fb.calls != 0 {
		t.Fatalf("the fallback was called %d times after an ambiguous answer", fb.calls)
	}
	if c := f.counts(t); c.Unknown != 1 || c.Sent != 79 {
		t.Fatalf("counts %+v; want the first recipient unknown and 79 sent by the first provider", c)
	}
}

// Once the failover window has passed, the first provider is tried again and, working again, takes the
// rest: a short outage moves only what it must.
func TestFirstProviderIsTriedAgainAfterTheWindow(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Millisecond, func(call int, _ providers.Message) error {
		if call <= 2 {
			return &providers.Error{Provider: "test", Status: 500, Class: providers.Transient, Message: "oops"}
		}
		return nil
	})
	fb.before = func(providers.Message) { time.Sleep(2 * time.Millisecond) } // the window passes during each fallback send
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want 80", n)
	}
	if fb.total() != 2 || f.provider.total() != 78 {
		t.Fatalf("fallback sent %d, first %d; want the fallback to send only the 2 the first refused", fb.total(), f.provider.total())
	}
}

// A first provider that resets every connection (each request written, no answer: ambiguous, which never
// fails over one by one, since the message may have gone) is called down by its pace within a dozen
// requests; from then on the recipients not sent yet go through the fallback, and the first gets one
// probe when the failover window ends. Before, every recipient was sent to the first and became unknown.
func TestAFirstProviderThatResetsEveryRequestIsFailedOverOnceItIsDown(t *testing.T) {
	t.Parallel()
	f, fb := failoverFixture(t, time.Hour, func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Class: providers.Ambiguous, Message: "connection reset after the request was written"}
	})
	f.provider.before = func(providers.Message) { time.Sleep(3 * time.Millisecond) } // a reset takes a round trip
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	c := f.counts(t)
	if c.Pending != 0 || c.Unknown+c.Sent != 80 {
		t.Fatalf("counts %+v; want every recipient sent or unknown", c)
	}
	if int(c.Unknown) != f.provider.calls || c.Sent != int64(fb.total()) {
		t.Fatalf("counts %+v, first provider called %d times, fallback accepted %d: want the first's calls unknown and the fallback's sent",
			c, f.provider.calls, fb.total())
	}
	// The pace calls the provider down after 10 refused answers in a row (paceUrgent), then one probe.
	t.Logf("first provider: %d calls (unknown); fallback: %d sent", f.provider.calls, fb.total())
	if f.provider.calls > 15 {
		t.Fatalf("the first provider was called %d times (%d unknown): want it left for the fallback once down", f.provider.calls, c.Unknown)
	}
}

// Without a fallback, a provider down by its pace holds the sends back, with one probe a second over all
// workers, on the path that sends one message at a time too (as a window of sends does): a provider that
// resets every request makes a dozen recipients unknown, not the whole batch.
func TestAProviderThatResetsEveryRequestIsHeldBackOnceItIsDown(t *testing.T) {
	t.Parallel()
	f := planWith(t, 150, func(s *campaign.Spec) { s.BatchSize = 100 })
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Class: providers.Ambiguous, Message: "connection reset after the request was written"}
	}
	f.provider.before = func(providers.Message) { time.Sleep(3 * time.Millisecond) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(2500*time.Millisecond, cancel) // a cancel, not a deadline: a run keeps a deadline's margin for itself
	err := f.h.RunBatch(ctx, f.id, 0)             // ends when ctx does: the provider stays down
	f.provider.mu.Lock()
	calls := f.provider.calls
	f.provider.mu.Unlock()
	// 10 to call it down, then a probe a second.
	t.Logf("%d calls in 2.5 s", calls)
	if calls < 10 || calls > 16 {
		t.Fatalf("the provider was called %d times in 2.5 s (run: %v): want about 10, then one probe a second", calls, err)
	}
}

// A worker's heartbeat says which channels fall over, and whether its sends go to the fallback now: status
// reads it to tell a campaign moving through the fallback from one that waits.
func TestTheHeartbeatSaysWhenAWorkerHasFailedOver(t *testing.T) {
	t.Parallel()
	f, _ := failoverFixture(t, time.Hour, nil)
	var info state.WorkerInfo
	f.h.NoteFailover(&info)
	if info.Fallbacks["sms"] != "second" || info.FailedOver["sms"] {
		t.Fatalf("before any failure: %+v, want the fallback named and not in use", info)
	}
	f.h.markDown(f.provider.Name())
	f.h.NoteFailover(&info)
	if !info.FailedOver["sms"] {
		t.Fatalf("the first provider skipped: %+v, want failed over", info)
	}
}

// A first provider called down by the shared pace is probed while the fallback carries the sends, and comes
// back for every worker as soon as a probe gets through and the pace calls it up, not at the end of each
// worker's failover window: a 20 s outage kept an outside run on the dearer fallback for 60 s.
func TestAFirstProviderBackUpIsUsedBeforeTheFailoverWindowEnds(t *testing.T) {
	t.Parallel()
	var recovered atomic.Bool
	f, fb := failoverFixture(t, time.Hour, func(int, providers.Message) error {
		if recovered.Load() {
			return nil
		}
		return &providers.Error{Provider: "test", Class: providers.Ambiguous, Message: "connection reset after the request was written"}
	})
	f.provider.before = func(providers.Message) { time.Sleep(3 * time.Millisecond) }
	fb.before = func(providers.Message) {
		time.Sleep(40 * time.Millisecond)
		if fb.total() == 5 {
			recovered.Store(true) // the outage ends; nobody tells the pace
		}
	}
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	if sentByFirst := f.provider.total() - int(f.counts(t).Unknown); sentByFirst < 40 {
		t.Fatalf("the first provider sent %d after it was up again, the fallback %d: want the first back within moments, not after the hour's window",
			sentByFirst, fb.total())
	}
}

// The same after a 503 outage: the worker went over on a 503 of its own, before the pace called the first
// provider down from every worker's answers; from then on the pace governs it, and it is probed. Before,
// such a worker never probed it, and came back only when its window ended.
func TestAFirstProviderBackUpAfterA503OutageIsUsedBeforeTheWindowEnds(t *testing.T) {
	t.Parallel()
	var recovered atomic.Bool
	f, fb := failoverFixture(t, time.Hour, func(int, providers.Message) error {
		if recovered.Load() {
			return nil
		}
		return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, Message: "unavailable"}
	})
	f.h.cfg.FailoverProbeEvery = 300 * time.Millisecond
	fb.before = func(providers.Message) {
		time.Sleep(40 * time.Millisecond)
		switch fb.total() {
		case 1:
			// Every worker's 503s call the first down.
			f.rdb.HSet(context.Background(), state.PaceKey(state.ProviderBucket(f.provider.Name())), "down", "1", "downat", time.Now().UnixMilli()) //nolint:errcheck
		case 5:
			recovered.Store(true) // the outage ends; nobody tells the pace
		}
	}
	f.runAll(t)
	if n := bothOnce(t, f.provider, fb); n != 80 {
		t.Fatalf("%d recipients got a message, want the 80 eligible", n)
	}
	if f.provider.total() < 20 {
		t.Fatalf("the first provider sent %d after it was up again, the fallback %d: want the first back within seconds, not after the hour's window",
			f.provider.total(), fb.total())
	}
}

// The log of a first provider called down says what happens with a fallback: its sends go through the
// fallback and it is probed now and then; "sends wait (one probe a second)" is said only without one.
func TestAProviderDownSaysItsSendsGoThroughTheFallback(t *testing.T) {
	t.Parallel()
	f, _ := failoverFixture(t, time.Hour, nil)
	var logs bytes.Buffer
	f.h.log = slog.New(slog.NewTextHandler(&logs, nil))
	down := limiter.PaceReport{Bucket: state.ProviderBucket(f.provider.Name()), Down: true, Event: limiter.PaceDown, Requests: 10, Rejected: 10}
	f.h.paceReport(down)
	if out := logs.String(); !strings.Contains(out, "through the fallback") || !strings.Contains(out, "fallback=second") || strings.Contains(out, "sends wait") {
		t.Fatalf("the first provider down with a fallback logged:\n%s", out)
	}
	logs.Reset()
	f.h.cfg.Fallback = nil
	f.h.paceReport(down)
	if out := logs.String(); !strings.Contains(out, "sends wait") {
		t.Fatalf("a provider down without a fallback logged:\n%s", out)
	}
}

// The heartbeat brings the failover note up to date before each beat: status reads from it whether the
// worker's sends go to the fallback.
func TestTheHeartbeatPublishesTheFailoverNote(t *testing.T) {
	t.Parallel()
	f, _ := failoverFixture(t, time.Hour, nil)
	f.h.markDown(f.provider.Name())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Heartbeat(ctx, f.rdb, state.WorkerInfo{Owner: "beat", Providers: map[string]string{"sms": f.provider.Name()}}, f.h.NoteFailover)
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, err := state.Workers(ctx, f.rdb)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) == 1 {
			if ws[0].Fallbacks["sms"] != "second" || !ws[0].FailedOver["sms"] {
				t.Fatalf("heartbeat %+v, want the fallback named and in use", ws[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
