package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testlog"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// Netgsm refuses a number that took its 20 messages of the minute (code 85). Order: eight of the
// campaign's numbers, two of them next to each other in a batch, each got a message through the same
// account moments before (another campaign's), to the limit; then the campaign runs. The refusals are the
// numbers', not the provider's: every other recipient gets its message at once, the shared pace does not
// lower, no two refusals in a row stop a batch, and the eight stay pending for a later run of their batch,
// which comes back no sooner than the minute, without anything sent to them twice.
func TestANumberNetgsmLimitsWaitsAloneAndSlowsNobody(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			f := plan(t, 60) // eligible: i%5 != 0 && i%3 != 0, 32 of them
			sb := sandbox.New(sandbox.Options{NetgsmUserCode: "8503000000", NetgsmPassword: "s3cretpass", NetgsmPerNumber: 1})
			srv := httptest.NewServer(sb)
			t.Cleanup(srv.Close)
			ng, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: "s3cretpass", Header: "KAMPANYA", BaseURL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			// No deadline (a batch takes its time from one) but a bound on the test: a run that waited for the
			// limited numbers would take their minute.
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(30*time.Second, cancel).Stop()
			defer cancel()
			limited := map[string]bool{}
			for _, i := range []int{1, 2, 7, 11, 16, 22, 26, 29} {
				if _, err := ng.Send(ctx, providers.Message{To: phone(i), Body: "başka bir kampanya"}); err != nil {
					t.Fatal(err)
				}
				limited[fmt.Sprintf("u%d", i)] = true
			}
			var out testlog.Buffer
			f.h = NewHandler(Config{
				Store: f.store, Redis: f.rdb, Owner: "test", SendWindow: window,
				Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: ng},
				ProviderRates: map[string]float64{},
				Logger:        slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			deferredBatches := 0
			for b := 0; b < f.batches; b++ {
				err := f.h.RunBatch(ctx, f.id, b)
				var re *RetryError
				switch {
				case err == nil:
				case errors.As(err, &re) && strings.Contains(err.Error(), "limit on messages to one address") && re.After >= time.Minute && re.Wait && !re.Failure:
					deferredBatches++
				default:
					t.Fatalf("batch %d: %v (%+v) (want it done, or back in a minute for its limited numbers, at info, its retries untouched)", b, err, re)
				}
			}
			if deferredBatches == 0 {
				t.Fatal("no batch came back for its limited numbers")
			}
			if ctx.Err() != nil {
				t.Fatalf("the campaign's run waited for the limited numbers: %v", ctx.Err())
			}
			perNumber := map[string]int{}
			for _, m := range sb.Messages() {
				perNumber[m.To]++
			}
			for i := 1; i <= 60; i++ {
				u := fmt.Sprintf("u%d", i)
				if i%5 == 0 || i%3 == 0 {
					continue
				}
				st, reason, _ := f.status(t, u)
				if limited[u] {
					if st != campaign.StatusPending || !strings.Contains(reason, "85") || perNumber[phone(i)] != 1 {
						t.Errorf("%s (limited): %s %q, %d messages; want pending with Netgsm's 85 and only the other campaign's message", u, st, reason, perNumber[phone(i)])
					}
					continue
				}
				if st != campaign.StatusSent || perNumber[phone(i)] != 1 {
					t.Errorf("%s: %s %q, %d messages; want sent once", u, st, reason, perNumber[phone(i)])
				}
			}
			if rate := f.h.pace("netgsm").Rate(ctx); rate != 0 {
				t.Errorf("the shared pace of Netgsm is %v a second after the limited numbers; want none (nothing asked to slow down)", rate)
			}
			if lowered := out.Lines("pace is lowered"); len(lowered) > 0 {
				t.Errorf("the limited numbers lowered every worker's pace: %q", lowered)
			}
		})
	}
}

