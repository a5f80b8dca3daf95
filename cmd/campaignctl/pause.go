package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

func (a *app) newPauseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pause ID",
		Short: "Stop a campaign's sends on every worker; `campaignctl resume ID` continues",
		Long: `Stop a campaign's sends on every worker. Postgres records the pause, and a halt mark in Redis makes
every worker check it before its next claim: no new send starts after pause returns (the sends already
waiting for the provider finish and are recorded). Running batches write their outcomes and hand the rest
back; queued batches wait. Nothing is lost: the recipients stay pending until ` + "`campaignctl resume ID`" + `.`,
		Example: `  campaignctl pause 42`,
		Args:    cobra.ExactArgs(1),
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
			was, err := campaign.NewStore(engine).Transition(ctx, id,
				[]campaign.State{campaign.StateRunning, campaign.StateScheduled}, campaign.StatePaused)
			if err != nil {
				return fmt.Errorf("%w; only a running or scheduled campaign can be paused", err)
			}
			if err := worker.Halt(ctx, rdb, id, string(campaign.StatePaused), 0); err != nil {
				// Postgres holds the pause: workers still stop at their next chunk (25 recipients).
				a.logger().Warn("pause recorded in Postgres, but not in Redis; workers stop at their next chunk instead of their next send", "err", err)
			}
			fmt.Fprintf(a.stdout, "campaign %d paused (was %s); no new send starts on any worker. Continue with `campaignctl resume %d`\n", id, was, id)
			return nil
		},
	}
}
