package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// batchRun is the state of one run of one batch.
type batchRun struct {
	c *campaign.Campaign
	// render makes each recipient's message (with the unsubscribe link of a commercial e-mail).
	render   Renderer
	nonce    string
	batch    int
	provider providers.Provider
	limits   []limiter.Limit
	// answerInNextClaim is set when no send waits for tokens: the claim script then also checks the
	// provider's pause and writes the previous sends' answers (answersDue), one Redis round trip per message
	// (per window of messages, when they go out several at a time).
	answerInNextClaim bool
	// authShown: a provider answered one of the run's sends, and the campaign's provider_auth wait was
	// cleared for it (answered).
	authShown bool
	// tokensAt is when the last readyToSend was granted tokens of a limit with a rate (zero: none), less
	// dueOverrun.
	tokensAt time.Time
	// beforeDue, when set, is called once in each wait for tokens (hold) when beforeDueLead is left of it:
	// readyReading reads the sends' consents again there, so that both are fresh when the tokens are due.
	// dueOverrun is how far past the wait's end it ran: the tokens are that much older.
	beforeDue     func(ctx context.Context)
	beforeDueLead time.Duration
	dueOverrun    time.Duration
	// primary and secondary are the routes one-message sends take: the channel's provider, and its
	// fallback (nil when none).
	primary    route
	secondary  *route
	answersDue []state.Answer
	// snapshots are the consent records read with the chunk's lease, by user, for the outcomes' audit.
	snapshots map[string]campaign.ConsentRecord
	tmpl      *campaign.Template
	lease     campaign.Lease
	// renewAt is when the chunk's lease is renewed before the next claim.
	renewAt time.Time
	// liveGen is the generation of this process's liveness lock (Liveness.Gen) when the lease was last
	// confirmed.
	liveGen int64
	// consentAt is when the chunk's consents were read (gate, recheck of all its recipients still to be
	// sent); readAt, when some of them were read again since (recheck of a request, recheckInFlight).
	consentAt time.Time
	readAt    map[string]time.Time
	// leasedAt is when the last lease's statement was sent (leaseChunk): the consents it read are as of
	// then, and a push's opt-ins read just before it as of the read's start, which a slow audience makes
	// older (one that took a second and more was never fresh enough to send on, and was read again for ever).
	leasedAt time.Time
	// revoked holds the users recheck found without consent (and settled) or no longer pending: not sent.
	revoked map[string]bool
	guard   state.Guard
	// pending are outcomes not yet written to Postgres.
	pending []campaign.Outcome
	// unclaimed is set when an answer of the sends since the last flush could not be written into its
	// claim: Postgres then holds the only record of it, and the outcomes are committed durably.
	unclaimed bool
	// inherited holds the users taken over from a run that died whose fate this run has not read yet
	// (their claims may say they were sent), and those whose claims it found in flight under another run
	// (busy): if the run stops before it knows, they stay in the chunk in hand for the sweeper, instead of
	// being let go as if nothing had happened to them.
	inherited map[string]bool
	// unblamedTried is how many of unblamed were set aside by probeAccount with attempts counted before,
	// or given up on as suspects (giveUp).
	unblamedTried int
	// answeredAny: the provider answered a send of this run for its recipient (answered).
	answeredAny bool
	// unblamed are recipients that kept failing transiently in this run. They count against the recipient
	// only once a later send of the run succeeds (the recipient is at fault, not the provider).
	unblamed []campaign.Outcome
	// failedInARow counts consecutive recipients whose retries all failed transiently.
	failedInARow int
	// accountProbed counts the account-level refusals set aside since the run's last answer (probeAccount),
	// and probed is the last of them.
	accountProbed int
	probed        *providers.Error
	deferred      int
	// limited counts the deferred recipients left for a provider's limit on their address (deferLimited,
	// limitedHere); deferAfter is the longest wait that limit asked for: the batch comes back no sooner.
	limited int
	// downDeferred counts the deferred recipients whose sends kept failing while their provider was down
	// by the pace (deferDown): handed back so that another probes it.
	downDeferred int
	deferAfter   time.Duration
	busy         int
	halts        int
	// carried are the recipients of a chunk that were all that was left of it, each waiting out the
	// back-off of a transient refusal, when chunks of the batch followed: they go with the next chunk
	// (whose lease reads their status and consent again) instead of holding it up. retryOf keeps their
	// attempts and back-offs, by user, until the next chunk's sends take them up again; and those of the
	// recipients a halted window hands back (batchRun.halted), until the gate has read the state again.
	carried []campaign.Recipient
	retryOf map[string]windowSend
	counts  map[string]int64 // the recipients this run moved into each status (flush)
	// consentUntil is when the campaign's consents grow older than its --max-consent-age, by this
	// process's clock (zero: no age is kept); past it, the next chunk reads the campaign again.
	consentUntil time.Time
	// m is the metrics of the campaign's provider and channel (nil: none).
	m *metrics.Sends
}

// Modes of a chunk: send it, or close it because the campaign was cancelled.
type chunkMode int

const (
	modeSend chunkMode = iota
	modeCancel
)

// MaxRecipientAttempts is how many runs may find the same recipient failing transiently (while others
// of its batch are sent) before it is failed for good: a poison recipient never holds its batch back for
// long, and never makes it run out of retries.
const MaxRecipientAttempts = 5

