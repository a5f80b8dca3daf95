package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

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

// A batch Asynq took back from a worker that stopped heartbeating runs again within about a second, at any
// retry count: the minute Asynq waited to take it back is wait enough. Other failures keep their back-off.
func TestRetryDelayOfABatchTakenBackFromAStoppedWorker(t *testing.T) {
	t.Parallel()
	for n := range 8 {
		for range 20 {
			if d := RetryDelay(n, asynq.ErrLeaseExpired, nil); d < leaseExpiredDelay/2 || d > 3*leaseExpiredDelay/2 {
				t.Fatalf("retry %d after a lease expired: %v; want %v to %v", n, d, leaseExpiredDelay/2, 3*leaseExpiredDelay/2)
			}
		}
	}
	if d := RetryDelay(4, errors.New("provider down"), nil); d < 16*time.Second {
		t.Fatalf("retry 4 after a failure: %v; want at least 16 s (2 s·2^4, half of it jitter)", d)
	}
}

// countEnqueues calls at on each Asynq enqueue (a script call) the client makes, with how many came before.
type countEnqueues struct {
	n  int
	at func(n int)
}

func (c *countEnqueues) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countEnqueues) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *countEnqueues) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			c.at(c.n)
			c.n++
		}
		return next(ctx, cmd)
	}
}

// A launch marks the batches it hands to the queue as it goes, a group at a time: killed halfway, it leaves
// those it queued marked (enqueued_at), not only when the whole loop is over.
func TestEnqueueMarksTheBatchesItQueuedAsItGoes(t *testing.T) {
	t.Parallel()
	f := planWith(t, 900, func(s *campaign.Spec) { s.BatchSize = 1 })
	if f.batches < 2*markEvery+50 {
		t.Fatalf("%d batches planned, want more than %d", f.batches, 2*markEvery+50)
	}
	ctx := context.Background()
	c, err := f.store.Get(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}
	const at = 2*markEvery + 50
	marked := -1
	hook := &countEnqueues{at: func(n int) {
		if n == at {
			if err := f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND enqueued_at IS NOT NULL`, f.id).Scan(&marked); err != nil {
				t.Error(err)
			}
		}
	}}
	rdb := redis.NewClient(f.rdb.Options())
	defer rdb.Close()
	rdb.AddHook(hook)
	added, _, err := Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), f.store, c, true)
	if err != nil || added != f.batches {
		t.Fatalf("enqueue: added %d, err %v; want %d", added, err, f.batches)
	}
	if marked != 2*markEvery {
		t.Fatalf("%d batches marked enqueued when %d were queued, want %d", marked, at, 2*markEvery)
	}
	var unmarked int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND enqueued_at IS NULL`, f.id).Scan(&unmarked); err != nil || unmarked != 0 {
		t.Fatalf("%d batches left unmarked (%v), want none", unmarked, err)
	}
}
