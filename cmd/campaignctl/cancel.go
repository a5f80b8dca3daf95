package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

type cancelOptions struct {
	id   int64
	wait time.Duration
}

func (o *cancelOptions) validate() error {
	if o.wait < 0 {
		return usagef("--wait %v: give a duration of zero or more, e.g. --wait 1m", o.wait)
	}
	return nil
}

func (a *app) newCancelCmd() *cobra.Command {
	var o cancelOptions
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "End a campaign: nothing more is sent, unsent recipients are skipped (cancelled) and their codes go back to the pool",
		Long: `End a campaign for good. No new send starts on any worker once cancel has recorded it. Every recipient
not sent yet becomes skipped (cancelled) and its promo code goes back to its pool; recipients whose send
was already answered keep that outcome, and a send still waiting for the provider is recorded when it
returns. A recipient once recorded unknown and made pending again by resume --resend-unknown stays
unknown, with its code: its first message may have gone out. Batches that a worker is sending are closed
when that worker lets them go (within --wait);
batches of a worker that died are closed from their Redis claims, like resume does.

A cancelled campaign cannot be resumed, and its dead-lettered batches are not retried.`,
		Example: `  campaignctl cancel 42`,
		Args:    exactlyOne("a campaign ID", campaignIDHint("cancel")),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.id, err = parseID(args[0]); err != nil {
				return err
			}
			if err := o.validate(); err != nil {
				return err
			}
			return a.cancel(cmd.Context(), o)
		},
	}
	cmd.Flags().DurationVar(&o.wait, "wait", time.Minute, "how long to wait for workers to let go of the batches they are sending")
	return cmd
}

func (a *app) cancel(ctx context.Context, o cancelOptions) error {
	svc, err := a.openServicesForHalt(ctx, o.id)
	if err != nil {
		return err
	}
	defer svc.Close()
	// Redis not answering: recorded in Postgres, and what no run holds is closed there; the rest is the
	// workers' to close once Redis answers.
	host, _ := os.Hostname()
	rep, err := worker.Cancel(ctx, worker.CancelOptions{
		Store: svc.store, Redis: svc.redis, CampaignID: o.id, Wait: o.wait, Logger: a.logger(),
		Owner: fmt.Sprintf("%s:%d:cancel", host, os.Getpid()),
		Recorded: func(r worker.CancelReport) {
			if r.Was == campaign.StateCancelled {
				fmt.Fprintf(a.stdout, "campaign %d is cancelled already; closing what is left of it\n", r.CampaignID)
				return
			}
			if !r.Halted {
				fmt.Fprintf(a.stdout, "campaign %d cancelled in Postgres (was %s), but the halt mark could not be written to Redis: each worker stops at its next chunk, after the sends of the chunk it holds\n", r.CampaignID, r.Was)
				return
			}
			fmt.Fprintf(a.stdout, "campaign %d cancelled (was %s); no new send starts on any worker\n", r.CampaignID, r.Was)
		},
		Waiting: func(held int, upTo time.Duration) {
			fmt.Fprintf(a.stderr, "waiting for the workers to let go of %d batches (a dead worker's lease runs out first), up to %v more (--wait)\n",
				held, upTo.Round(time.Second))
		},
	})
	c := rep.Counts
	if c.Planned > 0 && rep.Was == campaign.StateCancelled {
		// What its first cancel did: said as that, not as this command's work.
		fmt.Fprintf(a.stdout, "campaign %d: %d recipients skipped (cancelled) in all", rep.CampaignID, rep.Cancelled)
	} else if c.Planned > 0 {
		fmt.Fprintf(a.stdout, "campaign %d: %d recipients skipped (cancelled)", rep.CampaignID, rep.Cancelled)
		if rep.CodePool != "" && rep.Cancelled > 0 {
			fmt.Fprintf(a.stdout, ", their codes back in pool %s", rep.CodePool)
		}
	}
	if c.Planned > 0 {
		fmt.Fprintf(a.stdout, "; %d sent, %d failed, %d skipped, %d unknown\n", c.Sent, c.Failed, c.Skipped, c.Unknown)
		if !rep.Halted && rep.Was != "" {
			// The runs still hold answers of their chunks (in Redis's claims, or in hand) that reach Postgres
			// with the chunk's end, or once Redis answers.
			fmt.Fprintf(a.stdout, "(Postgres's figures: the sends the workers' runs still hold are counted once they record them)\n")
		}
	}
	if err != nil && rep.Was != "" {
		// The cancel is recorded (nothing more is sent); closing its recipients stopped halfway (Postgres
		// restarted, say). The workers close them as they meet them; the same command finishes it now.
		return fmt.Errorf("%w; campaign %d is cancelled and nothing more is sent, but what is left of it is not all closed yet: the workers close it, or run campaignctl cancel %d again", err, o.id, o.id)
	}
	if err != nil {
		return err
	}
	if rep.QueueLeft {
		fmt.Fprintf(a.stdout, "its batches still in Redis's queue or DLQ were not taken out (Redis did not answer); each finds nothing to do. Run `campaignctl cancel %d` again once Redis answers to take them out and write the halt mark\n", rep.CampaignID)
	}
	if rep.Dequeued > 0 {
		fmt.Fprintf(a.stdout, "%d batches of it still queued taken out of the queue (nothing left to do)\n", rep.Dequeued)
	}
	if c.Pending > 0 {
		fmt.Fprintf(a.stdout, "%d recipients are still held by a worker; %d batches queued so that a worker closes them (campaignctl status %d)\n",
			c.Pending, rep.Requeued, rep.CampaignID)
	}
	return nil
}
