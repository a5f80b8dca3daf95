package sandbox

import (
	"sync"
	"time"
)

// rateLimiter is a token bucket per key (a Twilio account SID, later a SendGrid API key) that refills at
// rate tokens a second and holds at most one second's worth, so a client that keeps under the rate never
// sees a 429 and one that bursts above it does, as with the real providers.
type rateLimiter struct {
	rate  float64 // tokens per second; 0 disables the limit
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(rate float64) *rateLimiter {
	return &rateLimiter{rate: rate, burst: max(1, rate), now: time.Now, buckets: make(map[string]*bucket)}
}

// allow takes a token from key's bucket and reports whether there was one.
func (l *rateLimiter) allow(key string) bool {
	if l.rate <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (l *rateLimiter) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.buckets)
}
