package state

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// Two claims over the same address overlap (two campaigns without a cap, --frequency-cap 0, which never
// cap each other): B's claim keeps A's sent mark beside its own, C's claim then keeps B's. Neither B nor C
// sends (failed, refused), and their releases come in either order. With one mark kept per address, C's
// claim overwrote A's, C's release put B's mark back and B's release removed it with nothing left to put
// back: A's mark, of a message that went, was gone, and D, whose 24 h cap A's send holds back, sent an
// hour after A. The marks kept are a list now (keptMarks): both orders leave A's mark.
func TestOverlappingReleasesKeepTheMarkOfTheSendThatWent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, s := newClaims(t, time.Hour)
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour)
	mk := func(id int64, cap time.Duration) *campaign.Campaign {
		return &campaign.Campaign{ID: id, Channel: campaign.ChannelSMS, CreatedAt: now.Add(-time.Duration(id) * time.Hour), FrequencyCap: cap}
	}
	a, b, c, d := mk(1, 24*time.Hour), mk(2, 0), mk(3, 0), mk(4, 24*time.Hour)
	var addr string
	claim := func(camp *campaign.Campaign, at time.Time) Claimed {
		t.Helper()
		sc := SendClaim{Key: ClaimKey(camp.ID, "u-"+addr), Value: InFlightValue(at, "w"), Addr: addr}
		cl, err := s.ClaimSend(ctx, camp, Nonce(camp), sc, Guard{Epoch: "e1", Halt: HaltKey(camp.ID)}, nil, "", at)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	tA, tB, tC := now.Add(-time.Hour), now.Add(-2*time.Minute), now.Add(-time.Minute)
	for i, order := range []string{"C then B", "B then C"} {
		addr = "+90555000123" + strconv.Itoa(i)
		if cl := claim(a, tA); cl.Result != Ours { // A's message goes out
			t.Fatalf("A: %+v", cl)
		}
		if cl := claim(b, tB); cl.Result != Ours { // B claims; its send is still out
			t.Fatalf("B: %+v", cl)
		}
		if cl := claim(c, tC); cl.Result != Ours { // C claims meanwhile
			t.Fatalf("C: %+v", cl)
		}
		// Both providers refuse: nothing reached the person under either claim.
		first, second := [2]any{c, tC}, [2]any{b, tB}
		if order == "B then C" {
			first, second = second, first
		}
		for _, r := range [][2]any{first, second} {
			camp := r[0].(*campaign.Campaign)
			if err := s.ReleaseMarks(ctx, camp, Nonce(camp), []string{addr}, r[1].(time.Time)); err != nil {
				t.Fatal(err)
			}
		}
		key := FrequencyKey(campaign.ChannelSMS, addr, now)
		wantMark := markOwner(a, Nonce(a)) + "|" + strconv.FormatInt(tA.UnixMilli(), 10)
		if got := rdb.HGet(ctx, key, addr).Val(); got != wantMark {
			t.Errorf("%s: mark after both releases %q, want A's %q back", order, got, wantMark)
		}
		if rdb.HExists(ctx, key, addr+"\x00").Val() {
			t.Errorf("%s: marks still kept after every claim was released", order)
		}
		if cl := claim(d, now); cl.Result != Capped {
			t.Errorf("%s: D (24h cap) claimed %s an hour after A's message went: %+v, want capped by A's mark", order, addr, cl)
		}
	}
}
