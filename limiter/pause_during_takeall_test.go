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

// A request larger than its provider's burst (an SMS of 3 segments against a cap of 1/s, burst 1) is
// reserved 2 s ahead; 200 ms into that wait the provider answers 429 to another worker and is paused for
// 3 s. The request must not leave during that pause, as a request within the burst does not
// (TestAPauseSetWhileWaitingForTheProvidersOwnTokenIsHonoured).
func TestAPauseSetWhileAReservedRequestWaitsIsHonoured(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	provider := Limit{Key: "provider:reserve-pause", Rate: 1, Pausable: true, Cost: 3}
	done := make(chan time.Time, 1)
	go func() {
		if err := New(rdb).WaitN(ctx, 1, provider); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	if err := New(rdb).Pause(ctx, provider.Key, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	pausedUntil := time.Now().Add(3 * time.Second)
	at := <-done
	if at.Before(pausedUntil.Add(-50 * time.Millisecond)) {
		t.Fatalf("the reserved request was let out %v before the pause of %s ended", pausedUntil.Sub(at).Round(time.Millisecond), provider.Key)
	}
}

// A campaign launched with a huge --rate (1e8/s: validation takes any finite positive number; an
// operator's way to say "as fast as the provider lets") under a provider's cap of 10/s: the two limits are
// taken together (takeAll). The campaign's emission interval (1e-8 s) is below the resolution of Redis's
// clock as the script keeps it (seconds since 2017 in a double: about 6e-8 s), so the bucket's new arrival
// time equals now: its expiry is at least a second (a SET ... EX 0 is refused by Redis, and every wait
// would fail).
func TestAHugeCampaignRateUnderAProviderCapStillSends(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b := New(rdb)
	for i := range 3 {
		if err := b.Wait(ctx, Limit{Key: "campaign:huge", Rate: 1e8}, Limit{Key: "provider:huge", Rate: 10}); err != nil {
			t.Fatalf("wait %d: %v", i, err)
		}
	}
	// The same for a reserved request (an SMS of 3 segments against the provider's burst of 1, segments
	// counted) under the huge campaign rate.
	if err := b.WaitN(ctx, 1, Limit{Key: "campaign:huge2", Rate: 1e8}, Limit{Key: "provider:huge2", Rate: 10, Cost: 3}); err != nil {
		t.Fatalf("reserved wait: %v", err)
	}
}
