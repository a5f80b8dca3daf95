package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// DefaultSendWindow is how many one-message sends a batch run has out at once.
const DefaultSendWindow = 8

// windowed says whether a run's chunk goes out a window at a time: a one-message provider without a
// fallback (failing over is decided send by send), and a window above 1.
func (h *Handler) windowed(run *batchRun) bool {
	return h.cfg.SendWindow > 1 && run.provider != nil && run.secondary == nil
}

// windowSize is how many sends may go out together at rate (0: no limit): no more than the limiter's
// burst, so that a cap holds over every second even when the sends of a window leave at once.
func (h *Handler) windowSize(rate float64) int {
	if rate <= 0 {
		return h.cfg.SendWindow
	}
	return max(1, min(h.cfg.SendWindow, limiter.Burst(rate)))
}

// windowSend is one recipient of a window, with its message, the attempts it has had, and when it may be
// tried again after a transient refusal.
type windowSend struct {
	r        *campaign.Recipient
	msg      providers.Message
	tokens   int // what the message takes from its provider's bucket (sendTokens), counted once
	attempt  int
	notUntil time.Time
	// failedWhileDown counts its sends that failed while the provider was down by the pace
	// (probesPerRecipient).
	failedWhileDown int
}

// longHold is the longest a run waits, holding its batch, for a provider's Retry-After: a longer one (a
// receiver's hour) lets the batch go, its sends so far recorded, to come back when the wait is over.
const longHold = 30 * time.Second

// probesPerRecipient is how many of one recipient's sends may fail while its provider is down by the pace
// before it gives the probe up (deferDown: it is left for a later run of its batch, its attempt counted
// only once a later send of the run is answered). An outage fails every recipient's; one recipient the
// provider always refuses (a webhook receiver that fails on one user, a token FCM always answers 503)
// would otherwise be the probe for ever, and hold the provider down for every campaign on it.
const probesPerRecipient = 3

