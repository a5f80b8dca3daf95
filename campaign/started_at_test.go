package campaign_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A scheduled campaign paused before its start and resumed after it goes straight to running (Start), not
// through the scheduled state. Its started_at is when a worker first runs a batch of it (StartIfDue starts
// a running campaign not started yet), not the resume: a campaign resumed while no worker runs has not
// started. Resumed again after another pause, it keeps the first start.
func TestAScheduledCampaignPausedBeforeItsStartStartsWhenAWorkerRunsItAfterTheResume(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	ctx := context.Background()
	store := campaign.NewStore(db)
	sp := spec("paused-before-start")
	sp.StartAt = time.Now().Add(time.Hour)
	c := planned(t, db, sp)
	if c.State != campaign.StateScheduled {
		t.Fatalf("launched %s, want scheduled", c.State)
	}
	if _, err := store.Transition(ctx, c.ID, []campaign.State{campaign.StateScheduled}, campaign.StatePaused); err != nil {
		t.Fatal(err)
	}
	// The start passes while it is paused.
	if _, err := db.Exec(ctx, `UPDATE campaigns SET start_at = now() - interval '1 minute' WHERE id = $1`, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, to, err := store.Start(ctx, c.ID, []campaign.State{campaign.StatePaused}); err != nil || to != campaign.StateRunning {
		t.Fatalf("resume: %s, %v; want running", to, err)
	}
	got, err := store.Get(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.StartedAt != nil {
		t.Fatalf("resumed, no worker has run a batch: started_at %v, want null", got.StartedAt)
	}
	if st, err := store.StartIfDue(ctx, c.ID); err != nil || st != campaign.StateRunning {
		t.Fatalf("a worker's first run: %s, %v; want running", st, err)
	}
	if got, err = store.Get(ctx, c.ID); err != nil || got.StartedAt == nil {
		t.Fatalf("after a worker's first run: started_at null (%v)", err)
	}
	first := *got.StartedAt
	if _, err := store.Transition(ctx, c.ID, []campaign.State{campaign.StateRunning}, campaign.StatePaused); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Start(ctx, c.ID, []campaign.State{campaign.StatePaused}); err != nil {
		t.Fatal(err)
	}
	if got, err = store.Get(ctx, c.ID); err != nil || got.StartedAt == nil || !got.StartedAt.Equal(first) {
		t.Fatalf("after a second pause and resume: started_at %v (%v), want the first start %v", got.StartedAt, err, first)
	}
}
