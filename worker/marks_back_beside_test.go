package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A first campaign (cap 24h) claims u1 and its answer is lost (unknown). While that send is in flight a
// second campaign with no cap (--frequency-cap 0) sends u1: its mark replaces the first's. Without a Redis
// loss, `resume --resend-unknown` of the first campaign then finds the second campaign's mark within its
// cap and skips u1. After a Redis loss the marks are written back from the audit log: the latest row is
// the first campaign's own unknown (logged when its chunk ended, after the second campaign's send), which
// does not cap it; the second campaign's send is written back beside it, and does. (With one mark a
// person, u1 got the resend 1 s after the other campaign's message, within the first campaign's 24h cap.)
func TestMarksBackAfterALossKeepAnotherCampaignsSendBesideTheOwnUnknown(t *testing.T) {
	for _, wipe := range []bool{false, true} {
		name := "no loss"
		if wipe {
			name = "redis loss"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			f := planWith(t, 4, func(s *campaign.Spec) { s.FrequencyCap = 24 * time.Hour })
			rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx,
				func() campaign.Spec { s := fixtureSpec("nocap"); s.FrequencyCap = 0; return s }())
			if err != nil {
				t.Fatal(err)
			}
			second := rep.ID
			var inSecond, fired atomic.Bool
			f.provider.before = func(m providers.Message) {
				if m.To != phone(1) || inSecond.Load() || !fired.CompareAndSwap(false, true) {
					return
				}
				inSecond.Store(true)
				err := f.handler(f.rdb).RunBatch(ctx, second, 0)
				inSecond.Store(false)
				t.Logf("uncapped campaign's batch: %v", err)
			}
			f.provider.fail = func(_ int, m providers.Message) error {
				if m.To == phone(1) && !inSecond.Load() {
					return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
				}
				return nil
			}
			f.runAll(t)
			if st, _, _ := f.status(t, "u1"); st != campaign.StatusUnknown {
				t.Fatalf("u1 %s, want unknown", st)
			}
			if got := len(f.provider.sentTo(phone(1))); got != 2 {
				t.Fatalf("u1 reached %d times before the resend, want 2 (first campaign's unknown, uncapped one)", got)
			}
			f.provider.before, f.provider.fail = nil, nil
			if wipe {
				if err := f.rdb.FlushDB(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			f.ageUnknown(t)
			if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true}); err != nil {
				t.Fatal(err)
			}
			err = f.h.RunBatch(ctx, f.id, 0)
			t.Logf("resend run: %v", err)
			st, reason, _ := f.status(t, "u1")
			if got := f.provider.sentTo(phone(1)); len(got) > 2 {
				t.Fatalf("u1 got %d messages; the resend went out within the first campaign's 24h cap of the uncapped campaign's message (u1 now %s %s)", len(got), st, reason)
			}
			// Skipped by the cap, the resend did not go; the first campaign's own first message may have:
			// u1 stays unknown, saying why it was not sent again.
			if want := campaign.ResendNotSent(campaign.ReasonFrequencyCap); st != campaign.StatusUnknown || reason != want {
				t.Fatalf("u1 %s %q after the resend run, want unknown %q", st, reason, want)
			}
		})
	}
}