// RunBatch sends the still-pending recipients of one batch, a chunk at a time. Before each chunk it leases
// the chunk's rows in Postgres and reads the campaign's state and the chunk's consents as they are now (a
// pause or a RET recorded a moment ago takes effect within one chunk; a pause also stops the next claim
// through Redis); after each chunk it writes the outcomes and lets its leases go. A cancelled campaign's
// batch is closed the same way: recipients become skipped (cancelled) unless their claim says otherwise.
func (h *Handler) RunBatch(ctx context.Context, campaignID int64, batch int) error {
	log := h.log.With("campaign_id", campaignID, "batch", batch)
	c, err := h.cfg.Store.Get(ctx, campaignID)
	if errors.Is(err, campaign.ErrNotFound) {
		h.forgetTemplate(campaignID)
		log.Warn("batch of a campaign that no longer exists; dropping it")
		return nil
	}
	if err != nil {
		return waitForServices(err)
	}
	if c.State == campaign.StateScheduled {
		if c.State, err = h.cfg.Store.StartIfDue(ctx, c.ID); err != nil {
			return waitForServices(err)
		}
		if c.State == campaign.StateScheduled && c.StartAt != nil {
			return &RetryError{Err: fmt.Errorf("campaign %d starts at %s", c.ID, c.StartAt.Format(time.RFC3339)), After: time.Until(*c.StartAt), Wait: true}
		}
	} else if c.State == campaign.StateRunning && c.StartedAt == nil && c.Window.Open(h.cfg.Now()) {
		// Launched without --at, it starts when a worker first runs a batch of it inside its window: with
		// the window closed at the launch, or no worker running then, started_at said the launch.
		if c.State, err = h.cfg.Store.StartIfDue(ctx, c.ID); err != nil {
			return waitForServices(err)
		}
	}
	if _, retry, done := stateGate(c.ID, c.State); retry != nil || done {
		if done {
			h.forgetTemplate(c.ID)
		}
		return retry
	}
	if c.State == campaign.StateRunning {
		// A batch run long after the launch (its retries, the DLQ, resume) keeps the launch's
		// --max-consent-age: on older consents it sends nothing and waits in the DLQ for a sync.
		if why := c.ConsentStale(); why != "" {
			log.Error("batch not sent: consents too old", "detail", why)
			return toDLQ(errors.New(why))
		}
	}
	run, err := h.newRun(ctx, c, batch)
	if err != nil {
		return err
	}
	if d, ok := c.ConsentFreshFor(); ok && c.State == campaign.StateRunning {
		run.consentUntil = time.Now().Add(d)
	}
	epoch, err := h.state.Epoch(ctx)
	if err != nil {
		return waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
	}
	// Nothing is claimed under an epoch before the frequency marks of the recent sends are back in Redis
	// (a Redis that lost its data lost them too).
	if err := h.state.MarksBack(ctx, epoch, h.cfg.Store.RecentSends, h.cfg.Store.ChunksInHand); err != nil {
		if errors.Is(err, state.ErrMarksPending) {
			return &RetryError{Err: err, After: time.Second}
		}
		return waitForServices(err)
	}
	run.lease = campaign.Lease{Batch: batch, Token: state.Token(), Epoch: epoch, TTL: h.cfg.LeaseTTL, Holder: h.holder(), HolderGrace: h.cfg.LivenessGrace}
	h.leaseLive(run.lease.Token, true)
	defer h.leaseLive(run.lease.Token, false)
	run.liveGen = h.cfg.Liveness.Gen()
	run.guard = state.Guard{Epoch: epoch, Fence: state.FenceKey(run.lease.Token), Halt: state.HaltKey(c.ID)}
	// A run that starts over its campaign's share of the slots hands its batch back before it reads it.
	if h.overShare(ctx, run) {
		return errOverShare()
	}
	recipients, err := h.cfg.Store.LoadBatch(ctx, c.ID, batch)
	if err != nil {
		return waitForServices(err)
	}
	// waitCtx bounds the waits for tokens: it ends at the soft deadline (the task's, less a margin to write
	// the outcomes) or when the worker is told to stop, so a slow rate cap hands the rest of the batch back
	// instead of running into the task timeout. Sends and claim writes keep the task context.
	waitCtx, cancel := h.waitContext(ctx)
	defer cancel()

	chunkSize := h.cfg.ChunkSize
	batcher, _ := run.provider.(providers.Batcher)
	if batcher != nil {
		// One chunk is one request.
		chunkSize = batcher.MaxBatch()
	}
	// share, when set, gives the chunk's size before each lease (sharedChunk).
	var share func() int
	if run.provider != nil && !run.answerInNextClaim {
		// Under a cap, a chunk takes about a second's worth of the run's share of the cap at most (one
		// recipient under 2/s), so progress (written per chunk) moves about once a second, and a consent
		// read with the chunk's lease is at most about a second old when its message goes (older, recheck
		// reads it again), even when the cap is low and shared by this process's runs. Runs of other
		// processes are not counted: their share is not known here.
		rate := h.cfg.ProviderRates[run.provider.Name()]
		campaignCap := c.Rate > 0 && (rate <= 0 || c.Rate < rate)
		if campaignCap {
			rate = c.Rate
		}
		if rate > 0 {
			// Requests of many too: a chunk leased with its consents must not wait a long time for its
			// tokens (a RET recorded meanwhile would not be seen).
			chunkSize = min(chunkSize, max(1, int(rate)))
			if batcher == nil {
				// A run takes the provider's tokens whichever cap binds it: it is counted under both.
				providerKey, campaignKey := capKeys(c.ID, run.provider.Name())
				defer h.enter(providerKey, campaignKey)()
				key := providerKey
				if campaignCap {
					key = campaignKey
				}
				base := chunkSize
				share = func() int { return sharedChunk(base, rate, h.sharers(key)) }
			} else {
				// And a request, whose recipients reach the provider at once, is a tenth of a second's worth
				// at most: requests a second's worth each, spaced a second apart, put two in the same second
				// as soon as one goes out a little late (2,000 e-mails in a second under a cap of 1,000);
				// with a tenth, no second holds more than about 1.1 times the cap.
				chunkSize = min(chunkSize, max(1, int(rate/10)))
			}
		}
	}
	// pace, when set, sizes the chunks of a run without a cap by the pace of its sends (chunkPace).
	var pace *chunkPace
	if h.growChunks && run.answerInNextClaim && batcher == nil && h.windowed(run) {
		pace = h.chunkPaceFor(run.provider.Name())
		chunkSize = pace.size
	}
	// A chunk's outcomes are buffered until it is written: room for a whole chunk's from the start.
	run.pending = make([]campaign.Outcome, 0, min(chunkSize, len(recipients)))
	var stop error
	chunks := 0
	queue := recipients
	runStart := time.Now()
	for (len(queue) > 0 || len(run.carried) > 0) && stop == nil {
		// A run under a cap over its campaign's share hands the rest of its batch back at the end of a chunk
		// past TurnAfter (see overShare; the share was checked when it started).
		if !run.answerInNextClaim && time.Since(runStart) >= h.cfg.TurnAfter && len(run.carried) == 0 && h.overShare(ctx, run) {
			stop = errOverShare()
			break
		}
		if share != nil {
			chunkSize = share()
		}
		if pace != nil {
			chunkSize = pace.size
		}
		// The recipients carried from the chunk before count in the chunk's size, so that the chunk in hand
		// (what a kill together with a loss of Redis's data leaves unknown) is no larger than chunkSize, or
		// than the carried ones alone when the size has just come down.
		chunk := queue[:min(max(0, chunkSize-len(run.carried)), len(queue))]
		queue = queue[len(chunk):]
		// A chunk of carried recipients only waits out their back-offs in place rather than carry them
		// again at once (a lease and a write a turn, with nothing sent).
		more := len(queue) > 0 && len(chunk) > 0
		if len(run.carried) > 0 {
			// Behind the chunk's own, so that its sends start at once: their back-offs end meanwhile.
			chunk = append(slices.Clip(chunk), run.carried...)
			run.carried = nil
		}
		// The consents' --max-consent-age holds for every chunk, not only at the batch's start: a batch
		// that started on consents young enough sent on for as long as it lasted.
		if !run.consentUntil.IsZero() && !time.Now().Before(run.consentUntil) {
			if why, err := h.consentsAgedOut(ctx, run); err != nil || why != "" {
				stop = err
				if why != "" {
					log.Error("batch stopped: consents too old", "detail", why)
					stop = toDLQ(errors.New(why))
				}
				break
			}
		}
		leasedAt := time.Now()
		chunks++
		mode, todo, err := h.gate(ctx, run, chunk)
		if err != nil {
			stop = err
			break
		}
		if mode == modeSend && (batcher != nil || h.windowed(run)) {
			if batcher != nil {
				err = h.deliverGroup(ctx, waitCtx, run, batcher, todo)
			} else {
				err = h.deliverWindowed(ctx, waitCtx, run, todo, more)
				if err == nil && pace != nil {
					// Only the recipients answered: the ones carried over to wait out a back-off did not
					// make the chunk faster.
					pace.observe(len(todo)-len(run.carried), time.Since(leasedAt))
				}
			}
			if errors.Is(err, state.ErrHalted) && run.halts == 0 {
				run.halts++
				queue = append(append([]campaign.Recipient(nil), todo...), queue...)
				err = nil
			}
			if err != nil {
				stop = err
			}
			todo = nil
		}
		for i := range todo {
			if waitCtx.Err() != nil && ctx.Err() == nil {
				stop = &RetryError{Err: errors.New("batch handed back (worker stopping or batch time used up)"), After: time.Second}
				break
			}
			if mode == modeCancel {
				err = h.close(ctx, run, &todo[i], state.ReasonValue(state.Skipped, campaign.ReasonCancelled))
			} else {
				err = h.deliver(ctx, waitCtx, run, todo[i:])
			}
			if errors.Is(err, state.ErrHalted) {
				run.halts++
				if run.halts > 1 {
					stop = &RetryError{Err: fmt.Errorf("campaign %d is halted in Redis (%s) but %s in Postgres; `campaignctl resume %d` clears the halt", c.ID, HaltKey(c.ID), run.c.State, c.ID), After: 30 * time.Second}
					break
				}
				// Paused or cancelled a moment ago: what is left goes through the gate again, which reads why.
				queue = append(append([]campaign.Recipient(nil), todo[i:]...), queue...)
				log.Info("campaign halted; re-reading its state")
				break
			}
			if err != nil {
				stop = err
				break
			}
		}
		// Outcomes already known are written even when the batch stops early; they are in the claims too,
		// so a failed write is repaired by the next run.
		if err := h.flush(context.WithoutCancel(ctx), run); err != nil && stop == nil {
			stop = waitForServices(err)
		}
	}
	if stop == nil && len(run.unblamed) > 0 && (run.answeredAny || run.unblamedTried == len(run.unblamed)) {
		// The run's last sends were refused at the account level and set aside for a probe that never
		// came (nothing left to send). The provider answered an earlier send of this run for its recipient
		// (the account worked moments before), or an earlier run of each showed its failure to be its own
		// (a send after it was accepted): the refusals are the recipients'. Last in its batch, or left
		// alone in it, such a recipient's attempts never moved, and its batch came back every minute, its
		// refused request each time, until the dead-letter queue (26 minutes for one Twilio 21606). A run
		// of nothing but refusals of recipients never tried is still no proof: they wait, as for the
		// account.
		run.blame()
		if err := h.flush(context.WithoutCancel(ctx), run); err != nil {
			stop = waitForServices(err)
		}
	}
	if stop == nil && len(run.unblamed) > 0 && run.probed != nil && !run.answeredAny && run.accountProbed == len(run.unblamed) {
		// Every send of the run was refused at the account level and set aside for a probe that never
		// came, and no earlier run showed the refusals to be the recipients' (blamed above): nothing tells
		// the account from the recipients, and the account is the likelier (wrong credentials, a sender
		// not allowed). The batch waits as for the account, without using its retries. Before, a batch of
		// three recipients or fewer (often a campaign's last) used them up under wrong credentials and went
		// to the dead-letter queue, and status never said provider_auth.
		stop = h.accountError(ctx, run, run.probed)
	}
	if len(run.unblamed) > 0 {
		// The batch stopped before a later send showed the recipients were at fault: not counted.
		run.unblamed = nil
	}
	if err := h.cfg.Store.ReleaseBatch(context.WithoutCancel(ctx), c.ID, run.lease); err != nil {
		// The lease expires by itself; another run of the batch waits for it until then.
		log.Warn("batch lease not released", "err", err)
	}
	log.Info("batch run", "recipients", len(recipients), "chunks", chunks, "sent", run.counts[campaign.StatusSent],
		"failed", run.counts[campaign.StatusFailed], "skipped", run.counts[campaign.StatusSkipped],
		"unknown", run.counts[campaign.StatusUnknown], "deferred", run.deferred, "in_flight_elsewhere", run.busy)
	if errors.Is(stop, errCampaignOver) {
		h.forgetTemplate(c.ID)
		return nil
	}
	if errors.Is(stop, state.ErrEpoch) || errors.Is(stop, state.ErrFenced) {
		return &RetryError{Err: stop, After: time.Second}
	}
	if errors.Is(stop, state.ErrHalted) {
		return &RetryError{Err: fmt.Errorf("campaign %d is halted in Redis (%s) but %s in Postgres; `campaignctl resume %d` clears the halt", c.ID, HaltKey(c.ID), run.c.State, c.ID), After: 30 * time.Second}
	}
	if stop != nil {
		return stop
	}
	if run.busy > 0 {
		return &RetryError{Err: fmt.Errorf("%s being sent by another run of this batch", countRecipients(run.busy)), After: max(h.cfg.LeaseTTL, run.deferAfter)}
	}
	if run.deferred > 0 && run.deferred == run.limited {
		// Not a fault of the provider's nor of the batch: its retries are not used up (each recipient's
		// attempts bound it).
		return &RetryError{Err: fmt.Errorf("%s waiting out their provider's limit on messages to one address (Netgsm's 85); the rest of the batch is done", countRecipients(run.deferred)),
			After: run.deferAfter, Wait: true}
	}
	if run.deferred > 0 && run.deferred == run.limited+run.downDeferred && run.downDeferred > 0 {
		// Not the batch's fault: each recipient's attempts bound it (those whose failures a later answer
		// showed to be theirs are counted), and an outage must not use up the batch's retries.
		return &RetryError{Err: fmt.Errorf("%s kept failing while the provider was down, each as its probe; handed back so that another recipient probes it, the rest of the batch is done", countRecipients(run.deferred)),
			After: run.deferAfter}
	}
	if run.deferred > 0 {
		return &RetryError{Err: fmt.Errorf("%s kept failing with provider errors that can pass; retried later, the rest of the batch is done", countRecipients(run.deferred)), After: run.deferAfter, Failure: true}
	}
	if h.cfg.Redis != nil && !run.authShown {
		// The batch went through without a provider's answer (every recipient skipped): whatever account
		// refusal was noted for it is over all the same.
		state.ClearWaiting(ctx, h.cfg.Redis, c.ID, WaitProviderAuth) //nolint:errcheck // status only; it expires
	}
	if open, err := h.closeBatch(ctx, c.ID, batch); err != nil {
		return waitForServices(err)
	} else if open {
		// Recipients made pending again while this run sent (resume --resend-unknown): its task is the
		// only one of the batch (a second enqueue of it was refused), so it comes back for them.
		return &RetryError{Err: errors.New("recipients of this batch were made pending again while it ran; it runs again for them"), After: time.Second}
	}
	return nil
}

