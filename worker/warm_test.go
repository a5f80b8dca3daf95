package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// connectingProvider is a worker process's view of the scripted provider behind a pool of connections
// that take setup to open, as a TCP and TLS handshake to a distant provider does: a send that finds no
// idle connection opens one first, and reaches the provider setup later. With warmable, it can open them
// ahead (providers.Warmer).
type connectingProvider struct {
	*scriptedProvider
	setup time.Duration

	mu            sync.Mutex
	idle, opening int
}

func (p *connectingProvider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	p.mu.Lock()
	reuse := p.idle > 0
	if reuse {
		p.idle--
	}
	p.mu.Unlock()
	if !reuse {
		time.Sleep(p.setup)
	}
	defer func() {
		p.mu.Lock()
		p.idle++
		p.mu.Unlock()
	}()
	return p.scriptedProvider.Send(ctx, m)
}

// warmableProvider is a connectingProvider the engine can warm.
type warmableProvider struct{ *connectingProvider }

func (p warmableProvider) Warm(ctx context.Context, n int) error {
	p.mu.Lock()
	missing := n - p.idle - p.opening
	if missing <= 0 {
		p.mu.Unlock()
		return nil
	}
	p.opening += missing
	p.mu.Unlock()
	time.Sleep(p.setup) // opened at once, side by side
	p.mu.Lock()
	p.opening -= missing
	p.idle += missing
	p.mu.Unlock()
	return nil
}

// A campaign's first sends open their connections. Opened after the sends took their tokens, a
// handshake's time holds each request back while the sends after it go out on connections already open:
// the provider then counts the held ones on top of the cap. Opened before the tokens are taken (Warm), the
// requests leave as the bucket lets them, and no second carries more than the cap and its burst. One batch
// run a worker: runs of one worker share its idle connections, and a warm-up does not yet keep the
// connections it opened for the run that asked (docs/operations.md).
func TestConnectionsAreOpenedBeforeTheTokensAreTaken(t *testing.T) {
	t.Parallel()
	const rate, setup = 100, 300 * time.Millisecond
	// The bucket's burst, and the tokens of the 25 ms a send may hold them (staleTokens).
	bar := rate + limiter.Burst(rate) + 2
	for _, tc := range []struct{ window, workers, runs int }{{8, 3, 3}} {
		busiest := func(t *testing.T, warmable bool) int {
			f := planWith(t, 600, func(s *campaign.Spec) { s.BatchSize = 330 / tc.runs })
			if f.batches < tc.runs {
				t.Fatalf("%d batches for %d runs", f.batches, tc.runs)
			}
			at := f.sendTimes()
			handlers := make([]*Handler, tc.workers)
			for w := range handlers {
				var p providers.Provider = &connectingProvider{scriptedProvider: f.provider, setup: setup}
				if warmable {
					p = warmableProvider{p.(*connectingProvider)}
				}
				handlers[w] = NewHandler(Config{
					Store: f.store, Redis: f.rdb, Owner: fmt.Sprint("w", w), SendWindow: tc.window,
					Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p},
					ProviderRates: map[string]float64{"test": rate},
				})
			}
			errs := make(chan error, tc.runs)
			for b := range tc.runs {
				go func() { errs <- handlers[b%tc.workers].RunBatch(context.Background(), f.id, b) }()
			}
			for range tc.runs {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			f.assertOnce(t)
			sent := at()
			if len(sent) < 2*rate {
				t.Fatalf("%d messages sent, want over two seconds' worth", len(sent))
			}
			most, _ := busiestSecond(sent)
			t.Logf("busiest second: %d messages", most)
			return most
		}
		t.Run(fmt.Sprintf("%d workers, %d runs, %d at a time", tc.workers, tc.runs, tc.window), func(t *testing.T) {
			t.Parallel()
			t.Run("warmed", func(t *testing.T) {
				t.Parallel()
				if n := busiest(t, true); n > bar {
					t.Errorf("%d messages reached the provider within a second, cap %d/s (burst %d)", n, rate, limiter.Burst(rate))
				}
			})
			t.Run("not warmable", func(t *testing.T) {
				t.Parallel()
				if n := busiest(t, false); n <= bar {
					t.Errorf("a provider that cannot be warmed got at most %d messages in a second: the test does not tell the two apart", n)
				}
			})
		})
	}
}
