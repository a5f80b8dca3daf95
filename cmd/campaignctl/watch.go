package main

import (
	"context"
	"fmt"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/campaignctl/campaignctl/worker"
)

// watch follows a campaign until it is no longer running: live bars on a terminal, one progress line
// every few seconds otherwise. It ends by itself when the campaign completes, is cancelled or fails.
func (a *app) watch(ctx context.Context, svc *services, id int64) error {
	opts := worker.StatusOptions{Store: svc.store, Redis: svc.redis, CampaignID: id}
	v, err := worker.Status(ctx, opts)
	if err != nil {
		return err
	}
	interval := 2 * time.Second
	var update func(v worker.CampaignStatus, dt time.Duration)
	var done func()
	if isTerminal(a.stderr) {
		interval = 300 * time.Millisecond
		update, done = a.bars(ctx, v.Planned)
	} else {
		update = func(v worker.CampaignStatus, _ time.Duration) {
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
		if v.Over() {
			done()
			a.printStatus(v, nil)
			return nil
		}
		select {
		case <-ctx.Done():
			done()
			return ctx.Err()
		case <-time.After(interval):
		}
		if v, err = worker.Status(ctx, opts); err != nil {
			done()
			return err
		}
	}
}

// bars draws one bar for progress (with rate and ETA) and one per outcome.
func (a *app) bars(ctx context.Context, planned int64) (func(worker.CampaignStatus, time.Duration), func()) {
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
	return func(v worker.CampaignStatus, dt time.Duration) {
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
