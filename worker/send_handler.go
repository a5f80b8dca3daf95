package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// Store is what the send path reads and writes in Postgres, the source of truth: campaigns, their
// recipients' outcomes and the batch leases. *campaign.Store implements it; tests put faults in front of
// it (internal/faults).
type Store interface {
	Get(ctx context.Context, id int64) (*campaign.Campaign, error)
	StartIfDue(ctx context.Context, id int64) (campaign.State, error)
	LoadBatch(ctx context.Context, campaignID int64, batch int) ([]campaign.Recipient, error)
	LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (campaign.Chunk, error)
	RenewLease(ctx context.Context, campaignID int64, l campaign.Lease) (bool, error)
	ReleaseBatch(ctx context.Context, campaignID int64, l campaign.Lease) error
	Record(ctx context.Context, campaignID int64, outcomes []campaign.Outcome, l campaign.Lease, inHand []string) (map[string]int64, error)
	CompleteIfDone(ctx context.Context, id int64) (bool, error)
	MarkInvalid(ctx context.Context, ch campaign.Channel, address, reason string) error
	ExpiredLeases(ctx context.Context, limit int) ([]campaign.Expired, error)
}

var _ Store = (*campaign.Store)(nil)

// Config configures a Handler. Zero values mean the documented defaults.
type Config struct {
	Store Store
	// Redis holds the rate limiters' buckets, and the State when State is nil.
	Redis redis.UniversalClient
	// State is the send path's Redis state; nil means a state.Store on Redis.
	State State
	// Providers maps each channel to the provider that sends it.
	Providers map[campaign.Channel]providers.Provider
	// Fallback maps a channel to a second provider, used when the first is down: a send the first refused
	// without accepting it (a 5xx, a 429, a connection that failed before the request was written, or an
	// account-level refusal) goes through the second at once, under the same claim, and the first is left
	// alone for FailoverWindow. An ambiguous answer never fails over: the first may have sent it. Only
	// one-message-a-request providers fail over (SMS).
	Fallback map[campaign.Channel]providers.Provider
	// FailoverWindow is how long a first provider that failed is skipped in favour of the fallback before it
	// is tried again. Default 30 s.
	FailoverWindow time.Duration
	// ProviderRates caps each provider (by Name) in messages per second over all workers; 0 = no cap.
	ProviderRates map[string]float64
	Logger        *slog.Logger
	// Owner identifies this process in claims (host:pid); default "worker".
	Owner string
	// ClaimTTL is how long claims are kept; it must outlive any campaign. Default 45 days.
	ClaimTTL time.Duration
	// InFlightGrace is how old a claim without an answer must be before it is taken for a dead worker's
	// (and so unknown) rather than a live one still waiting for the provider. It must exceed the provider
	// timeout. Default LeaseTTL.
	InFlightGrace time.Duration
	// LeaseTTL is how long a batch run's lease on a chunk lasts without renewal (renewed every third of it
	// while sending); a run that dies holding one delays its chunk by this much. It must exceed the
	// provider timeout. Default 30 s.
	LeaseTTL time.Duration
	// SendAttempts is how many times a transient provider error is retried in place, with back-off, before
	// the rest of the batch is handed back to the queue. Default 3.
	SendAttempts int
	// ChunkSize is how many recipients are sent between two reads of the campaign state and consents and
	// two writes of outcomes to Postgres. Default 100; under a rate cap of R a second, at most max(5, R).
	ChunkSize int
	// DeadlineMargin is kept free before a batch's deadline to write outcomes and hand the rest back.
	// Default 30 s.
	DeadlineMargin time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Metrics records sends, provider latency, limiter waits, refused claims and retries; nil records
	// nothing.
	Metrics *metrics.Metrics
}

// DefaultClaimTTL is how long claims (and a cancelled campaign's halt mark) are kept: longer than any
// campaign runs.
const DefaultClaimTTL = 45 * 24 * time.Hour