// A limit on one number says nothing about the provider. Order: u1's number is limited (85, a minute), then
// u2's and u4's sends fail with 503s; then the provider works again and the batch is run again at once,
// twice. The 85 did not count as the provider working, so the 503s are its fault and cost u2 and u4
// nothing; u1 is charged its one refusal and is not tried again within its minute, while u2 and u4 go.
// Before, the 85 counted as an answer: u2 was charged, and u1 was tried again at every run, each costing
// it an attempt, until it failed for good within 0.1 s. Once the minute is over (the worker's clock moved
// on), u1 is not lost: the next run sends it, once.
func TestALimitedNumberIsNotTriedAgainWithinItsWaitNorTakenForAWorkingProvider(t *testing.T) {
	t.Parallel()
	f := plan(t, 4) // eligible u1, u2, u4: one batch
	calls := map[string]int{}
	var mu sync.Mutex
	down := true
	f.provider.fail = func(_ int, m providers.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls[m.To]++
		switch {
		case m.To == phone(1):
			return &providers.Error{Provider: "netgsm", Status: 200, Code: 85, Class: providers.Transient, RecipientLimited: true, RetryAfter: time.Minute}
		case down:
			return &providers.Error{Provider: "netgsm", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	var skew atomic.Int64 // the worker's clock runs this far ahead: the hold's end without waiting for it
	f.h = NewHandler(Config{
		Store: f.store, Redis: f.rdb, Owner: "test", SendWindow: 1, SendAttempts: 1,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider},
		ProviderRates: map[string]float64{},
		Now:           func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
	})
	ctx := context.Background()
	attempts := func(u string) (n int) {
		t.Helper()
		if err := f.db.QueryRow(ctx, `SELECT attempts FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, f.id, u).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var re *RetryError
	if err := f.h.RunBatch(ctx, f.id, 0); !errors.As(err, &re) {
		t.Fatalf("first run: %v; want the batch back later", err)
	}
	if a1, a2 := attempts("u1"), attempts("u2"); a1 != 1 || a2 != 0 {
		t.Fatalf("after the first run: u1 charged %d attempts, u2 %d; want 1 (its refusal) and 0 (the provider's 503)", a1, a2)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	for run := 2; run <= 3; run++ {
		err := f.h.RunBatch(ctx, f.id, 0)
		if !errors.As(err, &re) || !re.Wait || re.After < 50*time.Second {
			t.Fatalf("run %d: %v (%+v); want the batch back in about a minute for u1", run, err, re)
		}
	}
	if n := calls[phone(1)]; n != 1 {
		t.Errorf("u1's number, limited for a minute, was tried %d times within it; want once", n)
	}
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusPending || attempts("u1") != 1 {
		t.Errorf("u1: %s %q after %d attempts; want pending, charged once", st, reason, attempts("u1"))
	}
	for _, u := range []string{"u2", "u4"} {
		if st, reason, _ := f.status(t, u); st != campaign.StatusSent {
			t.Errorf("%s: %s %q; want sent once the provider worked", u, st, reason)
		}
	}

	// The minute is over and the number takes messages again: u1, held back, is not lost, and goes once.
	mu.Lock()
	f.provider.fail = func(_ int, m providers.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls[m.To]++
		return nil
	}
	mu.Unlock()
	skew.Store(int64(61 * time.Second))
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatalf("the run after the wait: %v", err)
	}
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusSent || len(f.provider.sentTo(phone(1))) != 1 || calls[phone(1)] != 2 {
		t.Fatalf("u1 after its wait: %s %q, %d messages accepted in %d tries; want sent, once, on its second try", st, reason, len(f.provider.sentTo(phone(1))), calls[phone(1)])
	}
	f.assertOnce(t)
}

// The holds of addresses a provider limited end: a hold looked up after its end is taken out, and the
// others that ended go within a minute, so that once none holds, the runs' sends stop taking the lock for
// each recipient (limiting is 0 again). (Mutation: ended holds kept until there are 10,000 of them leave
// limiting above 0 for good after the first Netgsm 85.)
func TestProviderLimitHoldsEnd(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	h := NewHandler(Config{Now: clock})

	h.holdLimited("+905320000001", clock().Add(time.Minute))
	h.holdLimited("+905320000002", clock().Add(time.Minute))
	if got := h.limitedHere("+905320000001"); got != time.Minute {
		t.Fatalf("a held address: held for %v more, want 1m0s", got)
	}
	if got := h.limitedHere("+905320000003"); got != 0 {
		t.Fatalf("an address never held: held for %v", got)
	}
	advance(time.Minute + time.Second)
	if got := h.limitedHere("+905320000001"); got != 0 {
		t.Fatalf("a hold past its end: held for %v more", got)
	}
	advance(time.Minute)
	h.limitedHere("+905320000009") // another address: the other ended hold goes with the minute's pruning
	if n := h.limiting.Load(); n != 0 {
		t.Fatalf("%d holds counted after all ended: every send still takes the lock", n)
	}
	h.holdLimited("+905320000004", clock().Add(time.Minute))
	if n, got := h.limiting.Load(), h.limitedHere("+905320000004"); n != 1 || got != time.Minute {
		t.Fatalf("a new hold: %d counted, held %v more; want 1 and 1m0s", n, got)
	}
}
