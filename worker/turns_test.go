package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/worker"
)

// Batch runs under a cap share the worker slots with other campaigns' batches: a run of a campaign that runs
// more batches than its share of the slots in use, while a batch of another campaign waits in the queue,
// hands its batch back (a wait, not a failure): at once when it starts, or after TurnAfter at the end of a
// chunk; of the campaign's batches, the last ones by number, as many as it runs over its share. Before, a
// campaign at --rate 100 held every slot of every worker, and a campaign launched after it sent nothing
// until it ended (8.5 minutes); the first fix let them alternate, each holding every slot in turn. With
// nothing else waiting (or only its own batches), a run goes to its end.
func TestRunsUnderACapShareTheSlots(t *testing.T) {
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
	running := func(ids ...string) {
		t.Helper()
		if err := e.rdb.Del(ctx, "asynq:{"+worker.Queue+"}:active").Err(); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if err := e.rdb.LPush(ctx, "asynq:{"+worker.Queue+"}:active", id).Err(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(1100 * time.Millisecond) // the handler reads the queue at most once a second
	}

	// Only its own other batch waiting: no one to give the slot to; the run goes to the end of its batch.
	client := asynq.NewClientFromRedisClient(e.rdb)
	task, err := worker.NewBatchTask(slow.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(task); err != nil {
		t.Fatal(err)
	}
	running(worker.TaskID(slow.ID, 0), worker.TaskID(slow.ID, 1))
	if err := h.RunBatch(ctx, slow.ID, 0); err != nil {
		t.Fatalf("with only its own batch waiting the run returned %v; want it to end its batch", err)
	}
	if c := e.counts(t, slow.ID); c.Sent != 20 {
		t.Fatalf("counts %+v; want batch 0's 20 sent", c)
	}

	// Another campaign's batch waits; slow runs batches 0 and 1, over its share of the two slots: batch 1,
	// the last, hands back at once, before it sends anything; batch 0 would keep its slot. Batch 0 runs as
	// a sweep's follow-up task (its ID "<campaign>:<batch>/<kind>-<second>"): it counts as slow's all the
	// same.
	other := e.launch(t, "other", 40)
	running(fmt.Sprintf("%s/swept-%d", worker.TaskID(slow.ID, 0), time.Now().Unix()), worker.TaskID(slow.ID, 1))
	err = h.RunBatch(ctx, slow.ID, 1)
	var re *worker.RetryError
	if !errors.As(err, &re) || !re.Wait || re.Failure || !strings.Contains(re.Error(), "more than its share") {
		t.Fatalf("the run returned %v; want the batch handed back as a wait, another campaign's batch waiting", err)
	}
	if c := e.counts(t, slow.ID); c.Sent != 20 || p.calls() != 20 {
		t.Fatalf("counts %+v, %d calls; want nothing of batch 1 sent", c, p.calls())
	}
	// Within its share (the other campaign runs a batch too): batch 1 keeps its slot to its end, the other
	// campaign's still waiting.
	running(worker.TaskID(slow.ID, 1), worker.TaskID(other.ID, 0))
	if err := h.RunBatch(ctx, slow.ID, 1); err != nil {
		t.Fatalf("within its share the run returned %v; want it to end its batch", err)
	}
	if c := e.counts(t, slow.ID); c.Sent != 40 || p.calls() != 40 {
		t.Fatalf("counts %+v, %d calls; want all 40 sent once", c, p.calls())
	}

	// Mid-run: a second slow campaign's batch 1 starts within its share; then its batch 0 runs too, and at
	// the end of a chunk past TurnAfter batch 1, over the share, hands the rest back.
	slow2Spec := e.spec("slow2", 20)
	slow2Spec.Rate = 5 // a batch: 4 s, in chunks of about a second
	rep2, err := e.planner().Plan(ctx, slow2Spec)
	if err != nil {
		t.Fatal(err)
	}
	running(worker.TaskID(rep2.ID, 1))
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- h.RunBatch(ctx, rep2.ID, 1) }()
	time.Sleep(200 * time.Millisecond)
	if err := e.rdb.LPush(ctx, "asynq:{"+worker.Queue+"}:active", worker.TaskID(rep2.ID, 0)).Err(); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.As(err, &re) || !re.Wait || !strings.Contains(re.Error(), "more than its share") {
		t.Fatalf("the run returned %v after %v; want its batch handed back mid-run", err, time.Since(start))
	}
	if c := e.counts(t, rep2.ID); c.Sent == 0 || c.Sent >= 20 || c.Sent+c.Pending != 40 {
		t.Fatalf("counts %+v; want some of batch 1 sent and recorded, the rest pending", c)
	}
}

// By default a run under a cap over its campaign's share gives its slot at the end of its first chunk past
// a second (Config.TurnAfter), not ten seconds later. An outside run, 3 workers × 4 slots: a campaign
// launched 2 s after one at --rate 100 (64 batches, every slot waiting on the cap) sent its first message
// 8 s after its launch; with a second, about 2 s.
func TestARunUnderACapGivesItsSlotAfterASecondByDefault(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 40, nil)
	ctx := context.Background()
	spec := e.spec("slow", 20) // two batches of 20
	spec.Rate = 2              // a batch: 10 s, in chunks of about a second
	rep, err := e.planner().Plan(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	p := newGatedProvider()
	close(p.release)
	// TurnAfter left to its default.
	h := worker.NewHandler(worker.Config{Store: e.store, Redis: e.rdb, Owner: "turns-default", SendWindow: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})
	e.launch(t, "other", 40) // its batch waits in the queue
	active := "asynq:{" + worker.Queue + "}:active"
	if err := e.rdb.LPush(ctx, active, worker.TaskID(rep.ID, 1)).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- h.RunBatch(ctx, rep.ID, 1) }()
	// Within its share at its start (one slot of one in use); then its batch 0 runs too, and batch 1,
	// the last, is over the share.
	time.Sleep(200 * time.Millisecond)
	if err := e.rdb.LPush(ctx, active, worker.TaskID(rep.ID, 0)).Err(); err != nil {
		t.Fatal(err)
	}
	var re *worker.RetryError
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the run kept its slot for 15 s")
	}
	took := time.Since(start)
	if !errors.As(err, &re) || !re.Wait || !strings.Contains(re.Error(), "more than its share") {
		t.Fatalf("the run returned %v after %v; want its batch handed back mid-run", err, took)
	}
	if took > 5*time.Second {
		t.Fatalf("the run handed its batch back after %v; want it at the end of a chunk a second or two after it went over its share", took)
	}
	if c := e.counts(t, rep.ID); c.Sent == 0 || c.Sent >= 20 {
		t.Fatalf("counts %+v; want some of batch 1 sent before it was handed back, not all", c)
	}
}