// Handler processes batch tasks.
type Handler struct {
	cfg    Config
	state  State
	bucket *limiter.Bucket
	log    *slog.Logger

	mu sync.Mutex
	// templates holds the parsed content of the campaigns this process sends, by campaign ID, each with
	// what it was parsed from: a campaign read later with another nonce or content (the engine database
	// re-created, IDs starting again at 1) misses it. A campaign found over is dropped.
	templates map[int64]parsedTemplate

	stopping chan struct{}
	stopOnce sync.Once
	// lastAnswer is when the provider last answered a send of this process (unix ns).
	lastAnswer atomic.Int64
	// downUntil holds, per provider name, until when (unix ns) a first provider that failed is skipped for
	// its fallback.
	downUntil sync.Map
}

// NewHandler returns a Handler for cfg.
func NewHandler(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Owner == "" {
		cfg.Owner = "worker"
	}
	if cfg.ClaimTTL == 0 {
		cfg.ClaimTTL = DefaultClaimTTL
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 30 * time.Second
	}
	if cfg.InFlightGrace == 0 {
		cfg.InFlightGrace = cfg.LeaseTTL
	}
	if cfg.SendAttempts == 0 {
		cfg.SendAttempts = 3
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 100
	}
	if cfg.FailoverWindow == 0 {
		cfg.FailoverWindow = 30 * time.Second
	}
	if cfg.DeadlineMargin == 0 {
		cfg.DeadlineMargin = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.State == nil {
		cfg.State = state.New(cfg.Redis, cfg.ClaimTTL)
	}
	return &Handler{
		cfg:       cfg,
		state:     cfg.State,
		bucket:    limiter.New(cfg.Redis),
		log:       cfg.Logger,
		templates: map[int64]parsedTemplate{},
		stopping:  make(chan struct{}),
	}
}

// RetryError asks the queue to run the batch again after After (0: the default back-off). Failure false
// means the retry is not the batch's fault (another worker holds some claims, the campaign is paused) and
// does not use up the retry budget.
type RetryError struct {
	Err     error
	After   time.Duration
	Failure bool
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }

// ProcessTask implements asynq.Handler.
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p BatchPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("batch payload %q: %v: %w", t.Payload(), err, asynq.SkipRetry)
	}
	return h.RunBatch(ctx, p.CampaignID, p.Batch)
}

