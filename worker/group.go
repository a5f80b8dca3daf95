package worker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers"
)

// prepare settles a recipient of the chunk that will not be sent (taken over from a dead run under
// another Redis epoch: settleUnverifiable; consent no longer ONAY: skipped, revoked; a message that does
// not render: failed with the reason) and renders the others' message, ok. Every send path (one at a
// time, windowed, many a request) starts with it: the consent check is written once. A non-nil error
// (Redis or Postgres) stops the chunk.
func (h *Handler) prepare(ctx context.Context, run *batchRun, r *campaign.Recipient) (providers.Message, bool, error) {
	switch {
	case run.revoked[r.UserID]:
		return providers.Message{}, false, nil // settled by recheck
	case r.Suspect:
		return providers.Message{}, false, h.settleUnverifiable(ctx, run, r)
	case !r.Consent:
		return providers.Message{}, false, h.close(ctx, run, r, state.ReasonValue(state.Skipped, campaign.ReasonRevoked))
	}
	msg, err := run.message(r)
	if err != nil {
		run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Reason: campaign.TemplateFailure + err.Error()})
		run.m.Failed(1)
		return providers.Message{}, false, nil
	}
	return msg, true, nil
}

// message renders the recipient's message (Renderer), with the campaign's shared content where the
// provider takes it (a value the shared form cannot write leaves the message rendered: its request then
// carries every recipient's text).
func (run *batchRun) message(r *campaign.Recipient) (providers.Message, error) {
	return run.render.Render(r)
}

// deliverGroup sends the recipients of one chunk through a provider that takes many in one request
// (SendGrid). Recipients that will not be sent (consent revoked, taken over from a dead run under
// another Redis epoch) are settled one by one first; the rest are claimed together just before their
// request, and their outcomes written into the claims as soon as the provider answers.
func (h *Handler) deliverGroup(ctx, waitCtx context.Context, run *batchRun, b providers.Batcher, rs []campaign.Recipient) error {
	send := make([]*campaign.Recipient, 0, len(rs))
	msgs := make([]providers.Message, 0, len(rs))
	for i := range rs {
		r := &rs[i]
		m, ok, err := h.prepare(ctx, run, r)
		if err != nil {
			return err
		}
		if ok {
			send, msgs = append(send, r), append(msgs, m)
		}
	}
	if len(send) == 0 {
		return nil
	}
	return h.sendGroup(ctx, waitCtx, run, b, send, msgs)
}

// sendGroup sends one request for rs. A request refused for good (400, a message too large to share a
// request) is split in halves until the recipient at fault is alone, so one bad address never fails a
// thousand good ones.
func (h *Handler) sendGroup(ctx, waitCtx context.Context, run *batchRun, b providers.Batcher, rs []*campaign.Recipient, msgs []providers.Message) error {
	return h.sendGroupAs(ctx, waitCtx, run, b, rs, msgs, false)
}

// recheckRequest reads the consents of a request's recipients again when they are stale (recheck) and
// returns the recipients still to be sent, with their messages.
func (h *Handler) recheckRequest(ctx context.Context, run *batchRun, rs []*campaign.Recipient, msgs []providers.Message) ([]*campaign.Recipient, []providers.Message, error) {
	drop, err := h.recheck(ctx, run, rs, false)
	if err != nil || len(drop) == 0 {
		return rs, msgs, err
	}
	kept := keptIndexes(rs, drop)
	return pick(rs, kept), pick(msgs, kept), nil
}

