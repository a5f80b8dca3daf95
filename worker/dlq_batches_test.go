package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
)

// deadLetter puts tasks of batch b of f's campaign in the DLQ under the given IDs, as Asynq archives a
// task whose retries are used up.
func (f *fixture) deadLetter(t *testing.T, b int, ids ...string) {
	t.Helper()
	client, insp := asynq.NewClientFromRedisClient(f.rdb), asynq.NewInspectorFromRedisClient(f.rdb)
	for _, id := range ids {
		task, err := NewBatchTask(f.id, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task, asynq.TaskID(id)); err != nil {
			t.Fatalf("enqueue %s: %v", id, err)
		}
		if err := insp.ArchiveTask(Queue, id); err != nil {
			t.Fatalf("archive %s: %v", id, err)
		}
	}
}

// archived lists the task IDs of f's campaign in the DLQ.
func (f *fixture) archived(t *testing.T) []string {
	t.Helper()
	entries, err := archivedBatches(f.rdb, f.id)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, e := range entries {
		ids = append(ids, e.TaskID)
	}
	return ids
}

// After a worker's death, a sweep queues the rest of its batch as a follow-up task of its own; both it and
// the batch's own task may end in the DLQ. That is one batch: status counts one, `dlq retry` says one and
// queues one task for it, resume says one taken back (and none "already queued"). Before, each task
// counted as a batch, and a retry queued both. Once the campaign completes, what is left of it in the
// DLQ (a follow-up of a batch that its own task then finished) is dropped: it has no work left, and stood
// in the status of a completed campaign as a batch to retry, which `dlq retry` then refused.
func TestABatchAndItsFollowUpInTheDLQAreOneBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 10, nil, nil)
	own, follow := TaskID(f.id, 0), followUpID(f.id, 0, time.Unix(1_800_000_000, 0))
	f.deadLetter(t, 0, own, follow)

	st, err := Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil {
		t.Fatal(err)
	}
	if st.DLQ == nil || *st.DLQ != 1 {
		got := "null"
		if st.DLQ != nil {
			got = fmt.Sprint(*st.DLQ)
		}
		t.Errorf("status dlq = %s, want 1: the batch and its follow-up are one batch", got)
	}

	rep, err := RetryDLQ(ctx, DLQOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil || DistinctBatches(rep.Queued) != 1 || len(rep.Queued) != 2 {
		t.Fatalf("dlq retry: %+v, %v; want both tasks taken, as 1 batch", rep, err)
	}
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	if info, err := insp.GetQueueInfo(Queue); err != nil || info.Pending != 1 || info.Archived != 0 {
		t.Fatalf("queue after dlq retry: %+v, %v; want the batch queued once (1 pending), nothing archived", info, err)
	}
	if _, err := insp.GetTaskInfo(Queue, own); err != nil {
		t.Errorf("the batch is not queued under its own task ID %s: %v", own, err)
	}

	// Both in the DLQ again, then resume.
	if err := insp.DeleteTask(Queue, own); err != nil {
		t.Fatal(err)
	}
	f.deadLetter(t, 0, own, follow)
	res, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil || res.FromDLQ != 1 || res.AlreadyQueued != 0 || res.Enqueued != f.batches-1 {
		t.Fatalf("resume: %+v, %v; want 1 batch taken back from the DLQ, none already queued, %d queued", res, err, f.batches-1)
	}

	// A follow-up left in the DLQ while the batch's own run finishes it: the campaign completes, and the
	// follow-up is dropped.
	f.deadLetter(t, 0, followUpID(f.id, 0, time.Unix(1_800_000_100, 0)))
	f.runAll(t)
	if c := f.campaign(t); c.State != campaign.StateCompleted {
		t.Fatalf("campaign is %s after every batch ran, want completed", c.State)
	}
	if ids := f.archived(t); len(ids) != 0 {
		t.Errorf("the completed campaign keeps %v in the DLQ, want none: nothing of it is pending", ids)
	}
}

