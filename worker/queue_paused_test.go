package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/internal/state"
)

// An operator presses "Pause" on the queue "campaigns" in asynqmon (campaignctl ui, not --read-only):
// every worker stops taking batches. The campaign is running, its batches are queued, a worker for its
// channel is alive, and nothing moves: status must say what it waits on, not report it as moving.
func TestStatusSaysTheQueueIsPaused(t *testing.T) {
	t.Parallel()
	f := queuedWithAWorker(t)
	ctx := context.Background()
	s, err := Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil || s.Waiting != nil {
		t.Fatalf("before the queue pause: waiting %+v, err %v; want none", s.Waiting, err)
	}
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	defer insp.Close()
	// What asynqmon's queue "Pause" button does (POST /api/queues/campaigns:pause).
	if err := insp.PauseQueue(Queue); err != nil {
		t.Fatal(err)
	}
	s, err = Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting == nil || s.Waiting.Reason != WaitPaused || !strings.Contains(s.Waiting.Detail, "queue "+Queue+" is paused") {
		t.Fatalf("queue %q paused in asynqmon, campaign %d %s with %d pending: status says %+v, want paused by the queue (as if it moved)",
			Queue, f.id, s.State, s.Pending, s.Waiting)
	}
	// campaignctl resume does not unpause the queue (it is every campaign's): it says why nothing moves.
	rep, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.QueuePaused {
		t.Fatalf("resume under a paused queue: %+v, want QueuePaused", rep)
	}
	if err := insp.UnpauseQueue(Queue); err != nil {
		t.Fatal(err)
	}
	if s, err = Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil || s.Waiting != nil {
		t.Fatalf("after the queue's unpause: waiting %+v, err %v; want none", s.Waiting, err)
	}
}

// queuedWithAWorker plans 30 recipients, queues the campaign's batches and publishes a live worker for its
// channel: a campaign that moves, as status sees it.
func queuedWithAWorker(t *testing.T) *fixture {
	t.Helper()
	f := plan(t, 30)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	if _, _, err := Enqueue(ctx, client, f.store, f.campaign(t), true); err != nil {
		t.Fatal(err)
	}
	if err := state.PublishWorker(ctx, f.rdb, state.WorkerInfo{Owner: "w1", Providers: map[string]string{"sms": f.provider.Name()},
		Commercial: map[string]bool{"sms": true}}); err != nil {
		t.Fatal(err)
	}
	return f
}
