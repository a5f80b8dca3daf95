package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// `launch --rate R` takes any positive R, and the worker puts it into the campaign's bucket as is. After
// the first token, the next waits at least 1/R, however small or odd R is. Before, the bucket turned R into
// a whole number of events per 1000 s with math.Round and at least 1: a cap below 0.001/s became 0.001/s,
// and 0.0025/s rounded up to 0.003/s.
func TestSmallRatesAreNotExceeded(t *testing.T) {
	t.Parallel()
	_, url := testredis.New(t)
	for _, rate := range []float64{0.0001, 0.0025, 1e-300, 1.0005, 2.0007} {
		b := New(newClient(t, url))
		key := "campaign:hunt-" + time.Now().Format("150405.000000")
		ctx := context.Background()
		first := time.Now()
		if err := b.Wait(ctx, Limit{Key: key, Rate: rate}); err != nil {
			t.Fatal(err)
		}
		var asked time.Duration
		stop := errors.New("stop")
		b.sleep = func(_ context.Context, d time.Duration) error { asked = d; return stop }
		if err := b.Wait(ctx, Limit{Key: key, Rate: rate}); !errors.Is(err, stop) {
			t.Fatalf("rate %v: the second token came without a wait (%v)", rate, err)
		}
		gap := min(1/rate, maxPeriod.Seconds()) // a rate below one event in maxPeriod is kept as one in it
		// The wait asked is the gap less the time since the first token (by Redis's clock): what passed
		// here since before the first call, and a little for the two clocks, is the slack (on a loaded
		// machine the two calls are tens of milliseconds apart).
		want := time.Duration(gap*float64(time.Second)) - time.Since(first) - time.Second/100
		if asked < want {
			t.Errorf("rate %v/s: the second message may go after %v, the cap allows it only after %v (%.4f/s)",
				rate, asked, time.Duration(gap*float64(time.Second)), float64(time.Second)/float64(asked))
		}
	}
}
