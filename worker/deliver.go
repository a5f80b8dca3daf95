package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// deliver handles one recipient, the first of rest (the chunk's recipients not handled yet, whose
// consents it reads again with the recipient's when they have grown old: recheck). A non-nil error stops
// the batch: the recipient (and the rest) stay pending for the next run.
func (h *Handler) deliver(ctx, waitCtx context.Context, run *batchRun, rest []campaign.Recipient) error {
	r := &rest[0]
	msg, ok, err := h.prepare(ctx, run, r)
	if err != nil || !ok {
		return err
	}
	key := ClaimKey(run.c.ID, r.UserID)
	g := run.guard
	g.CheckHalt = true

	var pauseFrom time.Time // when the pause check began (answerInNextClaim): the provider limit's wait
	failedOver := false     // this recipient goes through the fallback, whatever the window says by now
	refusedAlone := false   // it does because the first provider refused it, not being down (failoverAfter)
	probe := false          // this send is the probe of a provider that is down (waitWhileDown)
	failedWhileDown := 0    // this recipient's sends that failed while the provider was down by the pace
	for attempt := 1; ; attempt++ {
		rt, probed := h.route(ctx, run, r.Address)
		if failedOver {
			rt, probed = run.secondary, false
		}
		if !probe && !probed {
			next, p, err := h.whileDown(ctx, waitCtx, run, rt, r.Address)
			if err != nil {
				return err
			}
			failedOver = failedOver || next != rt // passed to the fallback: it stays there
			rt, probed = next, p
		}
		probed = probed || probe // this send is a probe of a first provider that is down
		probe = false
		tokens := sendTokens(rt, msg)
		drop, readErr, err := h.readyToSendFresh(ctx, waitCtx, run, sendSize{msgs: 1, tokens: tokens, calls: 1, via: rt.provider}, func() []*campaign.Recipient {
			rs := make([]*campaign.Recipient, len(rest))
			for i := range rest {
				rs[i] = &rest[i]
			}
			return rs
		}, rt.limits...)
		if err == nil {
			err = readErr
		}
		if err != nil || drop[r.UserID] {
			return err
		}
		if pauseFrom.IsZero() {
			pauseFrom = time.Now()
		}
		now := h.cfg.Now()
		inflight := state.InFlightValue(now, h.cfg.Owner)
		var prev *state.Answer
		if len(run.answersDue) == 1 {
			prev = &run.answersDue[0]
		} else {
			h.settleAnswers(ctx, run)
		}
		cl, err := h.state.ClaimSend(ctx, run.c, run.nonce, state.SendClaim{Key: key, Value: inflight, Addr: r.Address}, g, prev, rt.pauseKey, now)
		if err == nil || guardRefused(err) {
			run.answersDue = run.answersDue[:0] // the script wrote it before anything else
		}
		if guardRefused(err) {
			return err
		}
		if err != nil {
			// The claim may still have been written (the reply was lost); it is released once Redis answers,
			// since nothing is sent under it.
			h.releaseLater(key, run.nonce, inflight)
			h.log.Error("Redis is unreachable: no sends until it is back", "campaign_id", run.c.ID, "err", err)
			return waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
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
		if rt.answerInNextClaim {
			if o := rt.m.ProviderWait(); o != nil {
				o.Observe(time.Since(pauseFrom).Seconds())
			}
		}
		pauseFrom = time.Time{}
		switch cl.Result {
		case state.Taken:
			rt.m.ClaimsRefused(1)
			h.fromClaim(ctx, run, r.UserID, cl.Old)
			return nil
		case state.Capped:
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonFrequencyCap})
			rt.m.Skipped(1)
			return nil
		}
		if drop, err := h.tokensStillFresh(ctx, waitCtx, run, sendSize{msgs: 1, tokens: tokens, calls: 1},
			oneInFlight(r.UserID, key, inflight, r.Address, now), rt.limits...); err != nil || drop[r.UserID] {
			return err
		}
		start := time.Now()
		res, err := rt.provider.Send(ctx, msg)
		err = maskQuoted(err, msg, r)
		took := time.Since(start)
		rt.m.Request(took)
		v, pe := judge(err)
		h.observe(ctx, rt.provider.Name(), v, pe, tokens, took, r.Address, r.Attempts)
		if v == accepted {
			run.answersDue = append(run.answersDue, state.Answer{Key: key, InFlight: inflight, Value: state.SentValueVia(res.MessageID, res.Segments, rt.fallbackName())})
			if !rt.answerInNextClaim {
				// A token wait may come before the next claim: the answer is written now.
				h.settleAnswers(ctx, run)
			}
			o := campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, MessageID: res.MessageID, Segments: res.Segments, ReceiptKeyed: rt.keyed, Provider: rt.provider.Name(), SentAt: start}
			if rt.fallback {
				why := " was down"
				switch {
				case !providers.Takes(run.provider, r.Address):
					why = " cannot take this address"
				case refusedAlone:
					why = " refused this message without accepting it"
				}
				o.Reason = "sent through " + rt.provider.Name() + ", the fallback (" + run.provider.Name() + why + ")"
			}
			run.add(o)
			rt.m.Sent(1)
			h.answered(ctx, run)
			h.accepted(rt.provider.Name(), r.Address)
			return nil
		}
		if err := h.settleRefusal(ctx, run, rt.m, v, pe, oneInFlight(r.UserID, key, inflight, r.Address, now)); err != nil {
			return err
		}
		switch v {
		case notSent:
			return err
		case ambiguous, refused:
			return nil
		}
		if v == transient && pe.RecipientLimited {
			// Not the provider's trouble: no failover, no wait.
			h.deferLimited(run, r, pe)
			return nil
		}
		if v == accountRefused && h.aloneRefused(rt.provider.Name(), pe) {
			h.deferAlone(run, r, pe)
			return nil
		}
		// Nothing was accepted (transient, or the account is refused). A provider that asks to slow down
		// (a 429) is not down: the shared pace slows for it, and the fallback takes over only once it is
		// down by every worker's answers (whileDown). Before, one 429 moved this worker to the fallback for
		// the failover window: 8 sporadic 429s sent 95 % of a campaign through the dearer second provider.
		throttled := v == transient && pe.AsksToSlowDown()
		if !rt.fallback && !throttled && run.secondary != nil && providers.Takes(run.secondary.provider, r.Address) {
			// The first provider refused without accepting: the same recipient goes through the fallback
			// now, under a new claim of the same key. The first is left for the failover window only when
			// it is down (failoverAfter refusals in a row, the account refused, a probe that failed): a
			// sporadic 5xx among acceptances is over by the next request. Before, each one moved this
			// worker to the fallback for the window: 3 sporadic 503s sent 97.6 % of a campaign through it.
			refused := h.refusedAgain(rt.provider.Name())
			refusedAlone = !probed && v != accountRefused && refused < failoverAfter
			if !refusedAlone {
				if probed || v == accountRefused {
					h.markDown(rt.provider.Name())
				} else {
					// Refusals in a row that the pace has not called an outage: the fallback carries this
					// worker's sends only until the first provider's next probe is due (FailoverProbeEvery),
					// then one send tries it again; one refused more sends this worker back at once (the
					// refusals in a row stand until an acceptance). With the whole window, a worker came back
					// 15 s after a 15 s outage that its sends to the fallback kept the pace from seeing.
					h.markDownFor(rt.provider.Name(), min(h.cfg.FailoverWindow, h.cfg.FailoverProbeEvery))
				}
				if probed {
					// A probe that failed: the provider is still down by the pace, which is still probed.
					h.downByPace.Store(rt.provider.Name(), true)
				}
				h.log.Warn("provider failed without accepting; failing over", "campaign_id", run.c.ID, "provider", rt.provider.Name(),
					"fallback", run.secondary.provider.Name(), "for", h.cfg.FailoverWindow, "refused_in_a_row", refused, "err", pe.Reason())
			} else {
				h.log.Debug("provider failed without accepting; this message goes through the fallback", "campaign_id", run.c.ID,
					"provider", rt.provider.Name(), "fallback", run.secondary.provider.Name(), "refused_in_a_row", refused, "err", pe.Reason())
			}
			failedOver = true
			attempt--
			continue
		}
		if v == accountRefused {
			if h.probeAccount(run, r, pe) {
				return nil
			}
			return h.accountError(ctx, run, pe)
		}
		if pe.RetryAfter > longHold {
			// The provider asked this recipient to wait longer than a run holds its batch for one: it waits
			// for a later run, and the rest of the batch goes on (a receiver's Retry-After of an hour held
			// the run, and its sent recipients unrecorded, for that hour). After the failover above: a
			// fallback takes it now.
			h.deferLimited(run, r, pe)
			return nil
		}
		wait := h.backOff(pe, attempt)
		h.beforeGivingUp(ctx, rt.provider.Name(), attempt)
		p, err := h.waitWhileDown(ctx, waitCtx, run, rt.provider.Name())
		if err != nil {
			return err
		}
		if p {
			// The provider is down and this send is the probe: it goes now, and an outage uses up nobody's
			// attempts. Unless this recipient's own sends keep failing while it is down: then it may be the
			// recipient the provider cannot take (an in-house receiver that fails on one user), not the
			// provider, and as the probe for ever it would hold the provider down for every campaign.
			if failedWhileDown++; failedWhileDown >= probesPerRecipient {
				h.deferDown(run, r, pe)
				return nil
			}
			probe = true
			attempt--
			continue
		}
		if attempt >= h.cfg.SendAttempts {
			return h.giveUp(run, r, pe, wait)
		}
		h.log.Debug("transient provider error; retrying", "campaign_id", run.c.ID, "attempt", attempt, "err", pe.Reason(), "wait", wait)
		if err := h.hold(ctx, run, wait); err != nil {
			return err
		}
	}
}

