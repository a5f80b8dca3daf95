package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// slowDown shares a transient refusal of the provider named with every worker: a rate-limit answer
// pauses the provider for wait, a 5xx counts towards pausing it (Strike).
func (h *Handler) slowDown(ctx context.Context, provider string, pe *providers.Error, wait time.Duration) error {
	key := "provider:" + provider
	if pe.AsksToSlowDown() {
		return h.bucket.Pause(ctx, key, wait)
	}
	_, err := h.bucket.Strike(ctx, key, strikeThreshold, wait)
	return err
}

// strikeThreshold is how many 5xx answers within a second, over all workers, pause a provider for
// everyone.
const strikeThreshold = 5

// giveUp ends this run's tries of a recipient whose sends kept failing transiently. When the recipient
// before it failed the same way, the provider is in trouble rather than the recipient: the batch stops and
// comes back later. Otherwise the recipient is left pending and the batch goes on. The failure counts
// against the recipient once the provider is seen to work (a send of this run after it, or any send of
// this process in the last half minute), and a recipient that failed in MaxRecipientAttempts runs fails
// for good. A recipient that keeps failing while nothing else is sent stays pending, and its batch ends
// in the DLQ.
func (h *Handler) giveUp(run *batchRun, r *campaign.Recipient, pe *providers.Error, wait time.Duration) error {
	run.failedInARow++
	if run.failedInARow >= 2 {
		run.strikes = nil
		return &RetryError{Err: fmt.Errorf("provider kept failing: %w", pe), After: wait, Failure: true}
	}
	o := campaign.Outcome{UserID: r.UserID, Status: campaign.StatusPending, Reason: pe.Reason()}
	if r.Attempts+1 >= MaxRecipientAttempts {
		o.Status = campaign.StatusFailed
		o.Reason = fmt.Sprintf("gave up after %d runs with transient provider errors; last: %s", r.Attempts+1, pe.Reason())
	}
	if last := h.lastAnswer.Load(); last != 0 && h.cfg.Now().Sub(time.Unix(0, last)) < 30*time.Second {
		run.add(o)
		if o.Status == campaign.StatusPending {
			run.deferred++
		}
		return nil
	}
	run.deferred++
	run.strikes = append(run.strikes, o)
	delete(run.inherited, r.UserID) // its claim was released: nothing was sent
	return nil
}

// succeeded notes a recipient the provider answered for: the recipients that failed before it were at
// fault themselves.
func (h *Handler) succeeded(run *batchRun) {
	h.lastAnswer.Store(h.cfg.Now().UnixNano())
	run.failedInARow = 0
	for _, o := range run.strikes {
		if o.Status == campaign.StatusFailed {
			run.deferred--
		}
		run.add(o)
	}
	run.strikes = run.strikes[:0]
}

// backoff is exponential with jitter (half to all of 250 ms·2^(attempt-1), capped at 10 s), and never
// shorter than the provider's own hint.
func backoff(attempt int, hint time.Duration) time.Duration {
	d := 250 * time.Millisecond << min(attempt-1, 6)
	d = min(d, 10*time.Second)
	d = d/2 + rand.N(d/2+1)
	return max(d, hint)
}
