package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/campaignctl/campaignctl/campaign"
)

// watch follows a campaign until it is no longer running: live bars on a terminal, one progress line
// every few seconds otherwise. It ends by itself when the campaign completes, is cancelled or fails.
func (a *app) watch(ctx context.Context, engine *pgxpool.Pool, rdb *redis.Client, id int64) error {
	store := campaign.NewStore(engine)
	v, err := a.statusOf(ctx, store, rdb, id)
	if err != nil {
		return err
	}
	finished := func(v statusView) bool {
		return v.State == campaign.StateCompleted || v.State == campaign.StateCancelled || v.State == campaign.StateFailed
	}
	interval := 2 * time.Second
	var update func(v statusView, dt time.Duration)
	var done func()
	if isTerminal(a.stderr) {
		interval = 300 * time.Millisecond
		update, done = a.bars(ctx, v.Planned)
	} else {
		update = func(v statusView, _ time.Duration) {
			fmt.Fprintf(a.stderr, "campaign %d %s: planned %d sent %d failed %d skipped %d unknown %d pending %d\n",
				v.ID, v.State, v.Planned, v.Sent, v.Failed, v.Skipped, v.Unknown, v.Pending)
		}
		done = func() {}
	}
	last := time.Now()
	for {
		now := time.Now()
		update(v, now.Sub(last))
		last = now
		if finished(v) {
			done()
			a.printStatus(v)
			return nil
		}
		select {
		case <-ctx.Done():
			done()
			return ctx.Err()
		case <-time.After(interval):
		}
		if v, err = a.statusOf(ctx, store, rdb, id); err != nil {
			done()
			return err
		}
	}
}

// bars draws one bar for progress (with rate and ETA) and one per outcome.
func (a *app) bars(ctx context.Context, planned int64) (func(statusView, time.Duration), func()) {
	p := mpb.NewWithContext(ctx, mpb.WithOutput(a.stderr), mpb.WithWidth(50), mpb.WithRefreshRate(150*time.Millisecond))
	total := max(planned, 1)
	bar := func(name string, extra ...decor.Decorator) *mpb.Bar {
		return p.AddBar(total,
			mpb.PrependDecorators(decor.Name(name, decor.WC{C: decor.DindentRight | decor.DextraSpace, W: 9}), decor.CountersNoUnit("%d / %d", decor.WCSyncWidth)),
			mpb.AppendDecorators(extra...))
	}
	progress := bar("done", decor.Percentage(decor.WCSyncSpace), decor.Name("  "),
		decor.EwmaSpeed(nil, "%.0f msg/s", 30), decor.Name("  ETA "), decor.EwmaETA(decor.ET_STYLE_GO, 30))
	sent := bar("sent")
	failed := bar("failed")
	skipped := bar("skipped")
	unknown := bar("unknown")
	return func(v statusView, dt time.Duration) {
			progress.EwmaSetCurrent(v.Planned-v.Pending, dt)
			sent.SetCurrent(v.Sent)
			failed.SetCurrent(v.Failed)
			skipped.SetCurrent(v.Skipped)
			unknown.SetCurrent(v.Unknown)
		}, func() {
			for _, b := range []*mpb.Bar{progress, sent, failed, skipped, unknown} {
				if !b.Completed() {
					b.Abort(false)
				}
			}
			p.Wait()
		}
}