// deliverWindowed sends a chunk through a one-message provider up to SendWindow at a time. A window's
// recipients are claimed in one script call just before their requests go out together (the same call
// writes the answers of the window before and checks the provider's pause), and each answer is judged as a
// single send's is (judge, settleRefusal, the provider's shared pace). A crash loses at most the window in
// flight to `unknown`. A recipient refused transiently is tried again in a later window once its back-off
// (or the provider's Retry-After for it) has passed; the others of the chunk go on meanwhile. While the
// provider is down, the chunk waits, sending only the probe, and nobody's attempts are used up. When all
// that is left of the chunk waits for back-offs and more chunks follow (more), those recipients are carried
// over to the next chunk (batchRun.carried) with their attempts, and the batch goes on.
func (h *Handler) deliverWindowed(ctx, waitCtx context.Context, run *batchRun, rs []campaign.Recipient, more bool) error {
	rt := &run.primary
	queue := make([]windowSend, 0, len(rs))
	for i := range rs {
		r := &rs[i]
		msg, ok, err := h.prepare(ctx, run, r)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		w := windowSend{r: r, msg: msg, tokens: sendTokens(rt, msg), attempt: 1}
		if was, ok := run.retryOf[r.UserID]; ok {
			w.attempt, w.notUntil = was.attempt, was.notUntil
		}
		queue = append(queue, w)
	}
	clear(run.retryOf)
	name := rt.provider.Name()
	g := run.guard
	g.CheckHalt = true
	var waitFrom time.Time // when the window began to wait for the provider's limit and pause
	// The provider's wait is observed below, with its pause: not by the limit as well.
	limits := slices.Clone(rt.limits)
	for i := range limits {
		if _, ok := state.ProviderOf(limits[i].Key); ok {
			limits[i].Observer = nil
		}
	}
	unusedProbe := false // the probe of a provider down by the pace, taken and not used (its recipient refused)
	for len(queue) > 0 {
		if waitCtx.Err() != nil && ctx.Err() == nil {
			return &RetryError{Err: errors.New("batch handed back (worker stopping or batch time used up)"), After: time.Second}
		}
		if waitFrom.IsZero() {
			waitFrom = time.Now()
		}
		// What may go now: the first recipients whose back-off is over, up to the window: in messages under
		// the campaign's cap, in the provider's tokens under its pace (segments for Twilio: a window of
		// eight 10-segment SMS is 80 tokens let out at once, and a second held up to 1.4 times the cap).
		size := h.windowSize(run.c.Rate)
		budget := 0
		if pace := h.pace(name).Rate(ctx); pace > 0 {
			budget = limiter.Burst(pace)
		}
		probe := unusedProbe
		if !probe {
			var err error
			if probe, err = h.waitWhileDown(ctx, waitCtx, run, name); err != nil {
				return err
			}
		}
		unusedProbe = false
		if probe {
			size = 1
		}
		win, rest, next := readyWindow(queue, size, budget, time.Now())
		if len(win) == 0 && more {
			run.carryOver(queue)
			return nil
		}
		if len(win) == 0 {
			if err := h.hold(waitCtx, run, time.Until(next)); err != nil {
				return waitError(ctx, waitCtx, err)
			}
			continue
		}
		queue = rest
		drop, readErr, err := h.readyToSendFresh(ctx, waitCtx, run, sendSize{msgs: len(win), tokens: tokensOf(win), calls: len(win), via: rt.provider}, func() []*campaign.Recipient {
			rs := make([]*campaign.Recipient, 0, len(win)+len(queue))
			for _, w := range win {
				rs = append(rs, w.r)
			}
			for _, w := range queue {
				rs = append(rs, w.r)
			}
			return rs
		}, limits...)
		if err != nil {
			return err
		}
		if readErr != nil {
			return run.halted(readErr, win, queue)
		}
		if len(drop) > 0 {
			dropped := func(w windowSend) bool { return drop[w.r.UserID] }
			win, queue = slices.DeleteFunc(win, dropped), slices.DeleteFunc(queue, dropped)
			if len(win) == 0 {
				// The probe's recipient refused meanwhile: the probe goes to the next one, now.
				unusedProbe = probe
				continue
			}
		}
		now := h.cfg.Now()
		inflight := state.InFlightValue(now, h.cfg.Owner)
		scs := make([]state.SendClaim, len(win))
		for i, w := range win {
			scs[i] = state.SendClaim{Key: ClaimKey(run.c.ID, w.r.UserID), Value: inflight, Addr: w.r.Address}
		}
		cls, pause, err := h.state.ClaimWindow(ctx, run.c, run.nonce, scs, g, run.answersDue, rt.pauseKey, now)
		if err == nil || guardRefused(err) {
			run.answersDue = run.answersDue[:0] // the script wrote them before anything else
		}
		if guardRefused(err) {
			return run.halted(err, win, queue)
		}
		if err != nil {
			// The claims may have been written (the reply was lost): released once Redis answers, since
			// nothing is sent under them.
			for _, sc := range scs {
				h.releaseLater(sc.Key, run.nonce, sc.Value)
			}
			h.log.Error("Redis is unreachable: no sends until it is back", "campaign_id", run.c.ID, "err", err)
			return waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
		}
		if pause > longHold {
			// The provider asked every sender to wait longer than a run holds its batch: nothing was claimed;
			// the batch comes back when the wait is over, its sends so far recorded.
			return &RetryError{Err: fmt.Errorf("the provider asked every sender to wait %v", pause.Round(time.Second)), After: pause, Wait: true}
		}
		if pause > 0 {
			// The provider is paused (most 429s of a second said how long): nothing was claimed; wait it out.
			if err := h.hold(waitCtx, run, pause); err != nil {
				return waitError(ctx, waitCtx, err)
			}
			queue = append(win, queue...)
			continue
		}
		// Each send of the window waited as long for the provider's limit and pause (read by the claim).
		if o := rt.m.ProviderWait(); o != nil {
			for range win {
				o.Observe(time.Since(waitFrom).Seconds())
			}
		}
		waitFrom = time.Time{}
		sends := win[:0:0]
		for i, cl := range cls {
			switch cl.Result {
			case state.Taken:
				rt.m.ClaimsRefused(1)
				h.fromClaim(ctx, run, win[i].r.UserID, cl.Old)
			case state.Capped:
				run.add(campaign.Outcome{UserID: win[i].r.UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonFrequencyCap})
				rt.m.Skipped(1)
			default:
				sends = append(sends, win[i])
			}
		}
		if len(sends) > 0 {
			drop, err := h.tokensStillFresh(ctx, waitCtx, run, sendSize{msgs: len(sends), tokens: tokensOf(sends), calls: len(sends)},
				windowInFlight(run.c.ID, sends, inflight, now), limits...)
			if err != nil {
				return run.halted(err, sends, queue)
			}
			sends = slices.DeleteFunc(sends, func(w windowSend) bool { return drop[w.r.UserID] })
		}
		retry, err := h.sendWindow(ctx, run, rt, sends, inflight, now)
		queue = append(queue, retry...)
		if err != nil {
			return err
		}
	}
	return nil
}