// route is the provider a one-message send goes through, with its limits and metrics.
type route struct {
	provider providers.Provider
	limits   []limiter.Limit
	// pauseKey is the provider's pause, checked by the claim script when answerInNextClaim ("" when the
	// limits check it).
	pauseKey string
	// answerInNextClaim is set when no send waits for tokens: the claim script then also checks the
	// provider's pause and writes the previous send's answer, one Redis round trip per message.
	answerInNextClaim bool
	m                 *metrics.Sends
	fallback          bool
	// segmentsPaced: the provider's limit counts SMS segments, a token each (providers.SegmentPaced).
	segmentsPaced bool
	// keyed: the provider's receipts name their recipient (providers.ReceiptsNameRecipient).
	keyed bool
}

// fallbackName is the route's provider's name when it is the channel's fallback, "" when it is its first.
func (rt *route) fallbackName() string {
	if !rt.fallback {
		return ""
	}
	return rt.provider.Name()
}

// pacesSegments says whether p's rate limit counts SMS segments rather than messages.
func pacesSegments(p providers.Provider) bool {
	sp, ok := p.(providers.SegmentPaced)
	return ok && sp.PacesSegments()
}

// route picks the provider of the next send to addr: the fallback while the first is marked down, or when
// only the fallback can take addr (providers.AddressTaker); never the fallback with an address it cannot
// take (the send then waits for the first).
// While the first is skipped and the shared pace has it down, it is probed every
// Config.FailoverProbeEvery over all workers (probe: this send is the probe), and every worker goes back to it as
// soon as the pace calls it up.
func (h *Handler) route(ctx context.Context, run *batchRun, addr string) (_ *route, probe bool) {
	if sec := run.secondary; sec != nil && providers.Takes(sec.provider, addr) {
		if !providers.Takes(run.primary.provider, addr) {
			return sec, false
		}
		name := run.primary.provider.Name()
		if until, ok := h.downUntil.Load(name); ok && h.cfg.Now().UnixNano() < until.(int64) {
			if p := h.pace(name); p.Down(ctx) {
				// Down by every worker's answers (whatever made this worker go over: a 503 of its own, or
				// the pace): the pace now says when it is back. It is probed now and then, or it would be
				// tried again only at the end of each worker's window, however soon it was back: a 20 s
				// outage kept Netgsm sending for 60.
				h.downByPace.Store(name, true)
				if ok, err := p.ProbeEvery(ctx, h.cfg.FailoverProbeEvery); err != nil || !ok {
					return sec, false
				}
				return &run.primary, true
			}
			if _, byPace := h.downByPace.Load(name); !byPace {
				return sec, false // its own failure, the pace not down: the window runs out
			}
			// A probe got through: the pace calls it up, and every worker goes back to it now.
			h.downUntil.CompareAndDelete(name, until)
			h.downByPace.Delete(name)
		}
	}
	return &run.primary, false
}

