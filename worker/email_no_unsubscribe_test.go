package worker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// A worker that cannot make a commercial e-mail's unsubscribe links (no WEBHOOKS_PUBLIC_URL and
// UNSUBSCRIBE_SECRET) hands its batch back to the queue as soon as one without the channel's provider
// does, for another worker of the fleet, sends nothing, and uses none of the batch's retries. It handed it
// back for 30 s: beside a worker that could send it, a campaign stood still up to a minute at a time.
func TestAWorkerThatCannotMakeUnsubscribeLinksHandsTheBatchBackSoon(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 6, 3, rdb)
	h.cfg.Unsubscribe = nil
	err := h.RunBatch(context.Background(), id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || re.After != noProviderRetry || !strings.Contains(err.Error(), "UNSUBSCRIBE_SECRET") {
		t.Fatalf("the run returned %#v; want the batch back in %v for another worker, naming the settings, none of its retries used", err, noProviderRetry)
	}
	if len(p.accepted) != 0 {
		t.Fatalf("%d e-mails sent without unsubscribe links", len(p.accepted))
	}
	if c, err := store.Counts(context.Background(), id); err != nil || c.Pending != 6 {
		t.Fatalf("counts %+v, %v; want all 6 pending", c, err)
	}
}
