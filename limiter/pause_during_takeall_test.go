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
	pauseDuringWait(t, Limit{Key: "campaign:pausewait", Rate: 1}, Limit{Key: "provider:pausewait", Rate: 100, Pausable: true})
}

// The same with the provider's limit alone, capped low: a pause set while a send waits for the provider's
// own token holds it back too (the pause used to be read only before that wait).
func TestAPauseSetWhileWaitingForTheProvidersOwnTokenIsHonoured(t *testing.T) {
	t.Parallel()
	provider := Limit{Key: "provider:pausewait-alone", Rate: 1, Pausable: true}
	pauseDuringWait(t, provider, provider)
}

// pauseDuringWait spends first's token of this second, then waits for first and then (which may be
// first itself) while then's key is paused for 2 s 200 ms into the wait; the wait must outlast the pause.
func pauseDuringWait(t *testing.T, first, then Limit) {
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	b := New(rdb)
	if err := b.Wait(ctx, Limit{Key: first.Key, Rate: first.Rate}); err != nil { // the token of this second is spent
		t.Fatal(err)
	}
	limits := []Limit{first}
	if then.Key != first.Key {
		limits = append(limits, then)
	}
	done := make(chan time.Time, 1)
	go func() {
		if err := b.Wait(ctx, limits...); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	if err := New(rdb).Pause(ctx, then.Key, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	pausedUntil := time.Now().Add(2 * time.Second)
	at := <-done
	if at.Before(pausedUntil.Add(-50 * time.Millisecond)) {
		t.Fatalf("the tokens were granted %v before the pause of %s ended", pausedUntil.Sub(at).Round(time.Millisecond), then.Key)
	}
}
