package worker

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
)

// The whole path through Asynq: batches enqueued twice (the second enqueue is a no-op by task ID, a third
// after the campaign finished finds nothing pending), one server processing them; every eligible
// recipient gets exactly one message.
func TestBatchEnqueuedTwiceSendsOnce(t *testing.T) {
	t.Parallel()
	f := plan(t, 60) // 32 eligible in 4 batches
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := asynq.NewClientFromRedisClient(f.rdb)
	c, err := f.store.Get(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}

	added, existing, err := Enqueue(ctx, client, f.store, c, true)
	if err != nil || added != f.batches || existing != 0 {
		t.Fatalf("first enqueue: added %d existing %d err %v; want %d new", added, existing, err, f.batches)
	}
	added, existing, err = Enqueue(ctx, client, f.store, c, false)
	if err != nil || added != 0 || existing != f.batches {
		t.Fatalf("second enqueue: added %d existing %d err %v; want all %d already queued", added, existing, err, f.batches)
	}

	done := make(chan error, 1)
	go func() { done <- Serve(ctx, f.rdb, f.h, ServerConfig{Concurrency: 4}) }()
	deadline := time.After(30 * time.Second)
	for {
		c, err := f.store.Get(ctx, f.id)
		if err != nil {
			t.Fatal(err)
		}
		if c.State == campaign.StateCompleted {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("campaign not completed in 30s: %+v", f.counts(t))
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Enqueued once more after completion: the task IDs are free again, the batches have nothing pending.
	added, _, err = Enqueue(ctx, client, f.store, c, false)
	if err != nil || added != 0 {
		t.Fatalf("enqueue after completion: added %d err %v; want 0", added, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.provider.total(); got != 32 {
		t.Fatalf("provider accepted %d messages, want 32", got)
	}
	for to, bodies := range f.provider.accepted {
		if len(bodies) != 1 {
			t.Errorf("%s got %d messages", to, len(bodies))
		}
	}
}
