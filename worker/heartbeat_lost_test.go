package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/worker"
)

// A worker's heartbeat that Redis lost with its data is back within a look (state.WorkerLook), not a
// beat (state.WorkerTTL/3): status reads the heartbeats, and said "no worker is running: start
// campaignctl worker" for up to ten seconds while the worker sent.
func TestAHeartbeatRedisLostIsWrittenAgainWithinSeconds(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		worker.Heartbeat(ctx, rdb, state.WorkerInfo{Owner: "lost-beat", Providers: map[string]string{"sms": "twilio"}})
	}()
	defer func() { cancel(); <-done }()
	back := func(within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for !state.WorkerPublished(context.Background(), rdb, "lost-beat") {
			if time.Since(start) > within {
				t.Fatalf("the heartbeat is not in Redis %v after it was lost", within)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return time.Since(start)
	}
	back(5 * time.Second) // the first beat
	// Let the beat age a little, so that the next one is not due by the clock.
	time.Sleep(time.Second)
	if err := rdb.Del(context.Background(), state.WorkerKey("lost-beat"), state.SeenKey).Err(); err != nil {
		t.Fatal(err)
	}
	took := back(state.WorkerLook + 2*time.Second)
	t.Logf("heartbeat written again %v after Redis lost it", took.Round(10*time.Millisecond))
	workers, err := state.Workers(context.Background(), rdb)
	if err != nil || len(workers) != 1 || workers[0].Providers["sms"] != "twilio" {
		t.Fatalf("workers after the heartbeat came back: %+v, %v; want the one, with its providers", workers, err)
	}
}
