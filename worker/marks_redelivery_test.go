package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// Redis loses its data while a run of the first campaign (cap 1h) has its chunk in hand and has already
// sent to u1. `resume` (the documented recovery) queues the batch again, and a second worker picks up that
// same batch. It waits for the chunk in hand like any other before it writes the marks back: before, it
// left its own batch out, wrote the marks back from the audit log without u1's send (still only in the
// live run's hand) and recorded them done for the new epoch, and a run of the second campaign (cap 1h,
// same people) sent u1 again within the cap. Once the live run recorded its chunk, the second campaign
// skips u1.
func TestTheMarksWaitForTheChunkInHandOfTheBatchDeliveredAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, second := planTwoCapped(t)

	loseRedisAfterU1(t, f, func() {
		// resume queued the first campaign's batch again: another worker runs it (and comes back, the
		// chunk being held by a live run).
		other := f.handler(f.rdb)
		err := other.RunBatch(ctx, f.id, 0)
		t.Logf("redelivered batch of the first campaign: %v", err)
		// A worker runs the second campaign.
		err = other.RunBatch(ctx, second, 0)
		t.Logf("second campaign's batch: %v", err)
	})
	// The live run has recorded its chunk: the marks are written back with u1's send.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := f.handler(f.rdb).RunBatch(ctx, second, 0)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second campaign's batch after the first recorded: %v", err)
		}
	}
	if st, reason, _ := f.status(t, "u1"); st != string(campaign.StatusSent) {
		t.Errorf("u1 in the first campaign: %s (%s), want sent", st, reason)
	}

	if got := f.provider.sentTo(phone(1)); len(got) > 1 {
		t.Fatalf("u1 got %d messages within the 1h frequency cap (one from each campaign): %q", len(got), got)
	}
}

// planTwoCapped plans two campaigns of the same 4 customers, each with a 1 h frequency cap: the fixture's,
// and a second one, planned before the first sends (so its plan excludes nobody); it returns the second's ID.
func planTwoCapped(t *testing.T) (*fixture, int64) {
	t.Helper()
	f := planWith(t, 4, func(s *campaign.Spec) { s.FrequencyCap = time.Hour })
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(context.Background(),
		func() campaign.Spec { s := fixtureSpec("second"); s.FrequencyCap = time.Hour; return s }())
	if err != nil {
		t.Fatal(err)
	}
	return f, rep.ID
}

// loseRedisAfterU1 runs the first campaign's batch; once u1 is sent and its chunk still in hand (the send to
// u2 about to go), Redis loses its data (the test's own DB) and then comes.
func loseRedisAfterU1(t *testing.T, f *fixture, then func()) {
	t.Helper()
	ctx := context.Background()
	var fired atomic.Bool
	f.provider.before = func(m providers.Message) {
		if m.To != phone(2) || !fired.CompareAndSwap(false, true) {
			return
		}
		if err := f.rdb.FlushDB(ctx).Err(); err != nil {
			t.Error(err)
			return
		}
		then()
	}
	err := f.h.RunBatch(ctx, f.id, 0)
	t.Logf("first campaign's batch: %v", err)
	if !fired.Load() {
		t.Fatal("the fault never ran")
	}
}