// batchRun is the state of one run of one batch.
type batchRun struct {
	c        *campaign.Campaign
	nonce    string
	batch    int
	provider providers.Provider
	limits   []limiter.Limit
	// piggyback is set when no send waits for tokens: the claim script then also checks the provider's
	// pause and writes the previous send's answer (unsettled), one Redis round trip per message.
	piggyback bool
	// primary and secondary are the routes one-message sends take: the channel's provider, and its
	// fallback (nil when none).
	primary   route
	secondary *route
	unsettled *state.Answer
	// snapshots are the consent records read with the chunk's lease, by user, for the outcomes' audit.
	snapshots map[string]campaign.ConsentRecord
	tmpl      *campaign.Template
	// shared is the e-mail's text and HTML written once with a tag for each value (nil when the template
	// is not plain text and values), and sharedForm what gives each recipient's values for its tags.
	shared     *providers.Shared
	sharedForm *campaign.SharedForm
	lease      campaign.Lease
	// renewAt is when the chunk's lease is renewed before the next claim.
	renewAt time.Time
	guard   state.Guard
	// pending are outcomes not yet written to Postgres.
	pending []campaign.Outcome
	// inherited holds the users taken over from a run that died whose fate this run has not read yet
	// (their claims may say they were sent): if the run stops before it does, they stay in the chunk in
	// hand for the sweeper, instead of being let go as if nothing had happened to them.
	inherited map[string]bool
	// strikes are recipients that kept failing transiently in this run. They count against the recipient
	// only once a later send of the run succeeds (the recipient is at fault, not the provider).
	strikes []campaign.Outcome
	// failedInARow counts consecutive recipients whose retries all failed transiently.
	failedInARow int
	deferred     int
	busy         int
	halts        int
	counts       map[string]int64
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
		return infra(err)
	}
	if c.State == campaign.StateScheduled {
		if c.State, err = h.cfg.Store.StartIfDue(ctx, c.ID); err != nil {
			return infra(err)
		}
		if c.State == campaign.StateScheduled && c.StartAt != nil {
			return &RetryError{Err: fmt.Errorf("campaign %d starts at %s", c.ID, c.StartAt.Format(time.RFC3339)), After: time.Until(*c.StartAt)}
		}
	}
	if _, retry, done := stateGate(c.ID, c.State); retry != nil || done {
		if done {
			h.forgetTemplate(c.ID)
		}
		return retry
	}
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
			return fmt.Errorf("no provider is configured for channel %s on this worker", c.Channel)
		}
		if run.tmpl, err = h.template(c); err != nil {
			return fmt.Errorf("campaign %d: %v: %w", c.ID, err, asynq.SkipRetry)
		}
		if _, batches := run.provider.(providers.Batcher); batches && c.TemplateID == "" {
			if f := run.tmpl.Shared(providers.SharedTagPrefix); f != nil {
				run.sharedForm = f
				run.shared = &providers.Shared{Text: f.Text, HTML: f.HTML, Tags: f.Tags}
			}
		}
		run.limits = []limiter.Limit{
			{Key: "campaign:" + strconv.FormatInt(c.ID, 10), Rate: c.Rate, Observer: run.m.CampaignWait()},
			{Key: "provider:" + run.provider.Name(), Rate: h.cfg.ProviderRates[run.provider.Name()], Pausable: true, Observer: run.m.ProviderWait()},
		}
		run.piggyback = c.Rate <= 0 && h.cfg.ProviderRates[run.provider.Name()] <= 0
		// The claim script checks the provider's pause in the same round trip as the claim, so the token
		// wait need not (one round trip less per message under a cap; a token taken during a pause is
		// lost, which only lowers the rate). Without any cap there is no wait at all.
		run.primary = route{provider: run.provider, piggyback: run.piggyback, m: run.m,
			pauseKey: state.PauseKey(state.ProviderBucket(run.provider.Name()))}
		if !run.piggyback {
			for _, l := range run.limits {
				l.Pausable = false
				run.primary.limits = append(run.primary.limits, l)
			}
		}
		if fb := h.cfg.Fallback[c.Channel]; fb != nil {
			if _, batches := run.provider.(providers.Batcher); !batches {
				sec := &route{provider: fb, fallback: true}
				if h.cfg.Metrics != nil {
					sec.m = h.cfg.Metrics.For(fb.Name(), string(c.Channel))
				}
				sec.limits = []limiter.Limit{run.limits[0],
					{Key: "provider:" + fb.Name(), Rate: h.cfg.ProviderRates[fb.Name()], Pausable: true, Observer: sec.m.ProviderWait()}}
				run.secondary = sec
			}
		}
	}
	epoch, err := h.state.Epoch(ctx)
	if err != nil {
		return infra(fmt.Errorf("no send while Redis is unavailable: %w", err))
	}
	run.lease = campaign.Lease{Batch: batch, Token: state.Token(), Epoch: epoch, TTL: h.cfg.LeaseTTL}
	run.guard = state.Guard{Epoch: epoch, Halt: state.HaltKey(c.ID)}
	recipients, err := h.cfg.Store.LoadBatch(ctx, c.ID, batch)
	if err != nil {
		return infra(err)
	}
	// waitCtx bounds the waits for tokens: it ends at the soft deadline (the task's, less a margin to write
	// the outcomes) or when the worker is told to stop, so a slow rate cap hands the rest of the batch back
	// instead of running into the task timeout. Sends and claim writes keep the task context.
	waitCtx, cancel := h.waitContext(ctx)
	defer cancel()

	chunkSize := h.cfg.ChunkSize
	if run.provider != nil && !run.piggyback {
		// Under a cap, a chunk takes about a second's worth of the cap at most, so progress (written per
		// chunk) moves at least about once a second even when the cap is low.
		rate := h.cfg.ProviderRates[run.provider.Name()]
		if c.Rate > 0 && (rate <= 0 || c.Rate < rate) {
			rate = c.Rate
		}
		if rate > 0 {
			chunkSize = min(chunkSize, max(5, int(rate)))
		}
	}
	batcher, _ := run.provider.(providers.Batcher)
	if batcher != nil {
		// One chunk is one request.
		chunkSize = batcher.MaxBatch()
	}
	var stop error
	queue := recipients
	for len(queue) > 0 && stop == nil {
		chunk := queue[:min(chunkSize, len(queue))]
		queue = queue[len(chunk):]
		mode, todo, err := h.gate(ctx, run, chunk)
		if err != nil {
			stop = err
			break
		}
		if batcher != nil && mode == modeSend {
			err = h.deliverGroup(ctx, waitCtx, run, batcher, todo)
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
				err = h.deliver(ctx, waitCtx, run, &todo[i])
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
			stop = infra(err)
		}
	}
	if len(run.strikes) > 0 {
		// The batch stopped before a later send showed the recipients were at fault: not counted.
		run.strikes = nil
	}
	if err := h.cfg.Store.ReleaseBatch(context.WithoutCancel(ctx), c.ID, run.lease); err != nil {
		// The lease expires by itself; another run of the batch waits for it until then.
		log.Warn("batch lease not released", "err", err)
	}
	log.Info("batch run", "recipients", len(recipients), "sent", run.counts[campaign.StatusSent],
		"failed", run.counts[campaign.StatusFailed], "skipped", run.counts[campaign.StatusSkipped],
		"unknown", run.counts[campaign.StatusUnknown], "deferred", run.deferred, "in_flight_elsewhere", run.busy)
	if errors.Is(stop, errCampaignOver) {
		h.forgetTemplate(c.ID)
		return nil
	}
	if errors.Is(stop, state.ErrEpoch) {
		return &RetryError{Err: stop, After: time.Second}
	}
	if errors.Is(stop, state.ErrHalted) {
		return &RetryError{Err: fmt.Errorf("campaign %d is halted in Redis (%s) but %s in Postgres; `campaignctl resume %d` clears the halt", c.ID, HaltKey(c.ID), run.c.State, c.ID), After: 30 * time.Second}
	}
	if stop != nil {
		return stop
	}
	if run.busy > 0 {
		return &RetryError{Err: fmt.Errorf("%d recipients are being sent by another run of this batch", run.busy), After: h.cfg.LeaseTTL}
	}
	if run.deferred > 0 {
		return &RetryError{Err: fmt.Errorf("%d recipients kept failing with transient provider errors; they are retried later, the rest of the batch is done", run.deferred), Failure: true}
	}
	if done, err := h.cfg.Store.CompleteIfDone(ctx, c.ID); err != nil {
		return infra(err)
	} else if done {
		h.forgetTemplate(c.ID)
		log.Info("campaign completed")
	}
	return nil
}

