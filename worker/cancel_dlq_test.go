package worker_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// A campaign is cancelled (from the UI: a 10 s wait, shorter than a lease) while one of its batches is
// in the DLQ and the chunk its last run leased is still in hand (the run was killed before it claimed
// anyone; Asynq, the task's retries used up, archived it). Cancel cannot close the held rows, and its
// enqueue of the batch meets the archived task's ID. Every recipient must still end in a terminal state:
// once the lease runs out the sweeper, the queued tasks, `dlq retry` or `resume` must close them.
func TestACancelledBatchHeldInTheDLQIsClosed(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "dlqheld", 3) // one batch (0) of u1..u3
	epoch, err := worker.Epoch(ctx, e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	if _, err := e.store.LeaseChunk(ctx, c, []string{"u1", "u2", "u3"},
		campaign.Lease{Batch: 0, Token: "dead-run", Epoch: epoch, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	e.archive(t, c, 0)

	rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cancel: pending %d, requeued %d, cancelled %d", rep.Counts.Pending, rep.Requeued, rep.Cancelled)

	time.Sleep(ttl + 500*time.Millisecond) // the dead run's lease runs out
	h := worker.NewHandler(worker.Config{Store: e.store, Redis: e.rdb, Owner: "live", LeaseTTL: ttl})
	if n, err := h.Sweep(ctx); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("sweep settled %d", n)
	}
	// Every task of the campaign that is queued (pending, scheduled or retrying) runs, as a worker would.
	for round := 0; round < 5; round++ {
		ran := 0
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){e.insp.ListPendingTasks, e.insp.ListScheduledTasks, e.insp.ListRetryTasks} {
			tasks, err := list(worker.Queue)
			if err != nil && !strings.Contains(err.Error(), "does not exist") {
				t.Fatal(err)
			}
			for _, ti := range tasks {
				cid, rest, _ := strings.Cut(ti.ID, ":")
				b, _, _ := strings.Cut(rest, "/")
				id, _ := strconv.ParseInt(cid, 10, 64)
				batch, _ := strconv.Atoi(b)
				if id != c.ID {
					continue
				}
				err := h.RunBatch(ctx, id, batch)
				t.Logf("ran task %s: %v", ti.ID, err)
				if err == nil {
					e.insp.DeleteTask(worker.Queue, ti.ID) //nolint:errcheck
				}
				ran++
			}
		}
		if ran == 0 {
			break
		}
	}
	// What ops can do: retry the DLQ, resume.
	_, derr := worker.RetryDLQ(ctx, worker.DLQOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	_, rerr := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	t.Logf("dlq retry: %v; resume: %v; archived %d", derr, rerr, e.archived(t))

	if got := e.counts(t, c.ID); got.Pending != 0 {
		t.Fatalf("cancelled campaign left %d recipients pending for good (counts %+v, statuses %v)", got.Pending, got, e.statuses(t, c.ID))
	}
}

// A batch of a cancelled campaign reaches the DLQ after the cancel (a live run held its rows then, and its
// task used up its retries since): its recipients would stay pending for good, since `dlq retry` and
// `resume` leave a cancelled campaign alone. Cancelling again closes them: skipped (cancelled), their codes
// back in the pool, the DLQ empty.
func TestCancellingACancelledCampaignAgainClosesWhatIsLeft(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "again", 3) // one batch (0) of u1..u3
	epoch, err := worker.Epoch(ctx, e.rdb)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	if _, err := e.store.LeaseChunk(ctx, c, []string{"u1", "u2", "u3"},
		campaign.Lease{Batch: 0, Token: "live-run", Epoch: epoch, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}
	if n := e.counts(t, c.ID).Pending; n != 3 {
		t.Fatalf("%d pending after the first cancel, want the 3 the live run held", n)
	}
	// The run dies; its lease runs out; its task is in the DLQ.
	time.Sleep(ttl + 300*time.Millisecond)
	e.archive(t, c, 0)
	if _, err := worker.RetryDLQ(ctx, worker.DLQOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err == nil || !strings.Contains(err.Error(), "cancel") {
		t.Fatalf("dlq retry of a cancelled campaign: %v, want it refused, pointing at cancel", err)
	}
	rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("cancel again: %v", err)
	}
	if rep.Was != campaign.StateCancelled || rep.Counts.Pending != 0 || rep.Cancelled != 3 {
		t.Fatalf("cancel again: %+v; want all 3 closed as cancelled", rep)
	}
	if n := e.archived(t); n != 0 {
		t.Fatalf("%d batches left in the DLQ", n)
	}
	var released int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM released_codes`).Scan(&released); err != nil || released != 3 {
		t.Fatalf("%d codes back in the pool (%v), want 3", released, err)
	}
}
