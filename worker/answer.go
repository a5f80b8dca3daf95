package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// verdict is what a provider's answer to a send (one message, or one request of many) says happened.
// Every send path decides with judge and acts with settleRefusal, so that a claim, a recipient, a code and
// the provider's pacing are treated alike whichever path sent.
type verdict int

const (
	// accepted: the provider took the message(s). The claims get the answer; the recipients are sent.
	accepted verdict = iota
	// notSent: the request never left (the run's context ended first). Claims and marks are released.
	notSent
	// ambiguous: the request was written and no answer came; it may have been taken. The claims say
	// unknown, the marks stay (someone may have been reached), the recipients are unknown and keep their
	// codes; they are never resent on their own.
	ambiguous
	// refused: refused for good, for the recipients (a bad address, an opt-out). The claims say failed,
	// the marks go, the recipients fail with the provider's reason and their codes go back to the pool.
	refused
	// accountRefused: the provider refuses the account, not the recipients (credentials, sender). Nothing
	// was taken: claims and marks are released, nobody fails, and the batch waits for the fix (or the send
	// fails over to another provider).
	accountRefused
	// transient: nothing was taken (429, 5xx, a connection refused before the request was written).
	// Claims and marks are released; the provider is slowed for every worker and the send is tried again
	// after a back-off (or fails over).
	transient
)

// judge says what err, the error of a provider call, means (nil: accepted), with the provider's error.
func judge(err error) (verdict, *providers.Error) {
	if err == nil {
		return accepted, nil
	}
	var pe *providers.Error
	if !errors.As(err, &pe) {
		return notSent, nil
	}
	switch {
	case pe.Class == providers.Ambiguous:
		return ambiguous, pe
	case pe.Class == providers.Permanent && !pe.AccountLevel():
		return refused, pe
	case pe.Class == providers.Permanent:
		return accountRefused, pe
	}
	return transient, pe
}

// inFlight are the claims one send holds, a recipient each, with the recipients' addresses (their
// frequency marks) and when they were claimed.
type inFlight struct {
	users, keys, values, addrs []string
	at                         time.Time
}

// without returns f less the users in drop.
func (f inFlight) without(drop map[string]bool) inFlight {
	out := inFlight{at: f.at}
	for i, u := range f.users {
		if !drop[u] {
			out.users, out.keys = append(out.users, u), append(out.keys, f.keys[i])
			out.values, out.addrs = append(out.values, f.values[i]), append(out.addrs, f.addrs[i])
		}
	}
	return out
}

func oneInFlight(user, key, value, addr string, at time.Time) inFlight {
	return inFlight{users: []string{user}, keys: []string{key}, values: []string{value}, addrs: []string{addr}, at: at}
}

// settleRefusal acts on a verdict other than accepted for the claims of f: what it writes into the claims
// or releases, the marks it releases, the outcomes it records and counts (see verdict). It fails only when
// claims that must be released could not be (Redis gone: the batch waits, nothing more is sent).
func (h *Handler) settleRefusal(ctx context.Context, run *batchRun, m *metrics.Sends, v verdict, pe *providers.Error, f inFlight) error {
	n := len(f.keys)
	switch v {
	case notSent:
		ctx = context.WithoutCancel(ctx)
		h.state.ReleaseMany(ctx, f.keys, run.nonce, f.values)      //nolint:errcheck // a claim kept only makes the recipient unknown later
		h.state.ReleaseMarks(ctx, run.c, run.nonce, f.addrs, f.at) //nolint:errcheck // nothing was sent
	case ambiguous:
		if err := h.state.SettleMany(ctx, f.keys, run.nonce, f.values, repeat(state.ReasonValue(state.Unknown, pe.Reason()), n)); err != nil {
			// A claim without an answer reads as unknown too; the outcome is committed durably all the same.
			run.unclaimed = true
		}
		for _, u := range f.users {
			run.add(campaign.Outcome{UserID: u, Status: campaign.StatusUnknown, Reason: pe.Reason(), Provider: pe.Provider})
		}
		m.Unknown(n)
		h.log.Warn("provider answer lost; the recipients are unknown until a receipt or the late answer proves them sent, and are not resent automatically (resume --resend-unknown)",
			"campaign_id", run.c.ID, "recipients", n, "to", providers.MaskAddress(f.addrs[0]), "err", pe.Reason())
	case refused:
		// An unregistered push token condemns the address: no later campaign should try it. The claim's
		// reason says so, and the outcome's statement records the address (Outcome.BadAddress), so neither
		// a kill nor a Postgres gone after the answer loses it.
		reason := pe.Reason()
		if pe.BadAddress {
			reason = campaign.InvalidAddressReason(reason)
		}
		if pe.NoConsent || pe.OptedOut {
			// Kept in Postgres before the answer goes into the claims: once it is there, the chunk's
			// outcomes can be settled from the claims (a kill, a sweep) without the refusal.
			h.noConsent(ctx, run, pe, f.users, f.addrs)
		}
		if err := h.state.SettleMany(ctx, f.keys, run.nonce, f.values, repeat(state.ReasonValue(state.Failed, reason), n)); err != nil {
			// Postgres holds the only record of the failure: it is committed durably (flush).
			run.unclaimed = true
		}
		h.state.ReleaseMarks(ctx, run.c, run.nonce, f.addrs, f.at) //nolint:errcheck // nothing reached the person
		for _, u := range f.users {
			run.add(campaign.Outcome{UserID: u, Status: campaign.StatusFailed, Reason: reason, Provider: pe.Provider, BadAddress: pe.BadAddress})
		}
		m.Failed(n)
		h.answered(ctx, run)
	case accountRefused, transient:
		if v == accountRefused {
			m.AccountError(n)
		} else {
			m.Retried(n, pe.Status, pe.Code)
		}
		// Released first: a claim kept by mistake would make the recipient unknown.
		if err := h.releaseNotSent(ctx, run, f); err != nil {
			return err
		}
	}
	return nil
}

