package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// ErrLaunchDeclined is returned by Launch when Confirm said no: nothing was written or sent.
var ErrLaunchDeclined = errors.New("launch cancelled; nothing was written or sent")

// LaunchOptions configures Launch.
type LaunchOptions struct {
	// Planner plans the campaign; the campaign is read back from its Engine to be queued.
	Planner *campaign.Planner
	// Redis holds the queue; a dry run does not use it. Check that it answers before a launch: a plan that
	// cannot be queued is only half a launch.
	Redis redis.UniversalClient
	// Spec is the campaign. With Spec.DryRun, Launch computes the report and writes nothing.
	Spec campaign.Spec
	// Confirm, when set, is shown the report of a dry run of Spec before anything is written, and the
	// launch goes on only if it returns true. When that dry run fails, Launch returns its report (DryRun
	// set) and error without calling Confirm.
	Confirm func(preview campaign.Report) bool
}

// NotQueuedError is returned by Launch when the plan committed but not every batch was queued; `campaignctl
// resume` queues the rest (task IDs are deterministic, so nothing is queued twice).
type NotQueuedError struct {
	CampaignID int64
	// Queued of Batches were queued.
	Queued, Batches int
	Err             error
}

func (e *NotQueuedError) Error() string {
	return fmt.Sprintf("campaign %d is planned but only %d of %d batches were queued: %v; run `campaignctl resume %d` to queue the rest",
		e.CampaignID, e.Queued, e.Batches, e.Err, e.CampaignID)
}

func (e *NotQueuedError) Unwrap() error { return e.Err }

// Launch plans a campaign in Postgres (recipients, codes and batches in one transaction) and then queues
// one task per batch: the plan before the queue, so that a launch stopped in between is finished by
// Resume. It returns the plan's report with Enqueued set.
//
// The report comes back with the error too, holding what was counted: a plan that failed has no ID (and
// left nothing written); one whose queueing failed has its ID, and the error says how to finish it (a
// *NotQueuedError when some batches could not be queued).
func Launch(ctx context.Context, o LaunchOptions) (campaign.Report, error) {
	if o.Spec.DryRun {
		return o.Planner.Plan(ctx, o.Spec)
	}
	if o.Redis == nil {
		return campaign.Report{Name: o.Spec.Name, Channel: o.Spec.Channel}, errors.New("launch: no Redis to queue the campaign on; nothing was written or sent")
	}
	if o.Confirm != nil {
		preview := o.Spec
		preview.DryRun = true
		rep, err := o.Planner.Plan(ctx, preview)
		if err != nil {
			return rep, planLost(err)
		}
		if !o.Confirm(rep) {
			return rep, ErrLaunchDeclined
		}
	}
	rep, err := o.Planner.Plan(ctx, o.Spec)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, campaign.ErrCommitUnknown) {
			// The plan is one transaction: stopped anywhere before its commit, it left nothing (a commit
			// that went unanswered is asked about: written, the plan has its ID and goes on below).
			return rep, fmt.Errorf("launch interrupted: nothing was written or sent (%w)", ctx.Err())
		}
		if rep.ID == 0 && !errors.Is(err, campaign.ErrCommitUnknown) {
			return rep, planLost(err)
		}
		return rep, err
	}
	store := campaign.NewStore(o.Planner.Engine)
	c, err := store.Get(ctx, rep.ID)
	if err != nil {
		return rep, fmt.Errorf("campaign %d is planned but not queued: %w; run `campaignctl resume %d`", rep.ID, err, rep.ID)
	}
	// The campaign is new: nothing in Redis is its own yet. A halt mark or a task under its ID is left from
	// an engine database that was re-created (or restored from a backup) while Redis kept its data, and
	// the IDs started again: the mark would hold this campaign, and the task (say one in the DLQ) would
	// make its enqueue a no-op.
	if err := state.Unhalt(ctx, o.Redis, rep.ID); err != nil {
		return rep, &NotQueuedError{CampaignID: rep.ID, Batches: rep.Batches, Err: err}
	}
	added, existing, err := Enqueue(ctx, asynq.NewClientFromRedisClient(o.Redis), store, c, true)
	if err == nil && existing > 0 {
		// Its payload names this campaign's ID and batch: run now, it sends this campaign's batch. Scheduled
		// tasks are left alone: the campaign's own wait there for its start or its send window.
		var n int
		n, err = runNow(o.Redis, rep.ID, asynq.TaskStateArchived, asynq.TaskStateRetry)
		added += n
	}
	rep.Enqueued = added
	if err != nil {
		return rep, &NotQueuedError{CampaignID: rep.ID, Queued: added, Batches: rep.Batches, Err: err}
	}
	return rep, nil
}

// planLost says, of a plan that failed because Postgres went away (restarted, failed over, the
// connection cut), that nothing was written and what to do; other errors are returned as they are.
func planLost(err error) error {
	if !lostPostgres(err) {
		return err
	}
	return fmt.Errorf("%w: Postgres went away during the plan, which is one transaction: nothing was written or sent; launch again once it answers", err)
}

// lostPostgres says whether err is Postgres's connection failing rather than Postgres refusing a
// statement: a connection or operator-intervention error (an admin shutdown, a crash recovery), or the
// connection itself broken.
func lostPostgres(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "connection reset")
}