// whileDown is the route a send to addr takes, about to go through rt, when rt's provider is down by
// every worker's answers (limiter.Pace): a first provider that is down passes the send to its fallback
// (when the fallback takes addr) for FailoverWindow, and gets one probe over all workers when this
// process's window has run out; a provider down with nothing to fall back on holds the send back until it
// gets the probe or is up again (waitWhileDown). probe says the send is that probe.
//
// Without it, a provider that resets its connections or never answers was called for every recipient:
// such answers are ambiguous (the request was written, the message may have gone), which never fail over
// one by one and were never held back either, so each recipient became unknown at the full pace.
func (h *Handler) whileDown(ctx, waitCtx context.Context, run *batchRun, rt *route, addr string) (_ *route, probe bool, err error) {
	name := rt.provider.Name()
	if !rt.fallback && run.secondary != nil && providers.Takes(run.secondary.provider, addr) {
		p := h.pace(name)
		if !p.Down(ctx) {
			return rt, false, nil
		}
		ok, err := p.Probe(ctx)
		if err != nil {
			return nil, false, waitForServices(err)
		}
		if ok {
			return rt, true, nil
		}
		h.markDown(name)
		h.downByPace.Store(name, true)
		h.log.Warn("provider down; failing over", "campaign_id", run.c.ID, "provider", name,
			"fallback", run.secondary.provider.Name(), "for", h.cfg.FailoverWindow)
		rt = run.secondary
		name = rt.provider.Name()
	}
	probe, err = h.waitWhileDown(ctx, waitCtx, run, name)
	return rt, probe, err
}