// accountError is what a batch returns when the provider refuses the account: it waits for the fix,
// counting against its retries, and nobody fails. The wait is noted for campaignctl status
// (provider_auth).
func (h *Handler) accountError(ctx context.Context, run *batchRun, pe *providers.Error) error {
	if h.cfg.Redis != nil {
		state.NoteWaiting(context.WithoutCancel(ctx), h.cfg.Redis, run.c.ID, state.Waiting{Reason: WaitProviderAuth, //nolint:errcheck // status only
			Detail: fmt.Sprintf("%s refuses the account (%v): fix its credentials or sender on the workers; the batches wait and go on by themselves", pe.Provider, pe)})
	}
	// Not the batch's failure: it waits for the fix without using up its retries (it counted them, and
	// after about two hours of wrong credentials every batch was in the dead-letter queue).
	return &RetryError{Err: fmt.Errorf("provider refuses the account, not the recipients (fix the configuration; the batch waits): %w", pe), After: h.accountRetry(pe.Provider)}
}

// accountRetry is how long a batch whose provider refuses the account waits before it runs again: a
// quarter of the time since the provider last accepted a send of this process (or since it started), 5 s
// at least and 2 minutes at most. A fix is taken up within 2 minutes (the exponential back-off of a
// failure took up to 10), and a long refusal costs each batch one refused request every 2 minutes.
func (h *Handler) accountRetry(provider string) time.Duration {
	from := h.born
	if last := h.lastAccepted(provider); last != 0 {
		from = time.Unix(0, last)
	}
	return min(max(h.cfg.Now().Sub(from)/4, accountRetryMin), accountRetryMax)
}

// The bounds of accountRetry.
const (
	accountRetryMin = 5 * time.Second
	accountRetryMax = 2 * time.Minute
)

// backOff says how long a send refused transiently waits before its next attempt: an exponential back-off
// with jitter, never shorter than the provider's own Retry-After for that request. Slowing the provider
// for every worker is the shared pace's part (observe).
func (h *Handler) backOff(pe *providers.Error, attempt int) time.Duration {
	jitter := h.jitter
	if jitter == nil {
		jitter = rand.N[time.Duration]
	}
	return backoff(attempt, pe.RetryAfter, jitter)
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// observe tells the provider's shared pace what it answered to a request that took tokens of its limit
// and lasted took (see limiter.Pace): throttled and failed requests lower it for every worker, a run of
// answers raises it back. A request that never left is nothing to it, and neither is one left without a
// usable answer (ambiguous) that lasted longer than any provider call may (the in-flight grace, which
// exceeds the provider timeout): this process was stopped or starved while it waited (SIGSTOP, a paused
// virtual machine), and the reads that expired meanwhile say nothing of the provider; a burst of them
// would call a healthy provider down for every worker.
//
// A failure (5xx, a failed connection) of a send to addr, a recipient's address ("" for a request of
// several), is nothing to it either when the address fails alone (suspect: its failures were counted
// against it in an earlier run, or the provider accepted another send since they began) and the provider
// is up: an outage fails every address, and such a recipient's repeats called the provider down for every
// campaign, with nothing else left to send. Once it is down (other addresses failed), they count as before:
// its probes are judged alike, whoever they are for.
func (h *Handler) observe(ctx context.Context, provider string, v verdict, pe *providers.Error, tokens int, took time.Duration, addr string, attempts int) {
	if v == ambiguous && took > h.cfg.InFlightGrace {
		return
	}
	if v == transient && addr != "" && !pe.AsksToSlowDown() && !pe.RecipientLimited {
		h.suspects.failed(provider, addr, h.cfg.Now())
		if h.suspect(provider, addr, attempts) && !h.pace(provider).WasDown() {
			return
		}
	}
	var a limiter.Answer
	var hint time.Duration
	switch {
	case v == notSent:
		return
	case v == transient && pe.RecipientLimited:
		// The provider answered at its pace; only this address must wait.
		a = limiter.Taken
	case v == transient && pe.AsksToSlowDown() && pe.RetryAfter > 0:
		a, hint = limiter.ThrottledFor, pe.RetryAfter
	case v == transient && pe.AsksToSlowDown():
		a = limiter.Throttled
	case v == transient, v == ambiguous:
		a = limiter.Failed
	default:
		a = limiter.Taken
	}
	if err := h.pace(provider).ObserveN(ctx, a, hint, int64(tokens)); err != nil {
		h.log.Warn("provider pace not shared", "provider", provider, "err", err)
	}
}

// beforeGivingUp is called when attempt has failed transiently. When it was the last, the provider's pace
// is sent this worker's answers at once, so that whether the provider is down (and the attempt then not
// used up) is judged on every answer. The last flush was likely just before that send (the loop reads the
// pace before each one), so the failure would otherwise wait for the next.
func (h *Handler) beforeGivingUp(ctx context.Context, provider string, attempt int) {
	if attempt < h.cfg.SendAttempts {
		return
	}
	if err := h.pace(provider).Flush(ctx); err != nil {
		h.log.Warn("provider pace not shared", "provider", provider, "err", err)
	}
}

// waitWhileDown holds a send back while its provider is down (see limiter.Pace): every second it asks for
// the probe, the one request a second that may go over all workers, and returns when it has it (probe
// true: send one request) or the provider is up again. The wait uses none of the batch's retries: when the batch must hand back its
// recipients meanwhile (the worker stops, the task's time runs out), it says it is waiting, not failing.
func (h *Handler) waitWhileDown(ctx, waitCtx context.Context, run *batchRun, provider string) (probe bool, err error) {
	p := h.pace(provider)
	for p.Down(ctx) {
		if ok, err := p.Probe(ctx); err != nil {
			return false, waitForServices(err)
		} else if ok {
			return true, nil
		}
		if len(run.pending) > 0 {
			// The outcomes known so far are written before the wait, not at the chunk's end, which the
			// outage may put off for minutes: status and report showed the messages the provider took
			// before it went down as pending all the while, to an operator who might send them again.
			if err := h.flush(context.WithoutCancel(ctx), run); err != nil {
				h.log.Warn("outcomes not written before a wait for the provider; written at the chunk's end", "campaign_id", run.c.ID, "err", err)
			}
		}
		if err := h.hold(waitCtx, run, time.Second); err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if re := (*RetryError)(nil); waitCtx.Err() == nil && errors.As(err, &re) {
				return false, err // the lease: lost, or Postgres unreachable
			}
			return false, &RetryError{Err: fmt.Errorf("provider %s is down; the batch waits for it", provider), After: 5 * time.Second}
		}
	}
	return false, nil
}

