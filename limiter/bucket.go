// Package limiter keeps the send rate of every worker process, together, under the provider's and the
// campaign's caps. The buckets live in Redis (GCRA through go-redis/redis_rate: one key per limit, Redis's
// own clock, atomic in one script), so adding workers never adds rate. A Redis error is never read as
// "allowed": the caller gets the error and must not send (fail closed).
package limiter

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/state"
)

// Limit is one cap: at most Rate events per second over every process that uses the same Key.
type Limit struct {
	// Key names the bucket, e.g. "provider:twilio" or "campaign:42".
	Key string
	// Rate is in events per second; 0 (or less) means no cap.
	Rate float64
	// Pausable makes Wait honour a Pause of Key first. Only limits that can be paused (a provider's, after
	// it answered 429) need it: the check costs a round trip per token.
	Pausable bool
	// Observer, when set, is told how long each Wait or WaitN spent on this limit (its pause and its
	// tokens, Redis round trips included), in seconds; a limit without a cap that cannot be paused reports
	// nothing. A prometheus.Observer fits. It is instrumentation only: it changes no wait.
	Observer Observer
	// Hold, when set, is how the caller spends its waits on this limit: Hold(ctx, d) sleeps d (or returns
	// ctx's error, or its own, which ends the wait) and may work meanwhile, as a worker renews the lease
	// of the chunk it waits to send. While the caller waits for the process's other waiters of the same
	// bucket, Hold(ctx, 0) is called every HoldEvery. Without Hold, a wait is a plain sleep.
	Hold func(ctx context.Context, d time.Duration) error
	// Cost, when above 0, is how many tokens a WaitN takes from this limit instead of its n (a request of
	// n messages that is more tokens at its provider, as an SMS of several segments is).
	Cost int
}

// cost is how many tokens a WaitN of n takes from l.
func (l Limit) cost(n int) int {
	if l.Cost > 0 {
		return l.Cost
	}
	return n
}

// HoldEvery is how often a wait for the process's other waiters of a bucket calls Limit.Hold.
const HoldEvery = time.Second

// Observer receives one value per observation (a prometheus.Observer satisfies it).
type Observer interface{ Observe(float64) }

// Bucket takes tokens from Redis-held GCRA buckets.
type Bucket struct {
	rdb redis.UniversalClient
	rl  *redis_rate.Limiter
	// turns holds, per limit key with a waiter right now, a one-slot channel: the goroutines of this
	// process that wait for the same bucket take turns, so that one of them asks Redis at a time instead of
	// all of them polling it (dozens of senders behind one cap would otherwise spend more on refused asks
	// than on sends). An entry goes when its last waiter does: keys of finished campaigns do not pile up
	// over a worker's life.
	mu    sync.Mutex
	turns map[string]*turn
	// paces are the shared paces this process takes part in, by bucket (see Pace).
	paces  map[string]*Pace
	onPace func(PaceReport)
	// now and sleep are replaceable in tests.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// New returns a Bucket on rdb.
func New(rdb redis.UniversalClient) *Bucket {
	return &Bucket{rdb: rdb, rl: redis_rate.NewLimiter(rdb), now: time.Now, sleep: Sleep, turns: map[string]*turn{}}
}

// turn is one key's slot, with the number of goroutines holding or waiting for it.
type turn struct {
	slot    chan struct{}
	waiters int
}

// join returns key's turn, counting the caller among its waiters; leave undoes it.
func (b *Bucket) join(key string) *turn {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.turns[key]
	if t == nil {
		t = &turn{slot: make(chan struct{}, 1)}
		b.turns[key] = t
	}
	t.waiters++
	return t
}

func (b *Bucket) leave(key string, t *turn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.waiters--; t.waiters == 0 {
		delete(b.turns, key)
	}
}

// keys is how many limit keys have waiters now (for tests).
func (b *Bucket) keys() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.turns)
}

