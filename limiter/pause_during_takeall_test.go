package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// A send that needs a token of its campaign's cap (1/s) and one of its provider's (Pausable), while the
// campaign's bucket is empty for the next second: the provider answers 429 to another worker meanwhile and
// is paused for 2 s. The send must not leave during that pause (the limits taken one after the other
// checked the pause after the campaign's wait).
func TestAPauseSetWhileWaitingForTheCampaignsTokenIsHonoured(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	b := New(rdb)
	campaignCap := Limit{Key: "campaign:pausewait", Rate: 1}
	providerCap := Limit{Key: "provider:pausewait", Rate: 100, Pausable: true}
	if err := b.Wait(ctx, campaignCap); err != nil { // the campaign's token of this second is spent
		t.Fatal(err)
	}
	done := make(chan time.Time, 1)
	go func() {
		if err := b.Wait(ctx, campaignCap, providerCap); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	if err := New(rdb).Pause(ctx, providerCap.Key, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	pausedUntil := time.Now().Add(2 * time.Second)
	at := <-done
	if at.Before(pausedUntil.Add(-50 * time.Millisecond)) {
		t.Fatalf("the tokens were granted %v before the provider's pause ended", pausedUntil.Sub(at).Round(time.Millisecond))
	}
}
