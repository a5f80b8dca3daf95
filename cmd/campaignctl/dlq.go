package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// dlqEntry is the stable --json shape of one dead-lettered batch.
type dlqEntry struct {
	TaskID       string    `json:"task_id"`
	CampaignID   int64     `json:"campaign_id"`
	Batch        int       `json:"batch"`
	Retried      int       `json:"retried"`
	MaxRetry     int       `json:"max_retry"`
	LastError    string    `json:"last_error"`
	LastFailedAt time.Time `json:"last_failed_at"`
}

type dlqOptions struct {
	campaign int64
	json     bool
}

func (a *app) newDLQCmd() *cobra.Command {
	var o dlqOptions
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "The dead-letter queue: batches that used up their retries (Asynq's archive)",
		Long: `Batches that used up their retries wait in Asynq's archive, the dead-letter queue. Their recipients
stay pending in Postgres: nothing is lost, nothing is sent until the batch is retried.`,
		Example: `  campaignctl dlq list --json
  campaignctl dlq retry --campaign 42`,
	}
	cmd.PersistentFlags().Int64Var(&o.campaign, "campaign", 0, "only this campaign's batches")
	cmd.PersistentFlags().BoolVar(&o.json, "json", false, "print JSON")
	cmd.AddCommand(
		&cobra.Command{
			Use: "list", Short: "Show dead-lettered batches with campaign, batch, attempts and last error", Args: cobra.NoArgs,
			Example: `  campaignctl dlq list --campaign 42`,
			RunE:    func(cmd *cobra.Command, _ []string) error { return a.dlq(cmd.Context(), o, "list") },
		},
		&cobra.Command{
			Use: "retry", Short: "Queue dead-lettered batches again with a fresh retry budget", Args: cobra.NoArgs,
			Example: `  campaignctl dlq retry --campaign 42`,
			RunE:    func(cmd *cobra.Command, _ []string) error { return a.dlq(cmd.Context(), o, "retry") },
		},
		&cobra.Command{
			Use: "purge", Short: "Drop dead-lettered batches (their recipients stay pending)", Args: cobra.NoArgs,
			Example: `  campaignctl dlq purge --campaign 42`,
			RunE:    func(cmd *cobra.Command, _ []string) error { return a.dlq(cmd.Context(), o, "purge") },
		},
	)
	return cmd
}

func (a *app) dlq(ctx context.Context, o dlqOptions, action string) error {
	if o.campaign < 0 {
		return usagef("--campaign %d: give a campaign ID (campaignctl status lists them)", o.campaign)
	}
	engine, rdb, closeAll, err := a.openServices(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	store := campaign.NewStore(engine)
	if o.campaign != 0 {
		if _, err := store.Get(ctx, o.campaign); err != nil {
			return err
		}
	}
	entries, err := archivedBatches(rdb, o.campaign)
	if err != nil {
		return err
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	switch action {
	case "list":
		if o.json {
			if entries == nil {
				entries = []dlqEntry{}
			}
			return json.NewEncoder(a.stdout).Encode(entries)
		}
		w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "CAMPAIGN\tBATCH\tATTEMPTS\tLAST FAILED\tLAST ERROR")
		for _, e := range entries {
			fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\n", e.CampaignID, e.Batch, e.Retried+1, e.LastFailedAt.UTC().Format(time.RFC3339), e.LastError)
		}
		return w.Flush()
	case "retry":
		// Decide for every batch before moving any: a refusal leaves the DLQ as it was.
		var ok, refused []dlqEntry
		states := map[int64]campaign.State{}
		for _, e := range entries {
			st, seen := states[e.CampaignID]
			if !seen {
				c, err := store.Get(ctx, e.CampaignID)
				if err != nil {
					return err
				}
				st, states[e.CampaignID] = c.State, c.State
			}
			if st == campaign.StateCancelled || st == campaign.StateFailed || st == campaign.StateCompleted {
				refused = append(refused, e)
				continue
			}
			ok = append(ok, e)
		}
		if o.campaign != 0 && len(refused) > 0 {
			return usagef("the DLQ batches of campaign %d are not retried: the campaign is %s, so nothing more is sent for it (drop them with `campaignctl dlq purge --campaign %d`)",
				o.campaign, states[o.campaign], o.campaign)
		}
		for _, e := range ok {
			if err := requeue(ctx, rdb, e); err != nil {
				return err
			}
		}
		fmt.Fprintf(a.stdout, "%d batches queued again\n", len(ok))
		for _, e := range refused {
			fmt.Fprintf(a.stdout, "batch %d of campaign %d not retried: the campaign is %s\n", e.Batch, e.CampaignID, states[e.CampaignID])
		}
	case "purge":
		for _, e := range entries {
			if err := insp.DeleteTask(worker.Queue, e.TaskID); err != nil {
				return fmt.Errorf("purge batch %d of campaign %d: %w", e.Batch, e.CampaignID, err)
			}
		}
		fmt.Fprintf(a.stdout, "%d batches dropped from the DLQ; their recipients stay pending (`campaignctl resume ID` queues them again)\n", len(entries))
	}
	return nil
}

// archivedBatches lists the archived batch tasks, of one campaign or all (0).
func archivedBatches(rdb *redis.Client, campaignID int64) ([]dlqEntry, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	var out []dlqEntry
	for page := 1; ; page++ {
		tasks, err := insp.ListArchivedTasks(worker.Queue, asynq.Page(page), asynq.PageSize(1000))
		if err != nil {
			if errors.Is(err, asynq.ErrQueueNotFound) || strings.Contains(err.Error(), "does not exist") {
				return out, nil
			}
			return nil, fmt.Errorf("read the DLQ: %w", err)
		}
		for _, t := range tasks {
			cid, batch, ok := parseTaskID(t.ID)
			if !ok || (campaignID != 0 && cid != campaignID) {
				continue
			}
			out = append(out, dlqEntry{TaskID: t.ID, CampaignID: cid, Batch: batch, Retried: t.Retried, MaxRetry: t.MaxRetry,
				LastError: t.LastErr, LastFailedAt: t.LastFailedAt})
		}
		if len(tasks) < 1000 {
			return out, nil
		}
	}
}

func parseTaskID(id string) (int64, int, bool) {
	c, b, ok := strings.Cut(id, ":")
	if !ok {
		return 0, 0, false
	}
	cid, err1 := strconv.ParseInt(c, 10, 64)
	batch, err2 := strconv.Atoi(b)
	return cid, batch, err1 == nil && err2 == nil
}
