package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// DLQEntry is one dead-lettered batch: a batch task that used up its retries and waits in Asynq's archive.
// Its recipients stay pending in Postgres. The JSON is the stable shape of `campaignctl dlq list --json`.
type DLQEntry struct {
	TaskID     string `json:"task_id"`
	CampaignID int64  `json:"campaign_id"`
	Batch      int    `json:"batch"`
	Retried    int    `json:"retried"`
	MaxRetry   int    `json:"max_retry"`
	LastError  string `json:"last_error"`
	// LastFailedAt is when its last run failed (UTC); null for a batch moved to the DLQ by hand before it
	// ever failed.
	LastFailedAt *time.Time `json:"last_failed_at"`
}

// DLQOptions selects dead-lettered batches for ListDLQ, RetryDLQ and PurgeDLQ.
type DLQOptions struct {
	Store *campaign.Store
	Redis redis.UniversalClient
	// CampaignID selects one campaign's batches, and that campaign must exist; 0 selects every batch.
	CampaignID int64
}

// entries checks that the selected campaign exists and lists its dead-lettered batches.
func (o DLQOptions) entries(ctx context.Context) ([]DLQEntry, error) {
	if o.CampaignID != 0 && o.Store != nil {
		if _, err := o.Store.Get(ctx, o.CampaignID); err != nil {
			return nil, err
		}
	}
	return archivedBatches(o.Redis, o.CampaignID)
}

// ListDLQ returns the selected dead-lettered batches, in the archive's order.
func ListDLQ(ctx context.Context, o DLQOptions) ([]DLQEntry, error) {
	return o.entries(ctx)
}

// DLQRefusal is a dead-lettered batch that RetryDLQ left in the archive, and the state of its campaign.
type DLQRefusal struct {
	DLQEntry
	State campaign.State `json:"state"`
	// Why is set when the campaign may still send but not now: its consents are older than its
	// --max-consent-age (the batch would be back in the DLQ at once).
	Why string `json:"why,omitempty"`
}

// DLQRetryReport is what RetryDLQ did.
type DLQRetryReport struct {
	// Queued are the batches queued again, each with a fresh retry budget.
	Queued []DLQEntry `json:"queued"`
	// Refused are the batches of campaigns that are over (cancelled, failed or completed): nothing more is
	// sent for them, so they stay in the archive.
	Refused []DLQRefusal `json:"refused"`
}

// DLQRefusedError is returned by RetryDLQ for one campaign (DLQOptions.CampaignID) that is over: none of
// its batches was moved. It wraps campaign.ErrWrongState.
type DLQRefusedError struct {
	CampaignID int64
	State      campaign.State
}

func (e *DLQRefusedError) Error() string {
	if e.State == campaign.StateCancelled {
		return fmt.Sprintf("the DLQ batches of campaign %d are not retried: the campaign is cancelled, so nothing more is sent for it (`campaignctl cancel %d` again closes the recipients they still hold)",
			e.CampaignID, e.CampaignID)
	}
	return fmt.Sprintf("the DLQ batches of campaign %d are not retried: the campaign is %s, so nothing more is sent for it (drop them with `campaignctl dlq purge --campaign %d`)",
		e.CampaignID, e.State, e.CampaignID)
}

func (e *DLQRefusedError) Unwrap() error { return campaign.ErrWrongState }

// RetryDLQ queues the selected dead-lettered batches again with a fresh retry budget, except those of
// campaigns that are over. Every batch is decided before any is moved, so a refusal for the one selected
// campaign (a *DLQRefusedError) leaves the archive as it was.
func RetryDLQ(ctx context.Context, o DLQOptions) (DLQRetryReport, error) {
	rep := DLQRetryReport{Queued: []DLQEntry{}, Refused: []DLQRefusal{}} // lists, never null, in JSON
	entries, err := o.entries(ctx)
	if err != nil {
		return rep, err
	}
	states, stale := map[int64]campaign.State{}, map[int64]string{}
	for _, e := range entries {
		st, seen := states[e.CampaignID]
		if !seen {
			c, err := o.Store.Get(ctx, e.CampaignID)
			if err != nil {
				return rep, err
			}
			st, states[e.CampaignID] = c.State, c.State
			if !st.Over() {
				stale[e.CampaignID] = c.ConsentStaleThen(fmt.Sprintf("`campaignctl dlq retry --campaign %d`", c.ID))
			}
		}
		if st.Over() {
			rep.Refused = append(rep.Refused, DLQRefusal{DLQEntry: e, State: st})
			continue
		}
		if why := stale[e.CampaignID]; why != "" {
			rep.Refused = append(rep.Refused, DLQRefusal{DLQEntry: e, State: st, Why: why})
			continue
		}
		rep.Queued = append(rep.Queued, e)
	}
	if o.CampaignID != 0 && len(rep.Refused) > 0 {
		if why := stale[o.CampaignID]; why != "" {
			// Each batch would be back in the DLQ at once: none is moved.
			return DLQRetryReport{Queued: []DLQEntry{}, Refused: rep.Refused}, &campaign.ConsentStaleError{
				Msg: fmt.Sprintf("the DLQ batches of campaign %d are not retried (nothing was moved): %s", o.CampaignID, why)}
		}
		return DLQRetryReport{Queued: []DLQEntry{}, Refused: rep.Refused}, &DLQRefusedError{CampaignID: o.CampaignID, State: states[o.CampaignID]}
	}
	done, _, err := requeueBatches(ctx, o.Redis, rep.Queued)
	rep.Queued = rep.Queued[:done]
	return rep, err
}