// sendGroupAs is sendGroup; probe says the caller holds the probe of b's provider, down by every worker's
// answers (waitWhileDown), for this request.
//
// The provider's shared pace is read before each request. A provider that resets its connections or never
// answers gives ambiguous answers (the request was written, its messages may have gone): they are not
// retried, and every recipient of the request becomes unknown. Read only after a failure that is retried,
// the pace let such an outage take a whole request of recipients (up to a thousand e-mails) with every
// request, at the full rate, while it called the provider down. While it is down, requests wait; the probe,
// one request a second over every worker, carries one recipient.
func (h *Handler) sendGroupAs(ctx, waitCtx context.Context, run *batchRun, b providers.Batcher, rs []*campaign.Recipient, msgs []providers.Message, probe bool) error {
	g := run.guard
	g.CheckHalt = true
	for attempt := 1; ; attempt++ {
		if !probe {
			var err error
			if probe, err = h.waitWhileDown(ctx, waitCtx, run, b.Name()); err != nil {
				return err
			}
		}
		if probe && len(rs) > 1 {
			// The probe goes to a recipient still to be sent: the request's consents are read again first
			// (when they are stale), all at once. Read for the probe's recipient alone, each refusal made
			// meanwhile took a probe without a request, one a second, and the provider, never probed,
			// stayed down for every campaign on it.
			var err error
			if rs, msgs, err = h.recheckRequest(ctx, run, rs, msgs); err != nil || len(rs) == 0 {
				return err
			}
		}
		if probe && len(rs) > 1 {
			if err := h.sendGroupAs(ctx, waitCtx, run, b, rs[:1], msgs[:1], true); err != nil {
				return err
			}
			rs, msgs, probe = rs[1:], msgs[1:], false
			attempt-- // not an attempt of the others: the pace is read again first
			continue
		}
		probe = false
		if err := h.readyToSend(ctx, waitCtx, run, sendSize{msgs: len(rs), tokens: len(rs), calls: 1, via: b}, run.limits...); err != nil {
			return err
		}
		var err error
		if rs, msgs, err = h.recheckRequest(ctx, run, rs, msgs); err != nil || len(rs) == 0 {
			return err
		}

		// Claim everyone of the request at once, just before it, with their frequency marks.
		now := h.cfg.Now()
		value := state.InFlightValue(now, h.cfg.Owner)
		scs := make([]state.SendClaim, len(rs))
		for i, r := range rs {
			scs[i] = state.SendClaim{Key: ClaimKey(run.c.ID, r.UserID), Value: value, Addr: r.Address}
		}
		// The provider's pause is read in the same script: one set while the request waited for its tokens
		// (a 429 to another worker) holds it back; the tokens it took are spent, which only lowers the rate.
		got, pause, err := h.state.ClaimWindow(ctx, run.c, run.nonce, scs, g, nil, run.primary.pauseKey, now)
		if guardRefused(err) {
			return err
		}
		if err != nil {
			for _, sc := range scs {
				h.releaseLater(sc.Key, run.nonce, sc.Value)
			}
			h.log.Error("Redis is unreachable: no sends until it is back", "campaign_id", run.c.ID, "err", err)
			return waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
		}
		if pause > 0 {
			// Nothing was claimed: wait the pause out, then take the tokens again (not an attempt).
			if err := h.hold(waitCtx, run, pause); err != nil {
				return waitError(ctx, waitCtx, err)
			}
			attempt--
			continue
		}
		keys, inflight, addrs := make([]string, 0, len(got)), make([]string, 0, len(got)), make([]string, 0, len(got))
		// The recipients whose claims are ours are kept in place, in order: a request's messages are not
		// copied into new slices (a thousand messages are a few hundred kilobytes).
		n := 0
		for i, cl := range got {
			switch cl.Result {
			case state.Taken:
				run.m.ClaimsRefused(1)
				h.fromClaim(ctx, run, rs[i].UserID, cl.Old)
				continue
			case state.Capped:
				run.add(campaign.Outcome{UserID: rs[i].UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonFrequencyCap})
				run.m.Skipped(1)
				continue
			}
			if n != i {
				rs[n], msgs[n] = rs[i], msgs[i]
			}
			n++
			keys, inflight, addrs = append(keys, scs[i].Key), append(inflight, scs[i].Value), append(addrs, scs[i].Addr)
		}
		rs, msgs = rs[:n], msgs[:n]
		if n == 0 {
			return nil
		}

		users := make([]string, len(rs))
		for i, r := range rs {
			users[i] = r.UserID
		}
		drop, err := h.tokensStillFresh(ctx, waitCtx, run, sendSize{msgs: len(rs), tokens: len(rs), calls: 1},
			inFlight{users: users, keys: keys, values: inflight, addrs: addrs, at: now}, run.limits...)
		if err != nil {
			return err
		}
		if len(drop) > 0 {
			kept := keptIndexes(rs, drop)
			rs, msgs, keys, inflight, addrs = pick(rs, kept), pick(msgs, kept), pick(keys, kept), pick(inflight, kept), pick(addrs, kept)
			if len(rs) == 0 {
				return nil
			}
		}
		start := time.Now()
		stopKeeping := h.keepLease(ctx, run)
		res, err := b.SendBatch(ctx, msgs)
		err = providers.MaskContent(err, msgs...)
		stopKeeping()
		took := time.Since(start)
		run.m.BatchRequest(took, len(msgs))
		// Every answer counts in the provider's shared pace, acceptances too: a pace that saw only the
		// failures would call the provider down on one and never see it back.
		v, pe := judge(err)
		h.observe(ctx, b.Name(), v, pe, len(rs), took, "", 0)
		if err == nil { // accepted
			keyed, name := providers.ReceiptsNameRecipient(b), b.Name()
			vals := make([]string, len(rs))
			for i, r := range rs {
				if i > 0 && res[i] == res[i-1] {
					vals[i] = vals[i-1] // one request, one message ID: its value is made once
				} else {
					vals[i] = state.SentValue(res[i].MessageID, res[i].Segments)
				}
				run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, MessageID: res[i].MessageID, Segments: res[i].Segments, ReceiptKeyed: keyed, Provider: name, SentAt: start})
			}
			run.m.Sent(len(rs))
			if err := h.state.SettleMany(ctx, keys, run.nonce, inflight, vals); err != nil {
				// Postgres holds the only record of them: they are committed durably (flush).
				run.unclaimed = true
				h.log.Error("provider accepted but the claims could not be updated; Postgres will hold the outcomes", "campaign_id", run.c.ID, "recipients", len(rs), "err", err)
			}
			h.answered(ctx, run)
			return nil
		}
		f := inFlight{users: make([]string, len(rs)), keys: keys, values: inflight, addrs: addrs, at: now}
		for i, r := range rs {
			f.users[i] = r.UserID
		}
		if v == refused && len(rs) > 1 {
			// The request as a whole was refused: nothing was sent. Split it to find who is at fault.
			run.m.Split(len(rs))
			if err := h.releaseNotSent(ctx, run, f); err != nil {
				return err
			}
			half := len(rs) / 2
			if err := h.sendGroup(ctx, waitCtx, run, b, rs[:half], msgs[:half]); err != nil {
				return err
			}
			return h.sendGroup(ctx, waitCtx, run, b, rs[half:], msgs[half:])
		}
		if err := h.settleRefusal(ctx, run, run.m, v, pe, f); err != nil {
			return err
		}
		switch v {
		case notSent:
			return err
		case ambiguous, refused:
			return nil
		case accountRefused:
			return h.accountError(ctx, run, pe)
		}
		wait := h.backOff(pe, attempt)
		h.beforeGivingUp(ctx, b.Name(), attempt)
		p, err := h.waitWhileDown(ctx, waitCtx, run, b.Name())
		if err != nil {
			return err
		}
		if p {
			probe = true
			attempt--
			continue
		}
		if attempt >= h.cfg.SendAttempts {
			return &RetryError{Err: fmt.Errorf("provider kept failing a request of %d recipients: %w", len(rs), pe), After: wait, Failure: true}
		}
		h.log.Debug("transient provider error; retrying the request", "campaign_id", run.c.ID, "recipients", len(rs),
			"attempt", strconv.Itoa(attempt), "err", pe.Reason(), "wait", wait)
		if err := h.hold(ctx, run, wait); err != nil {
			return err
		}
	}
}

// keptIndexes are the indexes, in order, of the recipients of rs not in drop.
func keptIndexes(rs []*campaign.Recipient, drop map[string]bool) []int {
	kept := make([]int, 0, len(rs))
	for i, r := range rs {
		if !drop[r.UserID] {
			kept = append(kept, i)
		}
	}
	return kept
}

// pick keeps the elements of s at the indexes kept (increasing), in place: a request's messages and the
// slices parallel to them are compacted alike, without copies.
func pick[T any](s []T, kept []int) []T {
	for n, i := range kept {
		s[n] = s[i]
	}
	return s[:len(kept)]
}