// reasonReceiptFirst is why a pending recipient is recorded sent without a send: a delivery receipt for an
// earlier send of it (whose answer was lost) arrived after `resume --resend-unknown` made it pending again.
const reasonReceiptFirst = "accepted by the provider: its delivery receipt arrived before the message was sent again"

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
		return modeSend, &RetryError{Err: fmt.Errorf("campaign %d is %s", id, st), After: 30 * time.Second}, false
	}
	return modeSend, nil, true
}

// gate leases the chunk's rows and reads the campaign's state and the chunk's consents as they are now. It
// returns the recipients this run now holds, with their consent, in chunk order.
func (h *Handler) gate(ctx context.Context, run *batchRun, chunk []campaign.Recipient) (chunkMode, []campaign.Recipient, error) {
	if now := h.cfg.Now(); run.c.State != campaign.StateCancelled && !run.c.Window.Open(now) {
		next := run.c.Window.NextOpen(now)
		return 0, nil, &RetryError{Err: fmt.Errorf("outside the send window %s; sending resumes at %s", run.c.Window, next.Format(time.RFC3339)), After: next.Sub(now)}
	}
	users := make([]string, len(chunk))
	for i := range chunk {
		users[i] = chunk[i].UserID
	}
	at := h.cfg.Now()
	got, err := h.cfg.Store.LeaseChunk(ctx, run.c, users, run.lease)
	if err != nil {
		return 0, nil, infra(err)
	}
	mode, retry, done := stateGate(run.c.ID, got.State)
	if retry != nil {
		return 0, nil, retry
	} else if done {
		return 0, nil, errCampaignOver
	}
	if mode == modeCancel && run.c.State != campaign.StateCancelled {
		run.c.State = campaign.StateCancelled
	}
	run.busy += got.Busy
	run.renewAt = at.Add(run.lease.TTL / 3)
	for _, u := range got.Inherited {
		if run.inherited == nil {
			run.inherited = map[string]bool{}
		}
		run.inherited[u] = true
	}
	todo := chunk[:0:0]
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
		r.Consent, r.Suspect = got.Consent[r.Address], suspect
		todo = append(todo, r)
	}
	// The batch was taken over from a run that died under another Redis epoch: its chunk in hand is settled
	// first, whichever chunk of this run its users belong to.
	for u, suspect := range got.Leased {
		if suspect && !inChunk[u] {
			todo = append([]campaign.Recipient{{UserID: u, Suspect: true}}, todo...)
		}
	}
	for u, snap := range got.Snapshots {
		run.snapshots[u] = snap
	}
	return mode, todo, nil
}

