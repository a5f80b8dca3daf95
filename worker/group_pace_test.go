package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// An e-mail request's acceptance counts in the provider's shared pace, as a message's does: one 503 on a
// request of ten then ten accepted requests leave the provider up. Before, only the failures of a request
// reached the pace: a single 503 called the provider down for good (every answer the pace saw was a
// failure), status said provider_down while the campaign sent at full rate, and every later retry waited
// for the one-a-second probe. (Mutation: no observation of an accepted request. Caught: down.)
func TestAnAcceptedEmailRequestCountsInTheProvidersPace(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	_, id, p, h := planEmail(t, 100, 10, rdb)
	p.fail = func(n int) error {
		if n == 1 {
			return &providers.Error{Provider: "batch", Status: 503, Message: "Service Unavailable", Class: providers.Transient}
		}
		return nil
	}
	ctx := context.Background()
	stop := time.AfterFunc(20*time.Second, h.Stop)
	defer stop.Stop()
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.requests) < 5 {
		t.Fatalf("%d requests, want the batch sent in requests of 10", len(p.requests))
	}
	pace := h.pace(p.Name())
	if err := pace.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if pace.Down(ctx) {
		t.Fatalf("after one 503 and %d accepted requests the provider is called down", len(p.requests)-1)
	}
}
