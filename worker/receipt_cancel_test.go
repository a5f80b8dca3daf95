package worker

import (
	"context"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A receipt that came in while the recipient was pending proves the provider accepted the message
// (RecordDeliveries, Record, LeaseChunk's Accepted, gate: such a recipient is recorded sent and keeps its
// code). A cancel that finds such a recipient pending and not held by a run (CancelUnleased) does the same:
// it does not skip it as "never sent" nor give its code back to the pool. Before, it did both.
//
// Two ways to be pending, unheld, with a receipt:
//   - "5xx then receipt": Twilio answered 503 to every try of u7 (the first request was in fact taken:
//     its status callback comes later); the run gave up on u7 for now, leaving it pending (deferred).
//   - "resend then receipt": u7's answer was lost (unknown), `resume --resend-unknown` made it pending
//     again, and the receipt of the first message comes in before the resend runs.
//
// Then `campaignctl cancel`.
func TestAnEarlyReceiptOnAnUnheldPendingRecipientSurvivesACancel(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"5xx then receipt", "resend then receipt"} {
		t.Run(tc, func(t *testing.T) {
			t.Parallel()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			ctx := context.Background()
			_, _, code := f.status(t, "u7")
			if code == "" {
				t.Fatal("u7 has no code")
			}
			switch tc {
			case "5xx then receipt":
				f.provider.fail = func(_ int, m providers.Message) error {
					if m.To == phone(7) {
						return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
					}
					return nil
				}
				_ = f.h.RunBatch(ctx, f.id, 0) // a RetryError: u7 deferred
				f.provider.fail = nil
			case "resend then receipt":
				f.resentAfterLostAnswers(t, f.h)
			}
			if st, _, _ := f.status(t, "u7"); st != campaign.StatusPending {
				t.Fatalf("u7: %s, want pending before the receipt", st)
			}
			var held int
			if err := f.db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND 'u7' = ANY(lease_users || suspect_users)`, f.id).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Fatalf("u7 still held by a lease: this tests nothing")
			}
			// The status callback of u7's first message.
			applied, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u7",
				Address: phone(7), MessageID: "SMfirst-u7", Status: campaign.DeliveryDelivered, EventID: "ev-u7"}})
			if err != nil || applied.Changed != 1 {
				t.Fatalf("receipt applied %+v (%v), want 1 recipient changed", applied, err)
			}
			if _, err := Cancel(ctx, CancelOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
				t.Fatal(err)
			}
			st, reason, kept := f.status(t, "u7")
			var released int
			if err := f.db.QueryRow(ctx, `SELECT count(*) FROM released_codes rc JOIN promo_codes p ON p.id = rc.code_id WHERE p.code = $1`, code).Scan(&released); err != nil {
				t.Fatal(err)
			}
			if st != campaign.StatusSent {
				t.Errorf("u7 ends %s (%q) although its delivery receipt, recorded while it was pending, proves the provider accepted it; want sent", st, reason)
			}
			if kept != code || released != 0 {
				t.Errorf("u7's code %s (delivered to u7, says the receipt) is back in the pool: u7 holds %q, released %d", code, kept, released)
			}
		})
	}
}
