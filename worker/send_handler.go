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
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// Config configures a Handler. Zero values mean the documented defaults.
type Config struct {
	Store *campaign.Store
	Redis redis.UniversalClient
	// Providers maps each channel to the provider that sends it.
	Providers map[campaign.Channel]providers.Provider
	// ProviderRates caps each provider (by Name) in messages per second over all workers; 0 = no cap.
	ProviderRates map[string]float64
	Logger        *slog.Logger
	// Owner identifies this process in claims (host:pid); default "worker".
	Owner string
	// ClaimTTL is how long claims are kept; it must outlive any campaign. Default 45 days.
	ClaimTTL time.Duration
	// InFlightGrace is how old a claim without an answer must be before it is taken for a dead worker's
	// (and so unknown) rather than a live one still waiting for the provider. It must exceed the provider
	// timeout. Default 60 s.
	InFlightGrace time.Duration
	// SendAttempts is how many times a transient provider error is retried in place, with back-off, before
	// the rest of the batch is handed back to the queue. Default 3.
	SendAttempts int
	// ChunkSize is how many recipients are sent between two reads of the campaign state and consents and
	// two writes of outcomes to Postgres. Default 25.
	ChunkSize int
	// DeadlineMargin is kept free before a batch's deadline to write outcomes and hand the rest back.
	// Default 30 s.
	DeadlineMargin time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Handler processes batch tasks.
type Handler struct {
	cfg       Config
	claims    claims
	frequency frequencyCap
	bucket    *limiter.Bucket
	log       *slog.Logger

	mu        sync.Mutex
	templates map[int64]*campaign.Template

	stopping chan struct{}
	stopOnce sync.Once
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
		cfg.ClaimTTL = 45 * 24 * time.Hour
	}
	if cfg.InFlightGrace == 0 {
		cfg.InFlightGrace = 60 * time.Second
	}
	if cfg.SendAttempts == 0 {
		cfg.SendAttempts = 3
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 25
	}
	if cfg.DeadlineMargin == 0 {
		cfg.DeadlineMargin = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Handler{
		cfg:       cfg,
		claims:    claims{rdb: cfg.Redis, ttl: cfg.ClaimTTL},
		frequency: frequencyCap{rdb: cfg.Redis},
		bucket:    limiter.New(cfg.Redis),
		log:       cfg.Logger,
		templates: map[int64]*campaign.Template{},
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
	tmpl     *campaign.Template
	pending  []campaign.Outcome
	busy     int
	counts   map[string]int64
}

// RunBatch sends the still-pending recipients of one batch, a chunk at a time: before each chunk the
// campaign's state and the chunk's consents are read again (a pause or a RET recorded a moment ago takes
// effect within one chunk), and after each chunk the outcomes are written to Postgres.
func (h *Handler) RunBatch(ctx context.Context, campaignID int64, batch int) error {
	log := h.log.With("campaign_id", campaignID, "batch", batch)
	c, err := h.cfg.Store.Get(ctx, campaignID)
	if errors.Is(err, campaign.ErrNotFound) {
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
	if retry, done := stateGate(c.ID, c.State); retry != nil || done {
		return retry
	}
	provider := h.cfg.Providers[c.Channel]
	if provider == nil {
		return fmt.Errorf("no provider is configured for channel %s on this worker", c.Channel)
	}
	tmpl, err := h.template(c)
	if err != nil {
		return fmt.Errorf("campaign %d: %v: %w", c.ID, err, asynq.SkipRetry)
	}
	recipients, err := h.cfg.Store.LoadBatch(ctx, c.ID, batch)
	if err != nil {
		return infra(err)
	}
	run := &batchRun{
		c: c, nonce: Nonce(c), batch: batch, provider: provider, tmpl: tmpl, counts: map[string]int64{},
		limits: []limiter.Limit{
			{Key: "campaign:" + strconv.FormatInt(c.ID, 10), Rate: c.Rate},
			{Key: "provider:" + provider.Name(), Rate: h.cfg.ProviderRates[provider.Name()], Pausable: true},
		},
	}
	// waitCtx bounds the waits for tokens: it ends at the soft deadline (the task's, less a margin to write
	// the outcomes) or when the worker is told to stop, so a slow rate cap hands the rest of the batch back
	// instead of running into the task timeout. Sends and claim writes keep the task context.
	waitCtx, cancel := h.waitContext(ctx)
	defer cancel()

	var stop error
	for start := 0; start < len(recipients) && stop == nil; start += h.cfg.ChunkSize {
		chunk := recipients[start:min(start+h.cfg.ChunkSize, len(recipients))]
		if stop = h.gate(ctx, run, chunk); stop != nil {
			break
		}
		for i := range chunk {
			if waitCtx.Err() != nil && ctx.Err() == nil {
				stop = &RetryError{Err: errors.New("batch handed back (worker stopping or batch time used up)"), After: time.Second}
				break
			}
			if stop = h.deliver(ctx, waitCtx, run, &chunk[i]); stop != nil {
				break
			}
		}
		// Outcomes already known are written even when the batch stops early; they are in the claims too,
		// so a failed write is repaired by the next run.
		if err := h.flush(context.WithoutCancel(ctx), run); err != nil && stop == nil {
			stop = infra(err)
		}
	}
	log.Info("batch run", "recipients", len(recipients), "sent", run.counts[campaign.StatusSent],
		"failed", run.counts[campaign.StatusFailed], "skipped", run.counts[campaign.StatusSkipped],
		"unknown", run.counts[campaign.StatusUnknown], "in_flight_elsewhere", run.busy)
	if errors.Is(stop, errCampaignOver) {
		return nil
	}
	if stop != nil {
		return stop
	}
	if run.busy > 0 {
		return &RetryError{Err: fmt.Errorf("%d recipients are being sent by another worker", run.busy), After: h.cfg.InFlightGrace}
	}
	if done, err := h.cfg.Store.CompleteIfDone(ctx, c.ID); err != nil {
		return infra(err)
	} else if done {
		log.Info("campaign completed")
	}
	return nil
}

// errCampaignOver ends a batch whose campaign was cancelled or ended meanwhile.
var errCampaignOver = errors.New("campaign is over")

// stateGate says what a batch does in a campaign state: go on (nil, false), come back later (a
// RetryError), or stop for good (nil, true).
func stateGate(id int64, st campaign.State) (retry error, done bool) {
	switch st {
	case campaign.StateRunning:
		return nil, false
	case campaign.StatePaused, campaign.StateScheduled, campaign.StatePlanning:
		return &RetryError{Err: fmt.Errorf("campaign %d is %s", id, st), After: 30 * time.Second}, false
	}
	return nil, true
}

// gate reads the campaign's state and the chunk's consents as they are now.
func (h *Handler) gate(ctx context.Context, run *batchRun, chunk []campaign.Recipient) error {
	addrs := make([]string, len(chunk))
	for i := range chunk {
		addrs[i] = chunk[i].Address
	}
	if now := h.cfg.Now(); !run.c.Window.Open(now) {
		next := run.c.Window.NextOpen(now)
		return &RetryError{Err: fmt.Errorf("outside the send window %s; sending resumes at %s", run.c.Window, next.Format(time.RFC3339)), After: next.Sub(now)}
	}
	st, consent, err := h.cfg.Store.SendGate(ctx, run.c, addrs)
	if err != nil {
		return infra(err)
	}
	if retry, done := stateGate(run.c.ID, st); retry != nil {
		return retry
	} else if done {
		return errCampaignOver
	}
	for i := range chunk {
		chunk[i].Consent = consent[chunk[i].Address]
	}
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

// deliver handles one recipient. A non-nil error stops the batch: the recipient (and the rest) stay
// pending for the next run.
func (h *Handler) deliver(ctx, waitCtx context.Context, run *batchRun, r *campaign.Recipient) error {
	key := ClaimKey(run.c.ID, r.UserID)
	if !r.Consent {
		old, ours, err := h.claims.take(ctx, key, run.nonce, reasonValue(claimSkipped, campaign.ReasonRevoked))
		if err != nil {
			return infra(err)
		}
		if ours {
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonRevoked})
		} else {
			h.fromClaim(run, r.UserID, old)
		}
		return nil
	}

	body, err := run.tmpl.Render(r.TemplateData(run.c.Channel, run.c.Name))
	if err != nil {
		run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Reason: "template: " + err.Error()})
		return nil
	}
	msg := providers.Message{To: r.Address, Subject: run.c.Subject, Body: body, CampaignID: run.c.ID, UserID: r.UserID}

	for attempt := 1; ; attempt++ {
		if err := h.bucket.Wait(waitCtx, run.limits...); err != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case waitCtx.Err() != nil:
				return &RetryError{Err: errors.New("batch handed back while waiting for the rate limit (worker stopping or batch time used up)"), After: time.Second}
			}
			return infra(fmt.Errorf("rate limiter: no send while Redis is unavailable: %w", err))
		}
		// The wait for a token may have run past the end of the send window.
		if now := h.cfg.Now(); !run.c.Window.Open(now) {
			next := run.c.Window.NextOpen(now)
			return &RetryError{Err: fmt.Errorf("the send window %s closed; sending resumes at %s", run.c.Window, next.Format(time.RFC3339)), After: next.Sub(now)}
		}
		mine := pendingValue(h.cfg.Now(), h.cfg.Owner)
		old, ours, err := h.claims.take(ctx, key, run.nonce, mine)
		if err != nil {
			return infra(fmt.Errorf("no send while Redis is unavailable: %w", err))
		}
		if !ours {
			h.fromClaim(run, r.UserID, old)
			return nil
		}
		if capped, err := h.frequency.take(ctx, run.c, run.nonce, r.Address, h.cfg.Now()); err != nil {
			h.claims.release(context.WithoutCancel(ctx), key, run.nonce, mine) //nolint:errcheck // a kept claim only makes the recipient unknown later
			return infra(err)
		} else if capped {
			h.claims.settle(ctx, key, run.nonce, mine, reasonValue(claimSkipped, campaign.ReasonFrequencyCap)) //nolint:errcheck // Postgres records the skip
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSkipped, Reason: campaign.ReasonFrequencyCap})
			return nil
		}
		res, err := run.provider.Send(ctx, msg)
		if err == nil {
			if err := h.claims.settle(ctx, key, run.nonce, mine, sentValue(res.MessageID, res.Segments)); err != nil {
				h.log.Error("provider accepted but the claim could not be updated; Postgres will hold the outcome", "campaign_id", run.c.ID, "user_id", r.UserID, "err", err)
			}
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, MessageID: res.MessageID, Segments: res.Segments})
			return nil
		}

		var pe *providers.Error
		if !errors.As(err, &pe) {
			// Cancelled before the request went out: nothing was sent.
			h.claims.release(context.WithoutCancel(ctx), key, run.nonce, mine)           //nolint:errcheck // a kept claim only makes the recipient unknown later
			h.frequency.release(context.WithoutCancel(ctx), run.c, run.nonce, r.Address) //nolint:errcheck // nothing was sent
			return err
		}
		switch {
		case pe.Class == providers.Ambiguous:
			h.claims.settle(ctx, key, run.nonce, mine, reasonValue(claimUnknown, pe.Reason())) //nolint:errcheck // an unsettled claim reads as unknown too
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusUnknown, Reason: pe.Reason()})
			h.log.Warn("provider answer lost; recipient is unknown and will not be resent automatically",
				"campaign_id", run.c.ID, "user_id", r.UserID, "to", providers.MaskAddress(r.Address), "err", pe.Reason())
			return nil
		case pe.Class == providers.Permanent && !pe.AccountLevel():
			h.claims.settle(ctx, key, run.nonce, mine, reasonValue(claimFailed, pe.Reason())) //nolint:errcheck // Postgres records the failure
			h.frequency.release(ctx, run.c, run.nonce, r.Address)                             //nolint:errcheck // nothing reached the person
			run.add(campaign.Outcome{UserID: r.UserID, Status: campaign.StatusFailed, Reason: pe.Reason()})
			return nil
		}
		// Transient, or the account itself is refused: nothing was accepted, so the claim is released (first:
		// a claim kept by mistake would make the recipient unknown; a mark kept is ours and harmless).
		if err := h.claims.release(ctx, key, run.nonce, mine); err != nil {
			return infra(err)
		}
		if err := h.frequency.release(ctx, run.c, run.nonce, r.Address); err != nil {
			h.log.Warn("frequency mark not released", "campaign_id", run.c.ID, "err", err)
		}
		if pe.Class == providers.Permanent {
			return &RetryError{Err: fmt.Errorf("provider refuses the account, not the recipient (fix the configuration; the batch waits): %w", pe), Failure: true}
		}
		wait := backoff(attempt, pe.RetryAfter)
		if pe.Status == 429 || pe.Code == 20429 {
			// Every worker slows down, not only this one.
			if err := h.bucket.Pause(ctx, "provider:"+run.provider.Name(), wait); err != nil {
				return infra(err)
			}
		}
		if attempt >= h.cfg.SendAttempts {
			return &RetryError{Err: fmt.Errorf("provider kept failing: %w", pe), After: wait, Failure: true}
		}
		h.log.Debug("transient provider error; retrying", "campaign_id", run.c.ID, "attempt", attempt, "err", pe.Reason(), "wait", wait)
		if err := limiter.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// fromClaim turns a claim that already existed into an outcome.
