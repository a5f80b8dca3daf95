package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// A campaign launched with --rate 1e8 (validation takes it: a finite positive number) through a provider
// capped at 10/s: its sends take both limits together (takeAll), whose script SETs the campaign's bucket
// with an expiry of at least a second, even when its emission interval is below the clock's resolution in
// the script (an EX 0 is refused by Redis: the batch was handed back as "no send while Redis is
// unavailable", again and again, and nothing was ever sent).
var hugeRate = 1e8

func TestAHugeCampaignRateUnderAProviderCapSends(t *testing.T) {
	t.Parallel()
	f := planWith(t, 10, func(s *campaign.Spec) { s.Rate = hugeRate })
	h, _, _ := f.faulty(t, func(c *Config) { c.ProviderRates = map[string]float64{"test": 10} })
	for b := range f.batches {
		done := make(chan error, 1)
		go func() { done <- h.RunBatch(context.Background(), f.id, b) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("batch %d: %v", b, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("batch %d still running after 15 s", b)
		}
	}
	f.provider.mu.Lock()
	defer f.provider.mu.Unlock()
	if len(f.provider.accepted) == 0 {
		t.Fatal("nothing was sent")
	}
}
