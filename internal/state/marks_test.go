package state

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// The marks are written back once for an epoch, where Redis has none (a mark it kept stays), under a lock
// that a worker dying mid-way holds for seconds, not minutes: the writer extends it as it goes.
func TestMarksBackWritesTheMarksOnceUnderAShortLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, s := newClaims(t, time.Hour)
	at := time.Now().Add(-time.Minute)
	created := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	c := &campaign.Campaign{ID: 7, CreatedAt: created}
	kept := FrequencyKey(campaign.ChannelSMS, "+905320000002", at)
	if err := rdb.HSet(ctx, kept, "+905320000002", "9:other|1").Err(); err != nil {
		t.Fatal(err)
	}
	calls := 0
	var lockTTL time.Duration
	src := func(ctx context.Context, yield func(campaign.RecentSend) error) (time.Duration, error) {
		calls++
		lockTTL = rdb.PTTL(ctx, marksLockKey).Val()
		for _, a := range []string{"+905320000001", "+905320000002"} {
			if err := yield(campaign.RecentSend{CampaignID: 7, CampaignCreated: created, Channel: campaign.ChannelSMS, Address: a, At: at}); err != nil {
				return 0, err
			}
		}
		return 2 * time.Hour, nil
	}
	none := func(context.Context, string) (int, error) { return 0, nil }
	for range 2 {
		if err := s.MarksBack(ctx, "e1", src, none); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("the marks were written %d times for one epoch", calls)
	}
	if lockTTL <= 0 || lockTTL > 30*time.Second {
		t.Fatalf("the lock lived %v while the marks were written, want at most 30 s", lockTTL)
	}
	got := rdb.HGet(ctx, FrequencyKey(campaign.ChannelSMS, "+905320000001", at), "+905320000001").Val()
	if exp := markOwner(c, Nonce(c)) + "|" + strconv.FormatInt(at.UnixMilli(), 10); got != exp {
		t.Fatalf("mark %q, want %q", got, exp)
	}
	if got := rdb.HGet(ctx, kept, "+905320000002").Val(); got != "9:other|1" {
		t.Fatalf("the mark Redis kept became %q", got)
	}
	if done := rdb.Get(ctx, MarksKey).Val(); done != "e1" {
		t.Fatalf("marks recorded for %q, want e1", done)
	}
	if rdb.Exists(ctx, marksLockKey).Val() != 0 {
		t.Fatal("the lock outlived the writing")
	}
}
