package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// A request of 4 is refused with a 400 (nothing was sent; the split follows), and Redis fails the one call
// that gives back the request's claims (ReleaseMany). Redis then answers again, and the batch runs again:
// every recipient is sent once, none ends unknown. Before, the claims stayed in flight and the next run
// made all four unknown (a call that died unanswered), so nobody was sent.
func TestARefusedRequestWhoseReleaseFailsIsSentLater(t *testing.T) { releaseFailsOnce(t, 400) }

// The same for a request refused with a 503 (nothing accepted): its claims must be released for the retry.
func TestATransientlyRefusedRequestWhoseReleaseFailsIsSentLater(t *testing.T) {
	releaseFailsOnce(t, 503)
}

func releaseFailsOnce(t *testing.T, status int) {
	t.Parallel()
	shared, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 4, 4, shared)
	ctx := context.Background()
	if _, err := store.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	p.fail = func(n int) error {
		if n == 1 && status == 400 {
			return &providers.Error{Provider: "batch", Status: 400, Message: "invalid email", Class: providers.Permanent}
		}
		if n == 1 {
			return &providers.Error{Provider: "batch", Status: 503, Message: "unavailable", Class: providers.Transient}
		}
		return nil
	}
	h.cfg.LeaseTTL = 300 * time.Millisecond
	h.cfg.InFlightGrace = 300 * time.Millisecond
	fr := faults.NewState(state.New(shared, DefaultClaimTTL))
	h.state = fr
	rule := fr.Add(&faults.Rule{Match: faults.Method("ReleaseMany"), Times: 1, Kind: faults.Fail})
	err := h.RunBatch(ctx, id, 0)
	t.Logf("first run: %v (fault hits %d, %d requests)", err, rule.Hits(), len(p.requests))
	// Redis answers again; the batch runs again (as Asynq retries it) until it is done.
	for i := 0; i < 10; i++ {
		time.Sleep(400 * time.Millisecond)
		err = h.RunBatch(ctx, id, 0)
		if err == nil {
			break
		}
		t.Logf("run %d: %v", i+2, err)
	}
	c, _ := store.Counts(ctx, id)
	t.Logf("counts %+v, %d requests, %d accepted", c, len(p.requests), len(p.accepted))
	if c.Unknown != 0 || c.Sent != 4 || len(p.accepted) != 4 {
		t.Fatalf("counts %+v: recipients of a request refused with a %d (nothing accepted) ended unknown instead of being sent", c, status)
	}
}
