package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

type pauseOptions struct {
	id int64
}

func (a *app) newPauseCmd() *cobra.Command {
	var o pauseOptions
	return &cobra.Command{
		Use:   "pause ID",
		Short: "Stop a campaign's sends on every worker; `campaignctl resume ID` continues",
		Long: `Stop a campaign's sends on every worker. Postgres records the pause, and a halt mark in Redis makes
every worker check it before its next claim: no new send starts after pause returns (the sends already
waiting for the provider finish and are recorded). Running batches write their outcomes and hand the rest
back; queued batches wait. Nothing is lost: the recipients stay pending until ` + "`campaignctl resume ID`" + `.`,
		Example: `  campaignctl pause 42`,
		Args:    exactlyOne("a campaign ID", campaignIDHint("pause")),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.id, err = parseID(args[0]); err != nil {
				return err
			}
			return a.pause(cmd.Context(), o)
		},
	}
}

func (a *app) pause(ctx context.Context, o pauseOptions) error {
	// Redis not answering: the pause is recorded in Postgres, and says its halt mark is not written.
	svc, err := a.openServicesForHalt(ctx, o.id)
	if err != nil {
		return err
	}
	defer svc.Close()
	rep, err := worker.Pause(ctx, worker.PauseOptions{Store: svc.store, Redis: svc.redis, CampaignID: o.id, Logger: a.logger()})
	if err != nil {
		return err
	}
	if !rep.Halted {
		what := "paused in Postgres, but the halt mark could not be written to Redis"
		if rep.Was == campaign.StatePaused {
			what = "is paused already; its halt mark could not be written to Redis"
		}
		fmt.Fprintf(a.stdout, "campaign %d %s: each worker stops at its next chunk, after the sends of the chunk it holds. Run `campaignctl pause %d` again once Redis is reachable to stop them at once; continue with `campaignctl resume %d`\n", rep.CampaignID, what, rep.CampaignID, rep.CampaignID)
		return nil
	}
	if rep.Was == campaign.StatePaused {
		fmt.Fprintf(a.stdout, "campaign %d is paused already; its halt mark is written in Redis: no new send starts on any worker. Continue with `campaignctl resume %d`\n", rep.CampaignID, rep.CampaignID)
		return nil
	}
	fmt.Fprintf(a.stdout, "campaign %d paused (was %s); no new send starts on any worker. Continue with `campaignctl resume %d`\n", rep.CampaignID, rep.Was, rep.CampaignID)
	return nil
}