// windowInFlight is the claims of a window's sends, each with the in-flight value inflight taken at now.
func windowInFlight(id int64, sends []windowSend, inflight string, now time.Time) inFlight {
	f := inFlight{at: now}
	for _, w := range sends {
		f.users, f.keys = append(f.users, w.r.UserID), append(f.keys, ClaimKey(id, w.r.UserID))
		f.values, f.addrs = append(f.values, inflight), append(f.addrs, w.r.Address)
	}
	return f
}

// carryOver hands the recipients of queue, each waiting out a back-off, to the batch's next chunk.
func (run *batchRun) carryOver(queue []windowSend) {
	for _, w := range queue {
		run.carried = append(run.carried, *w.r)
	}
	run.keepRetries(queue)
}

// keepRetries keeps the attempts and back-offs of the recipients of ws for the next deliverWindowed of
// the run that sends them.
func (run *batchRun) keepRetries(ws ...[]windowSend) {
	for _, q := range ws {
		for _, w := range q {
			if w.attempt <= 1 && w.notUntil.IsZero() {
				continue
			}
			if run.retryOf == nil {
				run.retryOf = make(map[string]windowSend, len(q))
			}
			run.retryOf[w.r.UserID] = windowSend{attempt: w.attempt, notUntil: w.notUntil}
		}
	}
}

// halted returns err, after keeping the attempts and back-offs of the recipients not sent (ws) when err
// is a halt: the batch then reads the campaign's state again and goes on with the same recipients
// (RunBatch), which must still wait out their back-offs (a provider's Retry-After among them) and keep
// their attempts.
func (run *batchRun) halted(err error, ws ...[]windowSend) error {
	if errors.Is(err, state.ErrHalted) {
		run.keepRetries(ws...)
	}
	return err
}

// readyWindow takes from queue up to size recipients whose back-off is over at now, in queue order, whose
// tokens (windowSend.tokens) add up to no more than budget (0: no bound; the first always goes); it returns
// them, the rest of the queue, and, when none is ready, when the first will be.
func readyWindow(queue []windowSend, size, budget int, now time.Time) (win, rest []windowSend, next time.Time) {
	fits := func(n, tokens int, w windowSend) bool {
		return n < size && (n == 0 || budget <= 0 || tokens+w.tokens <= budget)
	}
	// Usually the head of the queue is ready: the window is that head, and nothing is copied (the window
	// cannot grow into the rest).
	k, tokens := 0, 0
	for k < len(queue) && fits(k, tokens, queue[k]) && !queue[k].notUntil.After(now) {
		tokens += queue[k].tokens
		k++
	}
	if k == len(queue) || !fits(k, tokens, queue[k]) {
		return queue[:k:k], queue[k:], time.Time{}
	}
	tokens, full := 0, false
	for _, w := range queue {
		switch {
		case !full && !w.notUntil.After(now) && fits(len(win), tokens, w):
			win = append(win, w)
			tokens += w.tokens
		default:
			// A ready recipient that does not fit closes the window: the order stays the queue's.
			full = full || !w.notUntil.After(now)
			if next.IsZero() || w.notUntil.Before(next) {
				next = w.notUntil
			}
			rest = append(rest, w)
		}
	}
	return win, rest, next
}

// tokensOf is what a window takes from the buckets: a message each, or, for a provider whose limit counts
// SMS segments (Twilio's does), a token a segment.
func tokensOf(win []windowSend) int {
	n := 0
	for _, w := range win {
		n += w.tokens
	}
	return n
}

