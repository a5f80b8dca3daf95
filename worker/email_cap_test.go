package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// An e-mail request waits for the provider's tokens behind other traffic (another campaign took the
// provider's next 2 s). Meanwhile the provider answers 429 to another worker and is paused for 3 s. The
// request must not leave during that pause. The campaign's --rate (50/s, below the provider's 100) is the
// request's bottleneck: ready at once, its tokens are reserved in both buckets for the provider's next
// moment, 2 s ahead, and the pause comes during that wait. The pause used to be read only before the
// reservation, with no check at the claim. The claim now reads the provider's pause, as a message's does.
func TestAnEmailRequestWaitingForTheProvidersTokensHonoursAPauseSetMeanwhile(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	_, id, p, h := planEmail(t, 20, 1000, rdb, func(s *campaign.Spec) { s.Rate = 50 })
	const providerRate = 100 // requests of 10, burst 5
	h.cfg.ProviderRates["batch"] = providerRate
	ctx := context.Background()
	providerCap := limiter.Limit{Key: state.ProviderBucket("batch"), Rate: providerRate}
	// Another process takes the provider's next 2 s.
	go limiter.New(rdb).WaitN(ctx, 2*providerRate, providerCap) //nolint:errcheck
	waitUntil(t, 5*time.Second, "the provider's bucket taken", func() bool {
		return rdb.Exists(ctx, "rate:"+providerCap.Key).Val() == 1
	})
	var mu sync.Mutex
	var at []time.Time
	p.before = func(int) { mu.Lock(); at = append(at, time.Now()); mu.Unlock() }
	var pausedUntil time.Time
	before := rdb.Get(ctx, "rate:"+providerCap.Key).Val()
	go func() {
		// Once the run has reserved its request's tokens behind the other traffic (the bucket moved on).
		for deadline := time.Now().Add(5 * time.Second); rdb.Get(ctx, "rate:"+providerCap.Key).Val() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the run never reserved the provider's tokens")
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
		// A 429 to another worker: the provider is paused for 3 s.
		if err := limiter.New(rdb).Pause(ctx, providerCap.Key, 3*time.Second); err != nil {
			t.Error(err)
		}
		mu.Lock()
		pausedUntil = time.Now().Add(3 * time.Second)
		mu.Unlock()
	}()
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) == 0 {
		t.Fatal("no request")
	}
	t.Logf("first request %v after the pause began to end; %d requests", at[0].Sub(pausedUntil), len(at))
	if at[0].Before(pausedUntil.Add(-50 * time.Millisecond)) {
		t.Fatalf("an e-mail request went out %v before the provider's pause ended (%d requests)", pausedUntil.Sub(at[0]).Round(time.Millisecond), len(at))
	}
}

// A campaign's --rate holds over every second when its e-mail requests wait behind the provider's cap. Ten
// workers send one batch each of a campaign at --rate 100 (requests of 10, more than its burst of 5)
// through a provider capped at 190/s (burst 9: requests of 10 reserve there too). Half a second in,
// another campaign takes the provider's next 3 s. Each run has reserved its request's campaign tokens and
// waits for the provider's; when the provider frees, the held requests must not leave at the provider's
// rate on top of the campaign's.
func TestACampaignsRateHoldsWhenItsEmailRequestsWaitBehindTheProvidersCap(t *testing.T) {
	t.Parallel()
	const rate, providerRate, workers = 100, 190, 10
	rdb, _ := testredis.New(t)
	_, store, id, _, _ := planEmailDB(t, 400, 1000, rdb, func(s *campaign.Spec) { s.Rate = rate; s.BatchSize = 40 })
	var mu sync.Mutex
	var at []time.Time
	p := &batchProvider{max: 1000, accepted: map[string][]providers.Message{}}
	errs := make(chan error, workers)
	var first sync.Once
	started := make(chan struct{})
	p.before = func(int) {
		first.Do(func() { close(started) })
	}
	rec := &recordingBatcher{batchProvider: p, at: func(n int) {
		mu.Lock()
		now := time.Now()
		for range n {
			at = append(at, now)
		}
		mu.Unlock()
	}}
	for b := range workers {
		h := NewHandler(Config{Store: store, Redis: rdb, Owner: fmt.Sprintf("w%d", b), Unsubscribe: testSigner,
			Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelEmail: rec},
			ProviderRates: map[string]float64{"batch": providerRate}})
		go func() { errs <- h.RunBatch(context.Background(), id, b) }()
	}
	<-started
	time.Sleep(500 * time.Millisecond)
	held := make(chan error, 1)
	go func() {
		held <- limiter.New(rdb).WaitN(context.Background(), 3*providerRate, limiter.Limit{Key: state.ProviderBucket("batch"), Rate: providerRate})
	}()
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	sent := append([]time.Time(nil), at...)
	mu.Unlock()
	if len(p.accepted) != 400 {
		t.Fatalf("%d addresses e-mailed, want 400", len(p.accepted))
	}
	slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
	busiest, from := busiestSecond(sent)
	var per []string
	for i := 0; i < len(sent); i += 10 {
		per = append(per, fmt.Sprintf("%.3f", sent[i].Sub(sent[0]).Seconds()))
	}
	t.Logf("request times (s): %v", per)
	t.Logf("%d sent in %d requests, busiest second %d from %s", len(sent), len(p.requests), busiest, from.Format("15:04:05.000"))
	if busiest > rate+rate/10+limiter.Burst(rate)+2 {
		t.Fatalf("%d e-mails of the campaign within a second from %s, its --rate %d/s", busiest, from.Format("15:04:05.000"), rate)
	}
}

// recordingBatcher is a batchProvider that records when each of its requests' messages went.
type recordingBatcher struct {
	*batchProvider
	at func(n int)
}

func (r *recordingBatcher) SendBatch(ctx context.Context, ms []providers.Message) ([]providers.Result, error) {
	r.at(len(ms))
	return r.batchProvider.SendBatch(ctx, ms)
}
