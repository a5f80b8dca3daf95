package worker

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// Five recipients the provider always answers 500 for (an in-house receiver that fails on some users, a
// push token the service cannot take), neighbours in their batch: the others are sent, and each of them
// fails after MaxRecipientAttempts runs, the later runs finding nothing else to send and the provider's
// last acceptance long past. Their failures never call the provider down. Before, their retries did once
// nothing else was left: the probes were theirs and failed, the provider stayed down for every campaign,
// nobody's attempts were used and they stayed pending for good. Both send paths: one at a time, and a
// window.
func TestRecipientsThatAlwaysFailAloneFailAndNeverCallTheProviderDown(t *testing.T) {
	t.Parallel()
	onBothSendPaths(t, 60, func(t *testing.T, f *fixture) {
		// Back-offs long enough for the shared pace to have judged the answers before a recipient runs out
		// of its attempts, as a worker's are.
		f.h.jitter = func(time.Duration) time.Duration { return 120 * time.Millisecond }
		users := f.batchUsers(t, 0)
		bad := map[string]bool{}
		for _, u := range users[:5] { // the batch's first five: neighbours, the first to go
			bad[u] = true
		}
		badPhones := map[string]bool{}
		for u := range bad {
			var n int
			fmt.Sscanf(u, "u%d", &n) //nolint:errcheck
			badPhones[phone(n)] = true
		}
		var refused atomic.Int32
		f.provider.fail = func(_ int, m providers.Message) error {
			if badPhones[m.To] {
				refused.Add(1)
				return &providers.Error{Provider: "test", Status: 500, Class: providers.Transient, Message: "internal server error"}
			}
			return nil
		}
		ctx := context.Background()
		pace := state.PaceKey(state.ProviderBucket(f.provider.Name()))
		runs := 0
		for ; runs < 3*MaxRecipientAttempts; runs++ {
			if c := f.counts(t); c.Pending == 0 {
				break
			}
			err := f.runBatchFor(ctx, 0, 30*time.Second)
			t.Logf("run %d: %v", runs+1, err)
			if down, _ := f.rdb.HGet(ctx, pace, "down").Result(); down == "1" {
				t.Fatalf("run %d (%v): the provider is down by the pace; only %d recipients failing alone were refused", runs+1, err, len(bad))
			}
			// The batch's retries are minutes apart: the process's last answer is long past when a later
			// run begins.
			f.h.lastAnswer.Store(time.Now().Add(-2 * time.Minute).UnixNano())
		}
		for u := range bad {
			if st, reason, code := f.status(t, u); st != campaign.StatusFailed || !strings.Contains(reason, "gave up after 5 runs") || code != "" {
				t.Errorf("%s after %d runs: %s/%q code %q; want failed after 5 runs, its code released", u, runs, st, reason, code)
			}
		}
		if c := f.counts(t); c.Pending != 0 || c.Failed != int64(len(bad)) || c.Sent != int64(len(users)-len(bad)) {
			t.Errorf("after %d runs: %+v; want the %d others sent, the %d failed", runs, c, len(users)-len(bad), len(bad))
		}
		if runs > MaxRecipientAttempts+1 {
			t.Errorf("%d runs to settle them; want at most %d", runs, MaxRecipientAttempts+1)
		}
		t.Logf("window %d: %d runs, %d refused requests", f.h.cfg.SendWindow, runs, refused.Load())
	})
}

// runBatchFor runs batch once, cancelled after d if it has not ended: a cancel, not a deadline, as a run
// keeps a deadline's margin for itself.
func (f *fixture) runBatchFor(ctx context.Context, batch int, d time.Duration) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := time.AfterFunc(d, cancel)
	defer stop.Stop()
	return f.h.RunBatch(runCtx, f.id, batch)
}

// onBothSendPaths runs test as a parallel subtest on each send path of a one-message provider, one message
// at a time (a window of 1) and DefaultSendWindow at once, each on a plan of n customers in one batch.
func onBothSendPaths(t *testing.T, n int, test func(t *testing.T, f *fixture)) {
	t.Helper()
	for _, window := range []int{1, DefaultSendWindow} {
		t.Run(fmt.Sprintf("a window of %d", window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, n, func(s *campaign.Spec) { s.BatchSize = n })
			f.h.cfg.SendWindow = window
			test(t, f)
		})
	}
}
