package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
)

// A campaign's --rate holds over every second even when its sends wait behind the provider's cap. Ten
// workers send one batch each of a campaign at --rate 20 through a provider capped at 100/s. Half a
// second in, other traffic on the provider (another campaign's workers) has its bucket taken for the
// next three seconds. Each run has by then taken its campaign token and waits for the provider's; when
// the provider's bucket frees, the ten held sends must not leave together on top of the campaign's own
// rate. Before, they did: the campaign tokens taken before the provider's wait were never checked for
// age (tokensStillFresh only ages the last limit's), and the second after the hold carried the held
// sends, the campaign bucket's burst and a second of its rate.
func TestACampaignsRateHoldsWhenItsSendsWaitBehindTheProvidersCap(t *testing.T) {
	t.Parallel()
	const rate, providerRate, workers = 20, 100, 10
	f := planWith(t, 150, func(s *campaign.Spec) { s.Rate = rate; s.BatchSize = 8 }) // 80 eligible, 10 batches
	if f.batches < workers {
		t.Fatalf("%d batches for %d workers", f.batches, workers)
	}
	at := f.sendTimes()
	errs := make(chan error, workers)
	for b := range workers {
		h, _, _ := f.faulty(t, func(c *Config) {
			c.SendWindow, c.ProviderRates = 8, map[string]float64{"test": providerRate}
		})
		go func() { errs <- h.RunBatch(context.Background(), f.id, b) }()
	}
	// Other traffic on the provider: another process takes the next 3 s of its cap (a request of 300).
	waitUntil(t, 10*time.Second, "the first send", func() bool { return len(at()) > 0 })
	time.Sleep(500 * time.Millisecond)
	other := limiter.New(f.rdb)
	held := make(chan error, 1)
	go func() {
		held <- other.WaitN(context.Background(), 3*providerRate, limiter.Limit{Key: state.ProviderBucket("test"), Rate: providerRate})
	}()
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	f.assertOnce(t)
	sent := at()
	busiest, from := busiestSecond(sent)
	var per []string
	for _, s := range sent {
		per = append(per, fmt.Sprintf("%.3f", s.Sub(sent[0]).Seconds()))
	}
	t.Logf("%d sent, busiest second %d from %s; send times (s): %v", len(sent), busiest, from.Format("15:04:05.000"), per)
	if busiest > rate+limiter.Burst(rate)+2 {
		t.Fatalf("%d messages of the campaign within a second from %s, its --rate %d/s (burst %d)", busiest, from.Format("15:04:05.000"), rate, limiter.Burst(rate))
	}
}
