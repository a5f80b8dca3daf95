package iys_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// A refusal that finds the consent RET here (the person's new ONAY in İYS not pulled yet) queues nothing;
// the pull days later brings the ONAY, older than the refusal, and the refusal's RET is queued then. The
// refusal arrived a week ago and is still not in İYS: the outbox must report it overdue (law 6563: three
// business days from the refusal), not give it two more days from the pull.
func TestARefusalRequeuedByALatePullIsReportedOverdue(t *testing.T) {
	const addr = "+905324444444"
	pool, _ := testdb.New(t)
	ctx := context.Background()
	brand := "654321"
	week := 7 * 24 * time.Hour
	t1 := time.Now().Add(-3 * week).Truncate(time.Second)
	t2, t3 := t1.Add(time.Hour), time.Now().Add(-week).Truncate(time.Second)
	consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", brand, "ONAY", t1.Add(-48 * time.Hour)})
	refuse := func(id string, at time.Time) {
		t.Helper()
		if _, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: id, Kind: "inbound",
			Recipient: addr, Type: "MESAJ", Evidence: "RET", At: at}}); err != nil {
			t.Fatal(err)
		}
	}
	refuse("SM1", t1)
	// The first RET reached İYS long ago.
	if _, err := pool.Exec(ctx, `UPDATE iys_outbox SET state = 'accepted', done_at = now()`); err != nil {
		t.Fatal(err)
	}
	// The person gave consent again in İYS at t2 (not pulled yet) and refused here at t3, a week ago.
	refuse("SM2", t3)
	// The pull, today, brings the ONAY t2.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
		Status: "ONAY", Source: "HS_WEB", ConsentDate: t2, CreationDate: t2}}, iys.OriginPull); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sum, err := iys.Outbox(ctx, pool, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("outbox: %+v", sum)
	if sum.States[iys.OutboxWaiting] != 1 {
		t.Fatalf("waiting %d, want the requeued RET", sum.States[iys.OutboxWaiting])
	}
	if sum.Overdue != 1 {
		t.Fatalf("overdue %d, want 1: the refusal of %s (a week ago) is not in İYS, past the law's three business days", sum.Overdue, t3.Format(time.DateTime))
	}
}
