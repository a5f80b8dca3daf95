package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
)

// A receipt that comes in for a pending recipient never made unknown (its worker was stopped before it
// wrote the answer) makes it sent without another send, and the reason says so: it said "before the
// message was sent again", which told operators of a second send that never happened.
func TestAReceiptBeforeTheAnswerSaysNothingMoreWasSent(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	if _, err := f.store.RecordDeliveries(context.Background(), []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u1",
		MessageID: "SMu1", Status: campaign.DeliveryDelivered}}); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	st, reason, _ := f.status(t, "u1")
	if st != campaign.StatusSent || len(f.provider.accepted[phone(1)]) != 0 {
		t.Fatalf("u1: %s, %d messages; want sent by its receipt, and no message", st, len(f.provider.accepted[phone(1)]))
	}
	if strings.Contains(reason, "again") || !strings.Contains(reason, "nothing more was sent") {
		t.Errorf("u1's reason %q; want one that says nothing more was sent, and no second send", reason)
	}
}