// gcra turns a rate in events per second into a redis_rate limit. Rates need not be whole numbers
// (0.5/s is one event every two seconds), so the period is stretched to keep Rate an integer. The burst is
// a fortieth of a second's worth, rounded up (2 from 41/s on): with burst 1, every token a sleeping worker
// wakes up late for is lost and the cap is under-used by 20 % or more. A bucket of burst B emitting r a second hands out
// at most B + r - 1 tokens in any second (B at once, then one every 1/r), so it emits rate - (B - 1): no
// second, whole or sliding, holds more than the cap (a provider counting over its own second sees no more
// than it allows); its steady rate is the cap less a fortieth of it at most (the cap itself up to 40/s).
// Burst is how many tokens a limit of rate may hand out at once: a fortieth of a second's worth, rounded
// up (see gcra).
func Burst(rate float64) int { return max(1, int(math.Ceil(rate/40-1e-9))) }

// Whatever rate is given, the limit is never faster: below one event a second it is one event a period of
// 1/rate rounded up to the millisecond (at most maxPeriod); above, rate×1000 events per 1000 s rounded down.
func gcra(rate float64) redis_rate.Limit {
	if rate < 1 {
		ms := math.Ceil(1000 / rate)
		period := maxPeriod
		if ms < float64(maxPeriod/time.Millisecond) {
			period = time.Duration(ms) * time.Millisecond
		}
		return redis_rate.Limit{Rate: 1, Burst: 1, Period: period}
	}
	const scale = 1000
	burst := Burst(rate)
	// The slack only absorbs a float's last digit (2.3 × 1000).
	n := int(math.Floor((rate-float64(burst-1))*scale + 1e-6))
	return redis_rate.Limit{Rate: n, Burst: burst, Period: scale * time.Second}
}

// maxPeriod is the longest period between two events a limit keeps: a rate lower than one event in it is
// kept as one event in it (never faster than asked).
const maxPeriod = 100 * 365 * 24 * time.Hour

// Wait blocks until it has taken one token from each limit, or ctx is done, or Redis fails. A Pausable
// limit paused with Pause is waited out first. The tokens of several capped limits are taken together, at
// one moment (takeAll): a token taken from one limit and held while another is empty would be spent later
// than its bucket let it out, on top of the tokens the bucket let out meanwhile.
func (b *Bucket) Wait(ctx context.Context, limits ...Limit) error {
	return b.WaitN(ctx, 1, limits...)
}

// WaitN is Wait for n events at once (one request that carries n messages). A request no larger than
// the bucket's burst takes its tokens when the bucket has them. A larger one reserves them all at once,
// the bucket running ahead of now by the time they are worth, and waits until the bucket would have let
// them out: requests of several processes then go out one after the other, each a request's worth of
// time after the one before, instead of all together once each has collected its tokens piece by piece
// (which kept the mean rate but put several requests' worth into one second).
//
// The tokens of every capped limit are taken in one step (takeAll), with the pauses of the Pausable
// limits read in the same step: reserved in all of them for the moment all of them let the request out,
// after the pauses, once the request's bottleneck (its slowest bucket) would let it out. One capped limit with
// no pause to read and a request within its burst goes through redis_rate's GCRA.
func (b *Bucket) WaitN(ctx context.Context, n int, limits ...Limit) error {
	var capped []Limit
	var pauses []string
	large := false // a limit's tokens exceed its burst: the request is reserved
	for _, l := range limits {
		if l.Rate > 0 {
			capped = append(capped, l)
			large = large || l.cost(n) > gcra(l.Rate).Burst
		}
		if l.Pausable {
			pauses = append(pauses, pauseKey(l.Key))
		}
	}
	start := time.Now()
	var err error
	switch {
	case len(capped) == 0:
		for _, l := range limits {
			if l.Pausable {
				if err = b.waitPause(ctx, l); err != nil {
					break
				}
			}
		}
	case len(capped) == 1 && len(pauses) == 0 && !large:
		err = b.allow(ctx, capped[0], capped[0].cost(n))
	default:
		err = b.takeAll(ctx, capped, pauses, n)
	}
	if err != nil {
		return err
	}
	for _, l := range limits {
		if l.Observer != nil && (l.Pausable || l.Rate > 0) { // a limit with neither waits for nothing
			l.Observer.Observe(time.Since(start).Seconds())
		}
	}
	return nil
}

