package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// The messages the provider took before it went down are recorded sent while the run waits for it, not at
// the end of their chunk, which the outage puts off: status and report showed them pending all the while
// (288 pushes FCM had taken, for 33 s), to an operator who might send them again. Both send paths: one at
// a time, and a window.
func TestMessagesTakenBeforeAnOutageAreRecordedDuringIt(t *testing.T) {
	t.Parallel()
	onBothSendPaths(t, 60, func(t *testing.T, f *fixture) {
		const taken, outage = 12, 8 * time.Second
		var down atomic.Int64 // when the outage ends, unix ns; 0 before it begins
		f.provider.fail = func(call int, _ providers.Message) error {
			if call <= taken {
				return nil
			}
			if down.Load() == 0 {
				down.CompareAndSwap(0, time.Now().Add(outage).UnixNano())
			}
			if time.Now().UnixNano() < down.Load() {
				return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, Message: "unavailable"}
			}
			return nil
		}
		ctx := context.Background()
		done := make(chan error, 1)
		go func() { done <- f.runBatchFor(ctx, 0, 40*time.Second) }()
		// Late in the outage, with the provider down by the pace and the run waiting for it.
		waitUntil(t, 10*time.Second, "the outage to begin", func() bool { return down.Load() != 0 })
		time.Sleep(time.Until(time.Unix(0, down.Load()).Add(-2 * time.Second)))
		sent, took := f.counts(t).Sent, f.provider.total()
		if sent != int64(took) || took < taken {
			t.Errorf("2 s before the outage ends: %d recorded sent, the provider took %d; want every message it took recorded", sent, took)
		}
		if err := <-done; err != nil {
			t.Logf("the run: %v", err)
		}
		if c := f.counts(t); c.Sent != int64(f.provider.total()) {
			t.Errorf("after the run: %+v, the provider took %d", c, f.provider.total())
		}
	})
}
