package worker

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A recipient recorded unknown (its answer timed out after the request was written) whose receipt then
// says delivered is reported sent with the reason a receipt gives, and what the worker saw is kept in
// last_error, as for a receipt that comes before the outcome. Before, the report printed a sent, delivered
// row whose reason was the unknown's timeout.
func TestAnUnknownProvedSentByItsReceiptIsReportedSo(t *testing.T) {
	t.Parallel()
	f := planWithU4Unknown(t)
	ctx := context.Background()
	if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u4",
		MessageID: "SMu4", Status: campaign.DeliveryDelivered}}); err != nil {
		t.Fatal(err)
	}
	var row campaign.ReportRow
	if err := f.store.Report(ctx, f.id, []string{"sent"}, func(r campaign.ReportRow) error {
		if r.UserID == "u4" {
			row = r
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if row.Status != campaign.StatusSent || !strings.Contains(row.Reason, "accepted by the provider") || strings.Contains(row.Reason, "deadline") {
		t.Fatalf("u4 in the report: %s, reason %q; want sent, accepted by the provider", row.Status, row.Reason)
	}
	var lastErr string
	if err := f.db.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u4'`, f.id).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "deadline") {
		t.Errorf("u4's last_error %q, want what the worker saw (the timeout)", lastErr)
	}
}

// planWithU4Unknown plans 10 customers (eligible in batch 0: u1 u2 u4 u7 u8) and runs the batch with
// u4's answer timing out after its request was written: u4 ends unknown, the others sent.
func planWithU4Unknown(t *testing.T) *fixture {
	t.Helper()
	f := plan(t, 10)
	f.runWithUnknown(t, 4)
	return f
}

// runWithUnknown runs the campaign's batches with the answer to u<i>'s send (phone(i)) timing out after
// its request was written, and checks that u<i> ends unknown.
func (f *fixture) runWithUnknown(t *testing.T, i int) {
	t.Helper()
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(i) {
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		}
		return nil
	}
	f.runAll(t)
	if st, _, _ := f.status(t, fmt.Sprintf("u%d", i)); st != campaign.StatusUnknown {
		t.Fatalf("u%d %s, want unknown", i, st)
	}
}
