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
	launched, url := testdb.New(t)
	seedAudience(t, launched, 3)
	ctx := context.Background()
	c := planned(t, launched, spec("durable"))
	db := newPool(t, url, 1) // one connection: whatever Record leaves on it, the next statement gets
	store := campaign.NewStore(db)
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

// An operator's UPDATE to unknown racing a chunk's outcome: the operator's transaction holds the row when
// Record comes, and commits while Record waits for it. Record then finds the row no longer pending and
// leaves it alone (no failure over the unknown, no code back to the pool), and the row carries the mark
// (the trigger of migration 0013, in the operator's transaction), so that a resend failing for good later
// keeps the code too.
func TestOperatorUnknownRacingAnOutcomeKeepsTheCode(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 4)
	addCodes(t, db, "race-unknown", 4)
	c := planned(t, db, crowdSpec("race-unknown", "race-unknown", 4))
	store := campaign.NewStore(db)
	const u = "u00001"
	planned, _ := codeOf(t, db, c.ID, u)
	l := campaign.Lease{Batch: 0, Token: "run-1", Epoch: "e", TTL: time.Minute}
	if ch, err := store.LeaseChunk(ctx, c, []string{u}, l); err != nil || len(ch.Leased) != 1 {
		t.Fatalf("lease: %v (%v)", ch.Leased, err)
	}

	op, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := op.Exec(ctx, `UPDATE campaign_recipients SET status = 'unknown', reason = 'set by hand' WHERE campaign_id = $1 AND user_id = $2`, c.ID, u); err != nil {
		t.Fatal(err)
	}
	type result struct {
		moved map[string]int64
		err   error
	}
	done := make(chan result, 1)
	go func() {
		moved, err := store.Record(ctx, c.ID, []campaign.Outcome{{UserID: u, Status: campaign.StatusFailed, Reason: "twilio 21610: unsubscribed recipient"}}, l, nil)
		done <- result{moved, err}
	}()
	// Record waits for the operator's row lock before the operator commits.
	deadline := time.Now().Add(10 * time.Second)
	for count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Record never waited for the operator's row lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := op.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Record still waiting after the operator committed")
	}
	if r.err != nil || len(r.moved) != 0 {
		t.Fatalf("Record after the operator's unknown: moved %v (%v), want nothing (the row is no longer pending)", r.moved, r.err)
	}
	var status string
	var mark bool
	if err := db.QueryRow(ctx, `SELECT status, ever_unknown FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, c.ID, u).Scan(&status, &mark); err != nil {
		t.Fatal(err)
	}
	if status != campaign.StatusUnknown || !mark {
		t.Fatalf("%s is %s (ever unknown: %v), want unknown with the mark", u, status, mark)
	}
	if got, _ := codeOf(t, db, c.ID, u); got != planned {
		t.Fatalf("%s holds %q after the race, want its code %q", u, got, planned)
	}
	// The operator then resends it (resume --resend-unknown) and the resend fails for good: the code stays.
	if n, err := store.Resend(ctx, c.ID, []string{u}); err != nil || n != 1 {
		t.Fatalf("resend moved %d (%v), want 1", n, err)
	}
	if _, err := store.Record(ctx, c.ID, []campaign.Outcome{{UserID: u, Status: campaign.StatusFailed, Reason: "twilio 21610: unsubscribed recipient"}}, l, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := codeOf(t, db, c.ID, u); got != planned {
		t.Errorf("%s (unknown by hand during an outcome, resent, failed) holds %q, want its code %q", u, got, planned)
	}
	if n := count(t, db, `SELECT count(*) FROM released_codes`); n != 0 {
		t.Errorf("%d codes back in the pool; the one recipient here may have got its code", n)
	}
	checkCodes(t, db)
}
