package supervisor

import (
	"testing"
	"time"
)

// The progress counters move when a run records its chunk: with a slow provider, a worker pool sending 25
// messages a second shows nothing for three seconds, then a hundred at once. The rate the policy reads is
// measured over RateWindow at least, so the per-worker rate it learns is what the workers send, not a
// chunk's burst: before, it was read over one interval (100/s for one worker here), and the rate caps
// seemed to need a quarter of the workers they did (the pool shrank to one and flapped).
func TestTheSendRateIsMeasuredOverAWindow(t *testing.T) {
	s := &Supervisor{}
	pol := Policy{Min: 1, Max: 10, Concurrency: 4, Cooldown: time.Minute}
	st := State{Workers: 1}
	t0 := time.Now()
	var sent int64
	for i := 0; i <= 30; i++ {
		if i > 0 && i%4 == 0 {
			sent += 100 // a chunk recorded
		}
		o := Observation{At: t0.Add(time.Duration(i) * time.Second), Active: 4, Pending: 40, RateCap: 45,
			Sends: map[int64]int64{1: sent}}
		if base := s.rateBase(o); base != nil {
			o.SendRate, o.RateSince = SendRate(*base, o), base.At
			if i < 10 {
				t.Fatalf("a rate after %d s, over less than RateWindow", i)
			}
		}
		if o.SendRate > 40 {
			t.Fatalf("second %d: a send rate of %.0f/s read from counters that move 100 every 4 s", i, o.SendRate)
		}
		var d Decision
		d, st = pol.Decide(st, o)
		st.Workers, st.LastChange = 1, time.Time{} // the pool is held at one worker: only the rate is looked at
		_ = d
	}
	if st.PerWorker < 20 || st.PerWorker > 30 {
		t.Fatalf("per-worker rate %.1f/s, want about 25 (100 messages every 4 s)", st.PerWorker)
	}
	if len(s.history) > 12 {
		t.Fatalf("%d observations kept for a window of %v at one a second", len(s.history), RateWindow)
	}
}