// allow takes n tokens, within its burst, from l's bucket (redis_rate's GCRA), waiting as the bucket
// says, in turn with the process's other waiters for the same bucket.
func (b *Bucket) allow(ctx context.Context, l Limit, n int) error {
	t := b.join(l.Key)
	defer b.leave(l.Key, t)
	if err := b.turn(ctx, l, t); err != nil {
		return err
	}
	defer func() { <-t.slot }()
	for {
		res, err := b.rl.AllowN(ctx, l.Key, gcra(l.Rate), n)
		if err != nil {
			return fmt.Errorf("rate limit %s: %w", l.Key, err)
		}
		if res.Allowed > 0 {
			return nil
		}
		if err := b.wait(ctx, l, res.RetryAfter); err != nil {
			return err
		}
	}
}

// takeAll takes its tokens (Limit.Cost, or n) from each of ls's buckets at one moment. It first waits,
// in turn with the process's other waiters of it, until the bottleneck (the bucket whose share of the
// request is worth the longest time: a campaign's low --rate beside its provider's cap) would let the
// request out, holding nothing else and taking nothing. It then reserves the tokens in every bucket for
// the one moment all of them, and the pauses, let the request out (reserveAllScript), and waits for that
// moment holding no turn. Nothing is reserved in a shared bucket before the request's own bottleneck lets
// it go: before, a run behind a campaign at --rate 1 either held the provider's turn through its wait, or
// reserved the provider's bucket for the campaign's moment, and every other campaign of the process went
// at the slow one's pace. A request reserved behind others' reservations waits its turn in the bucket,
// first come first served, rather than asking for tokens that the reservations always take first. No
// bucket's tokens are spent before that bucket let them out, and a pause set during the wait (a 429 to
// another worker) holds the request back until it ends. A reservation's wait cut short (ctx, Hold)
// leaves the tokens spent: the rate can only be lower for it, never higher.
func (b *Bucket) takeAll(ctx context.Context, ls []Limit, pauses []string, n int) error {
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, c Limit) int { return strings.Compare(a.Key, c.Key) })
	keys := make([]string, 0, len(ls)+len(pauses))
	args := make([]any, 0, 3*len(ls))
	ts := make([]*turn, len(ls))
	var holder Limit // whose Hold spends the waits: the first limit that has one
	neck, worth := 0, 0.0
	for i, l := range ls {
		ts[i] = b.join(l.Key)
		defer b.leave(l.Key, ts[i])
		lim := gcra(l.Rate)
		interval := lim.Period.Seconds() / float64(lim.Rate)
		keys = append(keys, state.RateKey(l.Key))
		args = append(args, l.cost(n), interval, lim.Burst)
		if holder.Hold == nil {
			holder = l
		}
		if w := float64(l.cost(n)) * interval; w > worth {
			neck, worth = i, w
		}
	}
	keys = append(keys, pauses...)
	args = append(args, neck+1)
	seconds := func(s string) (time.Duration, error) {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, fmt.Errorf("rate limits %s: the script answered %q", strings.Join(keys, ", "), s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	for {
		if err := b.takeTurns(ctx, ls, ts); err != nil {
			return err
		}
		s, err := reserveAllScript.Run(ctx, b.rdb, keys, args...).Text()
		early, isEarly := strings.CutPrefix(s, "early ")
		isEarly = isEarly && err == nil
		for i := range ls {
			if !isEarly || i != neck {
				<-ts[i].slot
			}
		}
		if err != nil {
			return fmt.Errorf("rate limits %s: %w", strings.Join(keys, ", "), err)
		}
		if isEarly {
			// Nothing taken: the bottleneck lets the request out only later. Waited in its turn alone (the
			// others let go), so that its other waiters in this process ask Redis one after the other.
			d, err := seconds(early)
			if err == nil {
				err = b.wait(ctx, holder, d)
			}
			<-ts[neck].slot
			if err != nil {
				return err
			}
			continue
		}
		d, err := seconds(s)
		if err == nil && d > 0 {
			err = b.wait(ctx, holder, d)
		}
		if err != nil {
			return err
		}
		break
	}
	// The moment has come; a pause set while it waited (a 429 to another worker) holds it back until the
	// pause ends. Its tokens stay spent: the rate can only be lower.
	return b.waitPauses(ctx, holder, pauses)
}

// takeTurns takes the turns ts of ls's keys, in order; on an error, none stays taken.
func (b *Bucket) takeTurns(ctx context.Context, ls []Limit, ts []*turn) error {
	for i, l := range ls {
		if err := b.turn(ctx, l, ts[i]); err != nil {
			for j := range i {
				<-ts[j].slot
			}
			return err
		}
	}
	return nil
}

// waitPauses waits until none of the pause keys is set, as l says (Hold), reading them again after each
// wait: a pause may be set or lengthened meanwhile.
func (b *Bucket) waitPauses(ctx context.Context, l Limit, pauses []string) error {
	for len(pauses) > 0 {
		s, err := longestPauseScript.Run(ctx, b.rdb, pauses).Int64()
		if err != nil {
			return fmt.Errorf("pauses %s: %w", strings.Join(pauses, ", "), err)
		}
		if s <= 0 {
			return nil
		}
		if err := b.wait(ctx, l, time.Duration(s)*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// longestPauseScript returns the longest time to live, in milliseconds, of the pause keys (0: none set).
var longestPauseScript = redis.NewScript(`
local m = 0
for i = 1, #KEYS do
  local p = redis.call("PTTL", KEYS[i])
  if p > m then m = p end
end
return m`)

// turn waits for the slot of key's turn t, calling l.Hold every HoldEvery meanwhile.
func (b *Bucket) turn(ctx context.Context, l Limit, t *turn) error {
	if l.Hold == nil {
		select {
		case t.slot <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	tick := time.NewTicker(HoldEvery)
	defer tick.Stop()
	for {
		select {
		case t.slot <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if err := l.Hold(ctx, 0); err != nil {
				return err
			}
		}
	}
}

// wait spends d as l says (Hold), or sleeps it.
func (b *Bucket) wait(ctx context.Context, l Limit, d time.Duration) error {
	if l.Hold != nil {
		return l.Hold(ctx, d)
	}
	return b.sleep(ctx, d)
}

// reserveAllScript reserves a request's tokens in every GCRA bucket it is given (kept as go-redis/redis_rate
// keeps one: the theoretical arrival time in seconds since 2017-01-01 on Redis's clock) for one moment: the
// latest of the moments each bucket would let its tokens out (its arrival time, or now when it stands in
// the past, moved ahead by the tokens less the burst) and the ends of the pauses. Each bucket is moved as
// if the request left at that moment, and the script returns how long, in seconds, until it. Unless the
// bottleneck would not let the request out now (within its burst: no room for the tokens; larger: the
// bucket runs ahead of now): then it takes nothing and returns "early " and how long until it would.
//
// KEYS -> the buckets' keys, then the pause keys
// ARGV -> per bucket: the tokens to take, its emission interval in seconds and its burst; then the
//
//	bottleneck's number (from 1)
var reserveAllScript = redis.NewScript(`
local t = redis.call("TIME")
local now = (t[1] - 1483228800) + t[2] / 1000000
local buckets = (#ARGV - 1) / 3
local neck = tonumber(ARGV[#ARGV])
do
  local n, interval, burst = tonumber(ARGV[3 * neck - 2]), tonumber(ARGV[3 * neck - 1]), tonumber(ARGV[3 * neck])
  local tat = tonumber(redis.call("GET", KEYS[neck]) or "") or now
  local e = tat - now - math.max(0, burst - n) * interval
  if e > 0 then return "early " .. tostring(e) end
end
local at = now
for i = buckets + 1, #KEYS do
  local p = redis.call("PTTL", KEYS[i]) / 1000
  if now + p > at then at = now + p end
end
local tat = {}
for i = 1, buckets do
  local n, interval, burst = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  tat[i] = tonumber(redis.call("GET", KEYS[i]) or "") or now
  local out = math.max(tat[i], now) + (n - burst) * interval
  if out > at then at = out end
end
for i = 1, buckets do
  local n, interval, burst = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local after = math.max(tat[i], at - math.max(0, n - burst) * interval) + n * interval
  redis.call("SET", KEYS[i], after, "EX", math.max(1, math.ceil(after - now)))
end
return tostring(at - now)`)

// PauseKey is the Redis key whose existence pauses the limit key (see Pause); a claim script may read it
// to check the pause in the same round trip.
func PauseKey(key string) string { return pauseKey(key) }

func pauseKey(key string) string { return state.PauseKey(key) }

// Pause stops every process from taking tokens for key during d, for example after a provider answered
// 429: the back-off is shared, not felt only by the worker that saw it. A shorter pause never cuts a longer
// one that is already running.
func (b *Bucket) Pause(ctx context.Context, key string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	// SET ... GT would need Redis 7 for PEXPIRE GT; a tiny script keeps it one round trip on any version.
	err := pauseScript.Run(ctx, b.rdb, []string{pauseKey(key)}, d.Milliseconds()).Err()
	if err != nil && err != redis.Nil {
		return fmt.Errorf("pause %s: %w", key, err)
	}
	return nil
}

// pauseLua is the Lua function pause(key, ms[, now]) of the scripts that pause a limit: key
// (limiter:pause:<…>) lives ms more unless it already lives longer (a shorter pause never cuts a longer
// one), and holds when the pause began, unix ms (now, or Redis's clock), kept while a longer pause
// extends it (status's since). key..":run" (state.PauseRunKey) outlives it by state.PauseRunGrace and
// holds when the run of pauses began: a pause that begins within the grace of the last keeps that start,
// and status shows the provider paused between two pauses of a provider that refuses every request. It
// returns whether it paused.
var pauseLua = `
local function pause(key, ms, now)
  if redis.call("PTTL", key) >= tonumber(ms) then return false end
  local since = redis.call("GET", key)
  if not since then
    since = redis.call("GET", key .. ":run")
  end
  if not since then
    since = now
    if not since then
      local t = redis.call("TIME")
      since = tostring(t[1] * 1000 + math.floor(t[2] / 1000))
    end
  end
  redis.call("SET", key, since, "PX", ms)
  redis.call("SET", key .. ":run", since, "PX", tonumber(ms) + ` + pauseRunGraceMs + `)
  return true
end
`

// pauseRunGraceMs is state.PauseRunGrace in milliseconds, for pauseLua.
var pauseRunGraceMs = strconv.FormatInt(state.PauseRunGrace.Milliseconds(), 10)

// KEYS[1] -> limiter:pause:<key>
// ARGV[1] -> pause length in milliseconds
var pauseScript = redis.NewScript(pauseLua + `
pause(KEYS[1], ARGV[1])
return 1`)

// Strike counts one provider error for key (a 5xx) and, when threshold of them fall within one second
// over all processes, pauses key for d: a burst of server errors slows every worker, as a 429 does,
// while a lone error only delays its own retry. It reports whether the pause was set.
func (b *Bucket) Strike(ctx context.Context, key string, threshold int, d time.Duration) (bool, error) {
	n, err := strikeScript.Run(ctx, b.rdb, []string{state.StrikesKey(key), pauseKey(key)}, threshold, d.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("strike %s: %w", key, err)
	}
	return n == 1, nil
}

// KEYS[1] -> limiter:strikes:<key>, the errors of the current second
// KEYS[2] -> limiter:pause:<key>
// ARGV[1] -> how many errors within a second pause the key
// ARGV[2] -> pause length in milliseconds
var strikeScript = redis.NewScript(pauseLua + `
local n = redis.call("INCR", KEYS[1])
if n == 1 then redis.call("PEXPIRE", KEYS[1], 1000) end
if n >= tonumber(ARGV[1]) then
  pause(KEYS[2], ARGV[2])
  return 1
end
return 0`)

// Paused returns how much longer key is paused (0 when it is not).
func (b *Bucket) Paused(ctx context.Context, key string) (time.Duration, error) {
	ttl, err := b.rdb.PTTL(ctx, pauseKey(key)).Result()
	if err != nil {
		return 0, fmt.Errorf("pause %s: %w", key, err)
	}
	if ttl < 0 {
		return 0, nil
	}
	return ttl, nil
}

func (b *Bucket) waitPause(ctx context.Context, l Limit) error {
	for {
		d, err := b.Paused(ctx, l.Key)
		if err != nil {
			return err
		}
		if d <= 0 {
			return nil
		}
		if err := b.wait(ctx, l, d); err != nil {
			return err
		}
	}
}

// Sleep waits d, or less if ctx ends first (then it returns ctx.Err()).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		d = time.Millisecond
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