// pendingKey and activeKey are Asynq's lists of the batch queue's tasks waiting for a worker (oldest on the
// right) and running: their task IDs are TaskID's "<campaign>:<batch>", or a follow-up's of it (parseTaskID). TestRunsUnderACapShareTheSlots
// holds the names to the Asynq in use.
const (
	pendingKey = "asynq:{" + Queue + "}:pending"
	activeKey  = "asynq:{" + Queue + "}:active"
)

// pendingLook is how many of the oldest waiting tasks turnOver reads.
const pendingLook = 2000

// queueView is what turnOver read of the queue: the campaigns with a batch waiting, and the batches
// running by campaign.
type queueView struct {
	pending map[int64]bool
	active  map[int64][]int
}

// overShare says whether run hands its batch back because campaigns share the worker slots: a campaign at
// --rate 100 with a hundred batches held every slot, each run waiting for its share of the cap, and a
// campaign launched after it sent nothing until it ended (an outside run: 90 s and counting, of 8.5 min);
// a campaign without a cap took every slot a capped one's runs freed, and the capped one sent nothing
// until the other's queued batches had all started. A running campaign's run holding more than its share
// while another campaign's batch waits (turnOver) hands its batch back: at once when it starts, or, under a
// cap, at the end of a chunk past TurnAfter. A run without a cap is checked when it starts only: its sends
// are in flight afterwards, and it ends its batch quickly.
func (h *Handler) overShare(ctx context.Context, run *batchRun) bool {
	return run.provider != nil && run.c.State == campaign.StateRunning && h.cfg.TurnAfter > 0 && h.turnOver(ctx, run.c.ID, run.batch)
}

// errOverShare is the wait of a run that hands its batch back (overShare): not a failure, tried again in a
// second, behind the batches waiting.
func errOverShare() error {
	return &RetryError{Err: errors.New("batch handed back: its campaign holds more than its share of the worker slots while a batch of another campaign waits"),
		After: time.Second, Wait: true}
}

// turnOver says whether the run of batch of campaign id hands its batch back: a batch of another campaign
// waits, and id runs more batches than its share of the slots in use (those slots over the campaigns that
// run or wait). Of id's batches running, the last ones (by number) hand back, as many as id runs over its
// share, so that not all of them do at once; a run not among those read yet counts as the last. The queue
// is read at most once a second by this process; a failed read says no.
func (h *Handler) turnOver(ctx context.Context, id int64, batch int) bool {
	v := h.queueNow(ctx)
	waits := false
	for c := range v.pending {
		waits = waits || c != id
	}
	if !waits {
		return false
	}
	campaigns := map[int64]bool{id: true}
	total := 0
	for c, bs := range v.active {
		total += len(bs)
		campaigns[c] = true
	}
	for c := range v.pending {
		campaigns[c] = true
	}
	mine := slices.Clone(v.active[id])
	if !slices.Contains(mine, batch) {
		mine = append(mine, batch)
		total++
	}
	slices.SortFunc(mine, func(a, b int) int { return b - a })
	share := max(1, (total+len(campaigns)-1)/len(campaigns))
	over := len(mine) - share
	return over > 0 && slices.Index(mine, batch) < over
}

