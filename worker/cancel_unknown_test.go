package worker_test

import (
	"context"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// A cancel after `resume --resend-unknown`: the recipients made pending again were unknown once, and their
// first message may have gone out with their codes. The cancel recorded them skipped (cancelled), which
// `status` and `report` read as "not sent", and said "their codes back in pool p" for all of them. They
// now stay unknown (reason campaign.CancelledUnsure) with their codes; the one never sent is skipped, its
// code back in the pool.
func TestACancelLeavesRecipientsOnceUnknownUnknown(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 4, nil)
	ctx := context.Background()
	c := e.launch(t, "kept", 4)
	e.exec(t, `UPDATE campaign_recipients SET status = CASE WHEN user_id IN ('u1', 'u2') THEN 'unknown' ELSE 'sent' END
		WHERE campaign_id = $1 AND user_id <> 'u4'`, c.ID)
	e.ageUnknown(t, c.ID)
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, ResendUnknown: true})
	if err != nil || rep.Resent != 2 {
		t.Fatalf("resume --resend-unknown: %+v, %v; want u1 and u2 pending again", rep, err)
	}
	cr, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	if cr.Cancelled != 1 || cr.Counts.Unknown != 2 || cr.Counts.Skipped != 1 {
		t.Fatalf("cancel: %d cancelled, counts %+v; want u4 cancelled, u1 and u2 unknown", cr.Cancelled, cr.Counts)
	}
	rows, err := e.db.Query(ctx, `SELECT user_id, status, coalesce(reason, ''), code_id IS NOT NULL FROM campaign_recipients WHERE campaign_id = $1 AND user_id <> 'u3' ORDER BY user_id`, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[string][3]string{
		"u1": {campaign.StatusUnknown, campaign.CancelledUnsure, "true"},
		"u2": {campaign.StatusUnknown, campaign.CancelledUnsure, "true"},
		"u4": {campaign.StatusSkipped, campaign.ReasonCancelled, "false"},
	}
	for rows.Next() {
		var user, st, reason string
		var code bool
		if err := rows.Scan(&user, &st, &reason, &code); err != nil {
			t.Fatal(err)
		}
		if got := [3]string{st, reason, map[bool]string{true: "true", false: "false"}[code]}; got != want[user] {
			t.Errorf("%s after the cancel: %v (status, reason, keeps a code); want %v", user, got, want[user])
		}
	}
}
