package main

import (
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

func (a *app) newResumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resume ID",
		Short: "Queue again every batch of a campaign that still has pending recipients (safe to repeat)",
		Long: `Queue again every batch that still has pending recipients. Batches already queued, retrying or in the
DLQ keep their task (task IDs are deterministic), so resume is safe to run twice or while workers run.
Counters are rebuilt from Postgres.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			engine, rdb, closeAll, err := a.openServices(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			store := campaign.NewStore(engine)
			c, err := store.Get(ctx, id)
			if err != nil {
				return err
			}
			switch c.State {
			case campaign.StateRunning, campaign.StateScheduled:
			case campaign.StatePaused:
				to := campaign.StateRunning
				if c.StartAt != nil && c.StartAt.After(time.Now()) {
					to = campaign.StateScheduled
				}
				if _, err := store.Transition(ctx, id, []campaign.State{campaign.StatePaused}, to); err != nil {
					return err
				}
				c.State = to
				fmt.Fprintf(a.stdout, "campaign %d is %s again\n", id, to)
			default:
				return usagef("campaign %d is %s; only a running, scheduled or paused campaign can be resumed", id, c.State)
			}
			counts, err := store.Counts(ctx, id)
			if err != nil {
				return err
			}
			if err := rdb.HSet(ctx, worker.ProgressKey(id), map[string]any{
				campaign.StatusSent: counts.Sent, campaign.StatusFailed: counts.Failed,
				campaign.StatusSkipped: counts.Skipped, campaign.StatusUnknown: counts.Unknown,
			}).Err(); err != nil {
				return fmt.Errorf("rebuild counters: %w", err)
			}
			added, existing, err := worker.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), store, c, false)
			if err != nil {
				return err
			}
			done, err := store.CompleteIfDone(ctx, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "campaign %d: %d pending recipients; %d batches re-enqueued, %d already queued; %d unknown\n",
				id, counts.Pending, added, existing, counts.Unknown)
			if done {
				fmt.Fprintf(a.stdout, "campaign %d had nothing pending and is now completed\n", id)
			}
			return nil
		},
	}
}
