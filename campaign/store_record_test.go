package campaign_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Record changes only recipients of the lease's batch, and the audit record of an outcome keeps the consent
// the lease read for it.
func TestRecordKeepsToTheLeasesBatchAndAuditsTheConsentRead(t *testing.T) {
	t.Parallel()
	db, c, store, batch := plannedForU2(t, "record")
	ctx := context.Background()

	// u2's outcome under another batch's lease changes nothing.
	sent := []campaign.Outcome{{UserID: "u2", Status: campaign.StatusSent, MessageID: "SM1"}}
	moved, err := store.Record(ctx, c.ID, sent, campaign.Lease{Batch: batch + 1}, nil)
	if err != nil || len(moved) != 0 {
		t.Fatalf("record under batch %d's lease: moved %v (%v), want nothing", batch+1, moved, err)
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2' AND status = 'pending'`, c.ID); n != 1 {
		t.Fatal("u2 left pending: recorded under another batch's lease")
	}

	l := campaign.Lease{Batch: batch, Token: "run-1", Epoch: "e", TTL: time.Minute}
	ch, err := store.LeaseChunk(ctx, c, []string{"u2"}, l)
	if err != nil {
		t.Fatal(err)
	}
	snap, ok := ch.Snapshots["u2"]
	if !ok || snap.Status != "ONAY" || snap.Source != "HS_WEB" || snap.Date.IsZero() || snap.SyncedAt.IsZero() {
		t.Fatalf("lease read u2's consent as %+v (found %v), want ONAY from HS_WEB with its dates", snap, ok)
	}
	sent[0].Snapshot = snap
	moved, err = store.Record(ctx, c.ID, sent, l, nil)
	if err != nil || moved[campaign.StatusSent] != 1 {
		t.Fatalf("record under its own batch's lease: moved %v (%v), want 1 sent", moved, err)
	}
	var status, source string
	var date, synced time.Time
	err = db.QueryRow(ctx, `SELECT consent_status, consent_source, consent_date, consent_synced_at FROM send_log
		WHERE campaign_id = $1 AND user_id = 'u2' AND status = 'sent'`, c.ID).Scan(&status, &source, &date, &synced)
	if err != nil {
		t.Fatalf("u2's audit record: %v", err)
	}
	if status != "ONAY" || source != "HS_WEB" || !date.Equal(snap.Date) || !synced.Equal(snap.SyncedAt) {
		t.Errorf("audit says %s from %s at %v (synced %v), want the lease's %+v", status, source, date, synced, snap)
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND batch = $2 AND lease_users <> '{}'`, c.ID, batch); n != 0 {
		t.Error("the chunk in hand was not emptied by the record")
	}
}

// The report names the provider each outcome was recorded with (the fallback's when the first was down),
// whatever the environment of whoever reads it configures.
func TestTheReportNamesTheProviderEachOutcomeWasRecordedWith(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	ctx := context.Background()
	c := planned(t, db, spec("providers"))
	store := campaign.NewStore(db)
	var users []string
	rows, err := db.Query(ctx, `SELECT user_id FROM campaign_recipients WHERE campaign_id = $1 ORDER BY user_id`, c.ID)
	if err == nil {
		users, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(users) != 2 {
		t.Fatalf("planned %v (%v), want 2 recipients", users, err)
	}
	outcomes := map[string]campaign.Outcome{
		users[0]: {UserID: users[0], Status: campaign.StatusSent, MessageID: "SM1", Provider: "twilio"},
		users[1]: {UserID: users[1], Status: campaign.StatusFailed, Reason: "netgsm 40: the number is invalid", Provider: "netgsm"},
	}
	for u, o := range outcomes {
		var batch int
		if err := db.QueryRow(ctx, `SELECT batch FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, c.ID, u).Scan(&batch); err != nil {
			t.Fatal(err)
		}
		if moved, err := store.Record(ctx, c.ID, []campaign.Outcome{o}, campaign.Lease{Batch: batch}, nil); err != nil || moved[o.Status] != 1 {
			t.Fatalf("record %+v: moved %v, %v", o, moved, err)
		}
	}
	got := map[string]string{}
	if err := store.Report(ctx, c.ID, nil, func(r campaign.ReportRow) error {
		if r.Status != campaign.StatusExcluded { // u1 is also excluded once (a second row of it)
			got[r.UserID] = r.Provider
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for u, want := range map[string]string{users[0]: "twilio", users[1]: "netgsm"} {
		if got[u] != want {
			t.Errorf("%s's provider in the report is %q, want %q", u, got[u], want)
		}
	}
}

// A provider's answer is text from outside: a NUL or invalid UTF-8 in one recipient's reason or message ID
// is stored (as U+FFFD), and the outcomes recorded with it are not refused along with it. Postgres refuses
// both in text, and the whole statement with them, on every retry of the chunk.
func TestAnOutcomeWithANulInItsReasonIsRecordedWithTheOthers(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	ctx := context.Background()
	sp := spec("nul")
	sp.BatchSize = 10
	c := planned(t, db, sp)
	store := campaign.NewStore(db)
	var users []string
	var batch int
	rows, err := db.Query(ctx, `SELECT user_id FROM campaign_recipients WHERE campaign_id = $1 ORDER BY user_id`, c.ID)
	if err == nil {
		users, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err == nil {
		err = db.QueryRow(ctx, `SELECT min(batch) FROM campaign_recipients WHERE campaign_id = $1`, c.ID).Scan(&batch)
	}
	if err != nil || len(users) != 2 || count(t, db, `SELECT count(DISTINCT batch) FROM campaign_recipients WHERE campaign_id = $1`, c.ID) != 1 {
		t.Fatalf("planned %v (%v), want 2 recipients in one batch", users, err)
	}
	outcomes := []campaign.Outcome{
		{UserID: users[0], Status: campaign.StatusSent, MessageID: "SM\x001"},
		{UserID: users[1], Status: campaign.StatusFailed, Reason: "twilio 21211: invalid \x00 'To' \xff number"},
	}
	moved, err := store.Record(ctx, c.ID, outcomes, campaign.Lease{Batch: batch}, nil)
	if err != nil || moved[campaign.StatusSent] != 1 || moved[campaign.StatusFailed] != 1 {
		t.Fatalf("record: moved %v (%v), want 1 sent and 1 failed", moved, err)
	}
	var reason string
	if err := db.QueryRow(ctx, `SELECT reason FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, c.ID, users[1]).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if want := "twilio 21211: invalid \uFFFD 'To' \uFFFD number"; reason != want {
		t.Errorf("reason stored %q, want %q", reason, want)
	}
}

// plannedForU2 plans the seeded audience (seedAudience) as campaign name on a database of its own, and
// returns the database, the campaign, its store and u2's batch.
func plannedForU2(t *testing.T, name string) (*pgxpool.Pool, *campaign.Campaign, *campaign.Store, int) {
	t.Helper()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	c := planned(t, db, spec(name))
	var batch int
	if err := db.QueryRow(context.Background(), `SELECT batch FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID).Scan(&batch); err != nil {
		t.Fatal(err)
	}
	return db, c, campaign.NewStore(db), batch
}
