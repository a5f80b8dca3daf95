package campaign_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// ReportsDue walks every SMS recipient sent through the provider whose delivery is not final, once each,
// in key order, across campaigns and pages: not those sent through another provider, not those with a
// final delivery (an intermediate one is still due), not a campaign that finished before the window, not
// an e-mail campaign, not a message older than the window.
func TestReportsDueWalksEachMessageOnce(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `INSERT INTO campaigns (id, name, channel, state, message, audience_sql, batch_size, finished_at)
		OVERRIDING SYSTEM VALUE VALUES (201, 'a', 'sms', 'completed', 'x', 'SELECT 1', 100, now()),
		(202, 'b', 'sms', 'running', 'x', 'SELECT 1', 100, NULL),
		(203, 'old', 'sms', 'completed', 'x', 'SELECT 1', 100, now() - interval '10 days'),
		(204, 'mail', 'email', 'running', 'x', 'SELECT 1', 100, NULL)`)
	for _, c := range []int{201, 202, 203, 204} {
		mustExec(t, db, `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status, provider, provider_message_id, sent_at)
			SELECT $1::bigint, 'u' || lpad(i::text, 3, '0'), '+90532' || lpad(i::text, 7, '0'), 0, 'sent',
				CASE WHEN i % 3 = 0 THEN 'twilio' ELSE 'netgsm' END, $1::text || '-' || i, now() - interval '1 hour'
			FROM generate_series(1, 150) i`, c)
	}
	mustExec(t, db, `UPDATE campaign_recipients SET delivery = 'delivered' WHERE campaign_id = 201 AND user_id IN ('u001', 'u002')`)
	mustExec(t, db, `UPDATE campaign_recipients SET delivery = 'sent' WHERE campaign_id = 201 AND user_id = 'u004'`)
	mustExec(t, db, `UPDATE campaign_recipients SET sent_at = now() - interval '5 days' WHERE campaign_id = 202 AND user_id = 'u005'`)
	mustExec(t, db, `UPDATE campaign_recipients SET status = 'unknown' WHERE campaign_id = 202 AND user_id = 'u007'`)
	store := campaign.NewStore(db)
	seen := map[string]int{}
	var order []string
	var camp int64
	var user string
	for page := 0; ; page++ {
		due, err := store.ReportsDue(ctx, "netgsm", time.Now().Add(-72*time.Hour), camp, user, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) == 0 {
			break
		}
		if page > 10 {
			t.Fatal("the walk does not end")
		}
		for _, d := range due {
			k := fmt.Sprintf("%d/%s", d.CampaignID, d.UserID)
			seen[k]++
			order = append(order, k)
			if d.MessageID != fmt.Sprintf("%d-%d", d.CampaignID, atoi(d.UserID[1:])) {
				t.Fatalf("%s: message ID %s", k, d.MessageID)
			}
		}
		camp, user = due[len(due)-1].CampaignID, due[len(due)-1].UserID
	}
	// 100 of each campaign's 150 went through netgsm; 201 has two final, 202 one too old and one unknown.
	if len(seen) != 98+98 {
		t.Fatalf("%d messages due, want 196", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s returned %d times", k, n)
		}
	}
	for _, k := range []string{"201/u001", "201/u002", "201/u003", "202/u005", "202/u007", "203/u001", "204/u001"} {
		if seen[k] != 0 {
			t.Errorf("%s is due, want not", k)
		}
	}
	if seen["201/u004"] != 1 {
		t.Error("a message with only an intermediate receipt is not due")
	}
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("not in key order: %s after %s", order[i], order[i-1])
		}
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
