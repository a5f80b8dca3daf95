package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// Store is what the send path reads and writes in Postgres, the source of truth: campaigns, their
// recipients' outcomes and the batch leases. *campaign.Store implements it; tests put faults in front of
// it (internal/faults).
type Store interface {
	Get(ctx context.Context, id int64) (*campaign.Campaign, error)
	RecentSends(ctx context.Context, yield func(campaign.RecentSend) error) (time.Duration, error)
	ChunksInHand(ctx context.Context, epoch string) (int, error)
	StartIfDue(ctx context.Context, id int64) (campaign.State, error)
	LoadBatch(ctx context.Context, campaignID int64, batch int) ([]campaign.Recipient, error)
	LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (campaign.Chunk, error)
	RenewLease(ctx context.Context, campaignID int64, l campaign.Lease) (bool, error)
	ReleaseBatch(ctx context.Context, campaignID int64, l campaign.Lease) error
	Record(ctx context.Context, campaignID int64, outcomes []campaign.Outcome, l campaign.Lease, inHand []string) (map[string]int64, error)
	AuditSecondSends(ctx context.Context, campaignID int64, outs []campaign.Outcome) (int64, error)
	CloseBatch(ctx context.Context, id int64, batch int) (done, open bool, err error)
	ExpiredLeases(ctx context.Context, limit int, gone []int64, holderGrace time.Duration) ([]campaign.Expired, error)
	GoneHolders(ctx context.Context) ([]int64, error)
	ProviderNoConsent(ctx context.Context, c *campaign.Campaign, addrs []string, source string, at time.Time) (int64, error)
	ProviderOptOut(ctx context.Context, c *campaign.Campaign, userIDs, addrs []string, evidence string, at time.Time) (int64, error)
	KeepPendingRefusal(ctx context.Context, p campaign.PendingRefusal, hold time.Duration) (int64, error)
	TakePendingRefusals(ctx context.Context, holder int64, limit int, hold time.Duration) ([]campaign.PendingRefusal, error)
	DropPendingRefusal(ctx context.Context, id int64) error
	ReleasePendingRefusals(ctx context.Context, ids []int64, after time.Duration) error
}

var _ Store = (*campaign.Store)(nil)

