package limiter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

type observations struct {
	mu sync.Mutex
	v  []float64
}

func (o *observations) Observe(v float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.v = append(o.v, v)
}

// Every Wait reports how long it spent on each limit that has a cap or can be paused: its tokens and its
// pause. A limit with neither reports nothing.
func TestMetricsObserverSeesEveryWait(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	b := New(rdb)
	ctx := context.Background()
	var capped, uncapped, paused observations
	for i := 0; i < 3; i++ {
		if err := b.Wait(ctx, Limit{Key: "campaign:1", Rate: 10, Observer: &capped}, Limit{Key: "campaign:2", Observer: &uncapped}); err != nil {
			t.Fatal(err)
		}
	}
	if len(capped.v) != 3 || len(uncapped.v) != 0 {
		t.Fatalf("observations: capped %v, uncapped %v; want 3 and none", capped.v, uncapped.v)
	}
	// 10/s with a burst of 1: the first token is at hand (a round trip, less than a token's period even on
	// a loaded machine), the second and third each wait about 100 ms.
	if capped.v[0] > 0.1 || capped.v[1] < 0.05 || capped.v[2] < 0.05 {
		t.Fatalf("capped waits %v, want about 0, 0.1, 0.1", capped.v)
	}
	if err := b.Pause(ctx, "provider:x", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitN(ctx, 5, Limit{Key: "provider:x", Pausable: true, Observer: &paused}); err != nil {
		t.Fatal(err)
	}
	if len(paused.v) != 1 || paused.v[0] < 0.1 {
		t.Fatalf("paused waits %v, want one of about 0.2 s", paused.v)
	}
}