// hold sleeps d (on ctx) while keeping the chunk's lease: it is renewed every third of its TTL, so a long
// wait for the provider (down, a Retry-After, a back-off) does not let the sweeper take a live run's chunk
// in hand for a dead run's. A lease lost meanwhile, or Postgres unreachable, ends the wait with renew's
// RetryError.
func (h *Handler) hold(ctx context.Context, run *batchRun, d time.Duration) error {
	// The answers of the sends before are written into their claims before the wait (a back-off, an
	// outage): a worker that died during it would otherwise leave accepted recipients in flight, unknown.
	h.settleAnswers(context.WithoutCancel(ctx), run)
	end := time.Now().Add(d)
	before := run.beforeDue // a wait for a turn (d 0) is not one for tokens
	if d <= 0 {
		before = nil
	}
	for {
		// The epoch is read when the lease is renewed (every third of its TTL), not at every call: the
		// wait for a turn calls hold every second in each waiting run.
		due := !h.cfg.Now().Before(run.renewAt)
		if err := h.renew(ctx, run); err != nil {
			return err
		}
		if due {
			if err := h.sameEpoch(ctx, run); err != nil {
				return err
			}
		}
		left := time.Until(end)
		if before != nil && left <= run.beforeDueLead {
			before(ctx)
			before = nil
			if left = time.Until(end); -left > run.dueOverrun {
				run.dueOverrun = -left
			}
		}
		if left <= 0 {
			return nil
		}
		step := min(left, max(run.lease.TTL/3, time.Millisecond))
		if before != nil {
			step = min(step, left-run.beforeDueLead)
		}
		if err := limiter.Sleep(ctx, step); err != nil {
			return err
		}
	}
}

// sameEpoch ends a wait of run whose Redis epoch changed meanwhile (Redis lost its data, or failed over):
// its claims would be refused anyway, and the sooner it lets its batch go, the sooner a run under the new
// epoch takes it (a run waiting out tokens reserved before the loss held it for seconds). A Redis that does
// not answer leaves the wait alone: the claim after it fails closed.
func (h *Handler) sameEpoch(ctx context.Context, run *batchRun) error {
	if h.cfg.Redis == nil || run.guard.Epoch == "" {
		return nil
	}
	e, err := h.cfg.Redis.Get(ctx, state.EpochKey).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil
	}
	if e != run.guard.Epoch {
		return &RetryError{Err: state.ErrEpoch, After: time.Second}
	}
	return nil
}

// paceReport exports a provider's shared pace after each flush, and logs its moves (each is reported to
// the one worker whose answers caused it, so each is logged once over the fleet).
func (h *Handler) paceReport(r limiter.PaceReport) {
	provider, _ := state.ProviderOf(r.Bucket)
	h.cfg.Metrics.Pace(provider, r.Rate, r.Down, string(r.Event))
	pace := func(rate float64) any {
		if rate <= 0 {
			return "none"
		}
		return math.Round(rate)
	}
	switch r.Event {
	case limiter.PaceLowered:
		h.log.Warn("provider pushes back: its pace is lowered for every worker", "provider", provider,
			"pace_per_second", pace(r.Rate), "was", pace(r.Was), "refused", r.Rejected, "of", r.Requests)
	case limiter.PaceRemeasured:
		h.log.Info("provider pace measured again with every worker's answers: raised for every worker", "provider", provider,
			"pace_per_second", pace(r.Rate), "was", pace(r.Was))
	case limiter.PaceAtCap:
		h.log.Info("provider pace back at its cap", "provider", provider, "pace_per_second", pace(r.Rate))
	case limiter.PaceDown:
		if fb := h.fallbackOf(provider); fb != "" {
			h.log.Error("provider down: its sends go through the fallback, and it is probed every "+h.cfg.FailoverProbeEvery.String()+" over every worker", "provider", provider,
				"fallback", fb, "failed", r.Rejected, "of", r.Requests)
			break
		}
		h.log.Error("provider down: sends wait (one probe a second over every worker); nobody's retries are used", "provider", provider,
			"failed", r.Rejected, "of", r.Requests)
	case limiter.PaceUp:
		h.log.Info("provider up again: sending goes on", "provider", provider, "pace_per_second", pace(r.Rate))
	case limiter.PacePaused:
		h.log.Warn("provider asked every request to wait (most 429s carried Retry-After): every worker pauses", "provider", provider)
	}
}

