package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

func (a *app) newResumeCmd() *cobra.Command {
	var resendUnknown bool
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Continue a campaign after a pause or any incident: re-queue, rebuild counters, report (safe to repeat)",
		Long: `Continue a campaign after a pause or after any incident: a killed worker or launch, Redis restarted
empty (queues, claims and counters gone), Postgres restarted.

resume reads Postgres, the source of truth, and
  - continues a paused campaign,
  - queues every batch that still has pending recipients and is not queued (task IDs are deterministic:
    a batch already queued, retrying or running keeps its task, so resume is safe to run twice or while
    workers run),
  - takes the campaign's batches out of the dead-letter queue and queues them with a fresh retry budget,
  - rebuilds the progress counters,
and prints what it found and did.

Recipients whose outcome is unknown (the provider's answer was lost, or a worker died after claiming
them) are not sent again unless you say so with --resend-unknown: then each is sent once more with the
same promo code, unless its claim shows the provider had accepted it. A completed campaign can be resumed
only with --resend-unknown.`,
		Example: `  campaignctl resume 42
  campaignctl resume 42 --resend-unknown`,
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
			return a.resume(ctx, campaign.NewStore(engine), rdb, id, resendUnknown)
		},
	}
	cmd.Flags().BoolVar(&resendUnknown, "resend-unknown", false, "send again the recipients whose outcome is unknown (each may get the message twice, with the same code)")
	return cmd
}

func (a *app) resume(ctx context.Context, store *campaign.Store, rdb *redis.Client, id int64, resendUnknown bool) error {
	c, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	counts, err := store.Counts(ctx, id)
	if err != nil {
		return err
	}
	switch c.State {
	case campaign.StateRunning, campaign.StateScheduled:
	case campaign.StatePaused, campaign.StateCompleted:
		if c.State == campaign.StateCompleted && (!resendUnknown || counts.Unknown == 0) {
			hint := ""
			if counts.Unknown > 0 {
				hint = fmt.Sprintf(" (%d recipients are unknown: `campaignctl resume %d --resend-unknown` sends them again)", counts.Unknown, id)
			}
			return fmt.Errorf("%w: campaign %d is completed; there is nothing to resume%s", campaign.ErrWrongState, id, hint)
		}
		to := campaign.StateRunning
		if c.StartAt != nil && c.StartAt.After(time.Now()) {
			to = campaign.StateScheduled
		}
		if _, err := store.Transition(ctx, id, []campaign.State{c.State}, to); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "campaign %d was %s and is %s again\n", id, c.State, to)
		c.State = to
	default:
		return fmt.Errorf("%w: campaign %d is %s and cannot be resumed; only a running, scheduled, paused (or, with --resend-unknown, completed) campaign can",
			campaign.ErrWrongState, id, c.State)
	}
	if err := worker.Unhalt(ctx, rdb, id); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "campaign %d found: %d planned, %d sent, %d failed, %d skipped, %d unknown, %d pending\n",
		id, counts.Planned, counts.Sent, counts.Failed, counts.Skipped, counts.Unknown, counts.Pending)

	if resendUnknown && counts.Unknown > 0 {
		users, err := store.Unknown(ctx, id)
		if err != nil {
			return err
		}
		// Claims first: a recipient back in pending with its old claim would only be found unknown again.
		if err := worker.ForgetUnanswered(ctx, rdb, c, users); err != nil {
			return err
		}
		n, err := store.Resend(ctx, id, users)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%d unknown recipients will be sent again, with the codes they already hold\n", n)
		if counts, err = store.Counts(ctx, id); err != nil {
			return err
		}
	}

	// Counters are a fast view for the progress bars; Postgres has the truth.
	if err := rdb.HSet(ctx, worker.ProgressKey(id), map[string]any{
		campaign.StatusSent: counts.Sent, campaign.StatusFailed: counts.Failed,
		campaign.StatusSkipped: counts.Skipped, campaign.StatusUnknown: counts.Unknown,
	}).Err(); err != nil {
		return fmt.Errorf("rebuild counters: %w", err)
	}

	fromDLQ, err := a.requeueArchived(ctx, rdb, id)
	if err != nil {
		return err
	}
	added, existing, err := worker.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), store, c, false)
	if err != nil {
		return err
	}
	done, err := store.CompleteIfDone(ctx, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "campaign %d: %d batches re-enqueued, %d already queued, %d taken back from the DLQ; %d recipients pending, %d unknown\n",
		id, added, max(existing-fromDLQ, 0), fromDLQ, counts.Pending, counts.Unknown)
	if counts.Unknown > 0 && !resendUnknown {
		fmt.Fprintf(a.stdout, "unknown recipients are not sent again by default; `campaignctl resume %d --resend-unknown` does\n", id)
	}
	if done {
		fmt.Fprintf(a.stdout, "campaign %d had nothing pending and is now completed\n", id)
	}
	return nil
}

// requeueArchived puts the campaign's dead-lettered batches back in the queue with a fresh retry budget,
// and returns how many it moved.
func (a *app) requeueArchived(ctx context.Context, rdb *redis.Client, id int64) (int, error) {
	entries, err := archivedBatches(rdb, id)
	if err != nil {
		return 0, err
	}
	for i, e := range entries {
		if err := requeue(ctx, rdb, e); err != nil {
			return i, err
		}
	}
	return len(entries), nil
}

// requeue moves one dead-lettered batch back to the queue. Running an archived task again would keep its
// used-up retry count (the next failure would archive it at once), so the task is deleted and enqueued
// anew under the same ID.
func requeue(ctx context.Context, rdb *redis.Client, e dlqEntry) error {
	if err := asynq.NewInspectorFromRedisClient(rdb).DeleteTask(worker.Queue, e.TaskID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return fmt.Errorf("take batch %d of campaign %d from the DLQ: %w", e.Batch, e.CampaignID, err)
	}
	task, err := worker.NewBatchTask(e.CampaignID, e.Batch)
	if err != nil {
		return err
	}
	if _, err := asynq.NewClientFromRedisClient(rdb).EnqueueContext(ctx, task); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("queue batch %d of campaign %d: %w; run `campaignctl resume %d` to queue it", e.Batch, e.CampaignID, err, e.CampaignID)
	}
	return nil
}