// NoteFailover notes in info, a worker's heartbeat, each channel this handler falls over on and whether
// its sends go to the fallback now (its first provider skipped for the failover window): status tells a
// campaign that moves through the fallback from one that waits.
func (h *Handler) NoteFailover(info *state.WorkerInfo) {
	if len(h.cfg.Fallback) == 0 {
		return
	}
	info.Fallbacks, info.FailedOver = map[string]string{}, map[string]bool{}
	now := h.cfg.Now().UnixNano()
	for ch, fb := range h.cfg.Fallback {
		first := h.cfg.Providers[ch]
		if first == nil {
			continue
		}
		info.Fallbacks[string(ch)] = fb.Name()
		if until, ok := h.downUntil.Load(first.Name()); ok && now < until.(int64) {
			info.FailedOver[string(ch)] = true
		}
	}
}

// failoverAfter is how many sends in a row a first provider refuses without accepting before this process
// leaves it for its fallback for the failover window (each of them goes through the fallback at once).
// Three in a row come within milliseconds of an outage; among sporadic 5xx at a few per cent they come
// once in tens of thousands of sends.
const failoverAfter = 3

// refusedAgain counts a refusal of provider name without acceptance, and returns how many came in a row
// (since its last acceptance by this process).
func (h *Handler) refusedAgain(name string) int32 {
	n, ok := h.refusedInARow.Load(name)
	if !ok {
		n, _ = h.refusedInARow.LoadOrStore(name, new(atomic.Int32))
	}
	return n.(*atomic.Int32).Add(1)
}

// markDown skips the provider named for FailoverWindow, in favour of its fallback (for its own failure:
// whileDown marks the skips the shared pace called for apart).
func (h *Handler) markDown(name string) { h.markDownFor(name, h.cfg.FailoverWindow) }

// markDownFor skips the provider named for d, in favour of its fallback (markDown).
func (h *Handler) markDownFor(name string, d time.Duration) {
	h.downUntil.Store(name, h.cfg.Now().Add(d).UnixNano())
	h.downByPace.Delete(name)
}

// sendSize is what a send weighs on the limits: msgs messages taken from the campaign's bucket (its
// --rate is in messages), tokens from the provider's (segments, where its limit counts them), in calls
// provider calls (each has the wait observed once).
type sendSize struct {
	msgs, tokens, calls int
	// via is the provider of the calls: when it can open its connections ahead (providers.Warmer) and
	// tokens are to be taken, calls connections are made ready first.
	via providers.Provider
}

