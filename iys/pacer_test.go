package iys

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeTime is a clock that only sleeping moves. Each sleep oversleeps by latency, as a goroutine that
// wakes up late does, and the time it ends is recorded.
type fakeTime struct {
	mu      sync.Mutex
	now     time.Time
	latency time.Duration
	woke    []time.Time
	fail    error // returned by sleep instead of sleeping, when set
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.now = f.now.Add(d + f.latency)
	f.woke = append(f.woke, f.now)
	return nil
}

func (f *fakeTime) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func newTestPacer(rate float64) (*pacer, *fakeTime) {
	ft := &fakeTime{now: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	p := newPacer(rate)
	p.now, p.sleep = ft.Now, ft.sleep
	return p, ft
}

// Many callers at once start one interval apart, and no one-second window holds more than the rate,
// even when every wake-up comes late.
func TestPacerSpacesConcurrentCallers(t *testing.T) {
	for _, tt := range []struct {
		rate    float64
		latency time.Duration
	}{{10, 0}, {3, 0}, {25, 0}, {0.5, 0}, {10, 7 * time.Millisecond}, {7, 30 * time.Millisecond}} {
		p, ft := newTestPacer(tt.rate)
		ft.latency = tt.latency
		first := ft.Now()
		const n = 40
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if err := p.wait(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		starts := append([]time.Time{first}, ft.woke...) // the first caller went without sleeping
		if len(starts) != n {
			t.Fatalf("rate %v: %d starts, want %d", tt.rate, len(starts), n)
		}
		for i := 1; i < n; i++ {
			if gap := starts[i].Sub(starts[i-1]); gap != p.interval+tt.latency {
				t.Errorf("rate %v: start %d came %v after the previous, want %v", tt.rate, i, gap, p.interval+tt.latency)
			}
		}
		limit := max(1, int(tt.rate))
		if float64(limit) < tt.rate {
			limit++
		}
		for i := range starts {
			in := 0
			for _, s := range starts[i:] {
				if s.Sub(starts[i]) < time.Second {
					in++
				}
			}
			if in > limit {
				t.Errorf("rate %v: %d starts in the second from start %d", tt.rate, in, i)
			}
		}
	}
}

// An idle pacer lets the next request go at once and saves up no burst.
func TestPacerNoBurstAfterIdle(t *testing.T) {
	p, ft := newTestPacer(10)
	ctx := context.Background()
	_ = p.wait(ctx)
	ft.advance(time.Minute)
	idle := ft.Now()
	for range 3 {
		if err := p.wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := []time.Time{idle.Add(100 * time.Millisecond), idle.Add(200 * time.Millisecond)}
	if !slices.Equal(ft.woke, want) {
		t.Errorf("after a minute idle: wake-ups %v, want the first at once then %v", ft.woke, want)
	}
	ft.advance(50 * time.Millisecond) // half an interval: the next waits the other half
	_ = p.wait(ctx)
	if got := ft.woke[2].Sub(idle.Add(200 * time.Millisecond)); got != 100*time.Millisecond {
		t.Errorf("started %v after the previous, want 100ms", got)
	}
}

// A caller whose context ends takes no slot, and lets the next caller in.
func TestPacerCancelledWait(t *testing.T) {
	p, ft := newTestPacer(10)
	ctx := context.Background()
	_ = p.wait(ctx)
	start := ft.Now()
	ft.fail = context.Canceled
	if err := p.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	ft.fail = nil
	_ = p.wait(ctx)
	if want := start.Add(100 * time.Millisecond); len(ft.woke) != 1 || !ft.woke[0].Equal(want) {
		t.Errorf("the next caller starts at %v, want %v", ft.woke, want)
	}
	// A caller queued behind a long wait gives up when its context does, without waiting its turn.
	p.turn <- struct{}{} // someone else is waiting for a slot
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.wait(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("queued and cancelled: %v", err)
	}
	<-p.turn
}

// sleepCtx against real time: it sleeps, and it stops when the context does.
func TestSleepCtx(t *testing.T) {
	start := time.Now()
	if err := sleepCtx(context.Background(), 30*time.Millisecond); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Errorf("sleep: %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := sleepCtx(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Errorf("cancelled sleep: %v after %v", err, time.Since(start))
	}
}
