package worker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// CampaignStatus is where a campaign stands: Postgres's counts by status, what the providers' receipts
// said, and its batches in the dead-letter queue. The JSON is the stable shape of `campaignctl status
// --json`.
type CampaignStatus struct {
	ID       int64            `json:"id"`
	Name     string           `json:"name"`
	Channel  campaign.Channel `json:"channel"`
	State    campaign.State   `json:"state"`
	Audience int64            `json:"audience"`
	Eligible int64            `json:"eligible"`
	Excluded map[string]int64 `json:"excluded"`
	campaign.Counts
	// Delivered and Undelivered are what the providers' receipts said about the sent messages.
	Delivered   int64 `json:"delivered"`
	Undelivered int64 `json:"undelivered"`
	// DLQ counts the campaign's batches that used up their retries; nil (null) when Redis, which holds
	// them, could not be read.
	DLQ       *int64 `json:"dlq"`
	CreatedAt string `json:"created_at"`
	// StartAt is when a scheduled campaign starts (launch --at); StartedAt when it started sending,
	// FinishedAt when it ended. All UTC; null when not set.
	StartAt    *time.Time `json:"start_at"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	// FailedByReason and SkippedByReason count the failed and skipped recipients by reason (the ten
	// most frequent of each).
	FailedByReason  map[string]int64 `json:"failed_by_reason"`
	SkippedByReason map[string]int64 `json:"skipped_by_reason"`
	// Waiting says why the campaign is not moving; absent while it moves (or is over).
	Waiting *Waiting `json:"waiting,omitempty"`
	// RedisUnavailable is set when Redis could not be read: the figures are Postgres's alone (the DLQ
	// and the waiting reason are unknown).
	RedisUnavailable bool `json:"redis_unavailable,omitempty"`
}

// DLQText is the DLQ count as status prints it: "unknown" when Redis could not be read.
func (s CampaignStatus) DLQText() string {
	if s.DLQ == nil {
		return "unknown"
	}
	return strconv.FormatInt(*s.DLQ, 10)
}

// Over reports whether the campaign has ended (completed, cancelled or failed): nothing more is sent.
func (s CampaignStatus) Over() bool {
	return s.State.Over()
}

// StatusOptions selects the campaign Status reads.
type StatusOptions struct {
	Store *campaign.Store
	// Redis is nil when it cannot be reached: the status is then Postgres's alone (RedisUnavailable).
	Redis redis.UniversalClient
	// CampaignID is the campaign Status reads; ListStatus reads every campaign.
	CampaignID int64
}

// Status reads where one campaign stands.
func Status(ctx context.Context, o StatusOptions) (CampaignStatus, error) {
	c, err := o.Store.Get(ctx, o.CampaignID)
	if err != nil {
		return CampaignStatus{}, err
	}
	if o.Redis == nil {
		s, err := statusOf(ctx, o.Store, nil, c, dlqBatches{})
		s.RedisUnavailable = true
		return s, err
	}
	entries, err := archivedBatches(o.Redis, o.CampaignID)
	if err != nil {
		return CampaignStatus{}, err
	}
	var dlq dlqBatches
	for _, e := range entries {
		dlq.add(e)
	}
	return statusOf(ctx, o.Store, newWaitEnv(o.Redis, o.Store), c, dlq)
}

// ListStatus reads where every campaign stands, newest first. The dead-letter queue is read once for all.
func ListStatus(ctx context.Context, o StatusOptions) ([]CampaignStatus, error) {
	list, err := o.Store.List(ctx)
	if err != nil {
		return nil, err
	}
	dlq := map[int64]dlqBatches{}
	if len(list) > 0 && o.Redis != nil {
		entries, err := archivedBatches(o.Redis, 0)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			d := dlq[e.CampaignID]
			d.add(e)
			dlq[e.CampaignID] = d
		}
	}
	out := make([]CampaignStatus, 0, len(list))
	var env *waitEnv
	if o.Redis != nil {
		env = newWaitEnv(o.Redis, o.Store)
	}
	for _, c := range list {
		s, err := statusOf(ctx, o.Store, env, c, dlq[c.ID])
		if err != nil {
			return nil, err
		}
		s.RedisUnavailable = o.Redis == nil
		out = append(out, s)
	}
	return out, nil
}

// statusOf reads one campaign's status; env (nil without Redis) gives what waitingOf reads of Redis.
func statusOf(ctx context.Context, store *campaign.Store, env *waitEnv, c *campaign.Campaign, dlq dlqBatches) (CampaignStatus, error) {
	counts, err := store.Counts(ctx, c.ID)
	if err != nil {
		return CampaignStatus{}, err
	}
	delivered, undelivered, err := store.DeliveryCounts(ctx, c.ID)
	if err != nil {
		return CampaignStatus{}, err
	}
	failed, skipped, err := store.ReasonCounts(ctx, c.ID, 10)
	if err != nil {
		return CampaignStatus{}, err
	}
	s := CampaignStatus{ID: c.ID, Name: c.Name, Channel: c.Channel, State: c.State, Audience: c.Audience, Eligible: c.Eligible,
		Excluded: c.Excluded, Counts: counts, Delivered: delivered, Undelivered: undelivered,
		CreatedAt: c.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"),
		StartAt:   utcOrNil(c.StartAt), StartedAt: utcOrNil(c.StartedAt), FinishedAt: utcOrNil(c.FinishedAt),
		FailedByReason: failed, SkippedByReason: skipped}
	if env != nil {
		s.DLQ = &dlq.n
		if s.Waiting, err = waitingOf(ctx, env, c, counts, dlq, time.Now()); err != nil {
			return CampaignStatus{}, err
		}
	}
	return s, nil
}

// dlqBatches is what status reads of a campaign's batches in the DLQ: how many, and when the last of
// them failed.
type dlqBatches struct {
	n       int64
	last    time.Time
	lastErr string       // the error of the batch that failed last (a consent too old, a refusal, ...)
	tasks   map[int]bool // the batches counted: a batch and its follow-ups are one
}

func (d *dlqBatches) add(e DLQEntry) {
	if d.tasks == nil {
		d.tasks = map[int]bool{}
	}
	if !d.tasks[e.Batch] {
		d.tasks[e.Batch] = true
		d.n++
	}
	if e.LastFailedAt != nil && e.LastFailedAt.After(d.last) {
		d.last = *e.LastFailedAt
		if e.LastError != "" {
			d.lastErr = e.LastError
		}
	}
}

// detail says why campaign id waits for the dead-letter queue and what to do, with the last batch's error:
// the cause (consents too old, an account refused) without a second command.
func (d *dlqBatches) detail(id int64) string {
	s := fmt.Sprintf("%s in the dead-letter queue (their retries used up, or a failure no retry would mend): see campaignctl dlq list --campaign %d, fix the cause, then campaignctl dlq retry --campaign %d", counted(int(d.n), "batch waits", "batches wait"), id, id)
	if d.lastErr != "" {
		s += ". The last one failed with: " + d.lastErr
	}
	return s
}

func utcOrNil(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	return utc(*t)
}

// rebuildProgress sets the campaign's progress counters (ProgressKey) to counts, read from Postgres.
func rebuildProgress(ctx context.Context, rdb redis.UniversalClient, campaignID int64, counts campaign.Counts) error {
	if err := rdb.HSet(ctx, ProgressKey(campaignID), map[string]any{
		campaign.StatusSent: counts.Sent, campaign.StatusFailed: counts.Failed,
		campaign.StatusSkipped: counts.Skipped, campaign.StatusUnknown: counts.Unknown,
		state.ProgressSegments: counts.Segments,
	}).Err(); err != nil {
		return fmt.Errorf("rebuild counters: %w", err)
	}
	return nil
}

// ProviderCalls reads, from the campaigns' progress counters, how many provider calls each campaign has
// made so far (sent, failed and unknown together), in one round trip. A campaign without counters has
// made none.
func ProviderCalls(ctx context.Context, rdb redis.UniversalClient, campaignIDs []int64) (map[int64]int64, error) {
	progress, err := providerProgress(ctx, rdb, campaignIDs)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]int64, len(progress))
	for id, p := range progress {
		out[id] = p.calls
	}
	return out, nil
}

// callsAndSegments is what a campaign's progress counters say of its provider calls.
type callsAndSegments struct {
	// calls: sent, failed and unknown; sent: accepted; segments: the SMS segments of those accepted.
	calls, sent, segments int64
}

// perMessage is the SMS segments a message has taken on average, 0 while no sent message counted any.
func (p callsAndSegments) perMessage() float64 {
	if p.sent <= 0 || p.segments <= 0 {
		return 0
	}
	return float64(p.segments) / float64(p.sent)
}

// providerProgress reads the campaigns' progress counters of provider calls and segments, in one round
// trip.
func providerProgress(ctx context.Context, rdb redis.UniversalClient, campaignIDs []int64) (map[int64]callsAndSegments, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(campaignIDs))
	for i, id := range campaignIDs {
		cmds[i] = pipe.HMGet(ctx, ProgressKey(id), campaign.StatusSent, campaign.StatusFailed, campaign.StatusUnknown, state.ProgressSegments)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("progress counters: %w", err)
	}
	out := make(map[int64]callsAndSegments, len(campaignIDs))
	for i, id := range campaignIDs {
		var n [4]int64
		for j, v := range cmds[i].Val() {
			if s, ok := v.(string); ok && j < len(n) {
				n[j], _ = strconv.ParseInt(s, 10, 64)
			}
		}
		out[id] = callsAndSegments{calls: n[0] + n[1] + n[2], sent: n[0], segments: n[3]}
	}
	return out, nil
}

// Pinger is a database that answers a ping (*pgxpool.Pool).
type Pinger interface {
	Ping(ctx context.Context) error
}

// Ready returns a readiness check for a worker: Redis and the engine database both answer.
func Ready(rdb redis.UniversalClient, db Pinger) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		if err := db.Ping(ctx); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		return nil
	}
}
