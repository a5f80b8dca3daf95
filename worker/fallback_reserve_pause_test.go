package worker

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// segmentProvider is a fallback whose limit counts SMS segments (as Twilio's does).
type segmentProvider struct{ namedProvider }

func (segmentProvider) PacesSegments() bool { return true }

// The first SMS provider is down, so sends go through the fallback, capped at 1 segment a second (burst
// 1) and counting segments. A message of 3 segments is larger than that burst: its tokens are reserved
// 2 s ahead (reserveAllScript). Half a second into that wait the fallback answers 429 to another worker
// and is paused for 3 s. The fallback's claim does not read its pause (route.pauseKey is ""; the
// Pausable limit is meant to): the limiter reads the pause again once the reservation's wait is over,
// and the message waits the pause out.
func TestAFallbackSendReservedBeforeAPauseWaitsItOut(t *testing.T) {
	t.Parallel()
	f := planWith(t, 150, func(s *campaign.Spec) { s.Message = strings.Repeat("Kampanya ", 40) + "{{.code}}" }) // over 306 GSM chars: 3 segments
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, Message: "unavailable"}
	}
	fb := newProvider()
	var mu sync.Mutex
	var sentAt []time.Time
	fb.before = func(providers.Message) { mu.Lock(); sentAt = append(sentAt, time.Now()); mu.Unlock() }
	f.h.cfg.Fallback = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: segmentProvider{namedProvider{fb, "second"}}}
	f.h.cfg.FailoverWindow = time.Hour
	f.h.cfg.ProviderRates = map[string]float64{"second": 1}
	var pausedFrom, pausedUntil time.Time
	go func() {
		// The fallback's bucket is reserved by the first send (its key appears): then the pause comes.
		for f.rdb.Exists(context.Background(), state.RateKey(state.ProviderBucket("second"))).Val() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		mu.Lock()
		pausedFrom, pausedUntil = time.Now(), time.Now().Add(3*time.Second)
		mu.Unlock()
		if err := limiter.New(f.rdb).Pause(context.Background(), state.ProviderBucket("second"), 3*time.Second); err != nil {
			t.Error(err)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- f.h.RunBatch(context.Background(), f.id, 0) }()
	// Watched until a send went through after the pause (what was to be shown), the batch ends, or 20 s
	// (a loaded machine may take a while to fail over).
	deadline := time.After(20 * time.Second)
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Logf("batch: %v", err)
			}
		case <-deadline:
		case <-time.After(100 * time.Millisecond):
			mu.Lock()
			for _, at := range sentAt {
				if !pausedFrom.IsZero() && at.After(pausedFrom) && at.Before(pausedUntil.Add(-50*time.Millisecond)) {
					mu.Unlock()
					t.Fatalf("a message went through the fallback %v into its 3 s pause", at.Sub(pausedFrom).Round(time.Millisecond))
				}
			}
			after := !pausedUntil.IsZero() && len(sentAt) > 0 && sentAt[len(sentAt)-1].After(pausedUntil)
			mu.Unlock()
			if !after {
				continue
			}
		}
		break
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sentAt) == 0 {
		t.Fatal("nothing went through the fallback: this tests nothing")
	}
	t.Logf("%d sends through the fallback, none in its pause", len(sentAt))
}
