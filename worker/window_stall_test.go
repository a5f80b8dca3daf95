package worker

import (
	"context"
	"errors"
	"github.com/campaignctl/campaignctl/limiter"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/providers"
)

// windowEdgeClock returns a fixture clock running at real speed that reads 19:59:59.5 in Istanbul now,
// half a second before a 09:00-20:00 window closes.
func windowEdgeClock() func() time.Time {
	ist, _ := time.LoadLocation(campaign.DefaultZone)
	edge := time.Date(2026, 12, 1, 19, 59, 59, 500_000_000, ist)
	off := edge.Sub(time.Now())
	return func() time.Time { return time.Now().Add(off) }
}

// A window check passed half a second before the window closes; the claim of that send then stalls on
// Redis for two seconds. The send does not leave after the window has closed. Before, with no cap (no
// campaign --rate, a provider cap of 0) nothing checked the window again, and the send left late.
func TestNoSendAfterTheWindowClosedWhileTheClaimStalled(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window int
		method string
		rate   float64
	}{
		{"one at a time, no cap", 1, "ClaimSend", 0},
		{"windowed, no cap", 8, "ClaimWindow", 0},
		{"one at a time, capped", 1, "ClaimSend", 100},
		{"windowed, capped", 8, "ClaimWindow", 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ist, _ := time.LoadLocation(campaign.DefaultZone)
			window, _ := campaign.ParseWindow("09:00-20:00", ist)
			f := planWith(t, 10, func(s *campaign.Spec) { s.Window = window })
			now := windowEdgeClock()
			h, fr, _ := f.faulty(t, func(c *Config) {
				c.Now, c.SendWindow = now, tc.window
				if tc.rate > 0 {
					c.ProviderRates = map[string]float64{"test": tc.rate}
				}
			})
			fr.Add(&faults.Rule{Match: faults.Method(tc.method), Times: 1, Kind: faults.Stall, Delay: 2 * time.Second})
			var mu sync.Mutex
			var late []string
			f.provider.fail = func(_ int, m providers.Message) error {
				if at := now(); !window.Open(at) {
					mu.Lock()
					late = append(late, m.To+" at "+at.In(ist).Format("15:04:05.000"))
					mu.Unlock()
				}
				return nil
			}
			err := h.RunBatch(context.Background(), f.id, 0)
			t.Logf("RunBatch: %v; sent %d", err, f.provider.total())
			if len(late) > 0 {
				t.Fatalf("%d sends left after the 09:00-20:00 window closed: %v", len(late), late)
			}
		})
	}
}

// At the window's opening, three workers whose batches were held back while it was closed start at once:
// the cap holds in every second (nothing carried over the closed hours).
func TestNoBurstAboveTheCapAtTheWindowsOpening(t *testing.T) {
	t.Parallel()
	const rate = 40
	ist, _ := time.LoadLocation(campaign.DefaultZone)
	window, _ := campaign.ParseWindow("09:00-20:00", ist)
	f := planWith(t, 600, func(s *campaign.Spec) { s.BatchSize = 110; s.Window = window })
	edge := time.Date(2026, 12, 1, 8, 59, 59, 0, ist)
	off := edge.Sub(time.Now())
	now := func() time.Time { return time.Now().Add(off) }
	at := f.sendTimes()
	hs := make([]*Handler, 3)
	for b := range hs {
		hs[b], _, _ = f.faulty(t, func(c *Config) {
			c.Now, c.SendWindow, c.ProviderRates = now, 8, map[string]float64{"test": rate}
		})
		var re *RetryError
		if err := hs[b].RunBatch(context.Background(), f.id, b); !errors.As(err, &re) {
			t.Fatalf("before 09:00: %v", err)
		}
	}
	for !window.Open(now()) {
		time.Sleep(time.Millisecond)
	}
	errs := make(chan error, len(hs))
	for b, h := range hs {
		go func() { errs <- h.RunBatch(context.Background(), f.id, b) }()
	}
	for range hs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	sent := at()
	busiest, from := busiestSecond(sent)
	t.Logf("%d sent, busiest second %d from %s", len(sent), busiest, from.Format("15:04:05.000"))
	if busiest > rate+limiter.Burst(rate)+2 {
		t.Fatalf("%d messages within a second from %s at the window's opening, cap %d/s", busiest, from.Format("15:04:05.000"), rate)
	}
}

// The same with Postgres: the lease's renewal, which comes after the window's check, stalls.
func TestNoSendAfterTheWindowClosedWhileTheLeaseRenewalStalled(t *testing.T) {
	t.Parallel()
	ist, _ := time.LoadLocation(campaign.DefaultZone)
	window, _ := campaign.ParseWindow("09:00-20:00", ist)
	f := planWith(t, 10, func(s *campaign.Spec) { s.Window = window })
	edge := time.Date(2026, 12, 1, 19, 59, 58, 500_000_000, ist)
	off := edge.Sub(time.Now())
	now := func() time.Time { return time.Now().Add(off) }
	h, _, fs := f.faulty(t, func(c *Config) { c.Now, c.LeaseTTL = now, 3*time.Second })
	fs.Add(&faults.Rule{Match: faults.Method("RenewLease"), Times: 1, Kind: faults.Stall, Delay: 2 * time.Second})
	var late []string
	f.provider.fail = func(call int, m providers.Message) error {
		if at := now(); !window.Open(at) {
			late = append(late, m.To+" at "+at.In(ist).Format("15:04:05.000"))
		}
		if call == 1 {
			time.Sleep(1200 * time.Millisecond) // a slow answer
		}
		return nil
	}
	err := h.RunBatch(context.Background(), f.id, 0)
	t.Logf("RunBatch: %v; sent %d", err, f.provider.total())
	if len(late) > 0 {
		t.Fatalf("%d sends left after the 09:00-20:00 window closed: %v", len(late), late)
	}
}
