package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/worker"
)

// The engine database is re-created (or restored from a backup) while Redis keeps its data, so campaign
// IDs start again at 1. The old campaign 1 left its batches in the DLQ and a halt mark (it was cancelled).
// The launch of the new campaign 1 found its enqueue a no-op for those task IDs ("existing"), so its
// batches waited in the DLQ under the old run's error until someone ran `dlq retry` or `resume`, and the
// halt mark held it. Nothing in Redis is a new campaign's own: its batches are queued to run, and the mark
// is gone.
func TestALaunchUnderAReusedIDIsNotHeldByAnOldDatabasesTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := newOpsEnv(t, 4, nil)
	was := old.launch(t, "old", 2)
	if was.ID != 1 {
		t.Fatalf("the first campaign of a fresh database has ID %d; the test needs 1", was.ID)
	}
	for _, b := range []int{0, 1} {
		if err := old.insp.ArchiveTask(worker.Queue, worker.TaskID(was.ID, b)); err != nil {
			t.Fatalf("archive batch %d: %v", b, err)
		}
	}
	if err := worker.Halt(ctx, old.rdb, was.ID, "cancelled", time.Hour); err != nil {
		t.Fatal(err)
	}

	fresh := newOpsEnv(t, 4, old.rdb)
	rep, err := worker.Launch(ctx, worker.LaunchOptions{Planner: fresh.planner(), Redis: fresh.rdb, Spec: fresh.spec("new", 2)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ID != was.ID {
		t.Fatalf("the new database's first campaign has ID %d; the test needs %d", rep.ID, was.ID)
	}
	var archived []string
	for _, b := range []int{0, 1} {
		info, err := fresh.insp.GetTaskInfo(worker.Queue, worker.TaskID(rep.ID, b))
		if err != nil {
			t.Fatalf("batch %d of the new campaign: %v", b, err)
		}
		if info.State == asynq.TaskStateArchived {
			archived = append(archived, info.ID)
		}
	}
	halted, err := fresh.rdb.Exists(ctx, worker.HaltKey(rep.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(archived) > 0 || halted != 0 || rep.Enqueued != 2 {
		t.Fatalf("the new campaign %d: batches %v left in the DLQ, halt mark %v, %d of 2 batches queued; want none, none, 2", rep.ID, archived, halted == 1, rep.Enqueued)
	}
}