// fallbackOf is the name of the provider the sends of the first provider named fall over to, "" when none.
func (h *Handler) fallbackOf(provider string) string {
	for ch, fb := range h.cfg.Fallback {
		if first := h.cfg.Providers[ch]; first != nil && first.Name() == provider {
			return fb.Name()
		}
	}
	return ""
}

// pace is the provider's shared pace under its configured cap.
func (h *Handler) pace(provider string) *limiter.Pace {
	return h.bucket.Pace(state.ProviderBucket(provider), h.cfg.ProviderRates[provider])
}

// giveUp ends this run's tries of a recipient whose sends kept failing transiently. When the recipient
// before it failed the same way, the provider is in trouble rather than the recipient: the batch stops and
// comes back later. Otherwise the recipient is left pending and the batch goes on. The failure counts
// against the recipient once the provider is seen to work (a send of this run after it, or any send of
// this process in the last half minute), and a recipient that failed in MaxRecipientAttempts runs fails
// for good. A recipient that keeps failing while nothing else is sent stays pending, and its batch ends
// in the DLQ.
//
// A recipient that failed so before this run (its attempts, or this process's suspects) is a suspect: its
// failure is no sign of the provider's trouble (it does not count as one in a row), and, when the run
// ends with nothing to show the provider works, it counts against the recipient all the same, as an
// earlier run showed it to be its own. Before, a few such recipients left alone in their batch (five users
// an in-house receiver answers 500 for) were never counted and stayed pending for good.
func (h *Handler) giveUp(run *batchRun, r *campaign.Recipient, pe *providers.Error, wait time.Duration) error {
	suspect := h.suspect(pe.Provider, r.Address, r.Attempts)
	if !suspect {
		run.failedInARow++
		if run.failedInARow >= 2 {
			run.unblamed = nil
			return &RetryError{Err: fmt.Errorf("provider kept failing: %w", pe), After: wait, Failure: true}
		}
	}
	o := transientOutcome(r, pe)
	if last := h.lastAnswer.Load(); last != 0 && h.cfg.Now().Sub(time.Unix(0, last)) < 30*time.Second {
		run.add(o)
		if o.Status == campaign.StatusPending {
			run.deferred++
		}
		return nil
	}
	run.deferUnblamed(r, o, suspect)
	return nil
}

// deferUnblamed leaves r, outcome o of its transient refusals, for a later run of the batch; o counts
// against r only once a later send of the run is answered (answered), or, when tried (an earlier run showed
// r's failures to be its own: unblamedTried), at the run's end all the same.
func (run *batchRun) deferUnblamed(r *campaign.Recipient, o campaign.Outcome, tried bool) {
	run.deferred++
	run.unblamed = append(run.unblamed, o)
	if tried {
		run.unblamedTried++
	}
	delete(run.inherited, r.UserID) // its claim was released: nothing was sent
}

// aloneRefused says whether an account-level refusal is rather the recipient's: a 404 (an in-house
// receiver answers it for a user it does not know, as a wrong URL does for every request) while the
// same provider accepted others within the last 30 s. Such a recipient waits for a later run (deferLimited),
// and fails after MaxRecipientAttempts runs; a wrong URL fails every send and still holds the batch
// (accountError). Before, one unknown user held its whole campaign as provider_auth, crawling.
func (h *Handler) aloneRefused(provider string, pe *providers.Error) bool {
	if pe.Status != 404 || pe.Account {
		return false
	}
	last := h.lastAccepted(provider)
	return last != 0 && h.cfg.Now().Sub(time.Unix(0, last)) < 30*time.Second
}

// probeAccount sets r aside, refused at the account level with no send of its provider accepted lately
// (aloneRefused) to tell whether the refusal is r's: the run's next send probes. Accepted, it shows the
// refusal was r's (an in-house receiver answers 401, 403 or 404 for a user it does not take), and r's run
// counts against its attempts (answered), as a recipient that kept failing does; refused at the account
// level too, the refusal is the account's, and the batch waits for the fix (accountError) with nobody's
// attempts used. Before, such a refusal of a batch's first recipient held the whole batch as provider_auth
// for good, on a worker that had not sent through the provider in the last 30 s. Up to accountProbes
// refusals in a row are set aside (users the receiver refuses can be neighbours in a batch: two of them
// held the batch when the probe was the second); it reports false, and sets nothing aside, past them, or
// when the provider's own code says the account (providers.Error.Account).
func (h *Handler) probeAccount(run *batchRun, r *campaign.Recipient, pe *providers.Error) bool {
	if pe.Account || run.accountProbed >= accountProbes {
		return false
	}
	run.accountProbed++
	run.probed = pe
	run.deferAfter = max(run.deferAfter, time.Minute)
	run.deferUnblamed(r, transientOutcome(r, pe), r.Attempts > 0)
	return true
}

// accountProbes is how many account-level refusals in a row a run sets aside before it takes the next for
// the account's (probeAccount).
const accountProbes = 3