func (h *Handler) fromClaim(run *batchRun, userID, val string) {
	st := parseClaim(val)
	switch st.kind {
	case claimSent:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusSent, MessageID: st.messageID, Segments: st.segments})
	case claimFailed:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusFailed, Reason: st.reason})
	case claimUnknown:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusUnknown, Reason: st.reason})
	case claimSkipped:
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusSkipped, Reason: st.reason})
	default:
		if !st.at.IsZero() && h.cfg.Now().Sub(st.at) < h.cfg.InFlightGrace {
			run.busy++
			return
		}
		run.add(campaign.Outcome{UserID: userID, Status: campaign.StatusUnknown,
			Reason: "a worker stopped after claiming and before the provider answered; the message may have been sent"})
	}
}

func (run *batchRun) add(o campaign.Outcome) { run.pending = append(run.pending, o) }

// flush writes buffered outcomes and advances the campaign's Redis counters by what actually changed.
func (h *Handler) flush(ctx context.Context, run *batchRun) error {
	if len(run.pending) == 0 {
		return nil
	}
	moved, err := h.cfg.Store.Record(ctx, run.c.ID, run.pending)
	if err != nil {
		return err
	}
	run.pending = run.pending[:0]
	pipe := h.cfg.Redis.Pipeline()
	key := ProgressKey(run.c.ID)
	for st, n := range moved {
		run.counts[st] += n
		pipe.HIncrBy(ctx, key, st, n)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// Counters are a fast view, rebuilt from Postgres by resume; the outcomes themselves are safe.
		h.log.Warn("progress counters not updated", "campaign_id", run.c.ID, "err", err)
	}
	return nil
}

// ProgressKey is the Redis hash of a campaign's progress counters.
func ProgressKey(campaignID int64) string {
	return "campaign:" + strconv.FormatInt(campaignID, 10) + ":progress"
}

func (h *Handler) template(c *campaign.Campaign) (*campaign.Template, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.templates[c.ID]; ok {
		return t, nil
	}
	t, err := campaign.ParseTemplate(c.Message)
	if err != nil {
		return nil, err
	}
	h.templates[c.ID] = t
	return t, nil
}

// backoff is exponential with jitter (half to all of 250 ms·2^(attempt-1), capped at 10 s), and never
// shorter than the provider's own hint.
func backoff(attempt int, hint time.Duration) time.Duration {
	d := 250 * time.Millisecond << min(attempt-1, 6)
	d = min(d, 10*time.Second)
	d = d/2 + rand.N(d/2+1)
	return max(d, hint)
}