// A run without a cap takes its share of the slots too: when it starts while its campaign runs more
// batches than its share and another campaign's batch waits, it hands its batch back before it sends.
// Before, a campaign without a cap took every slot a capped one freed, and the capped one (at --rate 100,
// 3 workers × 4 slots, 100 ms provider latency) sent nothing from 21 s on until the other's queued batches
// had all started; now it keeps its cap beside it.
func TestARunWithoutACapStartsOnlyWithinItsShare(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 40, nil)
	ctx := context.Background()
	fast := e.plan(t, "fast", 20) // two batches of 20, no cap
	p := newGatedProvider()
	close(p.release)
	h := worker.NewHandler(worker.Config{Store: e.store, Redis: e.rdb, Owner: "turns-uncapped",
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})
	active := "asynq:{" + worker.Queue + "}:active"
	if err := e.rdb.LPush(ctx, active, worker.TaskID(fast.ID, 0), worker.TaskID(fast.ID, 1)).Err(); err != nil {
		t.Fatal(err)
	}
	e.launch(t, "other", 40) // its batch waits in the queue
	err := h.RunBatch(ctx, fast.ID, 1)
	var re *worker.RetryError
	if !errors.As(err, &re) || !re.Wait || re.Failure || !strings.Contains(re.Error(), "more than its share") {
		t.Fatalf("the run returned %v; want batch 1, over its campaign's share, handed back as a wait", err)
	}
	if c := e.counts(t, fast.ID); c.Sent != 0 || p.calls() != 0 {
		t.Fatalf("counts %+v, %d calls; want nothing sent", c, p.calls())
	}
	// Batch 0, within the share (the first by number), goes to its end.
	if err := h.RunBatch(ctx, fast.ID, 0); err != nil {
		t.Fatalf("within its share the run returned %v; want it to end its batch", err)
	}
	if c := e.counts(t, fast.ID); c.Sent != 20 || p.calls() != 20 {
		t.Fatalf("counts %+v, %d calls; want batch 0's 20 sent once", c, p.calls())
	}
}
