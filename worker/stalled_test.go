package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A worker stopped (SIGSTOP, a paused virtual machine) while its requests were out wakes to reads that
// expired long ago: its recipients are unknown, but the provider is not to blame, and the provider's pace,
// shared by every worker, must not call it down. The same answers coming back within the provider's time
// do call it down: that is what the pace is for. (Mutation: observe counting every ambiguous answer, as before,
// calls the provider down after the stall too.)
func TestAStalledWorkerDoesNotCallTheProviderDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		took     time.Duration
		wantDown bool
	}{
		{"answers lost within the provider's time", time.Millisecond, true},
		{"answers lost while the worker was stopped", 150 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 60) // 33 eligible, in windows of 8
			lost := &loseAnswers{scriptedProvider: f.provider, after: tc.took}
			h, _, _ := f.faulty(t, func(c *Config) {
				c.SendWindow, c.InFlightGrace = 8, 50*time.Millisecond
				c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: lost}
			})
			// A provider called down holds the runs to a probe a second: three seconds tell.
			stop := time.AfterFunc(3*time.Second, h.Stop)
			defer stop.Stop()
			for b := 0; b < f.batches; b++ {
				_ = h.RunBatch(ctx, f.id, b)
			}
			if n := f.provider.total(); n < 5 {
				t.Fatalf("%d requests written, want at least 5 for the pace to judge", n)
			}
			if down := h.pace(lost.Name()).Down(ctx); down != tc.wantDown {
				t.Fatalf("after %d answers lost, each after %v: provider down %v, want %v", f.provider.total(), tc.took, down, tc.wantDown)
			}
		})
	}
}

// loseAnswers is a provider that takes every message and loses its answer after a while (ambiguous).
type loseAnswers struct {
	*scriptedProvider
	after time.Duration
}

func (p *loseAnswers) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	p.scriptedProvider.Send(ctx, m) //nolint:errcheck // taken; its answer is lost
	time.Sleep(p.after)
	return providers.Result{}, &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
}
