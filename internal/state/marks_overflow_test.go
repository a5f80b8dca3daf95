package state

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// A's message (24 h cap) goes out. Five campaigns without a cap (--frequency-cap 0, never capped by a
// mark) then claim the same address while each other's sends are still out; every one of them is refused
// (nothing reaches the person) and released. The kept list holds at most 4 marks: when the fifth claim
// came, the list dropped the oldest, A's, and once the five were released the address had no mark: D
// (24 h cap) claimed the address an hour after A's message went, and sent. The oldest mark now stays.
func TestFiveOverlappingReleasedClaimsKeepTheMarkOfTheSendThatWent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, s := newClaims(t, time.Hour)
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour)
	mk := func(id int64, cap time.Duration) *campaign.Campaign {
		return &campaign.Campaign{ID: id, Channel: campaign.ChannelSMS, CreatedAt: now.Add(-time.Duration(id) * time.Hour), FrequencyCap: cap}
	}
	const addr = "+905550001999"
	claim := func(camp *campaign.Campaign, at time.Time) Claimed {
		t.Helper()
		sc := SendClaim{Key: ClaimKey(camp.ID, "u1"), Value: InFlightValue(at, "w"), Addr: addr}
		cl, err := s.ClaimSend(ctx, camp, Nonce(camp), sc, Guard{Epoch: "e1", Halt: HaltKey(camp.ID)}, nil, "", at)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	a := mk(1, 24*time.Hour)
	if cl := claim(a, now.Add(-time.Hour)); cl.Result != Ours { // A's message goes out
		t.Fatalf("A: %+v", cl)
	}
	var zs []*campaign.Campaign
	var ats []time.Time
	for i := range 5 {
		z, at := mk(int64(10+i), 0), now.Add(-time.Duration(10-i)*time.Minute)
		if cl := claim(z, at); cl.Result != Ours {
			t.Fatalf("Z%d: %+v", i, cl)
		}
		zs, ats = append(zs, z), append(ats, at)
	}
	for i := range zs { // every uncapped send is refused: released, the earliest first
		if err := s.ReleaseMarks(ctx, zs[i], Nonce(zs[i]), []string{addr}, ats[i]); err != nil {
			t.Fatal(err)
		}
	}
	d := mk(4, 24*time.Hour)
	if cl := claim(d, now); cl.Result != Capped {
		t.Fatalf("D (24h cap) claimed %s an hour after A's message went: %+v, want capped by A's mark", addr, cl)
	}
}
