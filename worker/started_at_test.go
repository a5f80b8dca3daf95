package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/worker"
)

// A campaign launched without --at starts (started_at) when a worker first runs a batch of it inside its
// window, as status promises: not at its launch. Launched with its window closed, or with no worker
// running, it said the launch, though nothing was sent until the window opened or a worker came (an
// outside run: started_at 21:50:26 for a campaign whose window opened 20 hours later).
func TestACampaignStartsWhenAWorkerFirstRunsABatchInsideItsWindow(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 6, nil)
	ctx := context.Background()
	p := newGatedProvider()
	close(p.release)
	h := worker.NewHandler(worker.Config{Store: e.store, Redis: e.rdb, Owner: "started",
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})
	startedAt := func(id int64) *time.Time {
		t.Helper()
		return e.campaign(t, id).StartedAt
	}

	// No worker ran it yet: running, not started.
	c := e.plan(t, "later", 3)
	if c.State != campaign.StateRunning || c.StartedAt != nil {
		t.Fatalf("launched: %s, started_at %v; want running, started_at null", c.State, c.StartedAt)
	}
	before := time.Now()
	if err := h.RunBatch(ctx, c.ID, 0); err != nil {
		t.Fatal(err)
	}
	got := startedAt(c.ID)
	if got == nil || got.Before(before.Add(-time.Second)) {
		t.Fatalf("started_at %v after a worker ran its first batch at %v; want then", got, before)
	}
	if err := h.RunBatch(ctx, c.ID, 1); err != nil {
		t.Fatal(err)
	}
	if again := startedAt(c.ID); again == nil || !again.Equal(*got) {
		t.Fatalf("started_at %v after the second batch; want the first start %v kept", again, got)
	}

	// Its window closed when a worker runs a batch: the batch waits, and the campaign has not started.
	w := e.plan(t, "windowed", 3)
	now := time.Now().UTC()
	closed := now.Add(2*time.Hour).Format("15:04") + "-" + now.Add(3*time.Hour).Format("15:04")
	e.exec(t, `UPDATE campaigns SET send_window = $2, window_zone = 'UTC' WHERE id = $1`, w.ID, closed)
	err := h.RunBatch(ctx, w.ID, 0)
	var re *worker.RetryError
	if !errors.As(err, &re) || !re.Wait {
		t.Fatalf("a batch run with the window %s closed returned %v; want it to wait", closed, err)
	}
	if got := startedAt(w.ID); got != nil {
		t.Fatalf("started_at %v with the window closed and nothing sent; want null", got)
	}
	// The window opens.
	open := now.Add(-time.Hour).Format("15:04") + "-" + now.Add(time.Hour).Format("15:04")
	e.exec(t, `UPDATE campaigns SET send_window = $2 WHERE id = $1`, w.ID, open)
	if err := h.RunBatch(ctx, w.ID, 0); err != nil {
		t.Fatal(err)
	}
	if got := startedAt(w.ID); got == nil {
		t.Fatalf("started_at null after a batch ran inside the window %s", open)
	}
}