// Config configures a Handler. Zero values mean the documented defaults.
type Config struct {
	Store Store
	// OptIns re-reads, at send time, the opt-ins of a campaign on a channel without an İYS type from its
	// audience (campaign.OptIns); nil means on the Store's database when the Store has one (OptIns()).
	OptIns OptInReader
	// Redis holds the rate limiters' buckets, and the State when State is nil.
	Redis redis.UniversalClient
	// State is the send path's Redis state; nil means a state.Store on Redis.
	State State
	// Unsubscribe signs the one-click unsubscribe link of each recipient of a commercial e-mail
	// (WEBHOOKS_PUBLIC_URL, UNSUBSCRIBE_SECRET); nil: this worker sends no commercial e-mail (its batches
	// wait, without using retries, for a worker that has it). UnsubscribeMailto, when set, is an address
	// the List-Unsubscribe header offers besides the link.
	Unsubscribe       *unsubscribe.Signer
	UnsubscribeMailto string
	// Providers maps each channel to the provider that sends it.
	Providers map[campaign.Channel]providers.Provider
	// Fallback maps a channel to a second provider, used when the first is down: a send the first refused
	// without accepting it (a 5xx, a connection that failed before the request was written, or an
	// account-level refusal) goes through the second at once, under the same claim. The first is left
	// alone once it has refused failoverAfter sends in a row (until its next probe is due,
	// FailoverProbeEvery), at once for the account, or when the shared pace calls it down (FailoverWindow
	// both): a sporadic 5xx moves its own message only. An
	// ambiguous answer never fails over: the first may have sent it; nor does a 429 (the shared pace slows
	// for it), unless the first is down by every worker's answers. Only one-message-a-request providers
	// fail over (SMS).
	Fallback map[campaign.Channel]providers.Provider
	// FailoverWindow is how long a first provider that failed is skipped in favour of the fallback before it
	// is tried again. Default 30 s.
	FailoverWindow time.Duration
	// FailoverProbeEvery is how often, over all workers, a first provider down by the shared pace is probed
	// while the fallback carries its sends. Default 5 s: each probe of a provider that resets its
	// connections is a recipient unknown, so less often than the one a second of a provider with no
	// fallback, whose sends wait.
	FailoverProbeEvery time.Duration
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
	// RecordWait is how long a run waits for Postgres to take the outcomes of its chunk (a restart, a
	// failover) before it gives them up to the claims in Redis, which the chunk's next run reads. Default
	// DefaultRecordWait.
	RecordWait time.Duration
	// SendAttempts is how many times a transient provider error is retried in place, with back-off, before
	// the rest of the batch is handed back to the queue. Default 5 (with back-offs of 0.05–0.1, 0.1–0.2,
	// 0.2–0.4 and 0.4–0.8 s, or a Retry-After when longer).
	SendAttempts int
	// SendWindow is how many one-message sends a batch run has out at once when no rate cap paces it: they
	// are claimed together just before they go out, and a crash leaves at most that many in flight.
	// Default DefaultSendWindow; 1 sends one at a time.
	SendWindow int
	// ChunkSize is how many recipients are sent between two reads of the campaign state and consents and
	// two writes of outcomes to Postgres; under a rate cap of R a second, at most max(5, R). 0 (the
	// default): MinChunk, growing for a run without a cap to what it sends in about half of the consents'
	// longest age (chunkPace), MaxChunk at most.
	ChunkSize int
	// DeadlineMargin is kept free before a batch's deadline to write outcomes and hand the rest back.
	// Default 30 s.
	DeadlineMargin time.Duration
	// TurnAfter is how long a batch run under a cap (the campaign's or its provider's) keeps its worker
	// slot, beyond its campaign's share of the slots, while a batch of another campaign waits in the queue
	// for one: then it hands the rest of its batch back, behind that one (turnOver). Default 1 s, about a
	// chunk under a cap: only the runs over the share hand back, so a campaign launched behind a capped one
	// starts within a second or two, and capped campaigns do not trade slots back and forth; negative:
	// never.
	TurnAfter time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Liveness, when set, is the lock that tells the other workers' sweeps this process lives: its leases
	// carry its key, and a run sends only while it is held.
	Liveness *Liveness
	// LivenessGrace is how long this process's own lock must have been held without a break before its
	// sweep judges another holder gone (goneHolders). Default 10 s.
	LivenessGrace time.Duration
	// Metrics records sends, provider latency, limiter waits, refused claims and retries; nil records
	// nothing.
	Metrics *metrics.Metrics
}

// EngineConns is the size of a worker process's pool of connections to the engine database, unless its
// DATABASE_URL sets pool_max_conns (one more connection holds its liveness lock). A worker's statements
// are short, one or two a chunk of its runs, and few at a time keep up with any number of batch runs:
// with a campaign at full speed, 100,000 SMS on 2 cores with Postgres beside them, 2 connections a worker
// took 45 µs of Postgres CPU a message against 66 with 4 (pgx's default there), its backends contending
// less for the same pages and locks (docs/benchmarks.md, 2026-12-04 19:17). A statement that waits on a
// lock (a refusal's write behind an import) holds one of them; the runs go on through the other.
const EngineConns = 2

// DefaultClaimTTL is how long claims (and a cancelled campaign's halt mark) are kept: longer than any
// campaign runs.
const DefaultClaimTTL = 45 * 24 * time.Hour

