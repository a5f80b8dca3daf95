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

// A claim moves the address's mark to its own time, and a release of that claim (nothing went out) puts
// back the mark it replaced, whoever wrote it: the campaign's own earlier send (a resend of an unknown
// send, which may have reached the person) or another campaign's (which a campaign with a longer cap
// still judges). Both scripts alike.
func TestAReleasedClaimPutsBackTheMarkItReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, s := newClaims(t, time.Hour)
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour)
	c := &campaign.Campaign{ID: 46, Channel: campaign.ChannelSMS, CreatedAt: now, FrequencyCap: time.Hour}
	g := Guard{Epoch: "e1", Halt: HaltKey(c.ID)}
	if err := rdb.Set(ctx, EpochKey, "e1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(-d).UnixMilli(), 10) }
	for i, was := range []string{markOwner(c, Nonce(c)) + "|" + ms(90*time.Minute), "77:other|" + ms(3*time.Hour), ""} {
		for _, window := range []bool{false, true} {
			addr := "+9055500000" + strconv.Itoa(i) + strconv.FormatBool(window)[:1]
			key := FrequencyKey(c.Channel, addr, now)
			if was != "" {
				if err := rdb.HSet(ctx, key, addr, was).Err(); err != nil {
					t.Fatal(err)
				}
			}
			sc := SendClaim{Key: ClaimKey(c.ID, addr), Value: InFlightValue(now, "w"), Addr: addr}
			var err error
			if window {
				_, _, err = s.ClaimWindow(ctx, c, Nonce(c), []SendClaim{sc}, g, nil, "", now)
			} else {
				_, err = s.ClaimSend(ctx, c, Nonce(c), sc, g, nil, "", now)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := rdb.HGet(ctx, key, addr).Val(), markOwner(c, Nonce(c))+"|"+ms(0); got != want {
				t.Errorf("mark %q (was %q) after the claim (window %v): %q, want the claim's %q", addr, was, window, got, want)
			}
			if err := s.ReleaseMarks(ctx, c, Nonce(c), []string{addr}, now); err != nil {
				t.Fatal(err)
			}
			if got := rdb.HGet(ctx, key, addr).Val(); got != was {
				t.Errorf("mark %q after the release (window %v): %q, want %q back", addr, window, got, was)
			}
			if rdb.HExists(ctx, key, addr+"\x00").Val() {
				t.Errorf("the replaced mark of %q is still kept beside it after the release", addr)
			}
		}
	}
}

// A campaign with a frequency cap of 0 is capped by no mark: not even another campaign's mark written a
// moment after this claim's own time (another worker, a claim taken a little later), which "now minus the
// mark's time below 0" took for within the cap. Both scripts alike. A cap judges that mark as recent.
func TestACapOfZeroIsCappedByNoMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, s := newClaims(t, time.Hour)
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour)
	g := Guard{Epoch: "e1", Halt: "campaign:47:halt"}
	if err := rdb.Set(ctx, EpochKey, "e1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	later := "78:other|" + strconv.FormatInt(now.Add(300*time.Millisecond).UnixMilli(), 10)
	for i, capped := range []time.Duration{0, time.Hour} {
		c := &campaign.Campaign{ID: int64(47 + i), Channel: campaign.ChannelSMS, CreatedAt: now, FrequencyCap: capped}
		g.Halt = HaltKey(c.ID)
		for _, window := range []bool{false, true} {
			addr := "+9055510000" + strconv.Itoa(i) + strconv.FormatBool(window)[:1]
			if err := rdb.HSet(ctx, FrequencyKey(c.Channel, addr, now), addr, later).Err(); err != nil {
				t.Fatal(err)
			}
			sc := SendClaim{Key: ClaimKey(c.ID, addr), Value: InFlightValue(now, "w"), Addr: addr}
			var got Result
			if window {
				cls, _, err := s.ClaimWindow(ctx, c, Nonce(c), []SendClaim{sc}, g, nil, "", now)
				if err != nil || len(cls) != 1 {
					t.Fatalf("claim window: %v %v", cls, err)
				}
				got = cls[0].Result
			} else {
				cl, err := s.ClaimSend(ctx, c, Nonce(c), sc, g, nil, "", now)
				if err != nil {
					t.Fatal(err)
				}
				got = cl.Result
			}
			want := Ours
			if capped > 0 {
				want = Capped
			}
			if got != want {
				t.Errorf("cap %v, window %v: a mark 300 ms after the claim gave %c, want %c", capped, window, got, want)
			}
		}
	}
}

// The frequency cap is about commercial messages: a transactional campaign's claim is never capped by a
// promotion's mark and leaves no mark of its own, so that a promotion after it is not held back. Before,
// an order notice after a promotion was skipped as frequency_cap, and a promotion after an order notice
// too. Both scripts alike.
func TestATransactionalClaimIsNotCappedAndLeavesNoMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, s := newClaims(t, time.Hour)
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour)
	if err := rdb.Set(ctx, EpochKey, "e1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	promo := &campaign.Campaign{ID: 60, Channel: campaign.ChannelSMS, CreatedAt: now, FrequencyCap: 24 * time.Hour}
	notice := &campaign.Campaign{ID: 61, Channel: campaign.ChannelSMS, CreatedAt: now, FrequencyCap: 24 * time.Hour, Transactional: true}
	claim := func(c *campaign.Campaign, addr string, window bool) Result {
		t.Helper()
		g := Guard{Epoch: "e1", Halt: HaltKey(c.ID)}
		sc := SendClaim{Key: ClaimKey(c.ID, addr), Value: InFlightValue(now, "w"), Addr: addr}
		if window {
			cls, _, err := s.ClaimWindow(ctx, c, Nonce(c), []SendClaim{sc}, g, nil, "", now)
			if err != nil || len(cls) != 1 {
				t.Fatalf("claim window: %v %v", cls, err)
			}
			return cls[0].Result
		}
		cl, err := s.ClaimSend(ctx, c, Nonce(c), sc, g, nil, "", now)
		if err != nil {
			t.Fatal(err)
		}
		return cl.Result
	}
	for _, window := range []bool{false, true} {
		// A promotion, then the notice: the notice goes.
		addr := "+90555200000" + strconv.FormatBool(window)[:1]
		if got := claim(promo, addr, window); got != Ours {
			t.Fatalf("window %v: the promotion's claim gave %c", window, got)
		}
		if got := claim(notice, addr, window); got != Ours {
			t.Errorf("window %v: the notice after a promotion gave %c, want it sent", window, got)
		}
		if got, want := rdb.HGet(ctx, FrequencyKey(campaign.ChannelSMS, addr, now), addr).Val(), markOwner(promo, Nonce(promo))+"|"+strconv.FormatInt(now.UnixMilli(), 10); got != want {
			t.Errorf("window %v: the mark after the notice is %q, want the promotion's %q", window, got, want)
		}
		// The notice first, then a promotion: the promotion goes.
		addr = "+90555200001" + strconv.FormatBool(window)[:1]
		if got := claim(notice, addr, window); got != Ours {
			t.Fatalf("window %v: the notice's claim gave %c", window, got)
		}
		if rdb.HExists(ctx, FrequencyKey(campaign.ChannelSMS, addr, now), addr).Val() {
			t.Errorf("window %v: the notice left a frequency mark", window)
		}
		if got := claim(promo, addr, window); got != Ours {
			t.Errorf("window %v: the promotion after a notice gave %c, want it sent", window, got)
		}
	}
}