// readyToSend takes the tokens of a send of size sz; then it checks that the send window is still open
// (the wait may have run past its end) and that the chunk's lease still holds.
func (h *Handler) readyToSend(ctx, waitCtx context.Context, run *batchRun, sz sendSize, limits ...limiter.Limit) error {
	paced := false
	for i := range limits {
		// A provider's limit takes its shared pace: the cap, or lower when the provider pushes back.
		if name, ok := state.ProviderOf(limits[i].Key); ok {
			limits[i].Rate = h.pace(name).Rate(ctx)
		}
		paced = paced || limits[i].Rate > 0
	}
	if paced {
		// A wait may come: the answers of the sends before are written first, not after it.
		h.settleAnswers(ctx, run)
		h.warm(waitCtx, run, sz)
	}
	// The tokens of all the limits are taken together (a token of the campaign's cap held while the
	// provider's bucket is empty would go out later than its bucket let it, on top of the tokens it let
	// out meanwhile). The wait is observed once for each provider call it came before.
	var observe []limiter.Observer
	ls := make([]limiter.Limit, len(limits))
	for i, l := range limits {
		if _, ok := state.ProviderOf(l.Key); ok {
			l.Cost = sz.tokens
		}
		if l.Observer != nil && (l.Pausable || l.Rate > 0) { // a limit with neither waits for nothing
			observe = append(observe, l.Observer)
		}
		l.Observer = nil
		// However long the wait (a low cap shared by many runs, a large request's tokens, a provider's
		// pause), the chunk's lease is kept: the sweeper must not take a live run's chunk for a dead one's.
		l.Hold = func(ctx context.Context, d time.Duration) error { return h.hold(ctx, run, d) }
		ls[i] = l
	}
	start := time.Now()
	run.dueOverrun = 0
	if err := h.bucket.WaitN(waitCtx, sz.msgs, ls...); err != nil {
		return waitError(ctx, waitCtx, err)
	}
	waited := time.Since(start).Seconds()
	for _, o := range observe {
		for range sz.calls {
			o.Observe(waited)
		}
	}
	run.tokensAt = time.Time{}
	if paced {
		run.tokensAt = time.Now().Add(-run.dueOverrun)
	}
	if err := h.windowClosed(run); err != nil {
		return err
	}
	return h.renew(ctx, run)
}

// readyToSendFresh is readyToSend for sends of rs() (the chunk's recipients still to be sent: their
// consents were read with the chunk), followed by recheck: it returns the users not to send, and readErr,
// recheck's error (err is the wait's). When the run's sends wait for tokens, their consents are read again
// inside the wait, consentReadLead before the tokens are due (hold), if they would be stale by then: read
// after the wait, they made the tokens stale whenever Postgres took more than staleTokens to answer, and
// tokensStillFresh took them again (at a cap that made each send wait a second or more, half the cap went
// unused).
func (h *Handler) readyToSendFresh(ctx, waitCtx context.Context, run *batchRun, sz sendSize, rs func() []*campaign.Recipient, limits ...limiter.Limit) (drop map[string]bool, readErr, err error) {
	if run.answerInNextClaim { // its sends wait for no tokens
		err = h.readyToSend(ctx, waitCtx, run, sz, limits...)
	} else {
		err = h.readyReading(ctx, waitCtx, run, sz, func(ctx context.Context) {
			if lead := run.beforeDueLead; readErr == nil && h.consentStaleIn(run, lead) {
				var d map[string]bool
				d, readErr = h.recheckAhead(ctx, run, rs(), true, lead)
				drop = union(drop, d)
			}
		}, limits...)
	}
	if err != nil || readErr != nil {
		return drop, readErr, err
	}
	if h.consentStale(run) {
		var d map[string]bool
		d, readErr = h.recheck(ctx, run, rs(), true)
		drop = union(drop, d)
	}
	return drop, readErr, nil
}

// readyReading is readyToSend with read called once inside each wait for the tokens, run.beforeDueLead
// before they are due (hold): consents read there are fresh when the tokens are. A read that took more
// than half the lead begins earlier next time (readTook).
func (h *Handler) readyReading(ctx, waitCtx context.Context, run *batchRun, sz sendSize, read func(context.Context), limits ...limiter.Limit) error {
	run.beforeDueLead = max(run.beforeDueLead, consentReadLead)
	run.beforeDue = func(ctx context.Context) {
		start := time.Now()
		read(ctx)
		run.readTook(time.Since(start))
	}
	defer func() { run.beforeDue = nil }()
	return h.readyToSend(ctx, waitCtx, run, sz, limits...)
}

// union adds the users of b to a (made when a is nil and b is not empty) and returns it.
func union(a, b map[string]bool) map[string]bool {
	if len(b) > 0 && a == nil {
		a = make(map[string]bool, len(b))
	}
	maps.Copy(a, b)
	return a
}

