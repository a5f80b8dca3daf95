package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/worker"
)

type statusOptions struct {
	id          int64
	watch, json bool
	tz          string
	loc         *time.Location
}

func (o *statusOptions) validate() error {
	if o.id == 0 && o.watch {
		return usagef("--watch needs a campaign ID: campaignctl status ID --watch")
	}
	loc, err := time.LoadLocation(o.tz)
	if err != nil || o.tz == "" {
		return usagef("--tz %q is not a known time zone; use an IANA name such as Europe/Istanbul or UTC", o.tz)
	}
	o.loc = loc
	return nil
}

func (a *app) newStatusCmd() *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "Show a campaign's progress, or list campaigns",
		Example: `  campaignctl status
  campaignctl status 42 --json
  campaignctl status 42 --watch`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("status takes at most one campaign ID, not %d (%s): `campaignctl status` lists the campaigns, `campaignctl status 42` shows one", len(args), strings.Join(args, " "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				var err error
				if o.id, err = parseID(args[0]); err != nil {
					return err
				}
			}
			if err := o.validate(); err != nil {
				return err
			}
			return a.status(cmd.Context(), o)
		},
	}
	cmd.Flags().BoolVar(&o.watch, "watch", false, "draw live progress until the campaign ends")
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	cmd.Flags().StringVar(&o.tz, "tz", "Europe/Istanbul", "the time zone of the times shown in the table (JSON is always UTC)")
	return cmd
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("campaign ID %q must be a positive number (campaignctl status lists them)", s)
	}
	return id, nil
}

func (a *app) status(ctx context.Context, o statusOptions) error {
	svc, err := a.openServices(ctx, o.id)
	var bad usageError
	if errors.As(err, &bad) || errors.Is(err, campaign.ErrNotFound) {
		return err // a REDIS_URL that is not one, or no such campaign, is the user's to fix, not an outage to work around
	}
	var rdbErr error
	if err != nil && !o.watch {
		// The campaign's state is in Postgres: status answers without Redis, and says so.
		engine, perr := a.openEngine(ctx)
		if perr != nil {
			return err
		}
		rdbErr = err
		svc = &services{engine: engine, store: campaign.NewStore(engine)}
	} else if err != nil {
		// A watch goes on through a Redis outage (it shows Postgres's figures meanwhile): it starts in one
		// too, as status without --watch answers, instead of refusing to start.
		engine, perr := a.openEngine(ctx)
		if perr != nil {
			return err
		}
		rdb, _, cerr := a.newRedis()
		if cerr != nil {
			engine.Close()
			return err
		}
		svc = &services{engine: engine, redis: rdb, store: campaign.NewStore(engine)}
	}
	defer svc.Close()
	if rdbErr != nil {
		a.logger().Warn("Redis is unreachable from here: the status below is Postgres's alone (no DLQ count, no waiting reason); a worker that cannot reach Redis either sends nothing until it is back", "err", rdbErr)
	}
	opts := worker.StatusOptions{Store: svc.store, CampaignID: o.id}
	if svc.redis != nil {
		opts.Redis = svc.redis
	}
	switch {
	case o.id == 0:
		list, err := worker.ListStatus(ctx, opts)
		if err != nil {
			return err
		}
		if overdue := a.refusalsOverdue(ctx, svc); overdue > 0 && !o.json {
			defer fmt.Fprintf(a.stdout, "İYS: %d refusals not registered two business days after they came in (the law allows three): run campaignctl iys push\n", overdue)
		}
		return a.printStatusList(list, o.json, o.loc)
	case o.watch && o.json:
		// Progress on stderr; stdout gets the one object status --json prints, once the campaign ends.
		return a.watch(ctx, svc, o.id, func(v worker.CampaignStatus) error { return a.printStatusJSON(ctx, svc, v) })
	case o.watch:
		return a.watch(ctx, svc, o.id, nil)
	}
	v, err := worker.Status(ctx, opts)
	if err != nil {
		return err
	}
	if o.json {
		return a.printStatusJSON(ctx, svc, v)
	}
	overdue := a.refusalsOverdue(ctx, svc)
	a.printStatus(v, o.loc)
	if overdue > 0 {
		fmt.Fprintf(a.stdout, "İYS: %d refusals not registered two business days after they came in (the law allows three): run campaignctl iys push\n", overdue)
	}
	return nil
}

// printStatusJSON prints v as status --json does.
func (a *app) printStatusJSON(ctx context.Context, svc *services, v worker.CampaignStatus) error {
	return json.NewEncoder(a.stdout).Encode(struct {
		worker.CampaignStatus
		// Refusals received through the messages and still not in İYS two business days later.
		IYSRefusalsOverdue int `json:"iys_refusals_overdue"`
	}{v, a.refusalsOverdue(ctx, svc)})
}