// DLQPurgeReport is what PurgeDLQ did.
type DLQPurgeReport struct {
	// Dropped are the batches taken out of the archive; their recipients stay pending.
	Dropped []DLQEntry `json:"dropped"`
}

// PurgeDLQ drops the selected dead-lettered batches. Their recipients stay pending in Postgres, and a
// resume of their campaign queues them again.
func PurgeDLQ(ctx context.Context, o DLQOptions) (DLQPurgeReport, error) {
	rep := DLQPurgeReport{Dropped: []DLQEntry{}}
	entries, err := o.entries(ctx)
	if err != nil {
		return rep, err
	}
	dropped, err := takeArchived(o.Redis, entries)
	rep.Dropped = append(rep.Dropped, dropped...)
	return rep, err
}

// takeArchived deletes the tasks of entries that are still in the DLQ, and returns those it deleted. A task
// retried, resumed or purged by another command meanwhile is left alone: one of that ID queued anew since
// is not touched.
func takeArchived(rdb redis.UniversalClient, entries []DLQEntry) ([]DLQEntry, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	var taken []DLQEntry
	for _, e := range entries {
		deleted, err := deleteTaskIn(insp, e.TaskID, asynq.TaskStateArchived)
		if err != nil {
			return taken, fmt.Errorf("take batch %d of campaign %d from the DLQ: %w", e.Batch, e.CampaignID, err)
		}
		if deleted {
			taken = append(taken, e)
		}
	}
	return taken, nil
}

// deleteTaskIn deletes the task id of the queue when it is in one of states, and says whether it did. A
// task that is not there (or no longer: another command took it meanwhile), or in another state (being run,
// say), is left alone.
func deleteTaskIn(insp *asynq.Inspector, id string, states ...asynq.TaskState) (bool, error) {
	info, err := insp.GetTaskInfo(Queue, id)
	if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !slices.Contains(states, info.State) {
		return false, nil
	}
	if err := insp.DeleteTask(Queue, id); errors.Is(err, asynq.ErrTaskNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, nil
}

// requeueArchived puts the campaign's dead-lettered batches back in the queue with a fresh retry budget.
// It returns how many batches it moved, and how many of those it queued under their own task ID.
func requeueArchived(ctx context.Context, rdb redis.UniversalClient, campaignID int64) (batches, own int, err error) {
	entries, err := archivedBatches(rdb, campaignID)
	if err != nil {
		return 0, 0, err
	}
	done, own, err := requeueBatches(ctx, rdb, entries)
	return DistinctBatches(entries[:done]), own, err
}

// requeueBatches moves dead-lettered batches back to the queue, a batch at a time: entries of one batch
// (its own task, and the follow-ups sweeps queued for it after a worker's death) become one task. It returns
// how many of entries it moved (a prefix: those of the batches it finished), and how many batches it
// queued under their own task ID.
func requeueBatches(ctx context.Context, rdb redis.UniversalClient, entries []DLQEntry) (done, own int, err error) {
	byBatch := map[batchKey][]DLQEntry{}
	var order []batchKey
	for _, e := range entries {
		k := batchKey{e.CampaignID, e.Batch}
		if _, ok := byBatch[k]; !ok {
			order = append(order, k)
		}
		byBatch[k] = append(byBatch[k], e)
	}
	moved := make([]DLQEntry, 0, len(entries))
	for _, k := range order {
		var ownID, taken bool
		ownID, taken, err = requeue(ctx, rdb, byBatch[k])
		if err != nil {
			break
		}
		if !taken {
			continue // another retry, resume or purge took it from the DLQ meanwhile
		}
		if ownID {
			own++
		}
		moved = append(moved, byBatch[k]...)
	}
	// The entries moved first, in the order of their batches: callers report them.
	copy(entries, moved)
	return len(moved), own, err
}

// requeue moves one dead-lettered batch, its archived tasks es, back to the queue as one task. Running an
// archived task again would keep its used-up retry count (the next failure would archive it at once), so
// the tasks are deleted and the batch enqueued anew: under its own ID, or, while its own task is still in
// the queue (retrying, or running and maybe at its end), under the ID of the first of es, so that it is
// sure to get a run. ownID says it took its own ID; taken is false when none of es was in the DLQ any more
// (another command took them meanwhile): nothing is queued then.
func requeue(ctx context.Context, rdb redis.UniversalClient, es []DLQEntry) (ownID, taken bool, err error) {
	e := es[0]
	got, err := takeArchived(rdb, es)
	if err != nil || len(got) == 0 {
		return false, false, err
	}
	taken = true
	task, err := NewBatchTask(e.CampaignID, e.Batch)
	if err != nil {
		return false, true, err
	}
	client := asynq.NewClientFromRedisClient(rdb)
	_, err = client.EnqueueContext(ctx, task)
	if errors.Is(err, asynq.ErrTaskIDConflict) && e.TaskID != TaskID(e.CampaignID, e.Batch) {
		_, err = client.EnqueueContext(ctx, task, asynq.TaskID(e.TaskID))
	} else if err == nil {
		ownID = true
	}
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, true, fmt.Errorf("queue batch %d of campaign %d: %w; run `campaignctl resume %d` to queue it", e.Batch, e.CampaignID, err, e.CampaignID)
	}
	return ownID, true, nil
}

