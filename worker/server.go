package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ServerConfig configures an Asynq server that runs batch tasks.
type ServerConfig struct {
	// Concurrency is how many batches this process runs at once; default 16.
	Concurrency int
	// ShutdownTimeout is how long in-flight batches get to finish on SIGTERM before what is left is handed
	// back to the queue; default 30 s.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
}

// RetryDelay is the queue's back-off for a failed batch: the batch's own hint when it gave one, about a
// second for a batch whose worker stopped or died while it ran (its lease expired in the queue), otherwise
// exponential (2 s·2^n) with jitter, capped at 10 minutes.
func RetryDelay(n int, err error, _ *asynq.Task) time.Duration {
	if errors.Is(err, asynq.ErrLeaseExpired) {
		// Nothing failed: the process that ran the batch stopped heartbeating (killed, frozen, cut off from
		// Redis) and Asynq took the task back a minute or more later. A back-off would only add to that
		// wait, with the recipients pending and no reason to show; the next run waits on the batch's lease
		// in Postgres (or takes it over from a dead run) whenever it comes.
		return leaseExpiredDelay/2 + rand.N(leaseExpiredDelay+1)
	}
	var re *RetryError
	if errors.As(err, &re) && re.After > 0 {
		// A little jitter spreads batches handed back together; bounded, so that a batch waiting for
		// tomorrow's send window does not come back hours after it opened.
		return re.After + rand.N(min(re.After/4, 5*time.Second)+1)
	}
	d := 2 * time.Second << min(n, 9)
	d = min(d, 10*time.Minute)
	return d/2 + rand.N(d/2+1)
}

// leaseExpiredDelay is about how long a batch Asynq took back from a worker that stopped waits to run again.
const leaseExpiredDelay = time.Second

// isFailure keeps retries that are not the batch's fault from using up its retry budget.
func isFailure(err error) bool {
	var re *RetryError
	if errors.As(err, &re) {
		return re.Failure
	}
	return true
}

// NewServer builds the Asynq server for h on rdb. The caller runs it with Run or Start/Shutdown.
func NewServer(rdb redis.UniversalClient, h *Handler, cfg ServerConfig) *asynq.Server {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	notes := newRetryNotes(time.Now)
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              cfg.Concurrency,
		Queues:                   map[string]int{Queue: 1},
		RetryDelayFunc:           RetryDelay,
		IsFailure:                isFailure,
		ShutdownTimeout:          cfg.ShutdownTimeout,
		TaskCheckInterval:        250 * time.Millisecond,
		DelayedTaskCheckInterval: time.Second,
		Logger:                   asynqLogger{log},
		LogLevel:                 asynq.WarnLevel,
		HealthCheckFunc: func(err error) {
			if err != nil {
				log.Error("Redis is unreachable: no sends until it is back", "err", err)
			}
		},
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			id, _ := asynq.GetTaskID(ctx)
			n, _ := asynq.GetRetryCount(ctx)
			max, _ := asynq.GetMaxRetry(ctx)
			if errors.Is(err, asynq.SkipRetry) || isFailure(err) && n >= max {
				log.Error("batch moved to the dead-letter queue: campaignctl dlq list shows it, dlq retry runs it again once the cause is fixed",
					"task", id, "attempt", n+1, "max_retry", max, "err", err)
				return
			}
			notes.log(ctx, log, err, "task", id, "attempt", n+1, "max_retry", max)
		}),
	})
}

// retryNoteEvery is how long the log stays quiet about a reason it just gave for handing a batch back.
const retryNoteEvery = time.Minute

// retryNotes logs the batches handed back to the queue: a line for a reason not given in the last
// retryNoteEvery, and only a count for the others, carried into the reason's next line
// (same_since_last_line). Each batch of a paused campaign comes back every 30 s: a campaign of 2,000 batches
// would write 2,000 lines every 30 s, each saying the same. A reason that stops coming back has its count
// written on its own line (quiet_since) at the first hand-back a retryNoteEvery after its last line.
type retryNotes struct {
	mu    sync.Mutex
	now   func() time.Time
	seen  map[string]*retryNote
	swept time.Time
}

type retryNote struct {
	at    time.Time // its last line
	last  time.Time // its last hand-back
	more  int       // hand-backs since its last line
	level slog.Level
}

// retryCount is the count of a reason that stopped coming back.
type retryCount struct {
	reason string
	n      retryNote
}

func newRetryNotes(now func() time.Time) *retryNotes {
	return &retryNotes{now: now, seen: map[string]*retryNote{}}
}

