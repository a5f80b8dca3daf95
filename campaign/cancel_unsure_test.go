package campaign_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// A run of a cancelled campaign closes the recipients of its chunk as skipped (cancelled). One that was
// once unknown (pending again for a resend) may have got its first message: Record leaves it unknown,
// reason campaign.CancelledUnsure, with its code, and audits it so. One never unknown is skipped and its
// code goes back.
func TestARunsCancelOfARecipientOnceUnknownLeavesItUnknown(t *testing.T) {
	t.Parallel()
	db, c, store, batch := plannedForU2(t, "unsure")
	ctx := context.Background()
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET ever_unknown = true WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID); err != nil {
		t.Fatal(err)
	}
	l := campaign.Lease{Batch: batch, Token: "run-1", Epoch: "e", TTL: time.Minute}
	if _, err := store.LeaseChunk(ctx, c, []string{"u2"}, l); err != nil {
		t.Fatal(err)
	}
	moved, err := store.Record(ctx, c.ID, []campaign.Outcome{{UserID: "u2", Status: campaign.StatusSkipped, Reason: campaign.ReasonCancelled}}, l, nil)
	if err != nil || moved[campaign.StatusUnknown] != 1 || len(moved) != 1 {
		t.Fatalf("the cancel's skip of u2 (once unknown): moved %v (%v), want it unknown", moved, err)
	}
	var status, reason string
	var kept bool
	var audited int
	if err := db.QueryRow(ctx, `SELECT status, reason, code_id IS NOT NULL FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID).Scan(&status, &reason, &kept); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM send_log WHERE campaign_id = $1 AND user_id = 'u2' AND status = 'unknown' AND reason = $2`, c.ID, campaign.CancelledUnsure).Scan(&audited); err != nil {
		t.Fatal(err)
	}
	if status != campaign.StatusUnknown || reason != campaign.CancelledUnsure || !kept || audited != 1 {
		t.Fatalf("u2 after the cancel's skip: %s (%s), keeps its code %v, audited %d; want unknown (%s), its code, audited once",
			status, reason, kept, audited, campaign.CancelledUnsure)
	}
}
