package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// consentMaxAge is how old the consents read with a chunk's lease may be when one of its messages goes.
// A chunk is sized to go out within about a second, but it can wait far longer for its provider: a pace
// the provider pushed down, an outage (only the probe goes), a Retry-After, a back-off. A refusal
// recorded meanwhile (an İYS sync, a RET reply) must still stop the messages not yet sent.
const consentMaxAge = time.Second

// recheck reads again, when the chunk's were read more than consentMaxAge ago, the consents of rs (the
// recipients of the chunk still to be sent), with the chunk's lease renewed by the same statement (see
// LeaseChunk). Those whose consent is gone are settled as revoked; those a receipt proves sent (an earlier
// send, resent as unknown) as sent; those no longer pending (settled by another hand meanwhile) are left
// alone. It returns the users not to send, nil when all may go. A lease
// lost to another run, or a campaign no longer running, ends the chunk as gate ends one.
func (h *Handler) recheck(ctx context.Context, run *batchRun, rs []*campaign.Recipient, whole bool) (map[string]bool, error) {
	return h.recheckAhead(ctx, run, rs, whole, 0)
}

// recheckAhead is recheck for sends that leave ahead from now: the consents that will be older than
// consentMaxAge by then are read again now.
func (h *Handler) recheckAhead(ctx context.Context, run *batchRun, rs []*campaign.Recipient, whole bool, ahead time.Duration) (map[string]bool, error) {
	if len(rs) == 0 || !h.consentStaleIn(run, ahead) {
		return nil, nil
	}
	// The campaign's --max-consent-age holds for these sends too, not only at the chunk's start: under
	// --rate 1 shared by many batch runs, each holding a leased chunk while it waited its turn for a token,
	// 9 messages went in the 9 s after the consents' age ran out. The batch stops as at a chunk's start.
	if !run.consentUntil.IsZero() && !time.Now().Add(ahead).Before(run.consentUntil) {
		why, err := h.consentsAgedOut(ctx, run)
		if err != nil {
			return nil, err
		}
		if why != "" {
			h.log.Error("batch stopped: consents too old", "campaign_id", run.c.ID, "batch", run.batch, "detail", why)
			return nil, toDLQ(errors.New(why))
		}
	}
	users := make([]string, len(rs))
	for i, r := range rs {
		users[i] = r.UserID
	}
	if !h.staleForIn(run, users, ahead) {
		return nil, nil // read again moments ago (the request before, split from this one)
	}
	got, err := h.reread(ctx, run, users, whole)
	if err != nil {
		return nil, err
	}
	var drop map[string]bool
	refused := 0
	for _, r := range rs {
		switch v := rereadVerdictOf(got, r.UserID, r.Address, r.Suspect); {
		case run.revoked[r.UserID]:
		case v == settledElsewhere:
			run.revoked[r.UserID] = true
		case v == sentBefore:
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, Reason: reasonReceiptFirst})
			run.revoked[r.UserID] = true
		case v == refusedMeanwhile:
			r.Consent = false
			if err := h.close(ctx, run, r, state.ReasonValue(state.Skipped, campaign.ReasonRevoked)); err != nil {
				return nil, err
			}
			run.revoked[r.UserID] = true
			refused++
		default:
			continue
		}
		if drop == nil {
			drop = map[string]bool{}
		}
		drop[r.UserID] = true
	}
	h.logRefused(run, refused)
	return drop, nil
}

// recheckInFlight reads again the consents of f, sends this run has claimed and is about to make, when
// the consents were read more than consentMaxAge ago: the claims, or the tokens taken again after them,
// took that long. Those whose consent is gone are not sent: their claims are settled as revoked (they are
// this run's) and their frequency marks given back. Those no longer pending are not sent either, their
// claims given back. It returns the users not to send.
func (h *Handler) recheckInFlight(ctx context.Context, run *batchRun, f inFlight) (map[string]bool, error) {
	got, err := h.reread(ctx, run, f.users, false)
	if err != nil {
		return nil, err
	}
	var drop map[string]bool
	var gone, refusedAddrs inFlight
	refused := 0
	for i, u := range f.users {
		switch rereadVerdictOf(got, u, f.addrs[i], false) { // a suspect is settled, never claimed for a send
		case settledElsewhere:
			gone.users, gone.keys = append(gone.users, u), append(gone.keys, f.keys[i])
			gone.values, gone.addrs = append(gone.values, f.values[i]), append(gone.addrs, f.addrs[i])
		case sentBefore:
			// The claim is this run's: it says sent, as the receipt does.
			if err := h.state.Settle(ctx, f.keys[i], run.nonce, f.values[i], state.SentValue("", 0)); err != nil {
				return nil, waitForServices(err)
			}
			run.add(campaign.Outcome{UserID: u, Status: campaign.StatusSent, Reason: reasonReceiptFirst})
			run.revoked[u] = true
		case refusedMeanwhile:
			if err := h.state.Settle(ctx, f.keys[i], run.nonce, f.values[i], state.ReasonValue(state.Skipped, campaign.ReasonRevoked)); err != nil {
				return nil, waitForServices(err)
			}
			refusedAddrs.addrs = append(refusedAddrs.addrs, f.addrs[i])
			run.add(campaign.Outcome{UserID: u, Status: campaign.StatusSkipped, Reason: campaign.ReasonRevoked})
			run.m.Skipped(1)
			run.revoked[u] = true
			refused++
		default:
			continue
		}
		if drop == nil {
			drop = map[string]bool{}
		}
		drop[u] = true
	}
	if len(gone.keys) > 0 {
		gone.at = f.at
		h.notSentAfterClaim(ctx, run, gone)
	}
	if len(refusedAddrs.addrs) > 0 {
		if err := h.state.ReleaseMarks(context.WithoutCancel(ctx), run.c, run.nonce, refusedAddrs.addrs, f.at); err != nil {
			h.log.Warn("frequency marks not released", "campaign_id", run.c.ID, "err", err)
		}
	}
	h.logRefused(run, refused)
	return drop, nil
}

