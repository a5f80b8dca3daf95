package worker

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
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
	// DLQ counts the campaign's batches that used up their retries.
	DLQ       int64  `json:"dlq"`
	CreatedAt string `json:"created_at"`
}

// Over reports whether the campaign has ended (completed, cancelled or failed): nothing more is sent.
func (s CampaignStatus) Over() bool {
	return s.State == campaign.StateCompleted || s.State == campaign.StateCancelled || s.State == campaign.StateFailed
}

// StatusOptions selects the campaign Status reads.
type StatusOptions struct {
	Store *campaign.Store
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
	dlq, err := archivedBatches(o.Redis, o.CampaignID)
	if err != nil {
		return CampaignStatus{}, err
	}
	return statusOf(ctx, o.Store, c, int64(len(dlq)))
}

// ListStatus reads where every campaign stands, newest first. The dead-letter queue is read once for all.
func ListStatus(ctx context.Context, o StatusOptions) ([]CampaignStatus, error) {
	list, err := o.Store.List(ctx)
	if err != nil {
		return nil, err
	}
	dlq := map[int64]int64{}
	if len(list) > 0 {
		entries, err := archivedBatches(o.Redis, 0)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			dlq[e.CampaignID]++
		}
	}
	out := make([]CampaignStatus, 0, len(list))
	for _, c := range list {
		s, err := statusOf(ctx, o.Store, c, dlq[c.ID])
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func statusOf(ctx context.Context, store *campaign.Store, c *campaign.Campaign, dlq int64) (CampaignStatus, error) {
	counts, err := store.Counts(ctx, c.ID)
	if err != nil {
		return CampaignStatus{}, err
	}
	delivered, undelivered, err := store.DeliveryCounts(ctx, c.ID)
	if err != nil {
		return CampaignStatus{}, err
	}
	return CampaignStatus{ID: c.ID, Name: c.Name, Channel: c.Channel, State: c.State, Audience: c.Audience, Eligible: c.Eligible,
		Excluded: c.Excluded, Counts: counts, Delivered: delivered, Undelivered: undelivered, DLQ: dlq,
		CreatedAt: c.CreatedAt.UTC().Format("2006-01-02T15:04:05Z")}, nil
}

// rebuildProgress sets the campaign's progress counters (ProgressKey) to counts, read from Postgres.
func rebuildProgress(ctx context.Context, rdb redis.UniversalClient, campaignID int64, counts campaign.Counts) error {
	if err := rdb.HSet(ctx, ProgressKey(campaignID), map[string]any{
		campaign.StatusSent: counts.Sent, campaign.StatusFailed: counts.Failed,
		campaign.StatusSkipped: counts.Skipped, campaign.StatusUnknown: counts.Unknown,
	}).Err(); err != nil {
		return fmt.Errorf("rebuild counters: %w", err)
	}
	return nil
}

// ProviderCalls reads, from the campaigns' progress counters, how many provider calls each campaign has
// made so far (sent, failed and unknown together), in one round trip. A campaign without counters has
// made none.
func ProviderCalls(ctx context.Context, rdb redis.UniversalClient, campaignIDs []int64) (map[int64]int64, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(campaignIDs))
	for i, id := range campaignIDs {
		cmds[i] = pipe.HMGet(ctx, ProgressKey(id), campaign.StatusSent, campaign.StatusFailed, campaign.StatusUnknown)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("progress counters: %w", err)
	}
	out := make(map[int64]int64, len(campaignIDs))
	for i, id := range campaignIDs {
		var n int64
		for _, v := range cmds[i].Val() {
			if s, ok := v.(string); ok {
				k, _ := strconv.ParseInt(s, 10, 64)
				n += k
			}
		}
		out[id] = n
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
