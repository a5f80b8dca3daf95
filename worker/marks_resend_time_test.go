package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// The frequency mark of a recipient sent again by `resume --resend-unknown` must say when the resend
// went out. Order: campaign A (cap 1h) sends u1 at T, the answer is lost (unknown; mark A|T); a second
// campaign B (cap 1h) is planned alongside; at T+90m the operator resumes A with --resend-unknown and the
// resend is accepted; at T+2h B runs. B must skip u1: u1 got A's resend 30 minutes before, within B's
// cap. The claim script used to see A's own mark from T and write no new one, so the mark still said T,
// and B judged it 2h old and sent; the claim now moves the mark to its own time (and a release of it puts
// T back: TestATransientFailureOfAResendKeepsTheMarkOfTheUnknownSend).
//
// Time is moved by the worker's clock (Config.Now), inside one UTC day, so that every check reads the
// same day's mark hash.
func TestAResendLeavesAMarkOfItsOwnTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Now().UTC().Truncate(24 * time.Hour).Add(time.Hour) // 01:00 UTC today
	f, second := planTwoCapped(t)
	f.h.cfg.Now = func() time.Time { return start }
	f.runWithUnknown(t, 1) // the provider accepted u1's message, its answer was lost
	// 90 minutes later: the operator resends the unknown; the provider accepts it.
	f.provider.fail = nil
	f.h.cfg.Now = func() time.Time { return start.Add(90 * time.Minute) }
	f.ageUnknown(t)
	if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := f.status(t, "u1"); st != campaign.StatusSent {
		t.Fatalf("u1 %s after the resend, want sent", st)
	}
	if got := len(f.provider.sentTo(phone(1))); got != 2 {
		t.Fatalf("u1 reached %d times by the first campaign, want 2 (the unknown send and its resend)", got)
	}
	keys, _ := f.rdb.Keys(ctx, "freq:*").Result()
	for _, k := range keys {
		if v, err := f.rdb.HGet(ctx, k, phone(1)).Result(); err == nil {
			t.Logf("mark of u1 in %s: %s (first send %d, resend %d)", k, v, start.UnixMilli(), start.Add(90*time.Minute).UnixMilli())
		}
	}
	// Two hours after the first send, 30 minutes after the resend: the second campaign (cap 1h) runs.
	f.h.cfg.Now = func() time.Time { return start.Add(2 * time.Hour) }
	if err := f.h.RunBatch(ctx, second, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.provider.sentTo(phone(1)); len(got) > 2 {
		t.Fatalf("u1 got a message from the second campaign 30 minutes after the first campaign's resend, within its 1h frequency cap: %q", got)
	}
}