// suspect says whether a recipient whose sends the provider fails (attempts counted so far, at addr)
// fails alone (see suspects): an earlier run counted its failures against it, or the provider accepted
// another send after its failures began.
func (h *Handler) suspect(provider, addr string, attempts int) bool {
	return attempts > 0 || h.suspects.failedBefore(provider, addr, h.lastAccepted(provider), h.cfg.Now())
}

// accepted notes that provider accepted a send to addr (aloneRefused, accountRetry, suspects).
func (h *Handler) accepted(provider, addr string) {
	if n, ok := h.refusedInARow.Load(provider); ok {
		n.(*atomic.Int32).Store(0)
	}
	// Every accepted send's path: an atomic store, no allocation after the provider's first.
	v, ok := h.acceptedAt.Load(provider)
	if !ok {
		v, _ = h.acceptedAt.LoadOrStore(provider, new(atomic.Int64))
	}
	v.(*atomic.Int64).Store(h.cfg.Now().UnixNano())
	h.suspects.accepted(provider, addr)
}

// lastAccepted is when provider last accepted a send of this process (unix ns), 0 when it never did.
func (h *Handler) lastAccepted(provider string) int64 {
	if v, ok := h.acceptedAt.Load(provider); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// deferAlone leaves r, refused alone (aloneRefused), for a later run a minute on at least.
func (h *Handler) deferAlone(run *batchRun, r *campaign.Recipient, pe *providers.Error) {
	pe.RecipientLimited, pe.RetryAfter = true, max(pe.RetryAfter, time.Minute)
	h.deferLimited(run, r, pe)
}

// downHandBack is the least wait of a batch handed back because recipients of it kept failing as the probe
// of a provider down by the pace (deferDown): meanwhile other runs probe it.
const downHandBack = 5 * time.Second

// deferDown leaves r pending for a later run of its batch: its sends kept failing while its provider was
// down by the pace (probesPerRecipient), each as the probe. In an outage everybody's do; one recipient the
// provider always refuses (a webhook receiver that fails on one user, a token FCM always answers 503) would
// otherwise be the probe for ever and hold the provider down for every campaign on it. As for a recipient
// that kept failing (giveUp), r's run counts against its attempts only once a later send of the run is
// answered (then it was r, not the provider); the batch's retries are not used up.
func (h *Handler) deferDown(run *batchRun, r *campaign.Recipient, pe *providers.Error) {
	run.downDeferred++
	run.deferAfter = max(run.deferAfter, downHandBack)
	run.deferUnblamed(r, transientOutcome(r, pe), false)
}

// deferLimited leaves r pending for a later run of its batch: the provider takes no more messages to its
// address for now (providers.Error.RecipientLimited). It says nothing about the provider's health either
// way (the run neither waits for the address nor counts it for or against the provider), and this process
// holds the address back until the provider's hint (limitedHere), so that no run of it tries the address
// again within its wait. The batch comes back no sooner (run.deferAfter). Each refusal costs r an attempt:
// after MaxRecipientAttempts runs that met it, r fails for good, like any recipient that kept failing.
func (h *Handler) deferLimited(run *batchRun, r *campaign.Recipient, pe *providers.Error) {
	o := transientOutcome(r, pe)
	if o.Status == campaign.StatusPending {
		run.limitedWait(pe.RetryAfter)
		h.holdLimited(r.Address, h.cfg.Now().Add(pe.RetryAfter))
	}
	run.add(o)
}

// transientOutcome is the outcome of r's run ending on pe, a transient refusal: pending for a later run,
// or failed for good once that makes MaxRecipientAttempts runs.
func transientOutcome(r *campaign.Recipient, pe *providers.Error) campaign.Outcome {
	if r.Attempts+1 >= MaxRecipientAttempts {
		return campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Provider: pe.Provider,
			Reason: fmt.Sprintf("gave up after %d runs, each failed by the provider with an error that can pass (a 5xx, a connection, an account-level refusal); last: %s", r.Attempts+1, pe.Reason())}
	}
	return campaign.Outcome{UserID: r.UserID, Status: campaign.StatusPending, Reason: pe.Reason()}
}

// limitedWait counts a recipient left for a later run for a provider's limit on its address, and makes
// the batch come back no sooner than wait.
func (run *batchRun) limitedWait(wait time.Duration) {
	run.deferred++
	run.limited++
	run.deferAfter = max(run.deferAfter, wait)
}

// holdLimited holds addr back in this process until until (limitedHere).
func (h *Handler) holdLimited(addr string, until time.Time) {
	h.limitedMu.Lock()
	defer h.limitedMu.Unlock()
	if h.limitedAddrs == nil {
		h.limitedAddrs = map[string]time.Time{}
	}
	h.pruneLimited(h.cfg.Now(), len(h.limitedAddrs) >= 10_000)
	if until.After(h.limitedAddrs[addr]) {
		h.limitedAddrs[addr] = until
	}
	h.limiting.Store(int64(len(h.limitedAddrs)))
}

// limitedHere returns how long a provider's limit on addr still holds it back in this process (0: it does
// not). Another worker does not know: it may try the address once and be told in turn. Holds that ended
// are taken out as they are met, and all of them once a minute, so that once none holds, the runs' sends
// look no more (limiting is 0 again).
func (h *Handler) limitedHere(addr string) time.Duration {
	if h.limiting.Load() == 0 {
		return 0 // no lock for each recipient of a run while nothing is held
	}
	h.limitedMu.Lock()
	defer h.limitedMu.Unlock()
	now := h.cfg.Now()
	until, ok := h.limitedAddrs[addr]
	if ok && !now.Before(until) {
		delete(h.limitedAddrs, addr)
	}
	h.pruneLimited(now, false)
	h.limiting.Store(int64(len(h.limitedAddrs)))
	return max(0, until.Sub(now))
}