// dropArchived deletes campaign id's batch tasks from the DLQ, for a campaign that has nothing pending
// any more (completed): a task of it left there (a sweep's follow-up of a batch that its own task then
// finished) has no work left, and would only stand in the campaign's status as a batch waiting there. It
// returns how many it deleted.
func dropArchived(rdb redis.UniversalClient, id int64) (int, error) {
	entries, err := archivedBatches(rdb, id)
	if err != nil {
		return 0, err
	}
	dropped, err := takeArchived(rdb, entries)
	return len(dropped), err
}

// batchKey names a batch of a campaign: its own task and the follow-ups sweeps or resumes queued for it
// are one batch.
type batchKey struct {
	c int64
	b int
}

// DistinctBatches counts the batches of entries: a batch whose own task and a sweep's follow-up are both
// listed is one batch.
func DistinctBatches(entries []DLQEntry) int {
	seen := map[batchKey]bool{}
	for _, e := range entries {
		seen[batchKey{e.CampaignID, e.Batch}] = true
	}
	return len(seen)
}

// failedAt is a task's last failure in UTC, nil when it never failed (the queue's zero time).
func failedAt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return utc(t)
}

// archivedBatches lists the archived batch tasks, of one campaign or all (0).
func archivedBatches(rdb redis.UniversalClient, campaignID int64) ([]DLQEntry, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	var out []DLQEntry
	err := batchTasks(insp.ListArchivedTasks, campaignID, func(t *asynq.TaskInfo, cid int64, batch int) {
		out = append(out, DLQEntry{TaskID: t.ID, CampaignID: cid, Batch: batch, Retried: t.Retried, MaxRetry: t.MaxRetry,
			LastError: t.LastErr, LastFailedAt: failedAt(t.LastFailedAt)})
	})
	if err != nil {
		return nil, fmt.Errorf("read the DLQ: %w", err)
	}
	// By campaign and batch number: the archive lists them by task ID as text (0, 10, 11, …, 2).
	slices.SortStableFunc(out, func(a, b DLQEntry) int {
		return cmp.Or(cmp.Compare(a.CampaignID, b.CampaignID), cmp.Compare(a.Batch, b.Batch))
	})
	return out, nil
}

// batchTasks calls each with the batch tasks, of one campaign or all (0), that list (one of asynq's
// Inspector.List…Tasks) returns, a page at a time. A queue not created yet (before the first launch)
// holds none.
func batchTasks(list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error), campaignID int64, each func(t *asynq.TaskInfo, cid int64, batch int)) error {
	const pageSize = 1000
	for page := 1; ; page++ {
		tasks, err := list(Queue, asynq.Page(page), asynq.PageSize(pageSize))
		if err != nil {
			if errors.Is(err, asynq.ErrQueueNotFound) || strings.Contains(err.Error(), "does not exist") {
				return nil
			}
			return err
		}
		for _, t := range tasks {
			if cid, batch, ok := parseTaskID(t.ID); ok && (campaignID == 0 || cid == campaignID) {
				each(t, cid, batch)
			}
		}
		if len(tasks) < pageSize {
			return nil
		}
	}
}

// parseTaskID reads a batch task ID (TaskID, or a sweep's follow-up: followUpID) back into its campaign
// and batch.
func parseTaskID(id string) (int64, int, bool) {
	c, b, ok := strings.Cut(id, ":")
	if !ok {
		return 0, 0, false
	}
	b, _, _ = strings.Cut(b, "/")
	cid, err1 := strconv.ParseInt(c, 10, 64)
	batch, err2 := strconv.Atoi(b)
	return cid, batch, err1 == nil && err2 == nil
}

// toDLQ sends a batch whose err no retry can mend to the dead-letter queue at once (asynq.SkipRetry),
// with err's own words after DLQAtOnce as its last error: `dlq list` and `status` show them without
// Asynq's.
func toDLQ(err error) error { return dlqNow{err} }

// DLQAtOnce starts the last error of a batch sent to the dead-letter queue at once, without its retries:
// its last run is not counted in its retries, as a batch's whose retries were used up is not.
const DLQAtOnce = "not retried, no retry can mend it: "

type dlqNow struct{ err error }

func (e dlqNow) Error() string   { return DLQAtOnce + e.err.Error() }
func (e dlqNow) Unwrap() []error { return []error{e.err, asynq.SkipRetry} }
