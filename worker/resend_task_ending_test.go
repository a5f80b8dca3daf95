package worker_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/worker"
)

// `resume --resend-unknown` right as a campaign completes: the last batch's task has made its last look
// for pending recipients (none: the campaign completed) and is about to be deleted, when the resume makes
// that batch's unknown recipients pending again. Its enqueue of the batch is refused (the task is still
// there), so it said the batch was "already queued"; a moment later the task was gone, and the
// recipients waited for a run that never came. Now resume waits for such a task to end and queues the
// batch again: the recipients get their run.
func TestAResendWhileTheBatchsTaskEndsQueuesTheBatchAgain(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "ending", 3) // one batch
	e.exec(t, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'u3' THEN 'sent' ELSE 'unknown' END WHERE campaign_id = $1`, c.ID)
	e.exec(t, `UPDATE campaigns SET state = 'completed' WHERE id = $1`, c.ID)

	// The batch's task, running and at its end: a server whose handler holds the first run until released,
	// then ends it as a run that found nothing pending does. Every later run of the batch is counted.
	started, release, again := make(chan struct{}), make(chan struct{}), make(chan struct{}, 10)
	var runs atomic.Int32
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 1, Queues: map[string]int{worker.Queue: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 50 * time.Millisecond,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc(worker.TaskBatch, func(context.Context, *asynq.Task) error {
		if runs.Add(1) == 1 {
			close(started)
			<-release
			return nil
		}
		again <- struct{}{}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	wait(t, started, "the batch's task running")

	go func() {
		time.Sleep(300 * time.Millisecond)
		close(release)
	}()
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, ResendUnknown: true})
	if err != nil || rep.Resent != 2 {
		t.Fatalf("resume --resend-unknown: %+v, %v; want 2 resent", rep, err)
	}
	if rep.Enqueued != 1 || rep.AlreadyQueued != 0 {
		t.Errorf("resume said %d batches queued, %d already queued; want the batch queued again (1, 0): its task was ending", rep.Enqueued, rep.AlreadyQueued)
	}
	select {
	case <-again:
	case <-time.After(5 * time.Second):
		t.Fatalf("the batch of the 2 recipients made pending again did not run again (runs: %d): they wait for a task that is gone", runs.Load())
	}
}

// The same resend while the batch's task stays running, as a killed worker's does until Asynq gives it
// back (a minute or more): the recipients made pending again are in no lease for a sweep to find, and
// waited that long for their run while resume said "1 already queued". Now, once resume has waited a
// moment for the task to end, the batch gets a follow-up task of its own, which runs beside the held one.
func TestAResendBesideATaskThatStaysRunningQueuesAFollowUp(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "held", 3)
	e.exec(t, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'u3' THEN 'sent' ELSE 'unknown' END WHERE campaign_id = $1`, c.ID)
	e.exec(t, `UPDATE campaigns SET state = 'completed' WHERE id = $1`, c.ID)

	started, release, again := make(chan struct{}), make(chan struct{}), make(chan string, 10)
	var runs atomic.Int32
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 2, Queues: map[string]int{worker.Queue: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 50 * time.Millisecond,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc(worker.TaskBatch, func(ctx context.Context, _ *asynq.Task) error {
		if runs.Add(1) == 1 {
			close(started)
			<-release // held: the dead worker's task, never ending while the test looks
			return nil
		}
		id, _ := asynq.GetTaskID(ctx)
		again <- id
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	defer close(release)
	wait(t, started, "the batch's task running")

	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, ResendUnknown: true})
	if err != nil || rep.Resent != 2 {
		t.Fatalf("resume --resend-unknown: %+v, %v; want 2 resent", rep, err)
	}
	if rep.Enqueued != 1 || rep.AlreadyQueued != 1 {
		t.Errorf("resume said %d queued, %d already queued; want the running task (1 already queued) and a follow-up (1 queued)", rep.Enqueued, rep.AlreadyQueued)
	}
	select {
	case id := <-again:
		if !strings.HasPrefix(id, worker.TaskID(c.ID, 0)+"/resumed-") {
			t.Errorf("the batch ran again as task %q, want a follow-up %s/resumed-…", id, worker.TaskID(c.ID, 0))
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the batch of the 2 recipients made pending again did not run while its old task stayed running (runs: %d)", runs.Load())
	}
}
