package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
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

// A worker that cannot send a batch hands it back for a second when a worker that can was seen within
// a heartbeat's life, and for noProviderRetry when none was: a fleet where some workers lacked a
// channel's provider sent that channel about 20 times slower (a push campaign of 1,200: 18.8 s against
// 0.87 s), each of its batches waiting 5 s whenever a worker that could not send it took it.
func TestAWorkerThatCannotSendABatchHandsItBackSoonWhenAnotherCan(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	store, id, p, h := planEmail(t, 6, 3, rdb)
	handBack := func(want time.Duration, why string) {
		t.Helper()
		err := h.RunBatch(ctx, id, 0)
		var re *RetryError
		if !errors.As(err, &re) || re.Failure || re.After != want {
			t.Fatalf("%s: the run returned %#v; want the batch back in %v", why, err, want)
		}
	}
	seen := func(field string, at time.Time) {
		t.Helper()
		if err := rdb.HSet(ctx, state.SeenKey, field, at.UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// No e-mail provider on this worker.
	mail := h.cfg.Providers[campaign.ChannelEmail]
	delete(h.cfg.Providers, campaign.ChannelEmail)
	handBack(noProviderRetry, "no worker that sends e-mail seen")
	seen(string(campaign.ChannelEmail), time.Now().Add(-state.WorkerTTL-time.Second))
	handBack(noProviderRetry, "a worker that sends e-mail last seen longer ago than a heartbeat lives")
	seen(string(campaign.ChannelEmail), time.Now())
	handBack(noProviderSoon, "a worker that sends e-mail seen a moment ago")

	// The provider, but no means to make the unsubscribe links of a commercial e-mail: what counts is a
	// worker that may send commercial e-mail.
	h.cfg.Providers[campaign.ChannelEmail] = mail
	h.cfg.Unsubscribe = nil
	handBack(noProviderRetry, "no worker that makes unsubscribe links seen (only one that sends e-mail)")
	seen(string(campaign.ChannelEmail)+state.SeenCommercial, time.Now())
	handBack(noProviderSoon, "a worker that makes unsubscribe links seen a moment ago")

	if len(p.accepted) != 0 {
		t.Fatalf("%d e-mails sent by a worker that cannot send them", len(p.accepted))
	}
	if c, err := store.Counts(ctx, id); err != nil || c.Pending != 6 {
		t.Fatalf("counts %+v, %v; want all 6 pending", c, err)
	}
}