// Handler processes batch tasks.
type Handler struct {
	cfg Config
	// limitedMu guards limitedAddrs: the addresses a provider limits for now, and until when (holdLimited),
	// and limitedPruned, when the holds that ended were last taken out. limiting is len(limitedAddrs),
	// read without the lock.
	limitedMu     sync.Mutex
	limitedAddrs  map[string]time.Time
	limitedPruned time.Time
	limiting      atomic.Int64
	// graceMu guards the fleet's in-flight grace as last read (inFlightGrace) and when.
	graceMu    sync.Mutex
	fleetGrace time.Duration
	graceRead  time.Time
	state      State
	bucket     *limiter.Bucket
	log        *slog.Logger
	// consentWrites lets one background consent write (noConsent) at a time hold a Postgres connection.
	consentWrites chan struct{}
	// consentPending counts the consent writes not done yet: Serve waits for them before it returns.
	consentPending sync.WaitGroup
	// refusalsUnkept counts the providers' refusals whose consents are not written and that are not kept in
	// Postgres either (KeepPendingRefusal): only those are lost if the process ends now.
	refusalsUnkept atomic.Int64
	// heldMu guards held: the addresses of the provider refusals for want of consent (noConsent) whose
	// RET is not written yet, counted by key (heldKey). Until it is, this process sends none of them a
	// message the refusal covers (refusedHere). holding is len(held), read without the lock.
	heldMu  sync.Mutex
	held    map[string]int
	holding atomic.Int64
	// spooled is who the refusals held in webhooks processes' spools refuse, as the last lease read them
	// (readSpooled); nil when none. Read for every recipient a lease gates: no lock.
	spooled atomic.Pointer[map[string]bool]
	// queuedMu guards queuedAt and queued: the queue's batches waiting and running, as read at queuedAt
	// (turnOver).
	queuedMu sync.Mutex
	queuedAt time.Time
	queued   queueView
	// consentCtx ends the consent writes' retries: they go on for as long as the process runs, and end
	// when Serve has waited for them at shutdown (endConsentWrites).
	consentCtx       context.Context
	endConsentWrites context.CancelFunc
	// consentAttempt bounds one attempt of a consent write, and consentPause is the wait between two;
	// defaults 2 s and 1 s.
	consentAttempt, consentPause time.Duration

	mu sync.Mutex
	// templates holds the parsed content of the campaigns this process sends, by campaign ID, each with
	// what it was parsed from: a campaign read later with another nonce or content (the engine database
	// re-created, IDs starting again at 1) misses it. A campaign found over is dropped.
	templates map[int64]parsedTemplate

	stopping chan struct{}
	stopOnce sync.Once
	// lastAnswer is when the provider last answered a send of this process (unix ns).
	lastAnswer atomic.Int64
	// suspects are the addresses whose sends the providers failed lately (observe, giveUp).
	suspects suspects
	// acceptedAt is when each provider last accepted a send of this process, by name (*atomic.Int64, unix
	// ns; lastAccepted): aloneRefused, accountRetry, suspect.
	acceptedAt sync.Map
	// born is when the handler was made (accountRetry).
	born time.Time
	// toldNoUnsubscribe holds the campaigns whose commercial e-mail this worker was told it cannot send
	// (no unsubscribe links): said once in its log, not at every hand-back.
	toldNoUnsubscribe sync.Map
	// refusedInARow counts, per first provider's name, its refusals without acceptance since it last
	// accepted a send of this process (*atomic.Int32): failoverAfter of them leave it for its fallback.
	refusedInARow sync.Map
	// waitsNoted holds the (campaign, reason) waits this process noted for status (noteWait), until the
	// batch gets past them (clearWait): only those are cleared, not every campaign at every lease.
	waitsNoted sync.Map
	// downUntil holds, per provider name, until when (unix ns) a first provider that failed is skipped for
	// its fallback; downByPace marks those skipped because the shared pace called them down, which come
	// back as soon as it calls them up (a probe got through), not only when the window ends.
	downUntil  sync.Map
	downByPace sync.Map
	// senders runs the sends of windows (deliverWindowed).
	senders *senders
	// growChunks is set when Config.ChunkSize was left to adapt; chunkHints holds, per provider name, the
	// chunk size the last run without a cap measured (*atomic.Int64), where the next run starts.
	growChunks bool
	chunkHints sync.Map
	// active counts this process's batch runs under way, by provider ("p:<name>") and by campaign
	// ("c:<id>"), under mu: the runs that share a cap (sharers).
	active map[string]int
	// jitter returns what a back-off adds to its half, from 0 up to its argument (nil: at random, rand.N;
	// tests fix it to know the waits).
	jitter func(time.Duration) time.Duration
	// missingSince is when the sweep first found each lease holder's lock missing (goneHolders), under mu.
	missingSince map[int64]time.Time
	// liveLeases holds the lease tokens of the batch runs running in this process, under mu: such a lease
	// is never taken over here (leaseChunk), even once it ran out.
	liveLeases map[string]bool
}

