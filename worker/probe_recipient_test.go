package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// oneRecipientRefused plans 60 customers in one batch, sent up to window at a time; the provider answers
// refusal for customer i (its phone) every time, and takes the others.
func oneRecipientRefused(t *testing.T, window, i int, refusal *providers.Error) *fixture {
	t.Helper()
	f := planWith(t, 60, func(s *campaign.Spec) { s.BatchSize = 60 })
	f.h.cfg.SendWindow = window
	bad := phone(i)
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == bad {
			e := *refusal // each call an error of its own, as an adapter's
			return &e
		}
		return nil
	}
	return f
}

// One recipient the provider always answers 5xx (an in-house receiver that crashes on one user's payload,
// a token FCM always answers 503) must not hold a provider that is down by the pace down for good: its
// own sends are the probes, each fails, and the pace never sees the provider answer. Before, that
// recipient was the probe for ever, nobody's attempts were used, nothing reached the DLQ, and every
// campaign on the provider waited behind it. Now a recipient whose sends have failed three times while
// the provider is down gives the probe up (it is deferred to a later run of its batch), and the next
// recipient probes: the provider is up again at once, and the rest go. Both send paths: one at a time,
// and a window.
func TestARecipientThatAlwaysFailsDoesNotKeepTheProviderDown(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		// u1, the first of the batch
		f := oneRecipientRefused(t, window, 1, &providers.Error{Provider: "test", Status: 500, Class: providers.Transient, Message: "internal server error"})
		// The provider is down by the pace (every worker's answers): only a probe a second goes.
		ctx := context.Background()
		f.rdb.HSet(ctx, state.PaceKey(state.ProviderBucket(f.provider.Name())), "down", "1", "downat", time.Now().UnixMilli()) //nolint:errcheck
		users := f.batchUsers(t, 0)
		if users[0] != "u1" {
			t.Fatalf("the batch's first recipient is %s; the test needs u1 to probe first", users[0])
		}
		runCtx, cancel := context.WithCancel(ctx)
		stop := time.AfterFunc(20*time.Second, cancel) // a cancel, not a deadline: a run keeps a deadline's margin for itself
		start := time.Now()
		err := f.h.RunBatch(runCtx, f.id, 0)
		stop.Stop()
		cancel()
		took := time.Since(start)
		eligible := 0
		for i := 1; i <= 60; i++ {
			if i%5 != 0 && i%3 != 0 && i != 1 {
				eligible++
				if len(f.provider.sentTo(phone(i))) != 1 {
					t.Errorf("window %d: customer %d got %d messages, want 1 (the run: %v after %v)", window, i, len(f.provider.sentTo(phone(i))), err, took)
				}
			}
		}
		if st, _, _ := f.status(t, "u1"); st != campaign.StatusPending || took > 15*time.Second {
			t.Errorf("window %d: the failing recipient is %s after %v (run: %v); want it pending for a later run, the run done well before its deadline", window, st, took, err)
		}
		t.Logf("window %d: %d others sent; run %v after %v", window, eligible, err, took)
		// The others were answered after it failed: it was the recipient, and the run counts against it.
		var attempts int
		if err := f.db.QueryRow(ctx, `SELECT attempts FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u1'`, f.id).Scan(&attempts); err != nil || attempts != 1 {
			t.Errorf("window %d: the failing recipient has %d attempts (%v); want its run counted, 1", window, attempts, err)
		}
		var re *RetryError
		if !errors.As(err, &re) {
			t.Errorf("window %d: the run returned %v; want the batch handed back", window, err)
		}

		// The next run of the batch, with that recipient alone left, on a worker of its own: its failures
		// do not call the provider down (a run of the first showed them to be its own: the provider took the
		// others meanwhile), and they count against it again, within seconds. Before, its own retries called
		// the provider down, its probes failed, nobody's attempts were used and it held the provider down for
		// every campaign (TestRecipientsThatAlwaysFailAloneFailAndNeverCallTheProviderDown).
		f.h = f.handler(f.rdb)
		f.h.cfg.SendWindow = window
		runCtx, cancel = context.WithCancel(ctx)
		stop = time.AfterFunc(20*time.Second, cancel)
		start = time.Now()
		err = f.h.RunBatch(runCtx, f.id, 0)
		stop.Stop()
		cancel()
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("window %d: the failing recipient alone held its run %v (run: %v); want it handed back within seconds", window, took, err)
		}
		if down, _ := f.rdb.HGet(ctx, state.PaceKey(state.ProviderBucket(f.provider.Name())), "down").Result(); down == "1" {
			t.Errorf("window %d: the provider is down by the pace after a run of the failing recipient alone", window)
		}
		if err := f.db.QueryRow(ctx, `SELECT attempts FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u1'`, f.id).Scan(&attempts); err != nil || attempts != 2 {
			t.Errorf("window %d: the failing recipient has %d attempts after its second run (%v); want 2", window, attempts, err)
		}
		if !errors.As(err, &re) {
			t.Errorf("window %d: the run alone returned %v; want the batch handed back", window, err)
		}
	}
}