// warm opens the connections of sz's calls before their tokens are taken (providers.Warmer): a send that
// had to open its connection after taking them (a TCP and TLS handshake, hundreds of milliseconds to a
// distant provider, for every send of a campaign's first moments) would reach the provider late, together
// with the sends that took their tokens after it on open connections, and a second could carry more than
// the cap. It waits no longer than a third of the lease (the lease is renewed after the tokens); a
// connection it could not open is opened, or fails, in the send itself.
func (h *Handler) warm(ctx context.Context, run *batchRun, sz sendSize) {
	w, ok := sz.via.(providers.Warmer)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL/3)
	defer cancel()
	if err := w.Warm(ctx, sz.calls); err != nil && ctx.Err() == nil {
		h.log.Debug("connections to the provider not opened ahead; the sends open them", "campaign_id", run.c.ID, "provider", sz.via.Name(), "err", fmt.Sprint(err))
	}
}

// guardAgainAfter is how long after its claims a send may leave without their guard (the halt, the
// epoch, the fence) being read again: the claims and the send are otherwise microseconds apart.
const guardAgainAfter = 100 * time.Millisecond

// staleTokens is how long after its tokens a send may leave. A bucket hands out a fortieth of a second's
// worth at once (limiter.Burst): tokens held much longer than that before their requests leave would land,
// in the provider's count, on top of what the bucket handed the other runs meanwhile.
const staleTokens = 25 * time.Millisecond

// claimTimeEach is what the claim of one recipient of a request may take on top of staleTokens (a
// request of 1,000 e-mails is claimed in one script call of about 12 ms) before its tokens are stale.
const claimTimeEach = 50 * time.Microsecond

// guardRefused says a claim script refused to claim (nothing claimed, the answers before it written): the
// campaign is halted, Redis lost its data, or another run took the chunk over.
func guardRefused(err error) bool {
	return errors.Is(err, state.ErrHalted) || errors.Is(err, state.ErrEpoch) || errors.Is(err, state.ErrFenced)
}

// tokensStillFresh is called when a send of size sz, whose claims are f, is about to leave. When its
// tokens were taken more than staleTokens ago (and claimTimeEach for each recipient of a request: the
// claim's own time), because the claim stalled on Redis or the consents' re-read or the lease's renewal on
// Postgres, it takes them again, waiting as readyToSend does: a stall of every run followed by their held
// requests at once, with the bucket's burst and rate on top, would put 1.2 times the cap in a second. The
// tokens taken first are lost: after a stall the send is slower, never faster, than the cap. When they
// cannot be taken again, nothing is sent, and what the claims took is given back (notSentAfterClaim). When
// the consents read before the claims are by now older than consentMaxAge, they are read again
// (recheckInFlight): it returns the users whose sends must not leave after all.
func (h *Handler) tokensStillFresh(ctx, waitCtx context.Context, run *batchRun, sz sendSize, f inFlight, limits ...limiter.Limit) (map[string]bool, error) {
	if h.leaseUnconfirmed(run) {
		// The process's liveness lock was lost after the lease was last confirmed (a stall between that
		// check and the claims): a sweep may have taken the chunk. It is confirmed before the sends leave.
		if err := h.renew(ctx, run); err != nil {
			h.notSentAfterClaim(ctx, run, f)
			return nil, err
		}
	}
	var drop map[string]bool
	// recheck reads the consents of f again and leaves out of f those not to be sent; it says whether
	// none is left.
	recheck := func(ctx context.Context) (bool, error) {
		d, err := h.recheckInFlight(ctx, run, f)
		if err != nil || len(d) == 0 {
			return false, err
		}
		drop = union(drop, d)
		f = f.without(d)
		sz.msgs, sz.tokens = len(f.users), max(0, sz.tokens-len(d))
		return len(f.users) == 0, nil
	}
	// Both must hold when the sends leave: consents read less than consentMaxAge ago, and tokens taken
	// less than staleTokens ago. Making one fresh takes time that may age the other (a re-read is a
	// Postgres round trip, a second wait for tokens may last seconds at a low cap): they are checked again
	// until both hold, a few times at most.
	for round := 0; ; round++ {
		if round == freshRounds {
			h.notSentAfterClaim(ctx, run, f)
			return nil, &RetryError{Err: fmt.Errorf("batch %d: the sends' tokens and consents could not both be fresh when they were to leave; the batch goes on from a fresh read", run.batch), After: time.Second}
		}
		if h.staleFor(run, f.users) {
			// The consents were read before the claims, and the claims or the tokens taken again since (a
			// stall, a wait at a low cap) took longer than consentMaxAge: a refusal recorded meanwhile (a
			// STOP reply, an İYS sync) must still stop these sends. They are read again.
			none, err := recheck(ctx)
			if err != nil {
				h.notSentAfterClaim(ctx, run, f)
				return nil, err
			}
			if none {
				return drop, nil
			}
		}
		if err := h.windowClosed(run); err != nil {
			// The send window closed while the claims were taken (a stall of Redis or Postgres after the
			// window was checked): the sends wait for its opening. Without a cap nothing else would check.
			h.notSentAfterClaim(ctx, run, f)
			return nil, err
		}
		if run.tokensAt.IsZero() || time.Since(run.tokensAt) <= staleTokens+time.Duration(sz.msgs)*claimTimeEach {
			if h.cfg.Now().Sub(f.at) > guardAgainAfter {
				// The claims were taken a while ago (Redis stalled, the consents were read again, the
				// tokens taken again): a pause, a cancel or a takeover written since, behind them in a
				// stalled Redis, must still stop the sends. The claims' guard is read again.
				g := run.guard
				g.CheckHalt = true // a send's claims are refused while the campaign is halted
				if err := h.state.StillGuarded(ctx, g); err != nil {
					h.notSentAfterClaim(ctx, run, f)
					if guardRefused(err) {
						return nil, err
					}
					return nil, waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
				}
			}
			return drop, nil
		}
		h.log.Debug("tokens taken too long before their send; taking them again", "campaign_id", run.c.ID,
			"held", time.Since(run.tokensAt).Round(time.Millisecond))
		// The send's wait for its limits was observed when it first took them: once a send.
		again := slices.Clone(limits)
		for i := range again {
			again[i].Observer = nil
		}
		// The consents are read again inside that wait, before the tokens are due (hold). Read after
		// it, at a cap that makes a send wait longer than consentMaxAge, they made the tokens stale whenever
		// Postgres took more than staleTokens to answer, and the tokens taken again made them stale: at 2
		// segments a second, with SMS of 3 and a Postgres answering in 60 ms, not one message went.
		var readErr error
		none := false
		err := h.readyReading(ctx, waitCtx, run, sz, func(ctx context.Context) {
			if readErr == nil && !none {
				none, readErr = recheck(ctx)
			}
		}, again...)
		if readErr != nil {
			err = readErr
		}
		if err != nil {
			h.notSentAfterClaim(ctx, run, f)
			return nil, err
		}
		if none {
			return drop, nil
		}
	}
}

