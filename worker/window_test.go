package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// windowedFixture is a planned campaign of n customers sent by a handler that has up to window sends out
// at once (no cap: the windowed path), with its Redis state and Postgres store behind fault rules.
func windowedFixture(t *testing.T, n, window int) (*fixture, *Handler, *faults.State, *faults.Store) {
	t.Helper()
	f := planWith(t, n, func(s *campaign.Spec) { s.BatchSize = 500 })
	h, fr, fs := f.faulty(t, func(c *Config) { c.SendWindow = window; c.LeaseTTL = 300 * time.Millisecond })
	return f, h, fr, fs
}

// Sends go out a window at a time, and everyone eligible gets exactly one message with its code; the
// claims of a window are one call.
func TestWindowedSendsEveryoneOnce(t *testing.T) {
	t.Parallel()
	f, h, fr, _ := windowedFixture(t, 100, 8) // 54 eligible, in one batch
	calls := fr.Add(&faults.Rule{Match: faults.Method("ClaimWindow"), Kind: faults.Stall})
	var inFlight, most atomic.Int64
	f.provider.before = func(providers.Message) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(2 * time.Millisecond)
		inFlight.Add(-1)
	}
	if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
		t.Fatal(err)
	}
	f.assertOnce(t)
	c := f.counts(t)
	if c.Sent != c.Planned || c.Pending != 0 || f.provider.total() != int(c.Planned) {
		t.Fatalf("counts %+v, %d messages", c, f.provider.total())
	}
	if m := most.Load(); m < 2 || m > 8 {
		t.Errorf("at most %d sends were out at once, want 2..8 (the window)", m)
	}
	// One call per window of a chunk (100 recipients a chunk, 8 a window), and the last answers written
	// with the chunk's outcomes.
	if n := calls.Hits(); n > (int(c.Planned)+7)/8+2 {
		t.Errorf("%d claim calls for %d recipients in windows of 8", n, c.Planned)
	}
	for _, u := range []string{"u1", "u2", "u4"} {
		v := f.rdb.Get(context.Background(), ClaimKey(f.id, u)).Val()
		if st := state.ParseValueOf(v, Nonce(f.campaign(t))); st.Kind != state.Sent {
			t.Errorf("%s's claim is %q, want the provider's answer", u, v)
		}
	}
}

// A window whose claim call fails (before Redis, or with its reply lost) sends nobody of it; everyone is
// sent once once Redis answers.
func TestWindowClaimFailureSendsNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range []faults.Kind{faults.Fail, faults.LoseReply} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			f, h, fr, _ := windowedFixture(t, 40, 4) // 22 eligible
			rule := fr.Add(&faults.Rule{Match: faults.Method("ClaimWindow"), Skip: 1, Times: 1, Kind: kind})
			notFailure(t, h.RunBatch(context.Background(), f.id, 0))
			if rule.Hits() != 1 || f.provider.total() != 4 {
				t.Fatalf("fault hits %d, %d sent; want the first window of 4 only", rule.Hits(), f.provider.total())
			}
			waitUntil(t, 5*time.Second, "the lost window's claims to be released", func() bool {
				n := 0
				for _, u := range f.batchUsers(t, 0) {
					v := f.rdb.Get(context.Background(), ClaimKey(f.id, u)).Val()
					if state.ParseValueOf(v, Nonce(f.campaign(t))).Kind == state.InFlight {
						n++
					}
				}
				return n == 0
			})
			notFailure(t, h.RunBatch(context.Background(), f.id, 0))
			f.assertOnce(t)
			if c := f.counts(t); c.Sent != c.Planned || c.Pending != 0 {
				t.Fatalf("counts %+v", c)
			}
		})
	}
}

// A run dies with a window in flight (the provider accepted it; neither Redis nor Postgres took the
// answers): once its lease expires, that window is unknown, never resent, and at most a window's worth;
// the rest is sent once.
func TestCrashLosesAtMostTheWindowInFlight(t *testing.T) {
	t.Parallel()
	f, h, fr, fs := windowedFixture(t, 40, 4)
	var sends atomic.Int64
	f.provider.before = func(providers.Message) {
		if sends.Add(1) == 5 { // the second window is going out: from now on the run can write nothing
			fr.Add(&faults.Rule{Kind: faults.Fail})
			fs.Add(&faults.Rule{Match: faults.Method("Record", "ReleaseBatch"), Kind: faults.Fail})
		}
	}
	notFailure(t, h.RunBatch(context.Background(), f.id, 0))
	f.provider.before = nil
	f.leaseExpired(t)
	if _, err := f.h.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	f.assertOnce(t)
	c := f.counts(t)
	if c.Unknown == 0 || c.Unknown > 4 || c.Pending != 0 || c.Sent+c.Unknown != c.Planned {
		t.Fatalf("counts %+v; want the window in flight (at most 4) unknown, everyone else sent", c)
	}
}