// rereadVerdict is what a re-read of the consents (reread) says of a recipient about to be sent.
type rereadVerdict int

const (
	stillToSend rereadVerdict = iota
	// settledElsewhere: no longer pending, settled by another hand meanwhile; not this run's to send or
	// to record.
	settledElsewhere
	// sentBefore: a receipt of an earlier send came in while it was pending (a resend of an unknown): it
	// is recorded sent, as gate does, and not sent again.
	sentBefore
	// refusedMeanwhile: its consent is gone; it is settled as revoked.
	refusedMeanwhile
)

func rereadVerdictOf(got campaign.Chunk, user, addr string, suspect bool) rereadVerdict {
	_, pending := got.Leased[user]
	switch {
	case !pending:
		return settledElsewhere
	case got.Accepted[user] && !suspect:
		return sentBefore
	case !got.Consent[addr]:
		return refusedMeanwhile
	}
	return stillToSend
}

func (h *Handler) logRefused(run *batchRun, refused int) {
	if refused > 0 {
		h.log.Info("consent refused while the chunk waited for its provider: not sent", "campaign_id", run.c.ID,
			"batch", run.batch, "recipients", refused)
	}
}

// reread leases users again (renewing the chunk's lease) and reads their consents as they are now, for
// recheck and recheckInFlight; whole says users are all the chunk's recipients still to be sent. A lease lost to another run, or a campaign no longer running, ends the
// chunk as gate ends one.
func (h *Handler) reread(ctx context.Context, run *batchRun, users []string, whole bool) (campaign.Chunk, error) {
	h.settleAnswers(ctx, run) // before a Postgres round trip that may stall (renew)
	got, err := h.leaseChunk(ctx, run, users)
	if err != nil {
		return got, waitForServices(err)
	}
	at := run.leasedAt
	switch mode, retry, done := stateGate(run.c.ID, got.State); {
	case retry != nil:
		return got, retry
	case done:
		return got, errCampaignOver
	case mode == modeCancel:
		// Cancelled since the chunk was leased: the batch reads why and closes the rest (gate).
		return got, state.ErrHalted
	}
	for a := range got.Consent {
		if h.refusedHere(run.c, a) || h.spooledOut(run.c, "", a) {
			delete(got.Consent, a) // refused by a provider, its RET still being written, or held in a spool
		}
	}
	if got.TookOver {
		// This run's lease had run out, and the run that took the batch over let its own lease run out
		// too: the statement took it back (once that run was fenced), with that run's chunk in hand. Claims
		// of that run may say it sent them: they stay in hand, and this run stops, as one whose lease was
		// lost does (its own lease was fenced before it was taken).
		h.inherit(run, got.Inherited)
		return got, &RetryError{Err: fmt.Errorf("lease of batch %d lost to another run", run.batch), After: time.Second}
	}
	if len(got.Leased) == 0 && got.Busy > 0 {
		return got, &RetryError{Err: fmt.Errorf("lease of batch %d lost to another run", run.batch), After: time.Second}
	}
	if whole {
		run.consentAt, run.readAt = at, nil
	} else {
		// Only a read of every recipient still to be sent makes the chunk's consents fresh: after a read of
		// some (a request, the sends just claimed), the others' are as old as before.
		if run.readAt == nil {
			run.readAt = make(map[string]time.Time, len(users))
		}
		for _, u := range users {
			run.readAt[u] = at
		}
	}
	run.renewAt = at.Add(run.lease.TTL / 3)
	if run.snapshots == nil {
		run.snapshots = make(map[string]campaign.ConsentRecord, len(got.Snapshots))
	}
	for u, snap := range got.Snapshots {
		run.snapshots[u] = snap
	}
	if run.revoked == nil {
		run.revoked = map[string]bool{}
	}
	return got, nil
}

// consentStale says whether the chunk's consents were read more than consentMaxAge ago (some may have
// been read again since: staleFor).
func (h *Handler) consentStale(run *batchRun) bool { return h.consentStaleIn(run, 0) }

// consentStaleIn is consentStale ahead from now.
func (h *Handler) consentStaleIn(run *batchRun, ahead time.Duration) bool {
	return h.cfg.Now().Add(ahead).Sub(run.consentAt) > consentMaxAge
}

// staleFor says whether the consent of any of users was read more than consentMaxAge ago: with the chunk,
// or again since on its own.
func (h *Handler) staleFor(run *batchRun, users []string) bool { return h.staleForIn(run, users, 0) }

// staleForIn is staleFor ahead from now.
func (h *Handler) staleForIn(run *batchRun, users []string, ahead time.Duration) bool {
	now := h.cfg.Now().Add(ahead)
	if now.Sub(run.consentAt) <= consentMaxAge {
		return false
	}
	for _, u := range users {
		if at, ok := run.readAt[u]; !ok || now.Sub(at) > consentMaxAge {
			return true
		}
	}
	return false
}