// freshRounds is how many times tokensStillFresh makes the consents and the tokens of a send fresh before
// it hands the batch back. One or two are enough on a machine with CPU to spare; on one starved of it (the
// whole test suite with three busy loops beside it), a goroutine may wait more than staleTokens to run
// again after its tokens came, round after round, and four were not always enough.
const freshRounds = 8

// consentReadLead is how long before a send's tokens are due its consents are first read again, when its
// wait for them is long enough to age them (readyToSendFresh, tokensStillFresh).
const consentReadLead = 100 * time.Millisecond

// readTook notes that a read of consents inside a wait for tokens took d: a read that took more than half
// the lead begins earlier next time (twice as long before the tokens are due, half a second at most).
func (run *batchRun) readTook(d time.Duration) {
	run.beforeDueLead = min(max(run.beforeDueLead, 2*d), consentMaxAge/2)
}

// windowClosed is the error of a send outside the campaign's daily window (nil inside it): the batch
// comes back when the window opens.
func (h *Handler) windowClosed(run *batchRun) *RetryError {
	now := h.cfg.Now()
	if run.c.Window.Open(now) {
		return nil
	}
	next := run.c.Window.NextOpen(now)
	return &RetryError{Err: fmt.Errorf("outside the send window %s; sending resumes at %s", run.c.Window, windowTime(run.c.Window, next)), After: next.Sub(now), Wait: true}
}

// notSentAfterClaim gives back what the claims of f took when their sends did not leave after all: the
// claims (once Redis answers: it may be what failed) and the frequency marks.
func (h *Handler) notSentAfterClaim(ctx context.Context, run *batchRun, f inFlight) {
	h.giveBack(ctx, run, f) //nolint:errcheck // retried in the background; the caller returns its own error
}

