package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
)

// statusView is the stable --json shape of one campaign.
type statusView struct {
	ID       int64            `json:"id"`
	Name     string           `json:"name"`
	Channel  campaign.Channel `json:"channel"`
	State    campaign.State   `json:"state"`
	Audience int64            `json:"audience"`
	Eligible int64            `json:"eligible"`
	Excluded map[string]int64 `json:"excluded"`
	campaign.Counts
	// Delivered and Undelivered are what the providers' receipts said about the sent messages.
	Delivered   int64  `json:"delivered"`
	Undelivered int64  `json:"undelivered"`
	DLQ         int64  `json:"dlq"`
	CreatedAt   string `json:"created_at"`
}

func (a *app) newStatusCmd() *cobra.Command {
	var watch, asJSON bool
	cmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "Show a campaign's progress, or list campaigns",
		Example: `  campaignctl status
  campaignctl status 42 --json
  campaignctl status 42 --watch`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var id int64
			if len(args) == 1 {
				var err error
				if id, err = parseID(args[0]); err != nil {
					return err
				}
			} else if watch {
				return usagef("--watch needs a campaign ID: campaignctl status ID --watch")
			}
			engine, rdb, closeAll, err := a.openServices(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			store := campaign.NewStore(engine)
			if id == 0 {
				return a.listCampaigns(ctx, store, rdb, asJSON)
			}
			if watch {
				return a.watch(ctx, engine, rdb, id)
			}
			v, err := a.statusOf(ctx, store, rdb, id)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(v)
			}
			a.printStatus(v)
			return nil
		},
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "draw live progress until the campaign ends")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("campaign ID %q must be a positive number (campaignctl status lists them)", s)
	}
	return id, nil
}

func (a *app) statusOf(ctx context.Context, store *campaign.Store, rdb *redis.Client, id int64) (statusView, error) {
	c, err := store.Get(ctx, id)
	if err != nil {
		return statusView{}, err
	}
	counts, err := store.Counts(ctx, id)
	if err != nil {
		return statusView{}, err
	}
	dlq, err := dlqCount(rdb, id)
	if err != nil {
		return statusView{}, err
	}
	delivered, undelivered, err := store.DeliveryCounts(ctx, id)
	if err != nil {
		return statusView{}, err
	}
	return statusView{ID: c.ID, Name: c.Name, Channel: c.Channel, State: c.State, Audience: c.Audience, Eligible: c.Eligible,
		Excluded: c.Excluded, Counts: counts, Delivered: delivered, Undelivered: undelivered, DLQ: dlq,
		CreatedAt: c.CreatedAt.UTC().Format("2006-01-02T15:04:05Z")}, nil
}

// dlqCount counts the campaign's archived batches (Asynq's archive is the DLQ).
func dlqCount(rdb *redis.Client, id int64) (int64, error) {
	entries, err := archivedBatches(rdb, id)
	return int64(len(entries)), err
}

func (a *app) printStatus(v statusView) {
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "campaign %d\t%s (%s)\n", v.ID, v.Name, v.Channel)
	fmt.Fprintf(w, "state\t%s\n", v.State)
	fmt.Fprintf(w, "audience / eligible\t%d / %d\n", v.Audience, v.Eligible)
	for _, r := range slices.Sorted(maps.Keys(v.Excluded)) {
		fmt.Fprintf(w, "excluded: %s\t%d\n", r, v.Excluded[r])
	}
	fmt.Fprintf(w, "planned\t%d\n", v.Planned)
	fmt.Fprintf(w, "sent (accepted)\t%d\n", v.Sent)
	fmt.Fprintf(w, "  delivered / not delivered\t%d / %d\n", v.Delivered, v.Undelivered)
	fmt.Fprintf(w, "failed\t%d\n", v.Failed)
	fmt.Fprintf(w, "skipped\t%d\n", v.Skipped)
	fmt.Fprintf(w, "unknown\t%d\n", v.Unknown)
	fmt.Fprintf(w, "pending\t%d\n", v.Pending)
	fmt.Fprintf(w, "dlq batches\t%d\n", v.DLQ)
	w.Flush()
}

func (a *app) listCampaigns(ctx context.Context, store *campaign.Store, rdb *redis.Client, asJSON bool) error {
	list, err := store.List(ctx)
	if err != nil {
		return err
	}
	views := make([]statusView, 0, len(list))
	for _, c := range list {
		v, err := a.statusOf(ctx, store, rdb, c.ID)
		if err != nil {
			return err
		}
		views = append(views, v)
	}
	if asJSON {
		return json.NewEncoder(a.stdout).Encode(views)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tCHANNEL\tSTATE\tPLANNED\tSENT\tFAILED\tSKIPPED\tUNKNOWN\tPENDING\tDLQ\tCREATED")
	for _, v := range views {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", v.ID, v.Name, v.Channel, v.State,
			v.Planned, v.Sent, v.Failed, v.Skipped, v.Unknown, v.Pending, v.DLQ, v.CreatedAt)
	}
	return w.Flush()
}