// renew extends the chunk's lease when a third of it has passed. A run that lost its lease (it was too
// slow, and another run took the rows over) must not send: it stops.
func (h *Handler) renew(ctx context.Context, run *batchRun) error {
	now := h.cfg.Now()
	if now.Before(run.renewAt) {
		return nil
	}
	held, err := h.cfg.Store.RenewLease(ctx, run.c.ID, run.lease)
	if err != nil {
		return infra(err)
	}
	if !held {
		return &RetryError{Err: fmt.Errorf("lease of batch %d lost to another run", run.batch), After: time.Second}
	}
	run.renewAt = now.Add(run.lease.TTL / 3)
	return nil
}

// waitContext derives the context token waits run under (see RunBatch).
func (h *Handler) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	waitCtx, cancel := context.WithCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		waitCtx, cancel = context.WithDeadline(ctx, dl.Add(-h.cfg.DeadlineMargin))
	}
	go func() {
		select {
		case <-h.stopping:
			cancel()
		case <-waitCtx.Done():
		}
	}()
	return waitCtx, cancel
}

// Stop asks running batches to hand back what they have not started: each finishes the send in
// flight, writes its outcomes and returns. Call it before shutting the server down.
func (h *Handler) Stop() { h.stopOnce.Do(func() { close(h.stopping) }) }

// infra marks an error of Redis or Postgres: the batch waits for them without using up its retries
// (fail closed: nothing is sent meanwhile, and nothing is given up on).
func infra(err error) error {
	var re *RetryError
	if errors.As(err, &re) {
		return err
	}
	return &RetryError{Err: err, After: 5 * time.Second}
}

// close settles a recipient that will not be sent (consent revoked, campaign cancelled) with val, unless
// its claim already holds an answer, which wins.
func (h *Handler) close(ctx context.Context, run *batchRun, r *campaign.Recipient, val string) error {
	if r.Suspect {
		return h.suspect(ctx, run, r)
	}
	g := run.guard
	g.CheckHalt = false
	old, ours, err := h.state.Take(ctx, ClaimKey(run.c.ID, r.UserID), run.nonce, val, g)
	if err != nil {
		return infra(err)
	}
	if !ours {
		h.fromClaim(run, r.UserID, old)
		return nil
	}
	st := state.ParseValue(val)
	run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSkipped, Reason: st.Reason})
	run.m.Skipped(1)
	return nil
}

// suspect settles a recipient taken over from a run that died under another Redis epoch: its claim, if
// Redis still has one, says what happened; without one the message may have been sent, so it is unknown.
func (h *Handler) suspect(ctx context.Context, run *batchRun, r *campaign.Recipient) error {
	const why = "Redis lost its data while a worker that has since stopped was sending this chunk; the message may have been sent"
	g := run.guard
	g.CheckHalt = false
	old, ours, err := h.state.Take(ctx, ClaimKey(run.c.ID, r.UserID), run.nonce, state.ReasonValue(state.Unknown, why), g)
	if err != nil {
		return infra(err)
	}
	if !ours {
		h.fromClaim(run, r.UserID, old)
		return nil
	}
	run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusUnknown, Reason: why})
	run.m.Unknown(1)
	return nil
}

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

