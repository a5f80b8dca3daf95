package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// deliver handles one recipient. A non-nil error stops the batch: the recipient (and the rest) stay
// pending for the next run.
func (h *Handler) deliver(ctx, waitCtx context.Context, run *batchRun, r *campaign.Recipient) error {
	if r.Suspect {
		return h.suspect(ctx, run, r)
	}
	if !r.Consent {
		return h.close(ctx, run, r, state.ReasonValue(state.Skipped, campaign.ReasonRevoked))
	}
	key := ClaimKey(run.c.ID, r.UserID)
	msg, err := run.message(r)
	if err != nil {
		run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Reason: "template: " + err.Error()})
		run.m.Failed(1)
		return nil
	}
	g := run.guard
	g.CheckHalt = true

	var pauseFrom time.Time // when the pause check began (piggyback): the provider limit's wait
	failedOver := false     // this recipient goes through the fallback, whatever the window says by now
	for attempt := 1; ; attempt++ {
		rt := h.route(run)
		if failedOver {
			rt = run.secondary
		}
		if err := h.readyToSend(ctx, waitCtx, run, 1, rt.limits...); err != nil {
			return err
		}
		if pauseFrom.IsZero() {
			pauseFrom = time.Now()
		}
		now := h.cfg.Now()
		mine := state.InFlightValue(now, h.cfg.Owner)
		cl, err := h.state.ClaimSend(ctx, run.c, run.nonce, state.SendClaim{Key: key, Mine: mine, Addr: r.Address}, g, run.unsettled, rt.pauseKey, now)
		if err == nil || errors.Is(err, state.ErrHalted) || errors.Is(err, state.ErrEpoch) {
			run.unsettled = nil // the script wrote it before anything else
		}
		if errors.Is(err, state.ErrHalted) || errors.Is(err, state.ErrEpoch) {
			return err
		}
		if err != nil {
			// The claim may still have been written (the reply was lost); it is released once Redis answers,
			// since nothing is sent under it.
			h.releaseLater(key, run.nonce, mine)
			h.log.Error("Redis is unreachable: no sends until it is back", "campaign_id", run.c.ID, "err", err)
			return infra(fmt.Errorf("no send while Redis is unavailable: %w", err))
		}
		switch cl.Result {
		case state.Paused:
			// The provider is paused (a 429 seen by some worker): nothing was written; wait it out.
			if err := limiter.Sleep(waitCtx, cl.Pause); err != nil {
				return waitError(ctx, waitCtx, err)
			}
			attempt--
			continue
		}
		if rt.piggyback {
			if o := rt.m.ProviderWait(); o != nil {
				o.Observe(time.Since(pauseFrom).Seconds())
			}
		}
		pauseFrom = time.Time{}
		switch cl.Result {
		case state.Taken:
			rt.m.ClaimsRefused(1)
			h.fromClaim(run, r.UserID, cl.Old)
			return nil
		case state.Capped:
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonFrequencyCap})
			rt.m.Skipped(1)
			return nil
		}
		start := time.Now()
		res, err := rt.provider.Send(ctx, msg)
		rt.m.Request(time.Since(start))
		if err == nil {
			run.unsettled = &state.Answer{Key: key, Mine: mine, Val: state.SentValue(res.MessageID, res.Segments)}
			if !rt.piggyback {
				// A token wait may come before the next claim: the answer is written now.
				h.settleAnswer(ctx, run)
			}
			o := campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, MessageID: res.MessageID, Segments: res.Segments}
			if rt.fallback {
				o.Reason = "sent through " + rt.provider.Name() + ", the fallback (" + run.provider.Name() + " was down)"
			}
			run.add(o)
			rt.m.Sent(1)
			h.succeeded(run)
			return nil
		}

		var pe *providers.Error
		if !errors.As(err, &pe) {
			// Cancelled before the request went out: nothing was sent.
			h.state.Release(context.WithoutCancel(ctx), key, run.nonce, mine)                            //nolint:errcheck // a kept claim only makes the recipient unknown later
			h.state.ReleaseMarks(context.WithoutCancel(ctx), run.c, run.nonce, []string{r.Address}, now) //nolint:errcheck // nothing was sent
			return err
		}
		switch {
		case pe.Class == providers.Ambiguous:
			h.state.Settle(ctx, key, run.nonce, mine, state.ReasonValue(state.Unknown, pe.Reason())) //nolint:errcheck // an unsettled claim reads as unknown too
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusUnknown, Reason: pe.Reason()})
			rt.m.Unknown(1)
			h.log.Warn("provider answer lost; recipient is unknown and will not be resent automatically",
				"campaign_id", run.c.ID, "user_id", r.UserID, "to", providers.MaskAddress(r.Address), "err", pe.Reason())
			return nil
		case pe.Class == providers.Permanent && !pe.AccountLevel():
			h.state.Settle(ctx, key, run.nonce, mine, state.ReasonValue(state.Failed, pe.Reason())) //nolint:errcheck // Postgres records the failure
			h.state.ReleaseMarks(ctx, run.c, run.nonce, []string{r.Address}, now)                   //nolint:errcheck // nothing reached the person
			if pe.BadAddress {
				// An unregistered push token: no later campaign should try it.
				if err := h.cfg.Store.MarkInvalid(ctx, run.c.Channel, r.Address, pe.Reason()); err != nil {
					h.log.Warn("could not record an invalid address", "campaign_id", run.c.ID, "err", err)
				}
			}
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Reason: pe.Reason()})
			rt.m.Failed(1)
			h.succeeded(run)
			return nil
		}
		if pe.Class == providers.Permanent {
			rt.m.AccountError(1)
		} else {
			rt.m.Retried(1, pe.Status, pe.Code)
		}
		// Transient, or the account itself is refused: nothing was accepted, so the claim is released (first:
		// a claim kept by mistake would make the recipient unknown; a mark kept is ours and harmless).
		if err := h.state.Release(ctx, key, run.nonce, mine); err != nil {
			return infra(err)
		}
		if err := h.state.ReleaseMarks(ctx, run.c, run.nonce, []string{r.Address}, now); err != nil {
			h.log.Warn("frequency mark not released", "campaign_id", run.c.ID, "err", err)
		}
		if !rt.fallback && run.secondary != nil {
			// The first provider is down (or refuses the account): the same recipient goes through the
			// fallback now, under a new claim of the same key; nothing was accepted by the first.
			h.markDown(rt.provider.Name())
			h.log.Warn("provider failed without accepting; failing over", "campaign_id", run.c.ID, "provider", rt.provider.Name(),
				"fallback", run.secondary.provider.Name(), "for", h.cfg.FailoverWindow, "err", pe.Reason())
			if pe.Class != providers.Permanent {
				h.slowDown(ctx, rt.provider.Name(), pe, backoff(1, pe.RetryAfter)) //nolint:errcheck // the fallback is what sends now
			}
			failedOver = true
			attempt--
			continue
		}
		if pe.Class == providers.Permanent {
			return &RetryError{Err: fmt.Errorf("provider refuses the account, not the recipient (fix the configuration; the batch waits): %w", pe), Failure: true}
		}
		wait := backoff(attempt, pe.RetryAfter)
		if err := h.slowDown(ctx, rt.provider.Name(), pe, wait); err != nil {
			return infra(err)
		}
		if attempt >= h.cfg.SendAttempts {
			return h.giveUp(run, r, pe, wait)
		}
		h.log.Debug("transient provider error; retrying", "campaign_id", run.c.ID, "attempt", attempt, "err", pe.Reason(), "wait", wait)
		if err := limiter.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// route is the provider a one-message send goes through, with its limits and metrics.
