package iys

import (
	"context"
	"math"
	"time"
)

// pacer lets requests start at least interval apart, measured from the moment the previous one was
// actually let go. Unlike a token bucket it allows no burst, so that any one-second window holds at most
// RatePerSecond request starts even when the requests reach İYS with some jitter; İYS counts its 10
// requests a second per IP, and a client that bursts to the limit risks 429 H124 on a slow link. Spacing
// from the actual start, not from a planned slot, keeps the guarantee when a goroutine wakes up late: the
// ones behind it are pushed back rather than bunched up. Callers wait one at a time, in arrival order. An
// idle pacer saves up nothing: after a pause the next request goes at once, the one after interval later.
type pacer struct {
	interval time.Duration
	now      func() time.Time
	sleep    func(ctx context.Context, d time.Duration) error

	turn chan struct{} // held by the caller waiting for its start
	last time.Time     // the previous start; guarded by turn
}

func newPacer(perSecond float64) *pacer {
	return &pacer{
		// Rounded up: a truncated interval (333,333,333 ns at 3/s) would fit rate+1 starts in a second.
		interval: time.Duration(math.Ceil(float64(time.Second) / perSecond)),
		now:      time.Now,
		sleep:    sleepCtx,
		turn:     make(chan struct{}, 1),
	}
}

// wait blocks until the caller may start a request, or ctx is done; a caller that gives up takes no slot.
func (p *pacer) wait(ctx context.Context) error {
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.turn }()
	if !p.last.IsZero() {
		if d := p.last.Add(p.interval).Sub(p.now()); d > 0 {
			if err := p.sleep(ctx, d); err != nil {
				return err
			}
		}
	}
	p.last = p.now()
	return nil
}

// sleepCtx waits d, or returns ctx's error if ctx is done first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