// Transient refusals in a window are retried in a later window after a back-off, without holding up the
// others; an unanswered send is unknown and never resent; a refused one fails with its reason.
func TestWindowAnswersAreJudgedOneByOne(t *testing.T) {
	t.Parallel()
	f, h, _, _ := windowedFixture(t, 40, 8)
	var first503 atomic.Bool
	f.provider.fail = func(_ int, m providers.Message) error {
		switch m.To {
		case phone(2):
			if first503.CompareAndSwap(false, true) {
				return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
			}
		case phone(4):
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		case phone(7):
			return &providers.Error{Provider: "test", Status: 400, Code: 21211, Message: "invalid number", Class: providers.Permanent}
		}
		return nil
	}
	if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
		t.Fatal(err)
	}
	for u, want := range map[string]string{"u2": campaign.StatusSent, "u4": campaign.StatusUnknown, "u7": campaign.StatusFailed, "u1": campaign.StatusSent} {
		if st, _, _ := f.status(t, u); st != want {
			t.Errorf("%s: %s, want %s", u, st, want)
		}
	}
	f.provider.fail = nil
	if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
		t.Fatal(err)
	}
	if n := len(f.provider.accepted[phone(4)]); n != 1 {
		t.Errorf("the unanswered u4 reached the provider %d times", n)
	}
	if n := len(f.provider.accepted[phone(2)]); n != 1 {
		t.Errorf("u2 (refused once with a 503) was accepted %d times, want 1", n)
	}
	if c := f.counts(t); c.Pending != 0 || c.Unknown != 1 || c.Failed != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// A provider paused by a 429 elsewhere holds the window back until the pause ends; nothing is claimed
// meanwhile.
func TestWindowWaitsOutAProviderPause(t *testing.T) {
	t.Parallel()
	f, h, _, _ := windowedFixture(t, 20, 8)
	if err := h.bucket.Pause(context.Background(), state.ProviderBucket("test"), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("the batch finished %v after a 300 ms pause began", took)
	}
	f.assertOnce(t)
	if c := f.counts(t); c.Sent != c.Planned {
		t.Fatalf("counts %+v", c)
	}
}

// A RET recorded after the launch blocks the windowed path too: the person is skipped (revoked) and their
// code goes back; the others of the window are sent.
func TestWindowedSendSkipsARevokedConsent(t *testing.T) {
	t.Parallel()
	f, h, _, _ := windowedFixture(t, 10, 8)
	if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = $1`, phone(1)); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
		t.Fatal(err)
	}
	if n := len(f.provider.accepted[phone(1)]); n != 0 {
		t.Fatalf("u1 revoked consent but got %d messages", n)
	}
	if st, reason, code := f.status(t, "u1"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked || code != "" {
		t.Fatalf("u1: %s/%s code %q, want skipped/revoked with the code released", st, reason, code)
	}
	if c := f.counts(t); c.Sent != c.Planned-1 || c.Pending != 0 {
		t.Fatalf("counts %+v, want all but u1 sent", c)
	}
}

func TestReadyWindowTakesTheReadyInQueueOrder(t *testing.T) {
	now := time.Unix(1000, 0)
	mk := func(ids string, later string) []windowSend {
		var q []windowSend
		for _, c := range ids {
			// Capital letters are 10-token messages (ten-segment SMS), the others one token each.
			w := windowSend{r: &campaign.Recipient{UserID: string(c)}, tokens: 1}
			if c >= 'A' && c <= 'Z' {
				w.tokens = 10
			}
			for _, l := range later {
				if l == c {
					w.notUntil = now.Add(time.Duration(c-'a'+1) * time.Second)
				}
			}
			q = append(q, w)
		}
		return q
	}
	ids := func(ws []windowSend) string {
		s := ""
		for _, w := range ws {
			s += w.r.UserID
		}
		return s
	}
	for _, tc := range []struct {
		queue, later string
		size, budget int
		win, rest    string
		next         time.Duration
	}{
		{"abcdef", "", 4, 0, "abcd", "ef", 0},
		{"abc", "", 4, 0, "abc", "", 0},
		{"abcdef", "b", 3, 0, "acd", "bef", 2 * time.Second},
		{"abcdef", "ae", 3, 0, "bcd", "aef", time.Second},
		{"abc", "abc", 2, 0, "", "abc", time.Second},
		// Under a provider's pace, a window's tokens stay within the bucket's burst: one 10-token message
		// goes alone when the burst is 8, however large the window.
		{"ABCD", "", 8, 8, "A", "BCD", 0},
		{"abCde", "", 8, 8, "ab", "Cde", 0},
		{"Abcde", "", 8, 12, "Abc", "de", 0},
		{"abcdefghij", "", 8, 5, "abcde", "fghij", 0},
		{"aBcd", "a", 8, 8, "B", "acd", 0},
		{"abCd", "b", 8, 8, "a", "bCd", 0},
		{"abC", "ab", 8, 8, "C", "ab", 0},
	} {
		win, rest, next := readyWindow(mk(tc.queue, tc.later), tc.size, tc.budget, now)
		if ids(win) != tc.win || ids(rest) != tc.rest {
			t.Errorf("%s (later %q) by %d: window %q, rest %q; want %q, %q", tc.queue, tc.later, tc.size, ids(win), ids(rest), tc.win, tc.rest)
		}
		if tc.win == "" && next.Sub(now) != tc.next {
			t.Errorf("%s (later %q): next in %v, want %v", tc.queue, tc.later, next.Sub(now), tc.next)
		}
		// A window put back in front of the rest (a pause) must not overwrite the rest.
		if again := append(win, rest...); ids(again) != tc.win+tc.rest {
			t.Errorf("%s: window put back gives %q, want %q", tc.queue, ids(again), tc.win+tc.rest)
		}
	}
}

// keyedProvider is a provider whose receipts name their recipient (providers.KeyedReceipts).
type keyedProvider struct{ *scriptedProvider }

func (keyedProvider) ReceiptsNameRecipient() bool { return true }

// Each send's audit entry says whether its receipts name the recipient, as its provider says: only the
// others need the message-ID index (migration 0014).
func TestSendsAuditWhetherTheirReceiptsNameTheRecipient(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		f, h, _, _ := windowedFixture(t, 30, 8)
		if keyed {
			h.cfg.Providers[campaign.ChannelSMS] = keyedProvider{f.provider}
		}
		if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
			t.Fatal(err)
		}
		var sent, marked int64
		if err := f.db.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE receipt_keyed) FROM send_log
			WHERE campaign_id = $1 AND status = 'sent'`, f.id).Scan(&sent, &marked); err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if keyed {
			want = sent
		}
		if sent == 0 || marked != want {
			t.Errorf("provider keyed %v: %d of %d sends audited as keyed, want %d", keyed, marked, sent, want)
		}
	}
}