// queueNow returns the queue as read less than a second ago, or reads it.
func (h *Handler) queueNow(ctx context.Context) queueView {
	h.queuedMu.Lock()
	defer h.queuedMu.Unlock()
	if h.cfg.Redis == nil || time.Since(h.queuedAt) < time.Second {
		return h.queued
	}
	h.queuedAt, h.queued = time.Now(), queueView{pending: map[int64]bool{}, active: map[int64][]int{}}
	pipe := h.cfg.Redis.Pipeline()
	pending := pipe.LRange(ctx, pendingKey, -pendingLook, -1)
	active := pipe.LRange(ctx, activeKey, 0, -1)
	if _, err := pipe.Exec(ctx); err != nil {
		return h.queued
	}
	for _, t := range pending.Val() {
		if c, _, ok := parseTaskID(t); ok {
			h.queued.pending[c] = true
		}
	}
	for _, t := range active.Val() {
		if c, b, ok := parseTaskID(t); ok {
			h.queued.active[c] = append(h.queued.active[c], b)
		}
	}
	return h.queued
}

// sharedChunk is the size of a chunk under a cap of rate a second shared by runs runs of this process:
// about a second's worth of one run's share, one recipient at least, base at most.
func sharedChunk(base int, rate float64, runs int) int {
	return min(base, max(1, int(rate/float64(runs))))
}

// closeBatch settles batch of campaign id when it has no pending recipient left and completes the
// campaign if it was the last (Store.CloseBatch); open reports that the batch still has one.
func (h *Handler) closeBatch(ctx context.Context, id int64, batch int) (open bool, err error) {
	done, open, err := h.cfg.Store.CloseBatch(ctx, id, batch)
	if done {
		h.forgetTemplate(id)
		h.log.Info("campaign completed", "campaign_id", id)
		if h.cfg.Redis != nil {
			if n, err := dropArchived(h.cfg.Redis, id); err != nil {
				h.log.Warn("completed campaign's batch tasks not dropped from the DLQ; `campaignctl dlq purge --campaign ID` drops them", "campaign_id", id, "err", fmt.Sprint(err))
			} else if n > 0 {
				h.log.Info("completed campaign's batch tasks dropped from the DLQ: nothing of them was pending", "campaign_id", id, "tasks", n)
			}
		}
	}
	return open, err
}

// noProviderRetry is how soon a batch handed back by a worker without its channel's provider (or, for a
// commercial e-mail, without the means to make its unsubscribe links) is offered to the fleet again when
// no worker that can send it was seen within a heartbeat's life (state.WorkerTTL): one that starts takes it
// then. noProviderSoon is how soon when one was (the queue's scheduled tasks are looked at every second):
// a fleet where some workers lack a channel's provider sent that channel about 20 times slower than one
// where all had it (a 1,200-recipient push campaign: 18.8 s against 0.87 s with one worker of two able to
// send it, 63 s with one of three), its batches waiting 5 s each time a worker that could not send them
// took them. The price: such a worker hands back up to five times as many batches a second.
const (
	noProviderRetry = 5 * time.Second
	noProviderSoon  = time.Second
)

// noProviderWait is how soon a batch this worker cannot send is offered to the fleet again (noProviderRetry,
// noProviderSoon); seen is the field of state.SeenKey of the workers that can send it.
func (h *Handler) noProviderWait(ctx context.Context, seen string) time.Duration {
	if h.cfg.Redis == nil {
		return noProviderRetry
	}
	ms, err := h.cfg.Redis.HGet(ctx, state.SeenKey, seen).Int64()
	if err != nil || time.Since(time.UnixMilli(ms)) > state.WorkerTTL {
		return noProviderRetry
	}
	return noProviderSoon
}

// newRun prepares a run of batch of campaign c: its template, its provider and fallback with their limits
// and metrics (a cancelled campaign's run only closes its recipients, and needs none of them).
func (h *Handler) newRun(ctx context.Context, c *campaign.Campaign, batch int) (*batchRun, error) {
	run := &batchRun{c: c, nonce: Nonce(c), batch: batch, counts: map[string]int64{}, snapshots: map[string]campaign.ConsentRecord{}}
	if h.cfg.Metrics != nil {
		name := ""
		if p := h.cfg.Providers[c.Channel]; p != nil {
			name = p.Name()
		}
		run.m = h.cfg.Metrics.For(name, string(c.Channel))
	}
	if c.State != campaign.StateCancelled {
		if run.provider = h.cfg.Providers[c.Channel]; run.provider == nil {
			// Another worker of the fleet may send the channel: the batch goes back to the queue for it,
			// without using a retry (a fleet with no worker for it shows no_worker_for_channel in status;
			// its batches must not end in the DLQ for that).
			return nil, &RetryError{Err: fmt.Errorf("no provider is configured for channel %s on this worker (%s); the batch waits for a worker that sends it", c.Channel, c.Channel.Spec().Title), After: h.noProviderWait(ctx, string(c.Channel))}
		}
		if c.OneClickUnsubscribe() {
			if h.cfg.Unsubscribe == nil {
				// As a worker without the channel's provider: another worker of the fleet may make the links,
				// and it takes the batch when it is offered again. Handed back for 30 s, a batch taken by such
				// a worker beside one that can send it waited up to a minute at a time, with nothing in status.
				if _, told := h.toldNoUnsubscribe.LoadOrStore(c.ID, true); !told {
					h.log.Error("a commercial e-mail needs a one-click unsubscribe link and this worker cannot make one: set WEBHOOKS_PUBLIC_URL and UNSUBSCRIBE_SECRET on it (the values campaignctl webhooks has); its batches go back to the queue for another worker", "campaign_id", c.ID)
				}
				return nil, &RetryError{Err: fmt.Errorf("campaign %d is a commercial e-mail and this worker has no WEBHOOKS_PUBLIC_URL and UNSUBSCRIBE_SECRET to make its unsubscribe links", c.ID), After: h.noProviderWait(ctx, string(c.Channel)+state.SeenCommercial)}
			}
			run.render.Unsubscribe, run.render.Mailto = h.cfg.Unsubscribe, h.cfg.UnsubscribeMailto
		}
		var err error
		if run.tmpl, err = h.template(c); err != nil {
			return nil, toDLQ(fmt.Errorf("campaign %d: %v", c.ID, err))
		}
		run.render.Campaign, run.render.Tmpl, run.render.Nonce = c, run.tmpl, run.nonce
		if _, batches := run.provider.(providers.Batcher); batches && c.TemplateID == "" {
			if f := run.tmpl.Shared(providers.SharedTagPrefix); f != nil {
				// The e-mail's text and HTML written once with a tag for each value (when the template is
				// plain text and values), and what gives each recipient's values for its tags.
				run.render.Form = f
				run.render.Shared = &providers.Shared{Text: f.Text, HTML: f.HTML, Tags: f.Tags}
			}
		}
		run.limits = []limiter.Limit{
			{Key: state.CampaignBucket(c.ID), Rate: c.Rate, Observer: run.m.CampaignWait()},
			{Key: state.ProviderBucket(run.provider.Name()), Rate: h.cfg.ProviderRates[run.provider.Name()], Pausable: true, Observer: run.m.ProviderWait()},
		}
		run.answerInNextClaim = c.Rate <= 0 && h.cfg.ProviderRates[run.provider.Name()] <= 0
		// The claim script checks the provider's pause in the same round trip as the claim, so the token
		// wait need not (one round trip less per message under a cap; a token taken during a pause is
		// lost, which only lowers the rate). Without any cap there is no wait at all.
		run.primary = route{provider: run.provider, answerInNextClaim: run.answerInNextClaim, m: run.m,
			pauseKey: state.PauseKey(state.ProviderBucket(run.provider.Name())), segmentsPaced: pacesSegments(run.provider),
			keyed: providers.ReceiptsNameRecipient(run.provider)}
		for _, l := range run.limits {
			// The provider's limit is kept even with no cap: its shared pace may lower it (readyToSend).
			l.Pausable = false
			run.primary.limits = append(run.primary.limits, l)
		}
		if fb := h.cfg.Fallback[c.Channel]; fb != nil {
			if _, batches := run.provider.(providers.Batcher); !batches {
				sec := &route{provider: fb, fallback: true, segmentsPaced: pacesSegments(fb), keyed: providers.ReceiptsNameRecipient(fb)}
				if h.cfg.Metrics != nil {
					sec.m = h.cfg.Metrics.For(fb.Name(), string(c.Channel))
				}
				sec.limits = []limiter.Limit{run.limits[0],
					{Key: state.ProviderBucket(fb.Name()), Rate: h.cfg.ProviderRates[fb.Name()], Pausable: true, Observer: sec.m.ProviderWait()}}
				run.secondary = sec
			}
		}
	}
	return run, nil
}

