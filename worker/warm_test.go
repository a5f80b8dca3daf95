package worker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/twilio"
)

// unwarmable is a Twilio adapter the engine cannot warm: the field Warm hides the adapter's method, so
// it is no providers.Warmer and its sends open their connections themselves.
type unwarmable struct {
	*twilio.Provider
	Warm struct{}
}

// A campaign's first sends open their connections: to a distant provider a TCP and TLS handshake of
// hundreds of milliseconds. Opened after the sends took their tokens, a handshake holds each request back
// while the sends after it go out on connections already open, and the provider counts the held ones on
// top of the cap. Opened before the tokens are taken (Warm), the requests leave as the bucket lets them,
// and no second carries more than the cap and its burst, also when a worker's batch runs (--concurrency)
// share its connections. Through the Twilio adapter and its transport, to the sandbox over TLS with
// handshakes of 300 ms.
func TestConnectionsAreOpenedBeforeTheTokensAreTaken(t *testing.T) {
	t.Parallel()
	const (
		rate, setup = 100, 300 * time.Millisecond
		sid, token  = "ACwarm000000000000000000000000000", "warmtoken"
	)
	// The tokens of 50 ms: the time a send may hold them (staleTokens, 25 ms) and the spread, on a loaded
	// machine (the suite runs with the race detector), of the time from a send's tokens to its arrival. The
	// bucket lets no second have more than the cap (its burst included). Without warming the busiest second
	// is 110-120 (115-130 when the bucket let the cap and its burst out in a second).
	bar := rate + rate/20
	for _, tc := range []struct{ window, workers, runs int }{{8, 5, 5}, {8, 2, 8}, {1, 2, 16}} {
		busiest := func(t *testing.T, warmable bool) int {
			f := planWith(t, 600, func(s *campaign.Spec) { s.BatchSize = 330 / tc.runs })
			if f.batches < tc.runs {
				t.Fatalf("%d batches for %d runs", f.batches, tc.runs)
			}
			sb := sandbox.New(sandbox.Options{TwilioAccountSID: sid, TwilioAuthToken: token})
			srv := providertest.NewCountingServer(t, sb, &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				time.Sleep(setup)
				return nil, nil
			}})
			roots := x509.NewCertPool()
			roots.AddCert(srv.Certificate())
			handlers := make([]*Handler, tc.workers)
			for w := range handlers {
				// One adapter a worker process, shared by its runs, as cmd builds it.
				tw, err := twilio.New(twilio.Config{AccountSID: sid, AuthToken: token, From: "+905550000000",
					BaseURL: srv.URL, RootCAs: roots, Timeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				var p providers.Provider = tw
				if !warmable {
					p = unwarmable{Provider: tw}
				}
				handlers[w] = NewHandler(Config{
					Store: f.store, Redis: f.rdb, Owner: fmt.Sprint("w", w), SendWindow: tc.window,
					Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p},
					ProviderRates: map[string]float64{"twilio": rate},
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
			msgs := sb.Messages()
			c := f.counts(t)
			sent := make([]time.Time, len(msgs))
			to := make(map[string]bool, len(msgs))
			for i, m := range msgs {
				sent[i] = m.At
				if to[m.To] {
					t.Errorf("%s got two messages", m.To)
				}
				to[m.To] = true
			}
			if len(msgs) != int(c.Sent) || c.Pending != 0 {
				t.Fatalf("the sandbox accepted %d messages, counts %+v", len(msgs), c)
			}
			if len(sent) < 2*rate {
				t.Fatalf("%d messages sent, want over two seconds' worth", len(sent))
			}
			slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
			most, _ := busiestSecond(sent)
			t.Logf("busiest second: %d messages, %d connections", most, srv.Opened(0))
			return most
		}
		// One case at a time (warmed and not side by side): 32 runs with TLS handshakes at once are load
		// enough.
		t.Run(fmt.Sprintf("%d workers, %d runs, %d at a time", tc.workers, tc.runs, tc.window), func(t *testing.T) {
			t.Run("warmed", func(t *testing.T) {
				t.Parallel()
				if n := busiest(t, true); n > bar {
					t.Errorf("%d messages reached the provider within a second, cap %d/s (burst %d)", n, rate, limiter.Burst(rate))
				}
			})
			t.Run("not warmable", func(t *testing.T) {
				t.Parallel()
				// The control: on a machine loaded enough (the whole suite under the race detector, beside
				// other work), the handshakes' bunching can drown in the load; it is run up to three times
				// before the test is found unable to tell the two apart.
				n := busiest(t, false)
				for try := 2; n <= bar && try <= 3; try++ {
					t.Logf("the control got at most %d messages in a second (cap and slack %d): run again", n, bar)
					n = busiest(t, false)
				}
				switch {
				case n < rate:
					// Not even the cap: the machine is too loaded for the sends to press on it, and the
					// handshakes' bunching cannot show. The warmed case above still holds its bar.
					t.Skipf("the control never reached the cap (%d messages in its busiest second, cap %d): too loaded to tell the two apart", n, rate)
				case n <= bar:
					t.Errorf("a provider that cannot be warmed got at most %d messages in a second: the test does not tell the two apart", n)
				}
			})
		})
	}
}

// warmingBatch is an e-mail provider that logs its warm-ups and requests in order.
type warmingBatch struct {
	*batchProvider
	mu  sync.Mutex
	log []string
}

func (p *warmingBatch) Warm(_ context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, fmt.Sprint("warm ", n))
	return nil
}

func (p *warmingBatch) SendBatch(ctx context.Context, ms []providers.Message) ([]providers.Result, error) {
	p.mu.Lock()
	p.log = append(p.log, fmt.Sprint("send ", len(ms)))
	p.mu.Unlock()
	return p.batchProvider.SendBatch(ctx, ms)
}

// The e-mail path warms too: under a cap, every request of many recipients is one call, and its
// connection is made ready before its tokens are taken; without a cap nothing waits and nothing is warmed.
func TestEmailRequestsWarmTheirConnectionUnderACap(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{0, 1000} {
		t.Run(fmt.Sprint("rate ", rate), func(t *testing.T) {
			t.Parallel()
			rdb, _ := testredis.New(t)
			_, id, bp, h := planEmail(t, 12, 4, rdb)
			p := &warmingBatch{batchProvider: bp}
			h.cfg.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p}
			h.cfg.ProviderRates = map[string]float64{"batch": rate}
			if err := h.RunBatch(context.Background(), id, 0); err != nil {
				t.Fatal(err)
			}
			want := []string{"warm 1", "send 4", "warm 1", "send 4", "warm 1", "send 4"}
			if rate == 0 {
				want = []string{"send 4", "send 4", "send 4"}
			}
			if !slices.Equal(p.log, want) {
				t.Fatalf("calls %q, want %q", p.log, want)
			}
		})
	}
}
