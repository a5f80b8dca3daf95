package campaign_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Record commits a chunk's outcomes with synchronous_commit off for its own transaction only: the session
// keeps its setting, so the next lease on the same connection (what makes the outcomes before it durable,
// and the chunk in hand with them) still waits for the WAL. An outcome that is in no claim (Durable) is
// recorded all the same. The crash itself is worker's TestPostgresCrashAfterAsyncOutcomesLosesNothing.
func TestRecordLeavesTheSessionsCommitsDurable(t *testing.T) {
	t.Parallel()
	planned, url := testdb.New(t)
	seedAudience(t, planned, 3)
	ctx := context.Background()
	rep, err := (&campaign.Planner{Engine: planned, Audience: planned}).Plan(ctx, spec("durable"))
	if err != nil {
		t.Fatal(err)
	}
	db := newPool(t, url, 1) // one connection: whatever Record leaves on it, the next statement gets
	store := campaign.NewStore(db)
	c, err := store.Get(ctx, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	var before string
	if err := db.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, o := range []campaign.Outcome{
		{UserID: "u1", Status: campaign.StatusSent, MessageID: "SM1"},
		{UserID: "u2", Status: campaign.StatusSent, MessageID: "SM2", Durable: true},
	} {
		l := campaign.Lease{Token: "run-1", Epoch: "e", TTL: time.Minute}
		if err := db.QueryRow(ctx, `SELECT batch FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, c.ID, o.UserID).Scan(&l.Batch); err != nil {
			t.Fatal(err)
		}
		if _, err := store.LeaseChunk(ctx, c, []string{o.UserID}, l); err != nil {
			t.Fatal(err)
		}
		moved, err := store.Record(ctx, c.ID, []campaign.Outcome{o}, l, nil)
		if err != nil || moved[campaign.StatusSent] != 1 {
			t.Fatalf("record %s (durable %v): moved %v (%v), want 1 sent", o.UserID, o.Durable, moved, err)
		}
		var after string
		if err := db.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Fatalf("after Record of %s the session's synchronous_commit is %q, was %q: the next lease on this connection would not be durable", o.UserID, after, before)
		}
	}
}