// countRecipients is "1 recipient" or "n recipients".
func countRecipients(n int) string {
	if n == 1 {
		return "1 recipient"
	}
	return strconv.Itoa(n) + " recipients"
}

// reasonReceiptFirst is why a pending recipient is recorded sent without a send: a delivery receipt for a
// send of it whose answer was not recorded (a worker stopped or cut off before writing it, or a send made
// unknown that `resume --resend-unknown` made pending again) arrived first. It says nothing of a second
// send: most of these recipients were sent once.
const reasonReceiptFirst = "accepted by the provider: its delivery receipt came in before the send's answer was recorded; nothing more was sent"

// errCampaignOver ends a batch whose campaign ended meanwhile.
var errCampaignOver = errors.New("campaign is over")

// stateGate says what a batch does in a campaign state: go on in a mode (nil, false), come back later (a
// RetryError), or stop for good (nil, true).
func stateGate(id int64, st campaign.State) (mode chunkMode, retry error, done bool) {
	switch st {
	case campaign.StateRunning:
		return modeSend, nil, false
	case campaign.StateCancelled:
		return modeCancel, nil, false
	case campaign.StatePaused, campaign.StateScheduled, campaign.StatePlanning:
		return modeSend, &RetryError{Err: fmt.Errorf("campaign %d is %s", id, st), After: 30 * time.Second, Wait: true}, false
	}
	return modeSend, nil, true
}

// gate leases the chunk's rows and reads the campaign's state and the chunk's consents as they are now. It
// returns the recipients this run now holds, with their consent, in chunk order.
func (h *Handler) gate(ctx context.Context, run *batchRun, chunk []campaign.Recipient) (chunkMode, []campaign.Recipient, error) {
	if run.c.State != campaign.StateCancelled {
		if err := h.windowClosed(run); err != nil {
			return 0, nil, err
		}
	}
	users := make([]string, len(chunk))
	for i := range chunk {
		users[i] = chunk[i].UserID
	}
	got, err := h.leaseChunk(ctx, run, users)
	if err != nil {
		if errors.As(err, new(leasedUnsent)) {
			// Leased, then stopped before any claim: Redis failed (the spools' notes could not be read),
			// the consents were read while refusals were spooled, or the opt-ins did not apply. Let go at
			// once (a dead run's chunk it took over stays in hand), so that the batch's next run leases the
			// chunk again and reads its consents anew; kept in hand, a Redis restart meanwhile would have
			// settled it unknown.
			h.inherit(run, got.Inherited)
			if _, rerr := h.cfg.Store.Record(context.WithoutCancel(ctx), run.c.ID, nil, run.lease, run.inHand()); rerr != nil {
				h.log.Warn("chunk not let go; its lease runs out by itself", "campaign_id", run.c.ID, "batch", run.batch, "err", fmt.Sprint(rerr))
			}
		}
		return 0, nil, waitForServices(err)
	}
	at := run.leasedAt
	mode, retry, done := stateGate(run.c.ID, got.State)
	if retry != nil {
		return 0, nil, retry
	} else if done {
		return 0, nil, errCampaignOver
	}
	if mode == modeCancel && run.c.State != campaign.StateCancelled {
		run.c.State = campaign.StateCancelled
	}
	// The chunk in hand of a run whose lease this one took stays in hand until this run reads its claims,
	// whatever stops this run first.
	h.inherit(run, got.Inherited)
	run.busy += got.Busy
	run.renewAt = at.Add(run.lease.TTL / 3)
	run.consentAt, run.readAt = at, nil
	todo := make([]campaign.Recipient, 0, len(chunk))
	inChunk := make(map[string]bool, len(chunk))
	for _, r := range chunk {
		inChunk[r.UserID] = true
		suspect, ok := got.Leased[r.UserID]
		if !ok {
			continue // sent, or held by a live run of the same batch
		}
		if got.Accepted[r.UserID] && !suspect {
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, Reason: reasonReceiptFirst})
			continue
		}
		if wait := h.limitedHere(r.Address); wait > 0 && mode == modeSend && !suspect {
			// A provider limits the address for now: left pending as it is, not claimed, not charged.
			run.limitedWait(wait)
			continue
		}
		// A provider's refusal whose RET is still being written is not in the lease's reading yet.
		r.Consent, r.Suspect = got.Consent[r.Address] && !h.refusedHere(run.c, r.Address) && !h.spooledOut(run.c, r.UserID, r.Address), suspect
		todo = append(todo, r)
	}
	// The batch was taken over from a run that died under another Redis epoch: its chunk in hand is settled
	// first, whichever chunk of this run its users belong to.
	for u, suspect := range got.Leased {
		if suspect && !inChunk[u] {
			todo = append([]campaign.Recipient{{UserID: u, Suspect: true}}, todo...)
		}
	}
	if len(run.snapshots) == 0 && got.Snapshots != nil {
		run.snapshots = got.Snapshots // the lease's own map, as large as the chunk: taken, not copied
	} else {
		for u, snap := range got.Snapshots {
			run.snapshots[u] = snap
		}
	}
	return mode, todo, nil
}

// leaseChunk leases users of run's batch (Store.LeaseChunk). A lease of another run that may be taken
// over (it ran out, or its worker process was judged gone) is fenced in Redis first, and only then taken:
// that run may be paused rather than dead, and claims nobody once fenced. The token is fenced before
// Postgres forgets it, so no failure in between can leave a run whose lease was taken still able to claim.
// A lease that changed hands again meanwhile is fenced in turn, a few times at most; after that the chunk
// is reported unleased (busy), as one held by a live run is.
func (h *Handler) leaseChunk(ctx context.Context, run *batchRun, users []string) (campaign.Chunk, error) {
	l := run.lease
	var before state.HeldRefusals
	checkHeld := !l.AnyState && run.c.ChecksIYS() && run.c.State != campaign.StateCancelled && h.cfg.Redis != nil
	if checkHeld {
		var err error
		if before, err = h.refusalsHeld(ctx, run); err != nil {
			return campaign.Chunk{}, err
		}
	}
	// Push and webhook opt-ins are read from the audience first: when it cannot be read, nothing is leased
	// and nothing stays in hand, so the batch's next run finds its rows free.
	var optIns campaign.OptInRows
	readOptIns := run.c.ReadsOptIns() && !l.AnyState && run.c.State != campaign.StateCancelled
	run.leasedAt = h.cfg.Now()
	if readOptIns {
		var err error
		if optIns, err = h.readOptIns(ctx, run, users); err != nil {
			return campaign.Chunk{}, err
		}
		run.leasedAt = h.cfg.Now()
	}
	for try := 0; ; try++ {
		got, err := h.cfg.Store.LeaseChunk(ctx, run.c, users, l)
		if err == nil && got.Fence == "" && readOptIns && got.State != campaign.StateCancelled {
			err = h.applyOptIns(ctx, run, got, users, optIns)
		}
		if err == nil && got.Fence == "" && checkHeld && got.State != campaign.StateCancelled {
			err = h.noRefusalHeldSince(ctx, run, before)
		}
		if err != nil && got.Fence == "" && len(got.Leased) > 0 {
			// Leased, and nothing of it claimed: the caller lets it go (a chunk kept in hand through a
			// Redis restart would be settled unknown from claims that were never taken).
			return got, leasedUnsent{err}
		}
		if err != nil || got.Fence == "" {
			return got, err
		}
		if h.leaseIsLive(got.Fence) {
			// A run of this very process holds it: alive, whatever its lease says (it ran out while
			// Postgres was away, and the run is writing its chunk's outcomes). Taken over, its chunk would
			// be settled from its claims, which Redis may have lost meanwhile.
			got.Busy = len(users)
			return got, nil
		}
		if try == 2 {
			got.Busy = len(users) // held by a run that changes too often to fence: as if live
			return got, nil
		}
		if err := h.state.Fence(ctx, l.Epoch, got.Fence); err != nil {
			return campaign.Chunk{}, err
		}
		l.Fenced = got.Fence
	}
}

