package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// paceRun drives a shared pace with a fake clock: every second, a sender offers offered requests (or as
// many as the pace lets through, when it is lower), in five flushes; answer says what the provider makes of
// the i-th request of the second. It returns per second the requests sent and the ones taken.
func paceRun(t *testing.T, p *Pace, clock *time.Time, seconds int, offered float64, answer func(i int) (Answer, time.Duration)) (sent, taken []int) {
	t.Helper()
	ctx := context.Background()
	for range seconds {
		n := offered
		if r := p.Rate(ctx); r > 0 && r < n {
			n = r
		}
		if p.Down(ctx) {
			n = 1 // the probe
		}
		per := int(n) / 5
		s, k := 0, 0
		for step := range 5 {
			for i := range per {
				a, hint := answer(step*per + i)
				if a == Taken {
					k++
				}
				s++
				if err := p.Observe(ctx, a, hint); err != nil {
					t.Fatal(err)
				}
			}
			if per == 0 && step == 0 {
				a, hint := answer(0)
				if a == Taken {
					k++
				}
				s++
				p.Observe(ctx, a, hint) //nolint:errcheck
			}
			*clock = clock.Add(200 * time.Millisecond)
		}
		sent, taken = append(sent, s), append(taken, k)
	}
	return sent, taken
}

func fakeClockBucket(t *testing.T) (*Bucket, *time.Time) {
	rdb, _ := testredis.New(t)
	b := New(rdb)
	clock := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return clock }
	return b, &clock
}

// A provider that takes at most 800 a second and answers 429 (no hint) past it, with nothing configured:
// the pace settles near 800, and the rejected requests stay a small share.
func TestPaceSettlesNearAHiddenLimit(t *testing.T) {
	t.Parallel()
	b, clock := fakeClockBucket(t)
	p := b.Pace("provider:hidden", 0)
	const limit = 800
	sent, taken := paceRun(t, p, clock, 40, 10000, func(i int) (Answer, time.Duration) {
		if i < limit {
			return Taken, 0
		}
		return Throttled, 0
	})
	t.Logf("sent per second %v", sent)
	var s, k int
	for i := 20; i < 40; i++ {
		s, k = s+sent[i], k+taken[i]
	}
	if rate := float64(k) / 20; rate < 0.85*limit {
		t.Errorf("steady rate %.0f/s, want at least %.0f (0.85 of the limit); sent per second %v", rate, 0.85*limit, sent[20:])
	}
	if rejected := float64(s-k) / float64(s); rejected > 0.05 {
		t.Errorf("%.1f%% of the requests rejected in the steady state, want at most 5%%; sent %v taken %v", 100*rejected, sent[20:], taken[20:])
	}
}

// Sporadic errors (5 % 503, 2 % 429 with Retry-After) at a cap of 1500: the pace stays at the cap.
func TestPaceStaysAtTheCapWhenErrorsAreSporadic(t *testing.T) {
	t.Parallel()
	b, clock := fakeClockBucket(t)
	p := b.Pace("provider:flaky", 1500)
	paceRun(t, p, clock, 20, 1500, func(i int) (Answer, time.Duration) {
		switch {
		case i%100 < 5:
			return Failed, 0
		case i%100 < 7:
			return ThrottledFor, time.Second
		}
		return Taken, 0
	})
	if r := p.Rate(context.Background()); r != 1500 {
		t.Fatalf("rate %v after 20 s of sporadic errors, want the cap 1500", r)
	}
	if ttl := b.rdb.PTTL(context.Background(), state.PauseKey("provider:flaky")).Val(); ttl > 0 {
		t.Fatalf("the provider was paused (%v) by a minority of 429s", ttl)
	}
}

// A provider failing every request is down: the pace lets one probe a second through, and the first probe
// that is taken ends it.
func TestPaceStopsForAProviderThatIsDownAndProbes(t *testing.T) {
	t.Parallel()
	b, clock := fakeClockBucket(t)
	p := b.Pace("provider:down", 0)
	up := false
	answer := func(int) (Answer, time.Duration) {
		if up {
			return Taken, 0
		}
		return Failed, 0
	}
	paceRun(t, p, clock, 3, 500, answer)
	ctx := context.Background()
	if !p.Down(ctx) {
		t.Fatal("not down after 3 s of every request failing")
	}
	if ok, err := p.Probe(ctx); err != nil || !ok {
		t.Fatalf("first probe: %v %v", ok, err)
	}
	if ok, _ := p.Probe(ctx); ok {
		t.Fatal("a second probe in the same second")
	}
	sent, _ := paceRun(t, p, clock, 2, 500, answer)
	if sent[0] != 1 || sent[1] != 1 {
		t.Fatalf("sent %v while down, want one probe a second", sent)
	}
	up = true
	paceRun(t, p, clock, 3, 500, answer)
	if p.Down(ctx) {
		t.Fatal("still down after probes were taken")
	}
}

// When most 429s of a second carry Retry-After, every worker pauses for it.
func TestPacePausesWhenMost429sSayHowLong(t *testing.T) {
	t.Parallel()
	b, clock := fakeClockBucket(t)
	p := b.Pace("provider:busy", 0)
	paceRun(t, p, clock, 2, 100, func(i int) (Answer, time.Duration) {
		if i%10 < 8 {
			return ThrottledFor, 2 * time.Second
		}
		return Taken, 0
	})
	if ttl := b.rdb.PTTL(context.Background(), state.PauseKey("provider:busy")).Val(); ttl < time.Second {
		t.Fatalf("pause %v after a second of mostly 429 with Retry-After: 2, want about 2 s", ttl)
	}
}