// pruneLimited takes the holds that ended by now out of limitedAddrs, when a minute has passed since it
// last did or when force is set. The caller holds limitedMu.
func (h *Handler) pruneLimited(now time.Time, force bool) {
	if !force && now.Sub(h.limitedPruned) < time.Minute {
		return
	}
	h.limitedPruned = now
	for a, u := range h.limitedAddrs {
		if !now.Before(u) {
			delete(h.limitedAddrs, a)
		}
	}
}

// answered notes a send the provider answered (accepted or refused for the recipient): the recipients
// that kept failing before it were at fault themselves.
func (h *Handler) answered(ctx context.Context, run *batchRun) {
	h.lastAnswer.Store(h.cfg.Now().UnixNano())
	run.answeredAny = true
	if !run.authShown && h.cfg.Redis != nil {
		// The provider answered for a recipient: the account is taken. A provider_auth wait noted for
		// the campaign is over now, not once the batch has ended, which may be minutes on.
		run.authShown = true
		state.ClearWaiting(ctx, h.cfg.Redis, run.c.ID, WaitProviderAuth) //nolint:errcheck // status only; it expires
	}
	run.failedInARow = 0
	run.accountProbed = 0
	run.blame()
}

// blame counts the run's unblamed recipients' failures against them: a failed one is no longer deferred.
func (run *batchRun) blame() {
	for _, o := range run.unblamed {
		if o.Status == campaign.StatusFailed {
			run.deferred--
		}
		run.add(o)
	}
	run.unblamed = run.unblamed[:0]
	run.unblamedTried = 0
}

// backoff is exponential with jitter (half to all of 100 ms·2^(attempt-1), capped at 10 s: jitter(n) adds
// up to n to the half), and never shorter than the provider's own hint. The first waits are short: a sporadic 5xx is over by the next
// request, and what keeps a provider that refuses more than now and then from being hammered is its shared
// pace (limiter.Pace), which every refusal lowers, not one recipient's wait.
func backoff(attempt int, hint time.Duration, jitter func(time.Duration) time.Duration) time.Duration {
	d := 100 * time.Millisecond << min(attempt-1, 7)
	d = min(d, 10*time.Second)
	d = d/2 + jitter(d/2+1)
	return max(d, hint)
}

// noConsent records a provider's refusal for want of consent against the recipients' consents, so that
// no later campaign sends them a commercial message through a provider that does not check İYS: Netgsm's
// "İYS holds none" turns the consents RET here only; Twilio's opt-out is the person's refusal, recorded as
// one (for İYS too). It runs in the background, so that it never holds up the batch (the recipients fail
// either way), one write at a time, each attempt bounded: the consents' writers take turns, and an import
// may hold them for minutes. It is retried for as long as the process runs: nothing else will carry the
// provider's word again (Twilio created no message, so no status callback follows). Before the first
// attempt, the refusal is kept in Postgres (KeepPendingRefusal), in a table of its own that no import
// holds: a process killed before the write lands leaves it there, and another worker writes it
// (DrainRefusals). The first attempt to keep it is made here, before noConsent returns (the caller writes
// the provider's answer into the claims after it): a kill right after the answer, before a goroutine ran,
// lost the refusal while the claims made the recipients failed. Only when Postgres cannot take it then is
// it kept in the background, before each write.
func (h *Handler) noConsent(ctx context.Context, run *batchRun, pe *providers.Error, users, addrs []string) {
	c := run.c
	p := campaign.PendingRefusal{CampaignID: c.ID, UserIDs: users, Addrs: addrs, OptedOut: pe.OptedOut, Reason: pe.Reason(), At: time.Now(), Holder: h.holder()}
	log := h.log.With("campaign_id", c.ID, "provider", pe.Provider, "to", providers.MaskAddress(addrs[0]), "err", p.Reason)
	// Until the RET is written, the leases read the ONAY: this process holds the addresses back itself.
	keys := h.holdRefused(c, pe.OptedOut, addrs)
	// Without keys nothing will be written (a transactional message, a channel İYS does not govern):
	// there is nothing to keep either.
	kept := keys == nil
	keepable := true
	if !kept {
		id, err := h.keepRefusal(context.WithoutCancel(ctx), p)
		switch {
		case err == nil:
			p.ID, kept = id, true
		case campaign.RefusedForGood(err):
			keepable = false
			log.Error("a provider's refusal for want of consent cannot be kept in Postgres: a stop of this worker before it is written loses it", "error", err)
		default:
			log.Warn("a provider's refusal for want of consent is not kept in Postgres yet; tried again before each write", "error", err)
		}
		if !kept {
			h.refusalsUnkept.Add(1)
		}
	}
	h.consentPending.Add(1)
	go func() {
		defer h.consentPending.Done()
		ctx := h.consentCtx
		for try := 1; ; try++ {
			if !kept && keepable {
				id, err := h.keepRefusal(ctx, p)
				switch {
				case err == nil:
					p.ID, kept = id, true
					h.refusalsUnkept.Add(-1)
				case campaign.RefusedForGood(err):
					keepable = false
					log.Error("a provider's refusal for want of consent cannot be kept in Postgres: a stop of this worker before it is written loses it", "error", err)
				}
			}
			n, done, err := h.writeHeld(ctx, c, p, keys)
			switch {
			case done:
				if !kept {
					h.refusalsUnkept.Add(-1)
				}
				if err != nil {
					log.Error("a provider refused for want of consent, and the refusal cannot be recorded: check it with campaignctl iys check", "error", err)
				} else {
					log.Warn("a provider refused for want of consent (İYS holds none, or the person opted out): the consent is RET here from now on", "turned", n)
				}
				return
			case ctx.Err() != nil && kept:
				log.Warn("a provider refused for want of consent, and the worker stopped before the consent could be turned RET here: the refusal is kept in Postgres, and the next worker to run writes it", "error", err)
				return
			case ctx.Err() != nil:
				log.Error("a provider refused for want of consent, and the worker stopped before the consent could be turned RET here: check it with campaignctl iys check", "error", err)
				return
			case try == 20:
				log.Warn("a provider's refusal for want of consent is still not written (the consents are busy, or Postgres is away); retrying for as long as the worker runs", "error", err)
			}
			limiter.Sleep(ctx, h.consentPause) //nolint:errcheck // the loop checks ctx
		}
	}()
}

