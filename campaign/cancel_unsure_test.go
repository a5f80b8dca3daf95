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

// A recipient once unknown, pending again for `resume --resend-unknown`, whose resend does not go (skipped
// at send time by the frequency cap, or by a refusal recorded since; or failed at the provider) may have
// got its first message, with its code: Record leaves it unknown, its reason saying why the resend did not
// go and that the first may have gone out, the why in last_error, with its code. Before, it became skipped
// or failed, which `status` and `report` read as "not sent", for people the provider had sent the first
// message to. The control: a recipient never unknown is skipped, and its code goes back to the pool.
func TestAResendThatDoesNotGoLeavesARecipientOnceUnknownUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		everUnknown  bool
		status, why  string
		wantStatus   string
		wantReason   string
		wantKeepCode bool
		bad          bool // the provider condemned the address (an unregistered push token)
	}{
		{"frequency cap", true, campaign.StatusSkipped, campaign.ReasonFrequencyCap, campaign.StatusUnknown, campaign.ResendNotSent(campaign.ReasonFrequencyCap), true, false},
		{"refused since", true, campaign.StatusSkipped, campaign.ReasonRevoked, campaign.StatusUnknown, campaign.ResendNotSent(campaign.ReasonRevoked), true, false},
		{"failed", true, campaign.StatusFailed, "twilio 21610: unsubscribed recipient", campaign.StatusUnknown, campaign.ResendNotSent("twilio 21610: unsubscribed recipient"), true, false},
		{"never unknown", false, campaign.StatusSkipped, campaign.ReasonFrequencyCap, campaign.StatusSkipped, campaign.ReasonFrequencyCap, false, false},
		// The address the resend's provider condemned is condemned for later launches all the same.
		{"condemned address", true, campaign.StatusFailed, "fcm http 404: UNREGISTERED", campaign.StatusUnknown, campaign.ResendNotSent("fcm http 404: UNREGISTERED"), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, c, store, batch := plannedForU2(t, "resend")
			ctx := context.Background()
			if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET ever_unknown = $2 WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID, tc.everUnknown); err != nil {
				t.Fatal(err)
			}
			l := campaign.Lease{Batch: batch, Token: "run-1", Epoch: "e", TTL: time.Minute}
			if _, err := store.LeaseChunk(ctx, c, []string{"u2"}, l); err != nil {
				t.Fatal(err)
			}
			moved, err := store.Record(ctx, c.ID, []campaign.Outcome{{UserID: "u2", Status: tc.status, Reason: tc.why, BadAddress: tc.bad}}, l, nil)
			if err != nil || moved[tc.wantStatus] != 1 || len(moved) != 1 {
				t.Fatalf("the resend's %s (%s): moved %v (%v), want u2 %s", tc.status, tc.why, moved, err, tc.wantStatus)
			}
			var status, reason, lastErr string
			var kept, released bool
			var audited int
			if err := db.QueryRow(ctx, `SELECT status, coalesce(reason, ''), coalesce(last_error, ''), code_id IS NOT NULL,
					EXISTS (SELECT 1 FROM released_codes rc WHERE rc.code_id = r.code_id)
				FROM campaign_recipients r WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID).Scan(&status, &reason, &lastErr, &kept, &released); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow(ctx, `SELECT count(*) FROM send_log WHERE campaign_id = $1 AND user_id = 'u2' AND status = $2 AND reason = $3`,
				c.ID, tc.wantStatus, tc.wantReason).Scan(&audited); err != nil {
				t.Fatal(err)
			}
			if status != tc.wantStatus || reason != tc.wantReason || kept != tc.wantKeepCode || audited != 1 {
				t.Fatalf("u2 after the resend's %s: %s (%q), keeps its code %v, audited %d; want %s (%q), keeps its code %v, audited once",
					tc.why, status, reason, kept, audited, tc.wantStatus, tc.wantReason, tc.wantKeepCode)
			}
			var condemned int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM invalid_addresses i JOIN campaign_recipients r ON r.address = i.address
				WHERE r.campaign_id = $1 AND r.user_id = 'u2'`, c.ID).Scan(&condemned); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1}[tc.bad]; condemned != want {
				t.Fatalf("u2's address condemned %d times after the resend's %s, want %d", condemned, tc.why, want)
			}
			if tc.everUnknown && (lastErr != tc.why || released) {
				t.Fatalf("u2 after the resend's %s: last_error %q, its code released %v; want %q and its code held", tc.why, lastErr, released, tc.why)
			}
		})
	}
}