// sendTokens is what one message takes from its provider's bucket: a token, or one a segment.
func sendTokens(rt *route, msg providers.Message) int {
	if !rt.segmentsPaced {
		return 1
	}
	_, segs := providers.SMSSegments(msg.Body)
	return max(1, segs)
}

// sendWindow sends the claimed recipients of one window at once and acts on every answer. It returns the
// recipients to try again (refused transiently, attempts left or the provider down, each with the time
// its back-off ends), and the error that ends the chunk, if any: every answer of the window is acted on
// first.
func (h *Handler) sendWindow(ctx context.Context, run *batchRun, rt *route, sends []windowSend, inflight string, now time.Time) ([]windowSend, error) {
	type result struct {
		res   providers.Result
		err   error
		start time.Time     // when its request went out
		took  time.Duration // how long it took
	}
	results := make([]result, len(sends))
	var wg sync.WaitGroup
	for i := range sends {
		h.senders.Go(&wg, func() {
			start := time.Now()
			res, err := rt.provider.Send(ctx, sends[i].msg)
			err = maskQuoted(err, sends[i].msg, sends[i].r)
			took := time.Since(start)
			rt.m.Request(took)
			results[i] = result{res, err, start, took}
		})
	}
	wg.Wait()
	var retry []windowSend
	var stop error
	name := rt.provider.Name()
	for i, w := range sends {
		key := ClaimKey(run.c.ID, w.r.UserID)
		v, pe := judge(results[i].err)
		h.observe(ctx, name, v, pe, w.tokens, results[i].took, w.r.Address, w.r.Attempts)
		if v == accepted {
			res := results[i].res
			run.answersDue = append(run.answersDue, state.Answer{Key: key, InFlight: inflight, Value: state.SentValueVia(res.MessageID, res.Segments, rt.fallbackName())})
			run.add(campaign.Outcome{UserID: w.r.UserID, Status: campaign.StatusSent, MessageID: res.MessageID, Segments: res.Segments, ReceiptKeyed: rt.keyed, Provider: rt.provider.Name(), SentAt: results[i].start})
			rt.m.Sent(1)
			h.answered(ctx, run)
			h.accepted(name, w.r.Address)
			continue
		}
		if err := h.settleRefusal(ctx, run, rt.m, v, pe, oneInFlight(w.r.UserID, key, inflight, w.r.Address, now)); err != nil {
			stop = firstErr(stop, err)
			continue
		}
		switch v {
		case notSent:
			stop = firstErr(stop, results[i].err)
		case accountRefused:
			if h.aloneRefused(name, pe) {
				h.deferAlone(run, w.r, pe)
				continue
			}
			if h.probeAccount(run, w.r, pe) {
				continue
			}
			stop = firstErr(stop, h.accountError(ctx, run, pe))
		case transient:
			if pe.RecipientLimited || pe.RetryAfter > longHold {
				// For this recipient alone, or longer than a run holds its batch for one (longHold): it
				// waits for a later run.
				h.deferLimited(run, w.r, pe)
				continue
			}
			wait := h.backOff(pe, w.attempt)
			h.beforeGivingUp(ctx, name, w.attempt)
			if h.pace(name).Down(ctx) {
				// An outage costs nobody an attempt: the recipient waits for the provider with the rest, behind
				// them (the next probe is another's). One whose sends keep failing while the provider is down
				// gives the probe up (probesPerRecipient).
				if w.failedWhileDown++; w.failedWhileDown >= probesPerRecipient {
					h.deferDown(run, w.r, pe)
					continue
				}
				w.notUntil = time.Now()
				retry = append(retry, w)
				continue
			}
			if w.attempt >= h.cfg.SendAttempts {
				stop = firstErr(stop, h.giveUp(run, w.r, pe, wait))
				continue
			}
			w.attempt++
			w.notUntil = time.Now().Add(wait)
			retry = append(retry, w)
			h.log.Debug("transient provider error; retrying after a back-off", "campaign_id", run.c.ID, "attempt", w.attempt, "err", pe.Reason(), "wait", wait)
		}
	}
	if stop != nil {
		return nil, stop
	}
	return retry, nil
}

// firstErr keeps the first error.
func firstErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}
