package worker

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// takeAsActive moves the task id from the queue's pending list to its active one with its lease ending at
// leaseEnd, as Asynq's (v0.26) dequeue does for the worker that takes it. A lease in the past is a worker
// that took the task and then lost Redis for longer than the lease: its hand back was lost with Redis, and
// nobody runs the task.
var takeAsActive = redis.NewScript(`
redis.call("LREM", KEYS[1], 0, ARGV[2])
redis.call("LPUSH", KEYS[2], ARGV[2])
redis.call("HSET", KEYS[4], "state", "active")
redis.call("HDEL", KEYS[4], "pending_since")
redis.call("ZADD", KEYS[3], ARGV[1], ARGV[2])
return 1`)

// enqueueBatch0 queues the task of f's batch 0, as a launch does.
func enqueueBatch0(t *testing.T, f *fixture) {
	t.Helper()
	task, err := NewBatchTask(f.id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asynq.NewClientFromRedisClient(f.rdb).EnqueueContext(context.Background(), task); err != nil {
		t.Fatal(err)
	}
}

func takeTask(t *testing.T, f *fixture, id string, leaseEnd time.Time) {
	t.Helper()
	q := "asynq:{" + Queue + "}:"
	if err := takeAsActive.Run(context.Background(), f.rdb, []string{q + "pending", q + "active", q + "lease", q + "t:" + id}, leaseEnd.Unix(), id).Err(); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	ti, err := insp.GetTaskInfo(Queue, id)
	if err != nil || ti.State != asynq.TaskStateActive {
		t.Fatalf("task %s after it was taken: %+v, %v; want it active", id, ti, err)
	}
}

// A batch whose task Asynq holds active with nobody running it (its worker let it go while Redis was away
// for longer than the task's lease, and the hand back was lost) is queued again by the next worker's look
// (requeueOrphans), once, and its run sends the batch. Before, its recipients stayed pending, with no
// waiting reason, for up to a minute and a half after the lease ended, until Asynq's own recovery gave the
// task back.
func TestABatchAsynqHoldsWithNobodyRunningItIsQueuedAgain(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // one batch; eligible: u1 u2 u4 u7 u8
	ctx := context.Background()
	enqueueBatch0(t, f)
	followed := map[string]time.Time{}

	// Taken by a worker that still holds its lease: left alone.
	takeTask(t, f, TaskID(f.id, 0), time.Now().Add(time.Minute))
	if err := f.h.requeueOrphans(ctx, followed); err != nil {
		t.Fatal(err)
	}
	if ids := followUps(t, f); len(ids) != 0 {
		t.Fatalf("a batch run under a live lease was queued again: %v", ids)
	}

	// The lease ran out: queued again, once however often the worker looks.
	takeTask(t, f, TaskID(f.id, 0), time.Now().Add(-time.Second))
	for range 2 {
		if err := f.h.requeueOrphans(ctx, followed); err != nil {
			t.Fatal(err)
		}
		if ids := followUps(t, f); len(ids) != 1 {
			t.Fatalf("follow-ups of the orphaned batch: %v, want one", ids)
		}
		time.Sleep(1100 * time.Millisecond) // a follow-up's ID carries its second: a second look must not add one
	}
	f.runAll(t)
	f.assertOnce(t)
	if c := f.counts(t); c.Pending != 0 || c.Sent != 5 {
		t.Fatalf("counts %+v, want all 5 sent", c)
	}
}

// An orphaned batch of a paused campaign is not queued again: it waits for its resume, as every batch of
// the campaign does.
func TestAnOrphanedBatchOfAPausedCampaignWaits(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx := context.Background()
	enqueueBatch0(t, f)
	takeTask(t, f, TaskID(f.id, 0), time.Now().Add(-time.Second))
	if _, err := f.store.Transition(ctx, f.id, []campaign.State{campaign.StateRunning}, campaign.StatePaused); err != nil {
		t.Fatal(err)
	}
	if err := f.h.requeueOrphans(ctx, map[string]time.Time{}); err != nil {
		t.Fatal(err)
	}
	if ids := followUps(t, f); len(ids) != 0 {
		t.Fatalf("an orphaned batch of a paused campaign was queued: %v", ids)
	}
}

// The same through a running worker (Serve): its sweep loop looks for orphaned batches, and the campaign
// completes within seconds of the lease's end, not when Asynq's recovery gives the task back.
func TestAWorkerRunsABatchAsynqHoldsWithNobodyRunningIt(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	enqueueBatch0(t, f)
	// Ended a moment ago: Asynq's recovery, which runs when the server starts, takes back only tasks whose
	// lease ended 30 s before.
	takeTask(t, f, TaskID(f.id, 0), time.Now().Add(-time.Second))
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, f.rdb, f.h, ServerConfig{Concurrency: 2}) }()
	deadline := time.After(20 * time.Second)
	for f.campaign(t).State != campaign.StateCompleted {
		select {
		case <-deadline:
			cancel()
			<-done
			t.Fatalf("campaign not completed in 20 s with its batch orphaned: %+v", f.counts(t))
		case <-time.After(100 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.assertOnce(t)
	if got := f.provider.total(); got != 5 {
		t.Fatalf("provider accepted %d messages, want 5", got)
	}
}
