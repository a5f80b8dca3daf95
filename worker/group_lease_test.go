package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// A request of many recipients is given longer than the chunk's lease (SendGrid's: 3 × --provider-timeout,
// the lease's own length). While one was held that long, another worker's sweep took the live run's chunk
// for a dead run's and settled it from the claims in flight: the recipients were recorded unknown with a
// reason that says a worker stopped, although nothing had stopped (outside, 3 of 3 runs with a held
// request). The run now keeps its lease while the request is under way, and the sweep finds nothing to
// take.
func TestALeaseIsKeptWhileARequestOutlastsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, _ := testredis.New(t)
	_, store, id, p, sweeper := planEmailDB(t, 6, 6, rdb)
	const ttl = 300 * time.Millisecond
	w1 := NewHandler(Config{Store: store, State: state.New(rdb, DefaultClaimTTL), Redis: rdb, Owner: "w1", Unsubscribe: testSigner, LeaseTTL: ttl,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p}, ProviderRates: map[string]float64{}})
	held, free := make(chan struct{}), make(chan struct{})
	p.before = func(n int) {
		if n == 1 {
			close(held)
			<-free
		}
	}
	done := make(chan error, 1)
	go func() { done <- w1.RunBatch(ctx, id, 0) }()
	<-held
	// The request is held four leases long; another worker sweeps all the while.
	until := time.Now().Add(4 * ttl)
	for time.Now().Before(until) {
		if n, err := sweeper.Sweep(ctx); err != nil || n != 0 {
			close(free)
			t.Fatalf("the sweep settled %d recipients (%v) of a run whose request is under way", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(free)
	if err := <-done; err != nil {
		t.Fatalf("the run: %v", err)
	}
	c, err := store.Counts(ctx, id)
	if err != nil || c.Sent != 6 || c.Unknown != 0 || c.Pending != 0 {
		t.Fatalf("counts %+v, %v; want all 6 sent, none unknown", c, err)
	}
	if len(p.requests) != 1 {
		t.Errorf("%d requests, want one", len(p.requests))
	}
}
