package worker_test

import (
	"context"
	"testing"

	"github.com/campaignctl/campaignctl/worker"
)

// A cancel after `resume --resend-unknown`: the recipients made pending again were unknown once, their
// first message may have gone out with their codes, and they keep them. The cancel said "their codes back
// in pool p" for all of them all the same; its report now counts those that keep theirs.
func TestACancelCountsTheCodesOnceUnknownRecipientsKeep(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 4, nil)
	ctx := context.Background()
	c := e.launch(t, "kept", 4)
	e.exec(t, `UPDATE campaign_recipients SET status = CASE WHEN user_id IN ('u1', 'u2') THEN 'unknown' ELSE 'sent' END
		WHERE campaign_id = $1 AND user_id <> 'u4'`, c.ID)
	e.exec(t, `UPDATE campaign_recipients SET status = 'unknown', updated_at = now() - interval '1 hour' WHERE campaign_id = $1 AND user_id IN ('u1', 'u2')`, c.ID)
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, ResendUnknown: true})
	if err != nil || rep.Resent != 2 {
		t.Fatalf("resume --resend-unknown: %+v, %v; want u1 and u2 pending again", rep, err)
	}
	cr, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	if cr.Cancelled != 3 || cr.KeptCodes != 2 || cr.CodePool != "p" {
		t.Fatalf("cancel: %d cancelled, %d keeping their codes (pool %q); want 3 (u1, u2, u4), 2 keeping theirs (u1, u2, once unknown)", cr.Cancelled, cr.KeptCodes, cr.CodePool)
	}
	var kept int
	if err := e.db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND code_id IS NOT NULL AND user_id IN ('u1', 'u2', 'u4')`, c.ID).Scan(&kept); err != nil || kept != 2 {
		t.Fatalf("%d of the cancelled keep a code (%v), want 2: the count must say what the rows hold", kept, err)
	}
}
