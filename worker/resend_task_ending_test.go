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

// heldBatch is a completed campaign of 3 whose u1 and u2 are unknown, and a running task of its one batch:
// a real Asynq server whose handler holds the batch's first run until release is closed, then ends it as
// a run that found nothing pending does. Each later run of the batch sends its task ID on again.
type heldBatch struct {
	e       *opsEnv
	id      int64
	release chan struct{}
	again   chan string
	runs    atomic.Int32
}

func newHeldBatch(t *testing.T, concurrency int) *heldBatch {
	t.Helper()
	e := newOpsEnv(t, 3, nil)
	c := e.launch(t, "held", 3) // one batch
	e.exec(t, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'u3' THEN 'sent' ELSE 'unknown' END WHERE campaign_id = $1`, c.ID)
	e.exec(t, `UPDATE campaigns SET state = 'completed' WHERE id = $1`, c.ID)
	h := &heldBatch{e: e, id: c.ID, release: make(chan struct{}), again: make(chan string, 10)}
	started := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: concurrency, Queues: map[string]int{worker.Queue: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 50 * time.Millisecond,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc(worker.TaskBatch, func(ctx context.Context, _ *asynq.Task) error {
		if h.runs.Add(1) == 1 {
			close(started)
			<-h.release
			return nil
		}
		id, _ := asynq.GetTaskID(ctx)
		h.again <- id
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	wait(t, started, "the batch's task running")
	return h
}

// resend runs `resume --resend-unknown`, which must send u1 and u2 again.
func (h *heldBatch) resend(t *testing.T) worker.ResumeReport {
	t.Helper()
	h.e.ageUnknown(t, h.id)
	rep, err := worker.Resume(context.Background(), worker.ResumeOptions{Store: h.e.store, Redis: h.e.rdb, CampaignID: h.id, ResendUnknown: true})
	if err != nil || rep.Resent != 2 {
		t.Fatalf("resume --resend-unknown: %+v, %v; want 2 resent", rep, err)
	}
	return rep
}

// ranAgain waits for the batch's next run and returns its task ID.
func (h *heldBatch) ranAgain(t *testing.T, why string) string {
	t.Helper()
	select {
	case id := <-h.again:
		return id
	case <-time.After(5 * time.Second):
		t.Fatalf("the batch of the 2 recipients made pending again did not run again (runs: %d): %s", h.runs.Load(), why)
		return ""
	}
}

// `resume --resend-unknown` right as a campaign completes: the last batch's task has made its last look
// for pending recipients (none: the campaign completed) and is about to be deleted, when the resume makes
// that batch's unknown recipients pending again. Its enqueue of the batch is refused (the task is still
// there), so it said the batch was "already queued"; a moment later the task was gone, and the
// recipients waited for a run that never came. Now resume waits for such a task to end and queues the
// batch again: the recipients get their run.
func TestAResendWhileTheBatchsTaskEndsQueuesTheBatchAgain(t *testing.T) {
	t.Parallel()
	h := newHeldBatch(t, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		close(h.release)
	}()
	rep := h.resend(t)
	if rep.Enqueued != 1 || rep.AlreadyQueued != 0 {
		t.Errorf("resume said %d batches queued, %d already queued; want the batch queued again (1, 0): its task was ending", rep.Enqueued, rep.AlreadyQueued)
	}
	h.ranAgain(t, "they wait for a task that is gone")
}

// The same resend while the batch's task stays running, as a killed worker's does until Asynq gives it
// back (a minute or more): the recipients made pending again are in no lease for a sweep to find, and
// waited that long for their run while resume said "1 already queued". Now, once resume has waited a
// moment for the task to end, the batch gets a follow-up task of its own, which runs beside the held one.
func TestAResendBesideATaskThatStaysRunningQueuesAFollowUp(t *testing.T) {
	t.Parallel()
	h := newHeldBatch(t, 2)
	defer close(h.release) // held: the dead worker's task, never ending while the test looks
	rep := h.resend(t)
	if rep.Enqueued != 0 || rep.AlreadyQueued != 1 || rep.FollowUps != 1 {
		t.Errorf("resume said %d queued, %d already queued, %d follow-ups; want the running task (1 already queued) with a follow-up, and nothing more: the campaign has one batch", rep.Enqueued, rep.AlreadyQueued, rep.FollowUps)
	}
	if id := h.ranAgain(t, "its old task stayed running"); !strings.HasPrefix(id, worker.TaskID(h.id, 0)+"/resumed-") {
		t.Errorf("the batch ran again as task %q, want a follow-up %s/resumed-…", id, worker.TaskID(h.id, 0))
	}
}

// A paused campaign whose batch's task stays running, as a worker killed just before the pause leaves it
// until Asynq gives it back (a minute or more): the pause kept the sweep from queuing the dead run's batch
// again, and a resume found the task "already queued", so its pending recipients waited that long with no
// reason shown (an outside run: 916 recipients for about 75 s). Now a resume of a paused campaign queues
// such a batch a follow-up task too.
func TestAResumeOfAPausedCampaignBesideATaskThatStaysRunningQueuesAFollowUp(t *testing.T) {
	t.Parallel()
	h := newHeldBatch(t, 2)
	defer close(h.release) // held: the dead worker's task
	h.e.exec(t, `UPDATE campaign_recipients SET status = CASE user_id WHEN 'u3' THEN 'sent' ELSE 'pending' END WHERE campaign_id = $1`, h.id)
	h.e.exec(t, `UPDATE campaigns SET state = 'paused' WHERE id = $1`, h.id)
	rep, err := worker.Resume(context.Background(), worker.ResumeOptions{Store: h.e.store, Redis: h.e.rdb, CampaignID: h.id})
	if err != nil || rep.Enqueued != 0 || rep.AlreadyQueued != 1 || rep.FollowUps != 1 {
		t.Fatalf("resume: %+v, %v; want the running task (1 already queued) with a follow-up, and nothing more: the campaign has one batch", rep, err)
	}
	if id := h.ranAgain(t, "its old task stayed running"); !strings.HasPrefix(id, worker.TaskID(h.id, 0)+"/resumed-") {
		t.Errorf("the batch ran again as task %q, want a follow-up %s/resumed-…", id, worker.TaskID(h.id, 0))
	}
}