// waitError turns the error of a wait for tokens or a pause into what the batch returns.
func waitError(ctx, waitCtx context.Context, err error) error {
	var re *RetryError
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case waitCtx.Err() != nil:
		return &RetryError{Err: errors.New("batch handed back while waiting for the rate limit (worker stopping or batch time used up)"), After: time.Second}
	case errors.As(err, &re):
		return err // the chunk's lease, renewed during the wait (hold)
	}
	return waitForServices(fmt.Errorf("rate limiter: no send while Redis is unavailable: %w", err))
}

// settleAnswers writes the answers of the run's last sends into their claims, when that has not happened
// yet.
func (h *Handler) settleAnswers(ctx context.Context, run *batchRun) {
	if len(run.answersDue) == 0 {
		return
	}
	keys, inflight, vals := make([]string, len(run.answersDue)), make([]string, len(run.answersDue)), make([]string, len(run.answersDue))
	for i, a := range run.answersDue {
		keys[i], inflight[i], vals[i] = a.Key, a.InFlight, a.Value
	}
	run.answersDue = run.answersDue[:0]
	if err := h.state.SettleMany(ctx, keys, run.nonce, inflight, vals); err != nil {
		// Postgres holds the only record of them: they are committed durably (flush).
		run.unclaimed = true
		h.log.Error("provider accepted but the claims could not be updated; Postgres will hold the outcomes", "campaign_id", run.c.ID, "recipients", len(keys), "err", err)
	}
}

// releaseNotSent gives back the claims and marks of f, whose sends the provider definitely did not accept
// (giveBack). When Redis fails the release, the batch waits for Redis: a claim kept would make its
// recipient unknown at the next run (a claim in flight whose call was never answered), and nobody would
// send it.
func (h *Handler) releaseNotSent(ctx context.Context, run *batchRun, f inFlight) error {
	if err := h.giveBack(ctx, run, f); err != nil {
		return waitForServices(err)
	}
	return nil
}

// giveBack deletes the claims of f (compare-and-delete on this worker's own pending values: nothing was
// accepted under them) and their frequency marks, in one round trip each. When Redis fails, the release
// is tried again in the background for up to a minute, and the error is returned.
func (h *Handler) giveBack(ctx context.Context, run *batchRun, f inFlight) error {
	ctx = context.WithoutCancel(ctx)
	c, nonce := run.c, run.nonce
	release := func(ctx context.Context) error {
		if err := h.state.ReleaseMany(ctx, f.keys, nonce, f.values); err != nil {
			return err
		}
		if err := h.state.ReleaseMarks(ctx, c, nonce, f.addrs, f.at); err != nil {
			h.log.Warn("frequency marks not released", "campaign_id", c.ID, "err", err)
		}
		return nil
	}
	if err := release(ctx); err != nil {
		inBackground(release)
		return err
	}
	return nil
}

// releaseLater deletes a claim whose SET may have reached Redis although its reply did not, once Redis
// answers again (for up to a minute). It is compare-and-delete on this worker's own pending value: nothing
// was sent under it.
func (h *Handler) releaseLater(key, nonce, inflight string) {
	inBackground(func(ctx context.Context) error { return h.state.Release(ctx, key, nonce, inflight) })
}

// inBackground calls f every second until it succeeds, for as long as Redis does not answer (up to
// backgroundGiveUp), then once more backgroundAgain later. A command whose reply was lost may still be
// run: a frozen Redis (SIGSTOP, a stalled VM) reads it from the given-up connection when it resumes, however
// long it was frozen. f's first success tells that Redis answers again; the pass after it undoes what such
// a command wrote meanwhile. Before, the tries stopped a minute after the failure, and a claim a Redis frozen
// longer ran on its return stayed, with nothing sent under it: its recipient was recorded unknown.
func inBackground(f func(context.Context) error) {
	try := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), backgroundTry)
		defer cancel()
		return f(ctx)
	}
	go func() {
		for start := time.Now(); try() != nil; time.Sleep(time.Second) {
			if time.Since(start) > backgroundGiveUp {
				return
			}
		}
		time.Sleep(backgroundAgain)
		try() //nolint:errcheck // a second pass; the first succeeded
	}()
}

// The background tries of inBackground: each bounded by backgroundTry, given up after backgroundGiveUp of
// an unanswering Redis, and made once more backgroundAgain after the first success.
const (
	backgroundTry    = 10 * time.Second
	backgroundGiveUp = time.Hour
	backgroundAgain  = 2 * time.Second
)
