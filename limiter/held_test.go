package limiter

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// Waiters that need a token of a campaign's cap (10/s) and one of a provider's (100/s), while the
// provider's bucket is taken for the next second by another process, must not hold campaign tokens
// through that wait: they would all go out together when the provider's bucket frees, on top of what the
// campaign's bucket lets out then. The tokens of both are taken at one moment (takeAll), so the sends that
// follow the wait are spaced by the campaign's rate.
func TestTokensOfSeveralLimitsAreNotHeldThroughAWait(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	campaignCap := Limit{Key: "campaign:held", Rate: 10}
	providerCap := Limit{Key: "provider:held", Rate: 100}
	// Another process takes the provider's next second (its request waits that second out meanwhile).
	go New(rdb).WaitN(ctx, 100, providerCap) //nolint:errcheck // only its reservation matters
	for deadline := time.Now().Add(5 * time.Second); rdb.Exists(ctx, "rate:"+providerCap.Key).Val() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the provider's bucket was never taken")
		}
	}
	var mu sync.Mutex
	var at []time.Time
	var wg sync.WaitGroup
	for range 6 {
		b := New(rdb) // a process of its own each
		wg.Go(func() {
			if err := b.Wait(ctx, campaignCap, providerCap); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			at = append(at, time.Now())
			mu.Unlock()
		})
	}
	wg.Wait()
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	// Within any 100 ms (the campaign's interval) at most its burst and one more (timing).
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < 100*time.Millisecond; j++ {
			n++
		}
		if n > Burst(campaignCap.Rate)+1 {
			t.Fatalf("%d of the campaign's sends within 100 ms after the provider's wait (its rate 10/s): %v", n, at)
		}
	}
}