// leasedUnsent is an error met after a chunk was leased and before any of it was claimed: the chunk is
// let go (gate).
type leasedUnsent struct{ err error }

func (e leasedUnsent) Error() string { return e.err.Error() }
func (e leasedUnsent) Unwrap() error { return e.err }

// leaseLive notes that the lease token belongs to a batch run of this process (live), or no more.
func (h *Handler) leaseLive(token string, live bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !live {
		delete(h.liveLeases, token)
		return
	}
	if h.liveLeases == nil {
		h.liveLeases = map[string]bool{}
	}
	h.liveLeases[token] = true
}

// readOptIns reads the opt-ins of users from the campaign's audience, run again now for them (a push or
// webhook campaign: the opt-in lives in the customer's database, and a withdrawal after the launch stops
// the send, as an İYS RET does). It fails closed: when the audience cannot be read, nothing of the chunk
// is sent, the run waits, and status says why.
func (h *Handler) readOptIns(ctx context.Context, run *batchRun, users []string) (campaign.OptInRows, error) {
	if h.cfg.OptIns == nil {
		return nil, &RetryError{Err: fmt.Errorf("campaign %d: this worker has no audience database to read its recipients' opt-ins from", run.c.ID), After: 30 * time.Second}
	}
	got, err := h.cfg.OptIns.Read(ctx, run.c, users)
	if err != nil {
		if unreachable(err) {
			// A restart or a failover of the audience's server: nothing to set, it comes back by itself.
			h.noteWait(ctx, run.c.ID, WaitOptInsUnreadable, fmt.Sprintf("the workers cannot reach the audience database to read the %s opt-ins (%v): nothing is sent until it answers, and the batches go on by themselves (a restart or a failover ends by itself; if it lasts, check AUDIENCE_DATABASE_URL on the workers)",
				run.c.Channel.Spec().Title, err))
			return nil, &RetryError{Err: fmt.Errorf("audience database unreachable (a restart or a failover ends by itself; if it lasts, check AUDIENCE_DATABASE_URL on the workers): %w", err), After: 5 * time.Second}
		}
		h.noteWait(ctx, run.c.ID, WaitOptInsUnreadable, fmt.Sprintf("the workers cannot read the %s opt-ins from the audience database (%v): nothing is sent until they can; check AUDIENCE_DATABASE_URL on the workers (the launch's), the audience tables and their grants; the batches go on by themselves",
			run.c.Channel.Spec().Title, err))
		return nil, &RetryError{Err: fmt.Errorf("%w (set AUDIENCE_DATABASE_URL for the workers as for the launch)", err), After: 5 * time.Second}
	}
	h.clearWait(ctx, run.c.ID, WaitOptInsUnreadable)
	return got, nil
}

// unreachable says whether err is Postgres out of reach (no answer, a connection lost, a server shutting
// down or starting: SQLSTATE classes 08 and 57) rather than a refusal of what was asked (a table, a grant).
func unreachable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57")
	}
	return !errors.Is(err, context.Canceled)
}

// waitKey names a wait of a campaign in Handler.waitsNoted.
type waitKey struct {
	campaign int64
	reason   string
}

// noteWait notes for status that campaign id's batch waits for reason (state.NoteWaiting), and remembers
// it so that clearWait removes it once a batch gets past.
func (h *Handler) noteWait(ctx context.Context, id int64, reason, detail string) {
	if h.cfg.Redis == nil {
		return
	}
	h.waitsNoted.Store(waitKey{id, reason}, true)
	state.NoteWaiting(context.WithoutCancel(ctx), h.cfg.Redis, id, state.Waiting{Reason: reason, Detail: detail}) //nolint:errcheck // status only
}

// clearWait removes a wait this process noted (noteWait); one it did not note costs nothing.
func (h *Handler) clearWait(ctx context.Context, id int64, reason string) {
	if _, noted := h.waitsNoted.LoadAndDelete(waitKey{id, reason}); noted && h.cfg.Redis != nil {
		state.ClearWaiting(ctx, h.cfg.Redis, id, reason) //nolint:errcheck // status only; it expires
	}
}

// applyOptIns takes out of got.Consent the addresses whose opt-in, read just before the lease (rows, for
// asked), no longer says true (campaign.OptInRows.OptedIn). The lease may hold users that were not asked
// (the chunk in hand of a run it took over): theirs are read now.
func (h *Handler) applyOptIns(ctx context.Context, run *batchRun, got campaign.Chunk, asked []string, rows campaign.OptInRows) error {
	was := make(map[string]bool, len(asked))
	for _, u := range asked {
		was[u] = true
	}
	var more []string
	for u := range got.ConsentOf {
		if !was[u] {
			more = append(more, u)
		}
	}
	if len(more) > 0 {
		also, err := h.readOptIns(ctx, run, more)
		if err != nil {
			return err
		}
		for u, addrs := range also {
			rows[u] = addrs
		}
	}
	for u, a := range got.ConsentOf {
		if !rows.OptedIn(u, a) {
			delete(got.Consent, a)
		}
	}
	return nil
}

// refusalsHeld keeps the run from leasing while a webhooks process holds refusals in its spool that
// Postgres has not taken yet (state.RefusalsHeld): the consents the lease would read miss them. A provider
// posted them while Postgres was away, and they are recorded within a second or so of its return; before,
// the workers leased and sent on the consents they read meanwhile. The wait is noted for status.
func (h *Handler) refusalsHeld(ctx context.Context, run *batchRun) (state.HeldRefusals, error) {
	held, err := state.RefusalsHeldNow(ctx, h.cfg.Redis)
	if err != nil {
		return held, waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
	}
	if err := h.readSpooled(ctx, held.Spooled); err != nil {
		return held, err
	}
	if !held.Held {
		h.clearWait(ctx, run.c.ID, WaitRefusalsHeld)
		return held, nil
	}
	return held, h.waitForRefusals(ctx, run, errRefusalsHeld)
}

// readSpooled reads who the refusals held in spools refuse (state.RefusalsSpooledKey), when n say some
// are: the note of a webhooks process that died with refusals in its spool runs out after a few seconds,
// and the workers lease again, but nobody those refusals name is sent until they are recorded. A failure
// to read them fails closed.
func (h *Handler) readSpooled(ctx context.Context, n int64) error {
	if n == 0 {
		h.spooled.Store(nil)
		return nil
	}
	m, err := state.SpooledRefusals(ctx, h.cfg.Redis)
	if err != nil {
		return waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
	}
	h.spooled.Store(&m)
	return nil
}

// spooledOut says whether a refusal held in a spool names addr on c's channel, or (an e-mail's one-click
// unsubscribe) user: not sent until the refusal is recorded.
func (h *Handler) spooledOut(c *campaign.Campaign, user, addr string) bool {
	m := h.spooled.Load()
	if m == nil || len(*m) == 0 || !c.ChecksIYS() {
		return false
	}
	return (*m)[state.SpooledAddress(string(c.Channel), addr)] ||
		user != "" && c.Channel == campaign.ChannelEmail && (*m)[state.SpooledUser(user)]
}