// A recipient the provider asks to wait longer than a run holds its batch (a receiver's 429 with
// Retry-After: 3600) waits for a later run; the rest of the batch goes, and its run ends with them
// recorded. Before, the run slept for the hour, a worker slot with it, and its sent recipients stayed
// pending in status and report until then.
func TestALongRetryAfterForOneRecipientDoesNotHoldTheRun(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		f := oneRecipientRefused(t, window, 2, &providers.Error{Provider: "test", Status: 429, Class: providers.Transient, Throttled: true, RetryAfter: time.Hour, Message: "slow down"})
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(20*time.Second, cancel)
		start := time.Now()
		err := f.h.RunBatch(ctx, f.id, 0)
		stop.Stop()
		cancel()
		took := time.Since(start)
		var re *RetryError
		if !errors.As(err, &re) || re.Failure || re.After < 59*time.Minute || took > 10*time.Second {
			t.Fatalf("window %d: the run returned %v after %v; want it handed back at once, to come back in an hour", window, err, took)
		}
		if c := f.counts(t); c.Sent != 31 || c.Pending != 1 {
			t.Errorf("window %d: counts %+v; want the 31 others sent and recorded, u2 pending", window, c)
		}
	}
}

// A 404 for one recipient while the provider takes the others (an in-house receiver that does not know one
// user) leaves that recipient for a later run; the rest of the batch goes. Before, it was taken for the
// account's refusal, and the whole campaign crawled as provider_auth. A 404 for everyone (a wrong URL)
// still holds the batch as the account's.
func TestA404ForOneRecipientHoldsItAlone(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		f := oneRecipientRefused(t, window, 2, &providers.Error{Provider: "test", Status: 404, Class: providers.Permanent, Message: `{"error":"no such user"}`})
		err := f.h.RunBatch(context.Background(), f.id, 0)
		var re *RetryError
		if !errors.As(err, &re) || re.Failure || !re.Wait {
			t.Fatalf("window %d: the run returned %v; want the batch back later for u2 alone", window, err)
		}
		if c := f.counts(t); c.Sent != 31 || c.Pending != 1 {
			t.Errorf("window %d: counts %+v; want the 31 others sent, u2 pending", window, c)
		}
	}
	// Everyone 404: the account's refusal, as before.
	f := planWith(t, 30, func(s *campaign.Spec) { s.BatchSize = 30 })
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 404, Class: providers.Permanent, Message: "not found"}
	}
	err := f.h.RunBatch(context.Background(), f.id, 0)
	if err == nil || !strings.Contains(err.Error(), "refuses the account") {
		t.Fatalf("every send answered 404: %v; want the account's refusal", err)
	}
}

// Whether a 404 is one recipient's is judged by the answers of the same provider: a worker whose SMS
// provider takes messages, while its webhook answers 404 to everyone (a wrong URL), holds the webhook's
// batches as the account's refusal instead of leaving each recipient for later (and failing them for good
// after MaxRecipientAttempts runs).
func TestAnotherProvidersAnswersDoNotMakeA404OneRecipients(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	notFound := &providers.Error{Provider: "webhook", Status: 404, Class: providers.Permanent, Message: "not found"}
	f.h.accepted("twilio", "")
	if f.h.aloneRefused("webhook", notFound) {
		t.Fatal("twilio's answers made the webhook's 404 one recipient's")
	}
	if !f.h.aloneRefused("twilio", notFound) {
		t.Fatal("a 404 from a provider that took a message just now was taken for the account's")
	}
	if f.h.aloneRefused("twilio", &providers.Error{Provider: "twilio", Status: 401, Class: providers.Permanent}) {
		t.Fatal("a 401 was taken for one recipient's")
	}
}
