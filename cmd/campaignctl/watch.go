package main

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/campaignctl/campaignctl/worker"
)

// rateWindow is how far back the rate a watch shows looks: the acceptances of the last few seconds, so
// the figure follows a rate that changes (a pace lowered, a window closing) and starts from the truth.
const rateWindow = 5 * time.Second

// acceptRate follows a campaign's acceptances (sent) over the last rateWindow.
type acceptRate struct {
	samples []rateSample
}

type rateSample struct {
	at   time.Time
	sent int64
}

// add records the count at t and returns the rate over the samples of the last rateWindow (0 until two
// samples span some time).
func (r *acceptRate) add(t time.Time, sent int64) float64 {
	r.samples = append(r.samples, rateSample{t, sent})
	for len(r.samples) > 2 && t.Sub(r.samples[1].at) >= rateWindow {
		r.samples = r.samples[1:]
	}
	first := r.samples[0]
	dt := t.Sub(first.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(sent-first.sent) / dt
}

// watchETA is the ETA a watch shows for v at rate: none ("?") while something holds the campaign (paused,
// a closed window, no worker, the provider down): the last seconds' rate says nothing of when it goes on.
func watchETA(v worker.CampaignStatus, rate float64) string {
	if v.Waiting != nil && v.Pending > 0 {
		return "?"
	}
	return eta(v.Pending, rate)
}

// eta is the time left at rate for pending recipients ("" when it cannot be told).
func eta(pending int64, rate float64) string {
	switch {
	case pending == 0:
		return "0s"
	case rate <= 0:
		return "?"
	}
	d := time.Duration(math.Ceil(float64(pending)/rate)) * time.Second
	return d.String()
}

// watch follows a campaign until it is no longer running: live bars on a terminal, one progress line
// every few seconds otherwise, with the rate of the last few seconds' acceptances and the ETA at it. It
// ends by itself when the campaign completes, is cancelled or fails; Ctrl-C (or SIGTERM) only stops the
// watching: the campaign keeps sending, and the way back is printed.
//
// final, when not nil, prints the campaign's end instead of printStatus on stdout.
func (a *app) watch(ctx context.Context, svc *services, id int64, final func(worker.CampaignStatus) error) error {
	opts := worker.StatusOptions{Store: svc.store, Redis: svc.redis, CampaignID: id}
	var blip string // what was unreachable at the last poll (watchStatus)
	// The first read outlives a blip as the next ones do: Redis may go away between the launch's report and
	// the watch's first poll. Only with neither Redis nor Postgres is there nothing to show.
	v, err := a.watchStatus(ctx, opts, &blip)
	if err != nil {
		return err
	}
	interval := 2 * time.Second
	var rate acceptRate
	var update func(v worker.CampaignStatus, perSec float64)
	var done func()
	if drawsBars(a.stderr, true) {
		interval = 300 * time.Millisecond
		update, done = a.bars(ctx, v.Planned)
	} else {
		update = func(v worker.CampaignStatus, perSec float64) {
			line := fmt.Sprintf("campaign %d %s: planned %d sent %d failed %d skipped %d unknown %d pending %d; %.0f msg/s, ETA %s",
				v.ID, v.State, v.Planned, v.Sent, v.Failed, v.Skipped, v.Unknown, v.Pending, perSec, watchETA(v, perSec))
			if v.Waiting != nil {
				line += "; waiting: " + v.Waiting.Reason
			}
			fmt.Fprintln(a.stderr, line)
		}
		done = func() {}
	}
	for {
		update(v, rate.add(time.Now(), v.Sent))
		if v.Over() {
			done()
			if final != nil {
				return final(v)
			}
			a.printStatus(v, nil)
			return nil
		}
		select {
		case <-ctx.Done():
			done()
			return a.detach(id)
		case <-time.After(interval):
		}
		next, err := a.watchStatus(ctx, opts, &blip)
		if ctx.Err() != nil {
			done()
			return a.detach(id)
		}
		if err == nil {
			v = next
		}
	}
}

// watchStatus reads the campaign's status for a watch. A watch outlives a blip of Redis or Postgres: the
// campaign goes on sending without it. With Redis unreachable the figures come from Postgres alone (no DLQ
// count, no waiting reason); with neither, the last figures stay up. Each change of what is reachable is
// said once on the log (blip holds the last one said).
func (a *app) watchStatus(ctx context.Context, opts worker.StatusOptions, blip *string) (worker.CampaignStatus, error) {
	v, err := worker.Status(ctx, opts)
	say := func(now, msg string, err error) {
		if *blip != now {
			*blip = now
			if err != nil {
				a.logger().Warn(msg, "err", err)
			} else {
				a.logger().Info(msg)
			}
		}
	}
	if err == nil {
		say("", "the status is whole again", nil)
		return v, nil
	}
	if ctx.Err() != nil {
		return v, err
	}
	pg := opts
	pg.Redis = nil
	if v, perr := worker.Status(ctx, pg); perr == nil {
		say("redis", "Redis is unreachable: the figures are Postgres's alone (no DLQ count, no waiting reason) until it is back; the watch goes on", err)
		return v, nil
	}
	say("both", "neither Redis nor Postgres answers: the figures shown are the last read; the watch goes on (Ctrl-C leaves it, the campaign keeps its state)", err)
	return v, err
}

// detach ends a watch stopped by the user: the campaign goes on without it.
func (a *app) detach(id int64) error {
	fmt.Fprintf(a.stderr, "\nstopped watching; campaign %d keeps sending.\n  watch again: campaignctl status %d --watch\n  pause:       campaignctl pause %d\n  cancel:      campaignctl cancel %d\n", id, id, id, id)
	return nil
}

// bars draws one bar for progress (with the rate of the last few seconds' acceptances and the ETA at it)
// and one per outcome.
func (a *app) bars(ctx context.Context, planned int64) (func(worker.CampaignStatus, float64), func()) {
	// Its own context: the bars are taken down by done, after the last figures, not by a Ctrl-C.
	p := mpb.NewWithContext(context.WithoutCancel(ctx), mpb.WithOutput(a.stderr), mpb.WithWidth(50), mpb.WithRefreshRate(150*time.Millisecond))
	total := max(planned, 1)
	bar := func(name string, extra ...decor.Decorator) *mpb.Bar {
		return p.AddBar(total,
			mpb.PrependDecorators(decor.Name(name, decor.WC{C: decor.DindentRight | decor.DextraSpace, W: 9}), decor.CountersNoUnit("%d / %d", decor.WCSyncWidth)),
			mpb.AppendDecorators(extra...))
	}
	var speed atomic.Value // read by the bars' goroutine
	speed.Store("")
	progress := bar("done", decor.Percentage(decor.WCSyncSpace), decor.Name("  "),
		decor.Any(func(decor.Statistics) string { return speed.Load().(string) }))
	sent := bar("sent")
	failed := bar("failed")
	skipped := bar("skipped")
	unknown := bar("unknown")
	return func(v worker.CampaignStatus, perSec float64) {
			line := fmt.Sprintf("%.0f msg/s  ETA %s", perSec, watchETA(v, perSec))
			if v.Waiting != nil {
				line += "  waiting: " + v.Waiting.Reason
			}
			speed.Store(line)
			progress.SetCurrent(v.Planned - v.Pending)
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