// noRefusalHeldSince looks at the spools' notes again once the lease has read the chunk's consents: a
// refusal spooled while the read waited on Postgres (frozen, or away and back) may have been taken into
// Postgres after the read's snapshot, and its note be gone already. A note written since before (the count
// of notes moved), or holding now, makes the read stale: the run waits as it does for a note found first,
// and its next lease reads the consents again. A failure to read the notes fails closed.
func (h *Handler) noRefusalHeldSince(ctx context.Context, run *batchRun, before state.HeldRefusals) error {
	now, err := state.RefusalsHeldNow(ctx, h.cfg.Redis)
	if err != nil {
		return waitForServices(fmt.Errorf("no send while Redis is unavailable: %w", err))
	}
	if !now.Held && now.Gen == before.Gen {
		return nil
	}
	h.log.Info("refusals were spooled while the chunk's consents were read: read again before any send", "campaign_id", run.c.ID, "batch", run.batch)
	return h.waitForRefusals(ctx, run, errRefusalsSpooled)
}

var (
	// errRefusalsHeld is refusalsHeld's refusal to lease: a spool holds refusals.
	errRefusalsHeld = errors.New("refusals received while Postgres was away are still being recorded: no send until they are")
	// errRefusalsSpooled is noRefusalHeldSince's refusal of a consent read.
	errRefusalsSpooled = errors.New("refusals were spooled while the chunk's consents were read: no send until they are read again")
)

// waitForRefusals notes for status that the campaign waits for spooled refusals, and returns the run's
// wait (why, tried again in a second, its retries not used).
func (h *Handler) waitForRefusals(ctx context.Context, run *batchRun, why error) error {
	h.noteWait(ctx, run.c.ID, WaitRefusalsHeld, "refusals that providers posted while Postgres was away wait in campaignctl webhooks' spool: nothing is sent until they are recorded (within seconds of Postgres's return); the batches go on by themselves")
	return &RetryError{Err: why, After: time.Second, Wait: true}
}

// leaseIsLive says whether token is the lease of a batch run of this process.
func (h *Handler) leaseIsLive(token string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.liveLeases[token]
}

// inherit keeps users, the chunk in hand of a run whose lease this one took over, in this run's chunk in
// hand until it has read their claims.
func (h *Handler) inherit(run *batchRun, users []string) {
	for _, u := range users {
		if run.inherited == nil {
			run.inherited = map[string]bool{}
		}
		run.inherited[u] = true
	}
}

// renew extends the chunk's lease when a third of it has passed. A run that lost its lease (it was too
// slow, and another run took the rows over) must not send: it stops.
func (h *Handler) renew(ctx context.Context, run *batchRun) error {
	confirm := h.leaseUnconfirmed(run)
	if !confirm && h.cfg.Now().Before(run.renewAt) {
		return nil
	}
	// A Postgres round trip comes, after a wait of up to regainLiveness when the process's lock was lost:
	// the answers held for the next claim are written first, so that a worker killed while either stalls
	// leaves no accepted recipient in flight.
	h.settleAnswers(ctx, run)
	if confirm && !h.cfg.Liveness.await(ctx, regainLiveness) {
		// The other workers' sweeps may be taking the chunk of a process whose lock is gone.
		return waitForServices(errors.New("this worker's liveness lock in Postgres is lost; sends wait until it is held again"))
	}
	gen := h.cfg.Liveness.Gen()
	now := h.cfg.Now()
	held, err := h.cfg.Store.RenewLease(ctx, run.c.ID, run.lease)
	if err != nil {
		return waitForServices(err)
	}
	if !held {
		return &RetryError{Err: fmt.Errorf("lease of batch %d lost to another run", run.batch), After: time.Second}
	}
	run.renewAt = now.Add(run.lease.TTL / 3)
	run.liveGen = gen
	return nil
}

// consentsAgedOut reads the campaign again once its consents' --max-consent-age has run out during the
// batch: a sync since then makes them young again (and the next check later); otherwise it says why the
// rest of the batch must not be sent.
func (h *Handler) consentsAgedOut(ctx context.Context, run *batchRun) (string, error) {
	c, err := h.cfg.Store.Get(ctx, run.c.ID)
	if err != nil {
		return "", waitForServices(err)
	}
	if why := c.ConsentStale(); why != "" {
		return why, nil
	}
	d, _ := c.ConsentFreshFor()
	run.consentUntil = time.Now().Add(d)
	return "", nil
}

// keepLease renews the chunk's lease every third of its TTL while one provider request is under way, until
// the returned stop is called. stop does not wait for a renewal under way (Postgres may be slow to answer
// it): the answer is written into the claims at once, and a renewal that lands later only extends the
// run's own lease, or finds it released and changes nothing. A request of many recipients is given
// longer than the lease (SendGrid's: 3 × --provider-timeout, the lease's own length): without it, a live
// run waiting for the answer lost its chunk to another worker's sweep, which recorded the recipients as a
// dead run's. A process that dies or freezes stops renewing, and the lease runs out as before. A renewal
// that fails is left to the next; one that finds the lease gone ends them (the run learns it at its next
// renewal).
func (h *Handler) keepLease(ctx context.Context, run *batchRun) (stop func()) {
	if h.cfg.Store == nil || run.lease.TTL <= 0 {
		return func() {}
	}
	l, id := run.lease, run.c.ID
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(max(l.TTL/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(ctx, l.TTL/3)
				held, err := h.cfg.Store.RenewLease(rctx, id, l)
				cancel()
				if err == nil && !held {
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// close settles a recipient that will not be sent (consent revoked, campaign cancelled) with val, unless
// its claim already holds an answer, which wins.
func (h *Handler) close(ctx context.Context, run *batchRun, r *campaign.Recipient, val string) error {
	if r.Suspect {
		return h.settleUnverifiable(ctx, run, r)
	}
	g := run.guard
	g.CheckHalt = false
	old, ours, err := h.state.Take(ctx, ClaimKey(run.c.ID, r.UserID), run.nonce, val, g)
	if err != nil {
		return waitForServices(err)
	}
	if !ours {
		h.fromClaim(ctx, run, r.UserID, old)
		return nil
	}
	st := state.ParseValue(val)
	run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSkipped, Reason: st.Reason})
	run.m.Skipped(1)
	return nil
}

// settleUnverifiable settles a recipient taken over from a run that died under another Redis epoch: its claim, if
// Redis still has one, says what happened; without one the message may have been sent, so it is unknown.
func (h *Handler) settleUnverifiable(ctx context.Context, run *batchRun, r *campaign.Recipient) error {
	const why = campaign.Unverifiable
	g := run.guard
	g.CheckHalt = false
	old, ours, err := h.state.Take(ctx, ClaimKey(run.c.ID, r.UserID), run.nonce, state.ReasonValue(state.Unknown, why), g)
	if err != nil {
		return waitForServices(err)
	}
	if !ours {
		h.fromClaim(ctx, run, r.UserID, old)
		return nil
	}
	run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusUnknown, Reason: why})
	run.m.Unknown(1)
	return nil
}

// fromClaim turns a claim that already existed into an outcome.
func (h *Handler) fromClaim(ctx context.Context, run *batchRun, userID, val string) {
	st := state.ParseValue(val)
	switch st.Kind {
	case state.Sent:
		o := campaign.Outcome{UserID: userID, Status: campaign.StatusSent, MessageID: st.MessageID, Segments: st.Segments}
		if st.Provider != "" {
			// A fallback's send: its provider's receipts and reports are the ones that follow it.
			o.Provider, o.Reason = st.Provider, "sent through "+st.Provider+", the fallback (recorded from its claim)"
		}
		run.add(o)
	case state.Failed:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusFailed, Reason: st.Reason, BadAddress: campaign.IsInvalidAddressReason(st.Reason)})
	case state.Unknown:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusUnknown, Reason: st.Reason})
	case state.Skipped:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusSkipped, Reason: st.Reason})
	default:
		// The fleet's grace as last read, and read again before a claim is judged past it: a worker with a
		// longer grace may have noted it since.
		age := h.cfg.Now().Sub(st.At)
		inGrace := func(fresh bool) bool { return age < h.inFlightGrace(ctx, fresh) }
		if !st.At.IsZero() && (inGrace(false) || inGrace(true)) {
			// A run that may still be live holds it: its claim is the record, and that run writes the
			// outcome. Until then the recipient stays in this run's chunk in hand: were that run to die
			// before recording it, a Redis that lost the claim meanwhile must find it in hand (unknown),
			// not free to be sent again.
			run.busy++
			h.inherit(run, []string{userID})
			return
		}
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusUnknown, Reason: reasonNoAnswerInGrace})
	}
}