type route struct {
	provider providers.Provider
	limits   []limiter.Limit
	// pauseKey is the provider's pause, checked by the claim script when piggyback ("" when the limits
	// check it).
	pauseKey  string
	piggyback bool
	m         *metrics.Sends
	fallback  bool
}

// route picks the provider of the next send: the fallback while the first is marked down.
func (h *Handler) route(run *batchRun) *route {
	if run.secondary != nil {
		if until, ok := h.downUntil.Load(run.primary.provider.Name()); ok && h.cfg.Now().UnixNano() < until.(int64) {
			return run.secondary
		}
	}
	return &run.primary
}

// markDown skips the provider named for FailoverWindow, in favour of its fallback.
func (h *Handler) markDown(name string) {
	h.downUntil.Store(name, h.cfg.Now().Add(h.cfg.FailoverWindow).UnixNano())
}

// readyToSend takes n tokens from the campaign's and the provider's buckets, then checks that the send
// window is still open (the wait may have run past its end) and that the chunk's lease still holds.
func (h *Handler) readyToSend(ctx, waitCtx context.Context, run *batchRun, n int, limits ...limiter.Limit) error {
	if err := h.bucket.WaitN(waitCtx, n, limits...); err != nil {
		return waitError(ctx, waitCtx, err)
	}
	if now := h.cfg.Now(); !run.c.Window.Open(now) {
		next := run.c.Window.NextOpen(now)
		return &RetryError{Err: fmt.Errorf("the send window %s closed; sending resumes at %s", run.c.Window, next.Format(time.RFC3339)), After: next.Sub(now)}
	}
	return h.renew(ctx, run)
}

// waitError turns the error of a wait for tokens or a pause into what the batch returns.
func waitError(ctx, waitCtx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case waitCtx.Err() != nil:
		return &RetryError{Err: errors.New("batch handed back while waiting for the rate limit (worker stopping or batch time used up)"), After: time.Second}
	}
	return infra(fmt.Errorf("rate limiter: no send while Redis is unavailable: %w", err))
}

// settleAnswer writes the answer of the run's last send into its claim, when that has not happened yet.
func (h *Handler) settleAnswer(ctx context.Context, run *batchRun) {
	a := run.unsettled
	if a == nil {
		return
	}
	run.unsettled = nil
	if err := h.state.Settle(ctx, a.Key, run.nonce, a.Mine, a.Val); err != nil {
		h.log.Error("provider accepted but the claim could not be updated; Postgres will hold the outcome", "campaign_id", run.c.ID, "err", err)
	}
}

// releaseLater deletes a claim whose SET may have reached Redis although its reply did not, once Redis
// answers again (for up to a minute). It is compare-and-delete on this worker's own pending value: nothing
// was sent under it.
func (h *Handler) releaseLater(key, nonce, mine string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			if err := h.state.Release(ctx, key, nonce, mine); err == nil {
				return
			}
			limiter.Sleep(ctx, time.Second) //nolint:errcheck // the loop checks ctx
		}
	}()
}
