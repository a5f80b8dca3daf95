package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// A campaign planned now and scheduled (--at) 60 hours ahead, with a 72 h frequency cap, is planned before
// another campaign (default 24 h cap) reaches the same people, so its plan excludes nobody; at its start it
// must skip everyone the other one reached 60 hours before (each campaign judges a mark by its own cap).
// The other campaign's marks last as long as the longest cap of a campaign that may still send, plus a
// day. Before, they lasted as long as its own cap allowed (max(24h, its cap) + a day = 48 h): Redis had
// dropped them when the scheduled campaign started, and it sent within its cap.
//
// Time is moved by the worker's clock (Config.Now) and by expiring, as Redis would 60 hours later, every
// mark hash whose TTL is shorter than 60 hours.
func TestTheMarksOutliveTheCapOfACampaignScheduledAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Now()
	// The first campaign (planned by the fixture) is the scheduled one, cap 72h, starting in 60h.
	f := planWith(t, 4, func(s *campaign.Spec) { s.FrequencyCap = 72 * time.Hour; s.StartAt = start.Add(60 * time.Hour) })
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx,
		func() campaign.Spec {
			s := fixtureSpec("other")
			s.FrequencyCap = campaign.DefaultFrequencyCap
			return s
		}())
	if err != nil {
		t.Fatal(err)
	}
	f.h.cfg.Now = func() time.Time { return start }
	if err := f.h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.provider.total(); got != 3 {
		t.Fatalf("other campaign sent %d, want 3", got)
	}
	// 60 hours later.
	later := start.Add(60 * time.Hour)
	keys, err := f.rdb.Keys(ctx, "freq:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("marks %v (%v)", keys, err)
	}
	for _, k := range keys {
		ttl := f.rdb.PTTL(ctx, k).Val()
		t.Logf("%s TTL %v", k, ttl)
		if ttl > 0 && ttl < 60*time.Hour {
			f.rdb.Del(ctx, k)
		}
	}
	if _, err := f.db.Exec(ctx, `UPDATE campaigns SET start_at = now() - interval '1 minute' WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	f.h.cfg.Now = func() time.Time { return later }
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.provider.sentTo(phone(1)); len(got) > 1 {
		t.Fatalf("u1 got %d messages 60h apart although the scheduled campaign's cap is 72h: %q", len(got), got)
	}
}