// inFlightGrace is the longer of this worker's in-flight grace and the longest one a worker of the fleet
// noted in Redis (state.NoteInFlightGrace: a worker with a longer --provider-timeout): a claim without an
// answer younger than that may be any live worker's call still under way. The fleet's is read at most
// every 10 s, or now when fresh; when Redis cannot tell, the last one read stands.
func (h *Handler) inFlightGrace(ctx context.Context, fresh bool) time.Duration {
	if h.cfg.Redis == nil {
		return h.cfg.InFlightGrace
	}
	h.graceMu.Lock()
	defer h.graceMu.Unlock()
	if now := time.Now(); fresh || h.graceRead.IsZero() || now.Sub(h.graceRead) >= 10*time.Second {
		if g, err := state.InFlightGrace(ctx, h.cfg.Redis); err == nil {
			h.fleetGrace, h.graceRead = g, now
		}
	}
	return max(h.cfg.InFlightGrace, h.fleetGrace)
}

func (run *batchRun) add(o campaign.Outcome) {
	// The audit records the consent the outcome was decided on: the chunk's reading now. A later reading
	// (the rest of the chunk read again after a wait) may see a refusal that came after this message went.
	if o.Snapshot.Status == "" {
		o.Snapshot = run.snapshots[o.UserID]
	}
	if o.Status == campaign.StatusSkipped && o.Reason == campaign.ReasonRevoked && o.Snapshot.Status == iys.StatusApproved {
		// Skipped on a refusal this process knew of before Postgres held it (refusedHere, spooledOut): the
		// decision was the RET's, not the ONAY the lease read.
		o.Snapshot = refusedLocally(run.c, time.Now())
	}
	run.pending = append(run.pending, o)
	delete(run.inherited, o.UserID)
}

// refusedLocally is the consent a skip decided at on a refusal not yet in Postgres: a RET received through
// the channel's own messages (İYS's HS_MESAJ or HS_EPOSTA), dated when the skip was decided.
func refusedLocally(c *campaign.Campaign, at time.Time) campaign.ConsentRecord {
	return campaign.ConsentRecord{Status: iys.StatusRejected, Source: iys.RefusalSource(c.Channel.IYSType()), Date: at}
}

// inHand lists the users the run must leave in its chunk in hand when it records (see inherited).
func (run *batchRun) inHand() []string {
	if len(run.inherited) == 0 {
		return nil
	}
	users := make([]string, 0, len(run.inherited))
	for u := range run.inherited {
		users = append(users, u)
	}
	return users
}

// flush writes buffered outcomes and advances the campaign's Redis counters by what actually changed.
func (h *Handler) flush(ctx context.Context, run *batchRun) error {
	h.settleAnswers(ctx, run)
	if run.provider != nil {
		if err := h.pace(run.provider.Name()).Flush(ctx); err != nil {
			h.log.Warn("provider pace not shared", "provider", run.provider.Name(), "err", err)
		}
	}
	for i := range run.pending {
		run.pending[i].Durable = run.unclaimed
	}
	moved, err := h.record(ctx, run)
	if err != nil {
		return err
	}
	if sent := sentWithID(run.pending); sent > 0 && moved[campaign.StatusSent] < int64(sent) {
		// A sent outcome that moved nothing: the same answer recorded before (a redelivered chunk), or a
		// second message, accepted for a recipient already sent under another message ID (a stopped run's
		// answer, come after the recipient was resent). The audit keeps every message the provider took.
		if n, err := h.cfg.Store.AuditSecondSends(ctx, run.c.ID, run.pending); err != nil {
			h.log.Warn("a second message's audit not written", "campaign_id", run.c.ID, "err", err)
		} else if n > 0 {
			h.log.Warn("the provider accepted a second message for recipients already sent (a late answer of a stopped run, after a resend): audited in send_log",
				"campaign_id", run.c.ID, "recipients", n)
		}
	}
	var sentCount, segments int64
	for _, o := range run.pending {
		if o.Status != campaign.StatusPending {
			delete(run.snapshots, o.UserID)
		}
		if o.Status == campaign.StatusSent && o.MessageID != "" && o.Segments > 0 {
			sentCount++
			segments += int64(o.Segments)
		}
	}
	run.pending = run.pending[:0]
	run.unclaimed = false
	delete(moved, campaign.StatusPending)
	for st, n := range moved {
		// What this run moved into each status, for its log line. A status it moved recipients out of
		// (another run had settled them first: a sweep after a stall, a takeover) is not counted down.
		if n > 0 {
			run.counts[st] += n
		}
	}
	if segments > 0 && moved[campaign.StatusSent] > 0 {
		// The segments of the messages this chunk moved into sent (those recorded before, by a redelivered
		// chunk, moved nothing): what the supervisor turns a cap in segments into messages with.
		moved[state.ProgressSegments] = segments * min(moved[campaign.StatusSent], sentCount) / sentCount
	}
	if err := h.state.AddProgress(ctx, run.c.ID, moved); err != nil {
		// Counters are a fast view, rebuilt from Postgres by resume; the outcomes themselves are safe.
		h.log.Warn("progress counters not updated", "campaign_id", run.c.ID, "err", err)
	}
	return nil
}

// DefaultRecordWait is how long a run waits by default for Postgres to take its chunk's outcomes: a managed
// Postgres fails over in 30 to 120 s.
const DefaultRecordWait = 2 * time.Minute

// recordWait is Config.RecordWait when none is given: DefaultRecordWait, except in this package's tests
// (TestMain), many of which make a run that dies by failing its writes for good.
var recordWait = DefaultRecordWait

// record writes the run's outcomes (Record), waiting for Postgres while it cannot take them, for up to
// RecordWait, or until ctx ends or Postgres refuses them for what they hold. The outcomes are in the
// claims too, but Redis may lose its data while Postgres is away, and then nothing but this run tells a
// recipient sent from one never sent: given up, the chunk in hand becomes unknown. Tried every 0.25 s,
// backing off to 1 s, so that they land within a second of Postgres's return, before a sweep can take the
// chunk over from the run's lease, which ran out meanwhile.
func (h *Handler) record(ctx context.Context, run *batchRun) (map[string]int64, error) {
	start, wait := time.Now(), 250*time.Millisecond
	warned := false
	for {
		moved, err := h.cfg.Store.Record(ctx, run.c.ID, run.pending, run.lease, run.inHand())
		if err == nil || campaign.RefusedForGood(err) || ctx.Err() != nil || time.Since(start) >= h.cfg.RecordWait {
			if warned && err == nil {
				h.log.Info("Postgres took the outcomes held in this worker", "campaign_id", run.c.ID, "batch", run.batch,
					"recipients", len(run.pending), "held", time.Since(start).Round(time.Millisecond))
			}
			return moved, err
		}
		if !warned && time.Since(start) >= 2*time.Second {
			warned = true
			h.log.Warn("Postgres cannot take the outcomes of a chunk: held in this worker until it can", "campaign_id", run.c.ID,
				"batch", run.batch, "recipients", len(run.pending), "for_up_to", h.cfg.RecordWait, "err", err)
		}
		limiter.Sleep(ctx, min(wait, h.cfg.RecordWait-time.Since(start))) //nolint:errcheck // ended by ctx, checked above
		wait = min(2*wait, time.Second)
	}
}

// sentWithID counts the sent outcomes of outs that carry the provider's message ID.
func sentWithID(outs []campaign.Outcome) int {
	n := 0
	for i := range outs {
		if outs[i].Status == campaign.StatusSent && outs[i].MessageID != "" {
			n++
		}
	}
	return n
}