// A refused send waits half to all of 100 ms·2^(attempt-1), at most 10 s, and never less than the
// provider's Retry-After.
func TestBackoffGrowsFromATenthOfASecondAndKeepsTheHint(t *testing.T) {
	for _, tc := range []struct {
		attempt  int
		hint     time.Duration
		min, max time.Duration
	}{
		{1, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 0, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 0, 400 * time.Millisecond, 800 * time.Millisecond},
		{9, 0, 5 * time.Second, 10 * time.Second},
		{40, 0, 5 * time.Second, 10 * time.Second},
		{1, time.Second, time.Second, time.Second},
		{4, 3 * time.Second, 3 * time.Second, 3 * time.Second},
	} {
		// At random, and at both ends of the jitter.
		shortest := func(time.Duration) time.Duration { return 0 }
		longest := func(n time.Duration) time.Duration { return n - 1 }
		for i := range 200 {
			jitter := rand.N[time.Duration]
			switch i {
			case 0:
				jitter = shortest
			case 1:
				jitter = longest
			}
			if d := backoff(tc.attempt, tc.hint, jitter); d < tc.min || d > tc.max {
				t.Fatalf("backoff(%d, %v) = %v, want within [%v, %v]", tc.attempt, tc.hint, d, tc.min, tc.max)
			}
		}
	}
}

// A recipient refused with a Retry-After does not hold up the rest of its batch: when all that is left of
// its chunk waits for a back-off, it goes with the next chunk, keeping its attempts, and is sent once.
func TestARefusalWaitsWithoutHoldingUpTheNextChunk(t *testing.T) {
	t.Parallel()
	f := planWith(t, 100, func(s *campaign.Spec) { s.BatchSize = 500 }) // 54 eligible, in one batch
	h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = 8; c.ChunkSize = 10 })
	var mu sync.Mutex
	var order []string
	refusedOnce := false
	f.provider.fail = func(_ int, m providers.Message) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, m.To)
		switch m.To {
		case phone(1):
			if !refusedOnce {
				refusedOnce = true
				return &providers.Error{Provider: "test", Status: 429, Class: providers.Transient, RetryAfter: 400 * time.Millisecond}
			}
		case phone(2):
			return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	err := h.RunBatch(context.Background(), f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) {
		t.Fatalf("RunBatch: %v, want the batch handed back for u2, which kept failing", err)
	}
	f.assertOnce(t)
	first, again, sends2, between := -1, -1, 0, 0
	for i, to := range order {
		switch {
		case to == phone(1) && first < 0:
			first = i
		case to == phone(1):
			again = i
		case to == phone(2):
			sends2++
		case first >= 0 && again < 0:
			between++
		}
	}
	// Before u1's retry, the batch went on: more sends to others than the rest of u1's chunk of 10 could
	// make.
	if first < 0 || again < 0 || between <= 9 {
		t.Errorf("u1 refused at send %d, tried again at send %d after %d sends to others: the batch waited for it", first, again, between)
	}
	if n := len(f.provider.accepted[phone(1)]); n != 1 {
		t.Errorf("u1 was accepted %d times, want 1", n)
	}
	// u2's attempts carry over from chunk to chunk: SendAttempts in all in this run, not per chunk.
	if sends2 != 5 {
		t.Errorf("u2 (always 503) was tried %d times in the run, want 5", sends2)
	}
	if st, _, _ := f.status(t, "u2"); st != campaign.StatusPending {
		t.Errorf("u2 is %s, want pending (deferred to a later run)", st)
	}
	if c := f.counts(t); c.Sent != c.Planned-1 || c.Pending != 1 {
		t.Fatalf("counts %+v", c)
	}
}