// A resume or `dlq retry` of a campaign whose consents are older than its --max-consent-age changes
// nothing and says why: each batch it queued would be back in the DLQ at once, and the command said
// "taken back from the DLQ" (exit 0) while nothing could be sent. Once the consents are brought up to
// date, both go on.
func TestAResumeOrRetryOnConsentsTooOldChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 10, func(s *campaign.Spec) { s.MaxConsentAge = 24 * time.Hour }, syncedNow(t))
	if _, err := Pause(ctx, PauseOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Fatal(err)
	}
	f.deadLetter(t, 0, TaskID(f.id, 0))
	if _, err := f.db.Exec(ctx, `UPDATE iys_sync_state SET last_success_at = now() - interval '3 days'`); err != nil {
		t.Fatal(err)
	}

	_, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if !errors.Is(err, campaign.ErrConsentStale) || !strings.Contains(err.Error(), "iys sync") ||
		!strings.Contains(err.Error(), fmt.Sprintf("`campaignctl resume %d`", f.id)) {
		t.Fatalf("resume on consents synced 3 days ago (--max-consent-age 24h): %v; want ErrConsentStale naming `iys sync` and the resume to run then", err)
	}
	if c := f.campaign(t); c.State != campaign.StatePaused {
		t.Errorf("the refused resume left the campaign %s, want it paused still", c.State)
	}
	if ids := f.archived(t); len(ids) != 1 {
		t.Errorf("the refused resume left %v in the DLQ, want the batch there still", ids)
	}

	if _, err := RetryDLQ(ctx, DLQOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); !errors.Is(err, campaign.ErrConsentStale) ||
		!strings.Contains(err.Error(), "iys sync") {
		t.Fatalf("dlq retry --campaign on stale consents: %v; want ErrConsentStale naming `iys sync`", err)
	}
	rep, err := RetryDLQ(ctx, DLQOptions{Store: f.store, Redis: f.rdb})
	if err != nil || len(rep.Queued) != 0 || len(rep.Refused) != 1 || !strings.Contains(rep.Refused[0].Why, "iys sync") {
		t.Fatalf("dlq retry (every campaign) on stale consents: %+v, %v; want the batch refused, saying why", rep, err)
	}
	if ids := f.archived(t); len(ids) != 1 {
		t.Errorf("the refused retries left %v in the DLQ, want the batch there still", ids)
	}

	if _, err := f.db.Exec(ctx, `UPDATE iys_sync_state SET last_success_at = now()`); err != nil {
		t.Fatal(err)
	}
	res, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil || res.FromDLQ != 1 || res.To != campaign.StateRunning {
		t.Fatalf("resume once the consents are up to date: %+v, %v; want it running, the batch taken back from the DLQ", res, err)
	}
}

// Two `dlq retry` commands at once both list the same batch in the DLQ; the one that takes it second
// finds it gone, queues nothing and does not count it (both said "queued again" before: twice the batches
// the DLQ held).
func TestADLQBatchTakenByAnotherRetryIsNotCountedTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 10, nil, nil)
	f.deadLetter(t, 0, TaskID(f.id, 0), followUpID(f.id, 0, time.Unix(1_800_000_000, 0)))
	listed, err := archivedBatches(f.rdb, f.id)
	if err != nil || len(listed) != 2 {
		t.Fatalf("DLQ: %v, %v", listed, err)
	}
	second := append([]DLQEntry(nil), listed...)
	if done, _, err := requeueBatches(ctx, f.rdb, listed); err != nil || done != 2 {
		t.Fatalf("first retry: %d moved, %v; want both tasks of the batch", done, err)
	}
	if done, own, err := requeueBatches(ctx, f.rdb, second); err != nil || done != 0 || own != 0 {
		t.Fatalf("second retry of the same listing: %d moved (%d under the batch's ID), %v; want none: the first took the batch", done, own, err)
	}
	if info, err := asynq.NewInspectorFromRedisClient(f.rdb).GetQueueInfo(Queue); err != nil || info.Pending != 1 {
		t.Fatalf("queue: %+v, %v; want the batch queued once", info, err)
	}
}