// log writes err's line (args first) unless the same reason was written less than retryNoteEvery ago: at
// info for a wait the batch was made for (a paused or scheduled campaign, a closed send window), at warn
// for anything else.
func (r *retryNotes) log(ctx context.Context, log *slog.Logger, err error, args ...any) {
	level := slog.LevelWarn
	var re *RetryError
	if errors.As(err, &re) && re.Wait {
		level = slog.LevelInfo
	}
	more, ok, ended := r.take(err.Error(), level)
	for _, e := range ended {
		log.Log(ctx, e.n.level, "batch will run again", "err", e.reason, "same_since_last_line", e.n.more, "quiet_since", e.n.last)
	}
	if !ok {
		return
	}
	args = append(args, "err", err)
	if re != nil && re.After > 0 {
		args = append(args, "retry_in", re.After.Round(time.Second))
	}
	if more > 0 {
		args = append(args, "same_since_last_line", more)
	}
	log.Log(ctx, level, "batch will run again", args...)
}

// take says whether reason's line is due, and how many times it came since its last line. At most once a
// retryNoteEvery it also forgets the reasons whose last line is older than that, and returns those among
// them that came back since, with their counts.
func (r *retryNotes) take(reason string, level slog.Level) (more int, due bool, ended []retryCount) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.swept) >= retryNoteEvery {
		r.swept = now
		for k, v := range r.seen {
			if k == reason || now.Sub(v.at) < retryNoteEvery {
				continue
			}
			if v.more > 0 {
				ended = append(ended, retryCount{reason: k, n: *v})
			}
			delete(r.seen, k)
		}
		slices.SortFunc(ended, func(a, b retryCount) int { return a.n.last.Compare(b.n.last) })
	}
	n := r.seen[reason]
	if n != nil && now.Sub(n.at) < retryNoteEvery {
		n.more++
		n.last = now
		return 0, false, ended
	}
	if n == nil {
		n = &retryNote{}
		r.seen[reason] = n
	}
	more, n.at, n.last, n.more, n.level = n.more, now, now, 0, level
	return more, true, ended
}

// Serve runs the worker until ctx is done, then shuts down gracefully.
func Serve(ctx context.Context, rdb redis.UniversalClient, h *Handler, cfg ServerConfig) error {
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := CheckRedisVersion(ctx, rdb); err != nil {
		return err
	}
	sweepEvery := max(2*time.Second, h.cfg.LeaseTTL/3)
	if h.cfg.Liveness != nil {
		// The lock first: the leases of the first runs carry its key.
		// Held until the server has shut down: the batches finishing after ctx ends still send.
		lctx, stopLiveness := context.WithCancel(context.WithoutCancel(ctx))
		defer stopLiveness()
		if err := h.cfg.Liveness.Start(lctx, 30*time.Second); err != nil {
			return fmt.Errorf("postgres: the worker's liveness lock: %w", err)
		}
		// A dead process's chunks are taken once two sweeps goneAfter apart found its lock missing.
		sweepEvery = time.Second
	}
	srv := NewServer(rdb, h, cfg)
	mux := asynq.NewServeMux()
	mux.Handle(TaskBatch, h)
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go h.sweepLoop(sweepCtx, sweepEvery)
	go h.refusalLoop(sweepCtx)
	<-ctx.Done()
	// Batches finish the send in flight, write their outcomes and hand the rest back, well inside the
	// shutdown timeout; nothing is cut off mid-call.
	h.Stop()
	srv.Shutdown()
	// A provider's word on consent still being written (an import may hold the consents a while): it
	// is waited for, up to 5 s more (the supervisor's and Kubernetes' kill margins), rather than lost.
	h.waitConsentWrites(min(cfg.ShutdownTimeout, 5*time.Second))
	return nil
}

// waitConsentWrites waits up to d for the background consent writes (noConsent), then ends their retries.
func (h *Handler) waitConsentWrites(d time.Duration) {
	defer h.endConsentWrites()
	done := make(chan struct{})
	go func() { h.consentPending.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		if h.refusalsUnkept.Load() > 0 {
			h.log.Error("a provider's refusal for want of consent was still not written at shutdown, nor kept in Postgres: it is lost; check the recipients of the last failures with campaignctl iys check")
		} else {
			h.log.Warn("a provider's refusal for want of consent was still not written at shutdown: it is kept in Postgres, and the next worker to run writes it")
		}
	}
}

// asynqLogger routes Asynq's own log lines into slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
