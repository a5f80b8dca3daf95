package worker

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
)

// Postgres crashes right after the second chunk's outcomes (synchronous_commit off) and is back within
// a few seconds, while the run that recorded them is held by a Redis stall (its progress counters). The
// run goes on with its third chunk on the restarted server: the crash took the second chunk's outcomes
// back (pending again, still in the chunk in hand). The third chunk's lease used to keep them in hand
// only until the third chunk's Record set the chunk in hand to the run's own (nothing): the second chunk's
// recipients, whose messages went out, were pending and in no chunk in hand, and a cancel closed them as
// never sent (skipped, their codes back in the pool). A run's lease now hands back what its own chunk in
// hand held, and the run keeps them there until it reads their claims: the cancel leaves them to the
// batch's run, which records them sent.
func TestPostgresRestartUnderARedisStallThenCancelKeepsTheSentChunk(t *testing.T) {
	t.Parallel()
	c, lost, inHand := crashUnderARedisStall(t)
	ctx := context.Background()
	for _, u := range lost {
		if !slices.Contains(inHand, u) {
			t.Errorf("%s, sent and pending again after the crash, is not in the chunk in hand after the run", u)
		}
	}
	// The operator cancels the campaign before the batch runs again; the batch's run closes it.
	if _, err := Cancel(ctx, CancelOptions{Store: c.store.Store, Redis: c.rdb, CampaignID: c.id}); err != nil {
		t.Fatal(err)
	}
	c.runToEnd(t)
	rs := c.recipients(t)
	for _, u := range lost {
		r := rs[u]
		if len(r.messages) == 1 && r.status != campaign.StatusSent {
			t.Errorf("%s got its message (%s) but ends %s", u, r.messages[0].SID, r.status)
		}
	}
	c.checkOnce(t, rs)
}

// The same order, then Redis loses its data before the batch runs again: the claims that said sent are
// gone. The second chunk's recipients, out of every chunk in hand, were sent again by the next run; kept
// in hand, they are a double fault's cost: unknown (their messages may have gone), never sent twice.
func TestPostgresRestartUnderARedisStallThenRedisLossSendsTheChunkOnce(t *testing.T) {
	t.Parallel()
	c, lost, _ := crashUnderARedisStall(t)
	ctx := context.Background()
	// Redis loses its data before the batch runs again.
	if err := c.redis.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.runToEnd(t)
	rs := c.recipients(t)
	for _, u := range lost {
		r := rs[u]
		if len(r.messages) == 1 && r.status != campaign.StatusSent && r.status != campaign.StatusUnknown {
			t.Errorf("%s got its message (%s) but ends %s", u, r.messages[0].SID, r.status)
		}
	}
	c.checkOnce(t, rs)
}

// crashUnderARedisStall runs a batch of 16 in chunks of 4 whose second chunk's outcomes (synchronous_commit
// off) a Postgres crash takes back, the restart coming while a Redis stall of 1.5 s holds the run (long
// enough for the pool to ping its idle connections again: the run goes on with the restarted server). It
// returns the crash's fixture, the users whose outcomes were lost, and the batch's chunk in hand after the
// run.
func crashUnderARedisStall(t *testing.T) (*pgCrash, []string, []string) {
	t.Helper()
	var rules *faults.State
	c := newPGCrash(t, func(cfg *Config) {
		rules = faults.NewState(state.New(cfg.Redis, DefaultClaimTTL))
		cfg.State = rules
	})
	// The second flush's progress update stalls on Redis (long enough for the pool to ping its idle
	// connections again: the run goes on with the restarted server).
	stall := rules.Add(&faults.Rule{Match: faults.Method("AddProgress"), Skip: 1, Times: 1, Kind: faults.Stall, Delay: 1500 * time.Millisecond})
	c.store.crash = func() {
		c.pg.Crash()
		c.pg.Restart()
	}
	ctx := context.Background()
	c.pg.HoldWAL()
	err := c.h.RunBatch(ctx, c.id, 0)
	t.Logf("first run: %v", err)
	if stall.Hits() != 1 {
		t.Fatalf("the progress stall hit %d times, want once", stall.Hits())
	}
	lost := c.store.lost()
	if len(lost) != 4 {
		t.Fatalf("Postgres crashed after the outcomes of %v, want a chunk of 4", lost)
	}
	if n := len(c.sandbox.Messages()); n != 16 {
		t.Logf("the sandbox accepted %d messages", n)
	}
	var inHand []string
	if err := c.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, c.id).Scan(&inHand); err != nil {
		t.Fatal(err)
	}
	sort.Strings(inHand)
	for _, u := range lost {
		st, _, _ := c.status(t, u)
		t.Logf("%s after the run: %s (in hand: %v)", u, st, slices.Contains(inHand, u))
	}

	return c, lost, inHand
}
