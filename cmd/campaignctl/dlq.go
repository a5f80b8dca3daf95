package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/worker"
)

type dlqOptions struct {
	campaign int64
	json     bool
	// campaignGiven: --campaign was given (0 is then no campaign, not "every campaign").
	campaignGiven bool
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
			RunE:    func(cmd *cobra.Command, _ []string) error { return a.dlq(cmd.Context(), o.given(cmd), "list") },
		},
		&cobra.Command{
			Use: "retry", Short: "Queue dead-lettered batches again with a fresh retry budget", Args: cobra.NoArgs,
			Example: `  campaignctl dlq retry --campaign 42`,
			RunE:    func(cmd *cobra.Command, _ []string) error { return a.dlq(cmd.Context(), o.given(cmd), "retry") },
		},
		&cobra.Command{
			Use: "purge", Short: "Drop dead-lettered batches (their recipients stay pending)", Args: cobra.NoArgs,
			Example: `  campaignctl dlq purge --campaign 42`,
			RunE:    func(cmd *cobra.Command, _ []string) error { return a.dlq(cmd.Context(), o.given(cmd), "purge") },
		},
	)
	return cmd
}

// given is o with campaignGiven read from cmd's flags.
func (o dlqOptions) given(cmd *cobra.Command) dlqOptions {
	o.campaignGiven = cmd.Flags().Changed("campaign")
	return o
}

func (o *dlqOptions) validate() error {
	if o.campaign < 0 || o.campaignGiven && o.campaign == 0 {
		return usagef("--campaign %d: give a campaign ID (campaignctl status lists them)", o.campaign)
	}
	return nil
}

func (a *app) dlq(ctx context.Context, o dlqOptions, action string) error {
	if err := o.validate(); err != nil {
		return err
	}
	svc, err := a.openServices(ctx, 0)
	if err != nil && action == "list" && postgresAway(err) {
		// The DLQ is in Redis: during a Postgres incident ops can still see it (the campaign given is
		// not checked then).
		rdb, rerr := a.openRedis(ctx)
		if rerr != nil {
			return err
		}
		defer rdb.Close()
		a.logger().Warn("Postgres is unreachable: the DLQ below is read from Redis alone (a --campaign that does not exist lists nothing)", "err", err)
		return a.dlqList(ctx, worker.DLQOptions{Redis: rdb, CampaignID: o.campaign}, o.json)
	}
	if err != nil {
		return err
	}
	defer svc.Close()
	opts := worker.DLQOptions{Store: svc.store, Redis: svc.redis, CampaignID: o.campaign}
	switch action {
	case "list":
		return a.dlqList(ctx, opts, o.json)
	case "retry":
		rep, err := worker.RetryDLQ(ctx, opts)
		if o.json && (err == nil || len(rep.Refused) > 0) {
			// Refused for the campaign given (its state, its consents too old): the report still says which
			// batches, and the error why, with its exit code. A script read nothing at all.
			if jerr := json.NewEncoder(a.stdout).Encode(rep); err == nil {
				return jerr
			}
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%d batches queued again\n", worker.DistinctBatches(rep.Queued))
		if len(rep.Queued) == 0 && len(rep.Refused) == 0 {
			// An empty DLQ after Redis lost its data (the DLQ went with it): the batches are back with resume.
			which, id := "", "ID"
			if o.campaign > 0 {
				id = strconv.FormatInt(o.campaign, 10)
				which = " of campaign " + id
			}
			fmt.Fprintf(a.stderr, "note: the DLQ holds no batch%s. A campaign whose recipients are pending with nothing queued (campaignctl status says redis_lost_data: Redis lost its data, the DLQ with it) goes on with `campaignctl resume %s`\n", which, id)
		}
		for _, r := range rep.Refused {
			if r.Why != "" {
				fmt.Fprintf(a.stdout, "batch %d of campaign %d not retried: %s\n", r.Batch, r.CampaignID, r.Why)
				continue
			}
			fmt.Fprintf(a.stdout, "batch %d of campaign %d not retried: the campaign is %s\n", r.Batch, r.CampaignID, r.State)
		}
	case "purge":
		rep, err := worker.PurgeDLQ(ctx, opts)
		if err != nil {
			return err
		}
		if o.json {
			return json.NewEncoder(a.stdout).Encode(rep)
		}
		fmt.Fprintf(a.stdout, "%d batches dropped from the DLQ; their recipients stay pending (`campaignctl resume ID` queues them again)\n", worker.DistinctBatches(rep.Dropped))
	}
	return nil
}

// dlqAttempts is how many times a dead-lettered batch ran: each failure before the last counted in
// Retried, and the last, once the retries were used up or when it was sent there at once (its last error
// starts with worker.DLQAtOnce), not; a batch moved to the DLQ by hand (asynqmon's archive) ran as often
// as it failed, none if it never did. Before, every batch showed Retried+1: one moved there before it ever
// ran showed one attempt; and one sent there at once by its first run showed none.
func dlqAttempts(e worker.DLQEntry) int {
	if e.LastFailedAt != nil && (e.Retried >= e.MaxRetry || strings.HasPrefix(e.LastError, worker.DLQAtOnce)) {
		return e.Retried + 1
	}
	return e.Retried
}

// dlqList prints the dead-lettered batches opts selects.
func (a *app) dlqList(ctx context.Context, opts worker.DLQOptions, asJSON bool) error {
	entries, err := worker.ListDLQ(ctx, opts)
	if err != nil {
		return err
	}
	if asJSON {
		if entries == nil {
			entries = []worker.DLQEntry{}
		}
		return json.NewEncoder(a.stdout).Encode(entries)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CAMPAIGN\tBATCH\tATTEMPTS\tLAST FAILED\tLAST ERROR")
	for _, e := range entries {
		failed := "—" // moved there by hand before it ever failed
		if e.LastFailedAt != nil {
			failed = e.LastFailedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\n", e.CampaignID, e.Batch, dlqAttempts(e), failed, e.LastError)
	}
	return w.Flush()
}
