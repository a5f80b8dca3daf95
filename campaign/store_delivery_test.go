package campaign_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Receipts set the delivery of sent recipients, once per event, never back from a final word to an
// intermediate one; a receipt for an unknown recipient proves the send; one that overtakes the worker's
// outcome (still pending) is kept and leaves the status to the worker.
func TestRecordDeliveries(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status, provider_message_id) VALUES
		(1, 'a', '+905320000001', 0, 'sent', 'SMa'), (1, 'b', '+905320000002', 0, 'sent', 'SMb'),
		(1, 'c', '+905320000003', 0, 'unknown', NULL), (1, 'd', '+905320000004', 0, 'pending', NULL)`)
	store := campaign.NewStore(db)
	now := time.Now()
	n, err := store.RecordDeliveries(ctx, []campaign.Delivery{
		{Provider: "twilio", MessageID: "SMa", Status: campaign.DeliverySent, At: now},
		{Provider: "twilio", MessageID: "SMa", Status: campaign.DeliveryDelivered, At: now.Add(time.Second)},
		{Provider: "sendgrid", CampaignID: 1, UserID: "b", Status: campaign.DeliveryBounced, Error: "550 no such user", EventID: "e1", At: now},
		{Provider: "twilio", CampaignID: 1, UserID: "c", MessageID: "SMc", Status: campaign.DeliveryDelivered, At: now},
		{Provider: "twilio", CampaignID: 1, UserID: "d", Status: campaign.DeliveryDelivered, At: now},
	})
	if err != nil || n != 4 {
		t.Fatalf("changed %d, err %v; want all four (d's receipt came before its outcome was written)", n, err)
	}
	// Late and repeated receipts change nothing: a final word stays, an event applies once.
	n, err = store.RecordDeliveries(ctx, []campaign.Delivery{
		{Provider: "twilio", MessageID: "SMa", Status: campaign.DeliverySent, At: now.Add(2 * time.Second)},
		{Provider: "sendgrid", CampaignID: 1, UserID: "b", Status: campaign.DeliveryDelivered, EventID: "e1", At: now.Add(time.Minute)},
	})
	if err != nil || n != 0 {
		t.Fatalf("late receipts changed %d, err %v", n, err)
	}
	want := map[string][2]string{"a": {"sent", "delivered"}, "b": {"sent", "bounced"}, "c": {"sent", "delivered"}, "d": {"pending", "delivered"}}
	for u, w := range want {
		var st, dl string
		if err := db.QueryRow(ctx, `SELECT status, coalesce(delivery, '') FROM campaign_recipients WHERE user_id = $1`, u).Scan(&st, &dl); err != nil {
			t.Fatal(err)
		}
		if st != w[0] || dl != w[1] {
			t.Errorf("%s: %s/%s, want %s/%s", u, st, dl, w[0], w[1])
		}
	}
	d, u, err := store.DeliveryCounts(ctx, 1)
	if err != nil || d != 3 || u != 1 {
		t.Fatalf("delivery counts %d/%d, %v", d, u, err)
	}
}