// refusalHold is how long a kept refusal without a liveness lock (Config.Liveness nil) is left to the
// worker that kept it or took it before another may take it (TakePendingRefusals). With a lock, the lock
// decides: a refusal is taken once its worker's lock is gone.
const refusalHold = 2 * time.Minute

// keepRefusal stores p in Postgres until its consents are written, one attempt bounded like a write's.
func (h *Handler) keepRefusal(ctx context.Context, p campaign.PendingRefusal) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, h.consentAttempt)
	defer cancel()
	return h.cfg.Store.KeepPendingRefusal(ctx, p, refusalHold)
}

// writeRefusal turns p's consents RET (ProviderOptOut, ProviderNoConsent), one write at a time, one
// attempt bounded.
func (h *Handler) writeRefusal(ctx context.Context, c *campaign.Campaign, p campaign.PendingRefusal) (int64, error) {
	select {
	case h.consentWrites <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-h.consentWrites }()
	ctx, cancel := context.WithTimeout(ctx, h.consentAttempt)
	defer cancel()
	if p.OptedOut {
		return h.cfg.Store.ProviderOptOut(ctx, c, p.UserIDs, p.Addrs, p.Reason, p.At)
	}
	return h.cfg.Store.ProviderNoConsent(ctx, c, p.Addrs, p.Reason, p.At)
}

// writeHeld writes p's consents (writeRefusal) while the addresses are held back under keys. Once they are
// written, or can never be (done; err then says why), the hold ends (a while after a write: a lease that
// read the consents just before its commit still carries the ONAY) and p's kept row is dropped. A row that
// cannot be dropped is written again by a later worker, which changes nothing. Otherwise the hold stays
// and err is the write's.
func (h *Handler) writeHeld(ctx context.Context, c *campaign.Campaign, p campaign.PendingRefusal, keys []string) (n int64, done bool, err error) {
	n, err = h.writeRefusal(ctx, c, p)
	switch {
	case err == nil:
		time.AfterFunc(holdAfterWrite, func() { h.unholdRefused(keys) })
	case errors.Is(err, iys.ErrBadRefusal) || campaign.RefusedForGood(err):
		h.unholdRefused(keys)
	default:
		return n, false, err
	}
	h.dropKept(p)
	return n, true, err
}

// dropKept forgets p's kept row (none when p.ID is 0).
func (h *Handler) dropKept(p campaign.PendingRefusal) {
	if p.ID == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(h.consentCtx), h.consentAttempt)
	defer cancel()
	if err := h.cfg.Store.DropPendingRefusal(ctx, p.ID); err != nil {
		h.log.Warn("a provider's refusal is written, but its row is still kept: a later worker writes it again, which changes nothing", "campaign_id", p.CampaignID, "err", err)
	}
}

// DrainRefusals writes the providers' refusals for want of consent that workers left kept in Postgres when
// they stopped before writing them (kill -9, OOM, a shutdown that could not wait), up to limit of them,
// and returns how many it wrote. Serve runs it at start and every refusalsEvery.
func (h *Handler) DrainRefusals(ctx context.Context, limit int) (int, error) {
	ps, err := h.cfg.Store.TakePendingRefusals(ctx, h.holder(), limit, refusalHold)
	if err != nil {
		return 0, err
	}
	done := 0
	camps := map[int64]*campaign.Campaign{}
	for i, p := range ps {
		if len(p.Addrs) == 0 || len(p.Addrs) != len(p.UserIDs) {
			h.dropKept(p)
			h.log.Error("a provider's refusal kept in Postgres names no address, or not one for each recipient: dropped", "campaign_id", p.CampaignID, "id", p.ID)
			continue
		}
		log := h.log.With("campaign_id", p.CampaignID, "to", providers.MaskAddress(p.Addrs[0]), "err", p.Reason)
		c := camps[p.CampaignID]
		if c == nil {
			c, err = h.cfg.Store.Get(ctx, p.CampaignID)
			if errors.Is(err, campaign.ErrNotFound) {
				h.dropKept(p)
				log.Error("a provider's refusal for want of consent left by a worker that stopped names a campaign that no longer exists: check the address with campaignctl iys check")
				continue
			}
			if err != nil {
				return done, h.letGo(ctx, ps[i:], err)
			}
			camps[p.CampaignID] = c
		}
		keys := h.holdRefused(c, p.OptedOut, p.Addrs)
		n, written, err := h.writeHeld(ctx, c, p, keys)
		switch {
		case written && err == nil:
			done++
			log.Warn("a provider's refusal for want of consent, left by a worker that stopped before writing it, is written: the consent is RET here from now on", "turned", n)
		case written:
			log.Error("a provider's refusal for want of consent, left by a worker that stopped, cannot be recorded: check it with campaignctl iys check", "error", err)
		default:
			h.unholdRefused(keys)
			return done, h.letGo(ctx, ps[i:], err)
		}
	}
	return done, nil
}

