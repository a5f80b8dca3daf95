package worker

import (
	"context"
	"testing"
)

// Redis loses its data while a run of the first campaign (cap 1h) has its chunk in hand and has already
// sent to u1, and that run is taken for dead (its lease ran out: a worker killed, or stalled past its
// lease). Its chunk no longer holds the marks back (ChunksInHand counts live leases only), and u1's send is
// only in the claim Redis lost: the marks written back from the audit log leave u1 out, and the second
// campaign (cap 1h, same people) sends u1 again within the cap. The recipients of every chunk in hand are
// marked as sent when the marks come back: they may have been.
func TestTheMarksComeBackWithTheChunkInHandOfARunTakenForDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, second := planTwoCapped(t)

	loseRedisAfterU1(t, f, func() {
		// The first campaign's run is taken for dead: its lease runs out.
		if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET lease_until = now() - interval '1 second' WHERE campaign_id = $1`, f.id); err != nil {
			t.Error(err)
			return
		}
		// A worker runs the second campaign.
		err := f.handler(f.rdb).RunBatch(ctx, second, 0)
		t.Logf("second campaign's batch: %v", err)
	})
	if got := f.provider.sentTo(phone(1)); len(got) > 1 {
		t.Fatalf("u1 got %d messages within the 1h frequency cap (one from each campaign): %q", len(got), got)
	}
}
