package worker

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
)

// A cancelled campaign whose recipients are still pending with none of its batches queued (a cancel that
// left the batches runs held to the workers, then Redis lost its data and the tasks with it) moves no
// more: status says so and names the command that closes them, a cancel run again, since resume refuses a
// cancelled campaign. With a batch queued a worker closes them, and nothing is said; once closed, nothing.
func TestStatusSaysACancelledCampaignsPendingRecipientsNeedACancelAgain(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	ctx := context.Background()
	if _, err := f.store.Transition(ctx, f.id, []campaign.State{campaign.StateRunning, campaign.StateScheduled}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	status := func(step string) CampaignStatus {
		t.Helper()
		s, err := Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		return s
	}
	s := status("cancelled, nothing queued")
	again := "run campaignctl cancel " + strconv.FormatInt(f.id, 10) + " again"
	pending := s.Counts.Pending
	if pending == 0 || s.Waiting == nil || s.Waiting.Reason != WaitRedisLostData || !strings.Contains(s.Waiting.Detail, again) {
		t.Fatalf("cancelled with %d pending and nothing queued: waiting %+v; want %s saying to %s", pending, s.Waiting, WaitRedisLostData, again)
	}

	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	f.enqueueFirstBatch(t, client)
	if s := status("a batch queued"); s.Waiting != nil {
		t.Fatalf("cancelled with a batch queued for a worker to close: waiting %+v, want nothing", s.Waiting)
	}

	if _, err := Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Fatal(err)
	}
	if s := status("cancelled again"); s.Counts.Pending != 0 || s.Counts.Skipped != pending || s.Waiting != nil {
		t.Fatalf("after the cancel run again: %+v, waiting %+v; want the %d pending skipped and nothing waiting", s.Counts, s.Waiting, pending)
	}
}