// letGo hands the refusals taken and not written back, for any worker to take at its next look
// (refusalsEvery), and returns err: this process's lock would otherwise keep the others from them for as
// long as it lives. What cannot be handed back now is taken again by this process once refusalHold has
// passed.
func (h *Handler) letGo(ctx context.Context, ps []campaign.PendingRefusal, err error) error {
	ids := make([]int64, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.consentAttempt)
	defer cancel()
	if rerr := h.cfg.Store.ReleasePendingRefusals(ctx, ids, refusalsEvery); rerr != nil {
		return fmt.Errorf("%w (and they are not let go: %v)", err, rerr)
	}
	return err
}

// refusalsEvery is how often Serve looks for refusals left by workers that stopped (DrainRefusals).
const refusalsEvery = 10 * time.Second

// refusalLoop runs DrainRefusals at once and every refusalsEvery until ctx ends.
func (h *Handler) refusalLoop(ctx context.Context) {
	t := time.NewTicker(refusalsEvery)
	defer t.Stop()
	for {
		for {
			n, err := h.DrainRefusals(ctx, 20)
			if err != nil && ctx.Err() == nil {
				h.log.Warn("providers' refusals left by stopped workers not written yet; tried again shortly", "err", fmt.Sprint(err))
			}
			if err != nil || n < 20 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// holdAfterWrite is how long a worker still holds back an address a provider refused once its RET is
// written: longer than a lease that read the consents just before that commit takes to reach its sends.
const holdAfterWrite = 5 * time.Second

// heldKey is the key of Handler.held for a refusal of addr under the consent type typ: of brand and
// recipient type rtype (a provider's "no consent": ProviderNoConsent), or of every brand and recipient type
// (all: an opt-out, recorded as the person's refusal: ProviderOptOut).
func heldKey(all bool, brand, typ, rtype, addr string) string {
	if all {
		return "*\x00" + typ + "\x00" + addr
	}
	return brand + "\x00" + typ + "\x00" + rtype + "\x00" + addr
}

// holdRefused notes that c's provider refused addrs for want of consent, until unholdRefused (the RET is
// written): refusedHere holds them back meanwhile. It returns the keys to let go of.
func (h *Handler) holdRefused(c *campaign.Campaign, optedOut bool, addrs []string) []string {
	typ := c.Channel.IYSType()
	if typ == "" || !optedOut && !c.ChecksIYS() {
		return nil // nothing will be written (ProviderNoConsent records nothing for a transactional message)
	}
	keys := make([]string, len(addrs))
	for i, a := range addrs {
		keys[i] = heldKey(optedOut, c.BrandCode, typ, c.IYSRecipientType(), a)
	}
	h.heldMu.Lock()
	defer h.heldMu.Unlock()
	if h.held == nil {
		h.held = map[string]int{}
	}
	for _, k := range keys {
		h.held[k]++
	}
	h.holding.Store(int64(len(h.held)))
	return keys
}

// unholdRefused lets keys go once their RET is written: the leases read it from then on.
func (h *Handler) unholdRefused(keys []string) {
	if len(keys) == 0 {
		return
	}
	h.heldMu.Lock()
	defer h.heldMu.Unlock()
	for _, k := range keys {
		if h.held[k]--; h.held[k] <= 0 {
			delete(h.held, k)
		}
	}
	h.holding.Store(int64(len(h.held)))
}

// refusedHere says whether a provider refused addr for want of the consent c's message needs, and its RET
// is not written yet (noConsent). Only this process knows: another worker's leases read the ONAY until the
// write lands.
func (h *Handler) refusedHere(c *campaign.Campaign, addr string) bool {
	if h.holding.Load() == 0 {
		return false
	}
	if !c.ChecksIYS() {
		return false
	}
	typ := c.Channel.IYSType()
	h.heldMu.Lock()
	defer h.heldMu.Unlock()
	return h.held[heldKey(true, "", typ, "", addr)] > 0 || h.held[heldKey(false, c.BrandCode, typ, c.IYSRecipientType(), addr)] > 0
}

// maskQuoted masks, in a provider's error, what it quotes of msg, the message sent to r, and of r's
// audience values and code, each on its own (providers.MaskContent): a name alone, or the message
// upper-cased, is no run of the text. The error path only: nil goes through at once.
func maskQuoted(err error, msg providers.Message, r *campaign.Recipient) error {
	if err == nil {
		return nil
	}
	var vars map[string]any
	json.Unmarshal(r.Vars, &vars) //nolint:errcheck // what it holds is masked; nothing else is read
	values := slices.Clip(msg.Values)
	if r.Code != "" {
		values = append(values, r.Code)
	}
	for _, v := range vars {
		switch v := v.(type) {
		case nil, bool:
		case string:
			values = append(values, v)
		default:
			values = append(values, fmt.Sprint(v))
		}
	}
	msg.Values = values
	return providers.MaskContent(err, msg)
}
