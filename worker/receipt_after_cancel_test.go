package worker

import (
	"context"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
)

// A recipient recorded unknown (its answer timed out after the request was written), made pending again
// by `resume --resend-unknown`, then closed by a cancel before the resend went: unknown again (its first
// message may have gone out; it was reported skipped, "not sent"), its code kept. The receipt of its first
// message then comes: it proves the message went out, and the recipient is reported sent, audited so.
// Before, the receipt was ignored and the report said skipped for someone who got the message.
func TestAReceiptAfterACancelOfTheResendProvesTheFirstSend(t *testing.T) {
	t.Parallel()
	f := planWithU4Unknown(t)
	ctx := context.Background()
	f.ageUnknown(t)
	if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Fatal(err)
	}
	if st, reason, code := f.status(t, "u4"); st != campaign.StatusUnknown || reason != campaign.CancelledUnsure || code == "" {
		t.Fatalf("u4 after the cancel: %s (%s), code %q; want unknown (%s), its code kept", st, reason, code, campaign.CancelledUnsure)
	}
	if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u4",
		MessageID: "SMu4", Status: campaign.DeliveryDelivered}}); err != nil {
		t.Fatal(err)
	}
	if st, reason, _ := f.status(t, "u4"); st != campaign.StatusSent {
		t.Fatalf("u4 after the receipt of its first message: %s (%s), want sent", st, reason)
	}
	var audited int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM send_log WHERE campaign_id = $1 AND user_id = 'u4' AND status = 'sent'`, f.id).Scan(&audited); err != nil {
		t.Fatal(err)
	}
	if audited != 1 {
		t.Errorf("u4's send audited %d times, want once", audited)
	}
}
