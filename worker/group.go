package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// message renders the recipient's message.
func (run *batchRun) message(r *campaign.Recipient) (providers.Message, error) {
	data := r.TemplateData(run.c.Channel, run.c.Name)
	parts, err := run.tmpl.RenderParts(data)
	if err != nil {
		return providers.Message{}, err
	}
	ch := run.c.Channel.Spec()
	if ch.Segmented {
		if err := campaign.CheckSMSLength(parts.Text, run.c.MaxSegments); err != nil {
			return providers.Message{}, fmt.Errorf("the message %w", err)
		}
	}
	if ch.SubjectHeader && strings.ContainsAny(parts.Subject, "\r\n") {
		return providers.Message{}, fmt.Errorf("the subject would hold a line break (%s)", campaign.ReasonInvalidValue)
	}
	m := providers.Message{To: r.Address, Subject: parts.Subject, Body: parts.Text, HTML: parts.HTML,
		TemplateID: run.c.TemplateID, CampaignID: run.c.ID, UserID: r.UserID,
		Commercial: !run.c.Transactional, RecipientType: run.c.IYSRecipientType()}
	if run.sharedForm != nil {
		// A value the shared form cannot write leaves the message rendered only: its request then carries
		// every recipient's rendered text.
		if vals, ok, err := run.sharedForm.Values(data); ok && err == nil {
			m.Shared, m.Values = run.shared, vals
		}
	}
	if run.c.TemplateID != "" || ch.Data {
		// A provider-side template (and a push's data payload) gets the values themselves.
		m.Data = make(map[string]string, len(data))
		for k, v := range data {
			if k == ch.AddressColumn {
				continue
			}
			m.Data[k] = fmt.Sprint(v)
		}
	}
	return m, nil
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
		switch {
		case r.Suspect:
			if err := h.suspect(ctx, run, r); err != nil {
				return err
			}
			continue
		case !r.Consent:
			if err := h.close(ctx, run, r, reasonValue(claimSkipped, campaign.ReasonRevoked)); err != nil {
				return err
			}
			continue
		}
		m, err := run.message(r)
		if err != nil {
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Reason: "template: " + err.Error()})
			run.m.Failed(1)
			continue
		}
		send, msgs = append(send, r), append(msgs, m)
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
	g := run.guard
	g.checkHalt = true
	for attempt := 1; ; attempt++ {
		if err := h.readyToSend(ctx, waitCtx, run, len(rs), run.limits...); err != nil {
			return err
		}

		// Claim everyone of the request at once, just before it, with their frequency marks.
		now := h.cfg.Now()
		pending := pendingValue(now, h.cfg.Owner)
		scs := make([]sendClaim, len(rs))
		for i, r := range rs {
			scs[i] = sendClaim{key: ClaimKey(run.c.ID, r.UserID), mine: pending, addr: r.Address}
		}
		got, err := h.claims.claimSendMany(ctx, run.c, run.nonce, scs, g, now)
		if errors.Is(err, errHalted) || errors.Is(err, errEpoch) {
			return err
		}
		if err != nil {
			for _, sc := range scs {
				h.releaseLater(sc.key, run.nonce, sc.mine)
			}
			h.log.Error("Redis is unreachable: no sends until it is back", "campaign_id", run.c.ID, "err", err)
			return infra(fmt.Errorf("no send while Redis is unavailable: %w", err))
		}
		var keys, mine, addrs []string
		sendRs, sendMsgs := rs, msgs
		rs, msgs = nil, nil
		for i, cl := range got {
			switch cl.kind {
			case 'x':
				run.m.ClaimsRefused(1)
				h.fromClaim(run, sendRs[i].UserID, cl.old)
				continue
			case 'c':
				run.add(campaign.Outcome{UserID: sendRs[i].UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonFrequencyCap})
				run.m.Skipped(1)
				continue
			}
			rs, msgs = append(rs, sendRs[i]), append(msgs, sendMsgs[i])
			keys, mine, addrs = append(keys, scs[i].key), append(mine, scs[i].mine), append(addrs, scs[i].addr)
		}
		if len(rs) == 0 {
			return nil
		}

		start := time.Now()
		res, err := b.SendBatch(ctx, msgs)
		run.m.BatchRequest(time.Since(start), len(msgs))
		if err == nil {
			vals := make([]string, len(rs))
			for i, r := range rs {
				vals[i] = sentValue(res[i].MessageID, res[i].Segments)
				run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, MessageID: res[i].MessageID, Segments: res[i].Segments})
			}
			run.m.Sent(len(rs))
			if err := h.claims.settleMany(ctx, keys, run.nonce, mine, vals); err != nil {
				h.log.Error("provider accepted but the claims could not be updated; Postgres will hold the outcomes", "campaign_id", run.c.ID, "recipients", len(rs), "err", err)
			}
			h.succeeded(run)
			return nil
		}
		var pe *providers.Error
		if !errors.As(err, &pe) {
			h.claims.releaseMany(context.WithoutCancel(ctx), keys, run.nonce, mine)           //nolint:errcheck // a kept claim only makes the recipients unknown later
			h.frequency.releaseMany(context.WithoutCancel(ctx), run.c, run.nonce, addrs, now) //nolint:errcheck // nothing was sent
			return err
		}
		switch {
		case pe.Class == providers.Ambiguous:
			vals := make([]string, len(rs))
			for i, r := range rs {
				vals[i] = reasonValue(claimUnknown, pe.Reason())
				run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusUnknown, Reason: pe.Reason()})
			}
			run.m.Unknown(len(rs))
			h.claims.settleMany(ctx, keys, run.nonce, mine, vals) //nolint:errcheck // unsettled claims read as unknown too
			h.log.Warn("provider answer lost; the request's recipients are unknown and will not be resent automatically",
				"campaign_id", run.c.ID, "recipients", len(rs), "err", pe.Reason())
			return nil
		case pe.Class == providers.Permanent && !pe.AccountLevel():
			if len(rs) == 1 {
				h.claims.settle(ctx, keys[0], run.nonce, mine[0], reasonValue(claimFailed, pe.Reason())) //nolint:errcheck // Postgres records the failure
				h.frequency.release(ctx, run.c, run.nonce, addrs[0], now)                                //nolint:errcheck // nothing reached the person
				run.add(campaign.Outcome{UserID: rs[0].UserID, Status: campaign.StatusFailed, Reason: pe.Reason()})
				run.m.Failed(1)
				h.succeeded(run)
				return nil
			}
			run.m.Split(len(rs))
			// The request as a whole was refused: nothing was sent. Split it to find who is at fault.
			if err := h.claims.releaseMany(ctx, keys, run.nonce, mine); err != nil {
				return infra(err)
			}
			h.frequency.releaseMany(ctx, run.c, run.nonce, addrs, now) //nolint:errcheck // ours, harmless
			half := len(rs) / 2
			if err := h.sendGroup(ctx, waitCtx, run, b, rs[:half], msgs[:half]); err != nil {
				return err
			}
			return h.sendGroup(ctx, waitCtx, run, b, rs[half:], msgs[half:])
		}
		if pe.Class == providers.Permanent {
			run.m.AccountError(len(rs))
		} else {
			run.m.Retried(len(rs), pe.Status, pe.Code)
		}
		// Transient, or the account is refused: nothing was accepted.
		if err := h.claims.releaseMany(ctx, keys, run.nonce, mine); err != nil {
			return infra(err)
		}
		if err := h.frequency.releaseMany(ctx, run.c, run.nonce, addrs, now); err != nil {
			h.log.Warn("frequency marks not released", "campaign_id", run.c.ID, "err", err)
		}
		if pe.Class == providers.Permanent {
			return &RetryError{Err: fmt.Errorf("provider refuses the account, not the recipients (fix the configuration; the batch waits): %w", pe), Failure: true}
		}
		wait := backoff(attempt, pe.RetryAfter)
		if err := h.slowDown(ctx, b.Name(), pe, wait); err != nil {
			return infra(err)
		}
		if attempt >= h.cfg.SendAttempts {
			return &RetryError{Err: fmt.Errorf("provider kept failing a request of %d recipients: %w", len(rs), pe), After: wait, Failure: true}
		}
		h.log.Debug("transient provider error; retrying the request", "campaign_id", run.c.ID, "recipients", len(rs),
			"attempt", strconv.Itoa(attempt), "err", pe.Reason(), "wait", wait)
		if err := limiter.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}