// refusalsOverdue counts the refusals still not registered in İYS two business days after they came
// in, and logs an error when there are any (0 when the outbox cannot be read: status still answers).
func (a *app) refusalsOverdue(ctx context.Context, svc *services) int {
	sum, err := iys.Outbox(ctx, svc.engine, time.Now())
	if err != nil {
		return 0
	}
	if sum.Overdue > 0 {
		a.logger().Error("refusals not registered in İYS two business days after they came in: run campaignctl iys push", "overdue", sum.Overdue)
	}
	return sum.Overdue
}

// utcTime matches the UTC times (RFC 3339) that a waiting reason's detail gives, as --json keeps them.
var utcTime = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z\b`)

// detailInZone writes the UTC times of a waiting detail in loc, as the text view writes the times around
// it (a start in UTC beside its until in Istanbul time read as two different times).
func detailInZone(detail string, loc *time.Location) string {
	return utcTime.ReplaceAllStringFunc(detail, func(s string) string { return inZone(s, loc) })
}

func (a *app) printStatus(v worker.CampaignStatus, loc *time.Location) {
	a.printStatusTo(a.stdout, v, loc)
}

// printStatusTo writes the text of status ID to out.
func (a *app) printStatusTo(out io.Writer, v worker.CampaignStatus, loc *time.Location) {
	if loc == nil {
		loc = iys.Istanbul()
	}
	at := func(t *time.Time) string { return t.In(loc).Format("2006-01-02 15:04:05 MST") }
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "campaign %d\t%s (%s)\n", v.ID, v.Name, v.Channel)
	fmt.Fprintf(w, "state\t%s\n", v.State)
	if v.RedisUnavailable {
		fmt.Fprintf(w, "redis\tunreachable: figures from Postgres alone (no DLQ count, no waiting reason)\n")
	}
	if v.Waiting != nil {
		fmt.Fprintf(w, "waiting\t%s: %s\n", v.Waiting.Reason, detailInZone(v.Waiting.Detail, loc))
		if v.Waiting.Since != nil {
			fmt.Fprintf(w, "  since\t%s\n", at(v.Waiting.Since))
		}
		if v.Waiting.Until != nil {
			fmt.Fprintf(w, "  until\t%s\n", at(v.Waiting.Until))
		}
	}
	for _, t := range []struct {
		name string
		t    *time.Time
	}{{"starts at", v.StartAt}, {"started", v.StartedAt}, {"finished", v.FinishedAt}} {
		if t.t != nil {
			fmt.Fprintf(w, "%s\t%s\n", t.name, at(t.t))
		}
	}
	fmt.Fprintf(w, "audience / eligible\t%d / %d\n", v.Audience, v.Eligible)
	for _, r := range slices.Sorted(maps.Keys(v.Excluded)) {
		fmt.Fprintf(w, "excluded: %s\t%d\n", r, v.Excluded[r])
	}
	fmt.Fprintf(w, "planned\t%d\n", v.Planned)
	fmt.Fprintf(w, "sent (accepted)\t%d\n", v.Sent)
	fmt.Fprintf(w, "  delivered / not delivered\t%d / %d\n", v.Delivered, v.Undelivered)
	fmt.Fprintf(w, "failed\t%d\n", v.Failed)
	for _, r := range slices.Sorted(maps.Keys(v.FailedByReason)) {
		fmt.Fprintf(w, "  failed: %s\t%d\n", r, v.FailedByReason[r])
	}
	fmt.Fprintf(w, "skipped\t%d\n", v.Skipped)
	for _, r := range slices.Sorted(maps.Keys(v.SkippedByReason)) {
		fmt.Fprintf(w, "  skipped: %s\t%d\n", r, v.SkippedByReason[r])
	}
	fmt.Fprintf(w, "unknown\t%d\n", v.Unknown)
	fmt.Fprintf(w, "pending\t%d\n", v.Pending)
	fmt.Fprintf(w, "dlq batches\t%s\n", v.DLQText())
	w.Flush()
}

func (a *app) printStatusList(views []worker.CampaignStatus, asJSON bool, loc *time.Location) error {
	if asJSON {
		return json.NewEncoder(a.stdout).Encode(views)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tCHANNEL\tSTATE\tPLANNED\tSENT\tFAILED\tSKIPPED\tUNKNOWN\tPENDING\tDLQ\tCREATED")
	for _, v := range views {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", v.ID, v.Name, v.Channel, v.State,
			v.Planned, v.Sent, v.Failed, v.Skipped, v.Unknown, v.Pending, v.DLQText(), inZone(v.CreatedAt, loc))
	}
	return w.Flush()
}

// inZone shows a UTC time of the JSON (RFC 3339) in loc, as the table's other times are; as it is when it
// does not parse.
func inZone(utc string, loc *time.Location) string {
	t, err := time.Parse(time.RFC3339, utc)
	if err != nil || loc == nil {
		return utc
	}
	return t.In(loc).Format("2006-01-02 15:04:05 MST")
}
