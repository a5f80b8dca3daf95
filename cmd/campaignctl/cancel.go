package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/worker"
)

func (a *app) newCancelCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "End a campaign: nothing more is sent, unsent recipients are skipped (cancelled) and their codes go back to the pool",
		Long: `End a campaign for good. No new send starts on any worker once cancel has recorded it. Every recipient
not sent yet becomes skipped (cancelled) and its promo code goes back to its pool; recipients whose send
was already answered keep that outcome, and a send still waiting for the provider is recorded when it
returns. Batches that a worker is sending are closed when that worker lets them go (within --wait);
batches of a worker that died are closed from their Redis claims, like resume does.

A cancelled campaign cannot be resumed, and its dead-lettered batches are not retried.`,
		Example: `  campaignctl cancel 42`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if wait < 0 {
				return usagef("--wait %v: give a duration of zero or more, e.g. --wait 1m", wait)
			}
			engine, rdb, closeAll, err := a.openServices(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			store := campaign.NewStore(engine)
			was, err := store.Transition(ctx, id, []campaign.State{campaign.StateRunning, campaign.StateScheduled, campaign.StatePaused},
				campaign.StateCancelled)
			if err != nil {
				return fmt.Errorf("%w; only a running, scheduled or paused campaign can be cancelled", err)
			}
			if err := worker.Halt(ctx, rdb, id, string(campaign.StateCancelled), worker.DefaultClaimTTL); err != nil {
				a.logger().Warn("cancel recorded in Postgres, but not in Redis; workers stop at their next chunk instead of their next send", "err", err)
			}
			fmt.Fprintf(a.stdout, "campaign %d cancelled (was %s); no new send starts on any worker\n", id, was)
			return a.closeCancelled(ctx, rdb, store, id, wait)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", time.Minute, "how long to wait for workers to let go of the batches they are sending")
	return cmd
}

// closeCancelled turns the pending recipients of a cancelled campaign into skipped (cancelled): first in
// bulk those no run holds, then batch by batch the rest, reading their claims.
func (a *app) closeCancelled(ctx context.Context, rdb *redis.Client, store *campaign.Store, id int64, wait time.Duration) error {
	if _, err := store.CancelUnleased(ctx, id); err != nil {
		return err
	}
	host, _ := os.Hostname()
	h := worker.NewHandler(worker.Config{Store: store, Redis: rdb, Logger: a.logger(), Owner: fmt.Sprintf("%s:%d:cancel", host, os.Getpid())})
	deadline := time.Now().Add(wait)
	for {
		batches, err := store.PendingBatches(ctx, id, false)
		if err != nil {
			return err
		}
		held := 0
		for _, b := range batches {
			var re *worker.RetryError
			if err := h.RunBatch(ctx, id, b); errors.As(err, &re) {
				held++
			} else if err != nil {
				return err
			}
		}
		if held == 0 || time.Now().After(deadline) {
			break
		}
		if err := limiter.Sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	counts, err := store.Counts(ctx, id)
	if err != nil {
		return err
	}
	c, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	cancelled, err := store.CountReason(ctx, id, campaign.StatusSkipped, campaign.ReasonCancelled)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "campaign %d: %d recipients skipped (cancelled)", id, cancelled)
	if c.CodePool != "" {
		fmt.Fprintf(a.stdout, ", their codes back in pool %s", c.CodePool)
	}
	fmt.Fprintf(a.stdout, "; %d sent, %d failed, %d skipped, %d unknown\n", counts.Sent, counts.Failed, counts.Skipped, counts.Unknown)
	if counts.Pending > 0 {
		// A live worker still holds them; its batch tasks close them when it lets go.
		added, _, err := worker.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), store, c, false)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%d recipients are still held by a worker; %d batches queued so that a worker closes them (campaignctl status %d)\n",
			counts.Pending, added, id)
	}
	return nil
}
