package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
)

func (a *app) newPauseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pause ID",
		Short: "Stop a campaign's sends on every worker; `campaignctl resume ID` continues",
		Long: `Stop a campaign's sends on every worker. Each running batch finishes the send in flight, writes its
outcomes and hands the rest back within one chunk (25 recipients); queued batches wait. Nothing is lost:
the recipients stay pending until ` + "`campaignctl resume ID`" + `.`,
		Example: `  campaignctl pause 42`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			engine, err := a.openEngine(ctx)
			if err != nil {
				return err
			}
			defer engine.Close()
			was, err := campaign.NewStore(engine).Transition(ctx, id,
				[]campaign.State{campaign.StateRunning, campaign.StateScheduled}, campaign.StatePaused)
			if err != nil {
				return fmt.Errorf("%w; only a running or scheduled campaign can be paused", err)
			}
			fmt.Fprintf(a.stdout, "campaign %d paused (was %s); sends stop within one chunk on every worker. Continue with `campaignctl resume %d`\n", id, was, id)
			return nil
		},
	}
}
