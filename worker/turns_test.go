package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/worker"
)

// A batch run under a cap takes turns with another campaign's batches: once it has held its worker slot for
// TurnAfter while a batch of another campaign waits in the queue, it hands the rest of its batch back
// (a wait, not a failure) and that batch gets the slot. Before, a campaign at --rate 100 held every slot of
// every worker, and a campaign launched after it sent nothing until it ended. With nothing else waiting
// (or only its own batches), the run goes on to its end.
func TestARunUnderACapTakesTurnsWithAnotherCampaign(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 40, nil)
	ctx := context.Background()
	slowSpec := e.spec("slow", 20) // two batches of 20
	slowSpec.Rate = 10             // a batch: 2 s
	rep, err := e.planner().Plan(ctx, slowSpec)
	if err != nil {
		t.Fatal(err)
	}
	slow := e.campaign(t, rep.ID)
	p := newGatedProvider()
	close(p.release)
	h := worker.NewHandler(worker.Config{Store: e.store, Redis: e.rdb, Owner: "turns", SendWindow: 1, TurnAfter: 500 * time.Millisecond,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})

	// Only its own other batch queued: no turn to take; the run goes to the end of its batch.
	client := asynq.NewClientFromRedisClient(e.rdb)
	task, err := worker.NewBatchTask(slow.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, slow.ID, 0); err != nil {
		t.Fatalf("with only its own batch queued the run returned %v; want it to end its batch", err)
	}
	if c := e.counts(t, slow.ID); c.Sent != 20 {
		t.Fatalf("counts %+v; want batch 0's 20 sent", c)
	}

	// Another campaign's batches queued: the run of batch 1 takes its turn and hands the rest back.
	e.launch(t, "other", 40)
	start := time.Now()
	err = h.RunBatch(ctx, slow.ID, 1)
	var re *worker.RetryError
	if !errors.As(err, &re) || !re.Wait || re.Failure || !strings.Contains(re.Error(), "another campaign waits") {
		t.Fatalf("the run returned %v after %v; want the batch handed back as a wait, another campaign's batch queued", err, time.Since(start))
	}
	if took := time.Since(start); took > 1800*time.Millisecond {
		t.Fatalf("the run handed its batch back after %v; want after its turn (0.5 s), before its end (2 s)", took)
	}
	sent := p.calls() - 20
	if c := e.counts(t, slow.ID); c.Sent != 20+int64(sent) || c.Pending != 20-int64(sent) || sent == 0 {
		t.Fatalf("counts %+v with %d of batch 1 sent; want what was sent recorded and the rest pending for the next run", c, sent)
	}
	// The other campaign's batches gone from the queue: the next run goes to the end.
	if _, err := e.insp.DeleteAllPendingTasks(worker.Queue); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, slow.ID, 1); err != nil {
		t.Fatalf("with nothing else queued the run returned %v; want it to end its batch", err)
	}
	if c := e.counts(t, slow.ID); c.Sent != 40 || p.calls() != 40 {
		t.Fatalf("counts %+v, %d calls; want all 40 sent once", c, p.calls())
	}
}
