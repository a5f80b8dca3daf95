package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// These benchmarks need the local Redis at 127.0.0.1:6379 (TEST_REDIS_ADDR overrides it); each leases a
// DB of its own through testredis. Run them alone with
//
//	go test ./limiter -run '^$' -bench . -benchtime 2s

var errBenchSleep = errors.New("limiter benchmark: Wait slept, the benchmark measures only the Redis round trips")

// benchBucket returns a Bucket on a leased Redis DB whose sleep fails instead of sleeping, so that a
// benchmark meant to measure round trips cannot silently measure waiting instead.
func benchBucket(b *testing.B) *Bucket {
	b.Helper()
	rdb, _ := testredis.New(b)
	bk := New(rdb)
	bk.sleep = func(context.Context, time.Duration) error { return errBenchSleep }
	return bk
}

// checkPauseHonoured makes sure Wait on l really asks Redis: while l.Key is paused it must try to sleep.
// The pause is removed afterwards.
func checkPauseHonoured(b *testing.B, bk *Bucket, l Limit) {
	b.Helper()
	ctx := context.Background()
	if err := bk.Pause(ctx, l.Key, time.Hour); err != nil {
		b.Fatal(err)
	}
	if err := bk.Wait(ctx, l); !errors.Is(err, errBenchSleep) {
		b.Fatalf("Wait on a paused key returned %v, want it to wait out the pause", err)
	}
	if err := bk.rdb.Del(ctx, pauseKey(l.Key)).Err(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWaitUncappedPausable measures Wait on one limit without a cap that can be paused (a
// provider's when no rate is configured): one Redis round trip per token, the pause check (PTTL).
//
//	go test ./limiter -run '^$' -bench WaitUncappedPausable -benchtime 2s
func BenchmarkWaitUncappedPausable(b *testing.B) {
	bk := benchBucket(b)
	ctx := context.Background()
	l := Limit{Key: "provider:" + b.Name(), Rate: 0, Pausable: true}
	checkPauseHonoured(b, bk, l)

	b.ReportAllocs()
	for b.Loop() {
		if err := bk.Wait(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWaitN100Capped measures WaitN of 100 tokens (one request carrying 100 messages) on a limit
// whose cap (1e9/s) is never reached, so it never sleeps: the cost of the GCRA script, one round trip per
// call. It also reports the cost per token (ns/token).
//
//	go test ./limiter -run '^$' -bench WaitN100Capped -benchtime 2s
func BenchmarkWaitN100Capped(b *testing.B) {
	const n = 100
	bk := benchBucket(b)
	ctx := context.Background()
	l := Limit{Key: "campaign:" + b.Name(), Rate: 1e9}
	if burst := gcra(l.Rate).Burst; burst < n {
		b.Fatalf("burst %d < %d: WaitN would take several round trips", burst, n)
	}
	// The tokens really are taken from the Redis bucket.
	if err := bk.WaitN(ctx, n, l); err != nil {
		b.Fatal(err)
	}
	if got, err := bk.rdb.Exists(ctx, "rate:"+l.Key).Result(); err != nil || got != 1 {
		b.Fatalf("after WaitN the GCRA key %q exists %d times (err %v), want 1", "rate:"+l.Key, got, err)
	}

	b.ReportAllocs()
	for b.Loop() {
		if err := bk.WaitN(ctx, n, l); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
}

// BenchmarkWaitParallel measures Wait on an uncapped pausable limit from many goroutines at once (GOMAXPROCS
// of them, times -cpu / SetParallelism), as a worker's send goroutines do: the pause checks share the
// client's connection pool. ns/op is wall time per Wait over all goroutines.
//
//	go test ./limiter -run '^$' -bench WaitParallel -benchtime 2s -cpu 1,4,16
func BenchmarkWaitParallel(b *testing.B) {
	bk := benchBucket(b)
	l := Limit{Key: "provider:" + b.Name(), Pausable: true}
	checkPauseHonoured(b, bk, l)

	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if err := bk.Wait(ctx, l); err != nil {
				b.Error(fmt.Errorf("parallel Wait: %w", err))
				return
			}
		}
	})
}