// fromClaim turns a claim that already existed into an outcome.
func (h *Handler) fromClaim(run *batchRun, userID, val string) {
	st := state.ParseValue(val)
	switch st.Kind {
	case state.Sent:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusSent, MessageID: st.MessageID, Segments: st.Segments})
	case state.Failed:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusFailed, Reason: st.Reason})
	case state.Unknown:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusUnknown, Reason: st.Reason})
	case state.Skipped:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusSkipped, Reason: st.Reason})
	default:
		if !st.At.IsZero() && h.cfg.Now().Sub(st.At) < h.cfg.InFlightGrace {
			// A live run holds it: its claim is the record, and that run writes the outcome.
			run.busy++
			delete(run.inherited, userID)
			return
		}
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusUnknown, Reason: reasonDiedMidCall})
	}
}

func (run *batchRun) add(o campaign.Outcome) {
	run.pending = append(run.pending, o)
	delete(run.inherited, o.UserID)
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
	h.settleAnswer(ctx, run)
	for i := range run.pending {
		o := &run.pending[i]
		if o.Snapshot.Status == "" {
			o.Snapshot = run.snapshots[o.UserID]
		}
	}
	var moved map[string]int64
	var err error
	// A Postgres restart takes a few seconds: the outcomes in hand are worth waiting for (they are in the
	// claims too, but only a run that takes the lease over later would read them).
	for try := 0; try < 4; try++ {
		if moved, err = h.cfg.Store.Record(ctx, run.c.ID, run.pending, run.lease, run.inHand()); err == nil {
			break
		}
		limiter.Sleep(ctx, time.Duration(try+1)*500*time.Millisecond) //nolint:errcheck // ctx has no deadline here
	}
	if err != nil {
		return err
	}
	for _, o := range run.pending {
		if o.Status != campaign.StatusPending {
			delete(run.snapshots, o.UserID)
		}
	}
	run.pending = run.pending[:0]
	delete(moved, campaign.StatusPending)
	for st, n := range moved {
		run.counts[st] += n
	}
	if err := h.state.AddProgress(ctx, run.c.ID, moved); err != nil {
		// Counters are a fast view, rebuilt from Postgres by resume; the outcomes themselves are safe.
		h.log.Warn("progress counters not updated", "campaign_id", run.c.ID, "err", err)
	}
	return nil
}

// parsedTemplate is a campaign's parsed content and what it was parsed from.
type parsedTemplate struct {
	nonce   string
	content campaign.Content
	tmpl    *campaign.Template
}

// maxTemplates bounds the cache: past it, it starts again empty (a worker rarely sends that many
// campaigns at once, and a parse costs microseconds).
const maxTemplates = 256

func (h *Handler) template(c *campaign.Campaign) (*campaign.Template, error) {
	nonce, content := Nonce(c), c.Content()
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.templates[c.ID]; ok && p.nonce == nonce && p.content == content {
		return p.tmpl, nil
	}
	t, err := campaign.ParseContent(content)
	if err != nil {
		return nil, err
	}
	if len(h.templates) >= maxTemplates {
		clear(h.templates)
	}
	h.templates[c.ID] = parsedTemplate{nonce: nonce, content: content, tmpl: t}
	return t, nil
}

// forgetTemplate drops a campaign's parsed content once its batches find it over.
func (h *Handler) forgetTemplate(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.templates, id)
}

// cachedTemplates is how many campaigns' parsed contents the handler holds (for tests).
func (h *Handler) cachedTemplates() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.templates)
}

// backoff is exponential with jitter (half to all of 250 ms·2^(attempt-1), capped at 10 s), and never
// shorter than the provider's own hint.
func backoff(attempt int, hint time.Duration) time.Duration {
	d := 250 * time.Millisecond << min(attempt-1, 6)
	d = min(d, 10*time.Second)
	d = d/2 + rand.N(d/2+1)
	return max(d, hint)
}