// capKeys are the keys under which a run of campaign id through provider name is counted in active.
func capKeys(id int64, name string) (provider, campaign string) {
	return "p:" + name, "c:" + strconv.FormatInt(id, 10)
}

// enter counts a run as under way under keys (capKeys) until the returned func is called.
func (h *Handler) enter(keys ...string) (leave func()) {
	h.mu.Lock()
	if h.active == nil {
		h.active = map[string]int{}
	}
	for _, k := range keys {
		h.active[k]++
	}
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		for _, k := range keys {
			if h.active[k]--; h.active[k] <= 0 {
				delete(h.active, k)
			}
		}
		h.mu.Unlock()
	}
}

// sharers is how many runs of this process are under way under key: those sharing the cap it names.
func (h *Handler) sharers(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(1, h.active[key])
}

// NewHandler returns a Handler for cfg.
// OptInReader re-reads recipients' opt-ins (campaign.OptIns): what the campaign's audience, run again
// now for users, says of them.
type OptInReader interface {
	Read(ctx context.Context, c *campaign.Campaign, users []string) (campaign.OptInRows, error)
}

func NewHandler(cfg Config) *Handler {
	if s, ok := cfg.Store.(interface{ OptIns() *campaign.OptIns }); ok && cfg.OptIns == nil {
		cfg.OptIns = s.OptIns()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Owner == "" {
		cfg.Owner = "worker"
	}
	if cfg.ClaimTTL == 0 {
		cfg.ClaimTTL = DefaultClaimTTL
	}
	if cfg.LivenessGrace == 0 {
		cfg.LivenessGrace = 10 * time.Second
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 30 * time.Second
	}
	if cfg.InFlightGrace == 0 {
		cfg.InFlightGrace = cfg.LeaseTTL
	}
	if cfg.RecordWait == 0 {
		cfg.RecordWait = recordWait
	}
	if cfg.TurnAfter == 0 {
		cfg.TurnAfter = time.Second
	}
	if cfg.SendAttempts == 0 {
		cfg.SendAttempts = 5
	}
	if cfg.SendWindow == 0 {
		cfg.SendWindow = DefaultSendWindow
	}
	growChunks := cfg.ChunkSize == 0
	if growChunks {
		cfg.ChunkSize = MinChunk
	}
	if cfg.FailoverProbeEvery == 0 {
		cfg.FailoverProbeEvery = 5 * time.Second
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
	h := &Handler{
		cfg:            cfg,
		born:           cfg.Now(),
		state:          cfg.State,
		bucket:         limiter.New(cfg.Redis),
		log:            cfg.Logger,
		templates:      map[int64]parsedTemplate{},
		stopping:       make(chan struct{}),
		senders:        newSenders(),
		consentWrites:  make(chan struct{}, 1),
		consentAttempt: 2 * time.Second,
		consentPause:   time.Second,
		growChunks:     growChunks,
	}
	h.consentCtx, h.endConsentWrites = context.WithCancel(context.Background())
	h.bucket.OnPace(h.paceReport)
	return h
}

// RetryError asks the queue to run the batch again after After (0: the default back-off). Failure false
// means the retry is not the batch's fault (another worker holds some claims, the campaign is paused) and
// does not use up the retry budget.
type RetryError struct {
	Err     error
	After   time.Duration
	Failure bool
	// Wait marks a wait the batch was made for, not a fault: its campaign is paused or not started yet,
	// or its send window is closed. It is logged at info.
	Wait bool
}

func (e *RetryError) Error() string { return e.Err.Error() }

func (e *RetryError) Unwrap() error { return e.Err }

// ProcessTask implements asynq.Handler.
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p BatchPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return toDLQ(fmt.Errorf("batch payload %q: %v", t.Payload(), err))
	}
	return h.RunBatch(ctx, p.CampaignID, p.Batch)
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

// waitForServices marks an error of Redis or Postgres: the batch waits for them without using up its retries
// (fail closed: nothing is sent meanwhile, and nothing is given up on).
func waitForServices(err error) error {
	var re *RetryError
	if errors.As(err, &re) {
		return err
	}
	return &RetryError{Err: err, After: 5 * time.Second}
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
