package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/state"
)

// Answer is what a provider said to one request, as a provider's pace counts it.
type Answer int

const (
	// Taken: the provider accepted (or refused for the recipient: it answered, it was not overloaded).
	Taken Answer = iota
	// Throttled: 429 without a hint.
	Throttled
	// ThrottledFor: 429 with Retry-After.
	ThrottledFor
	// Failed: 5xx, or the connection failed before an answer.
	Failed
)

// Pace is a provider's pace shared by every worker (in Redis, state.PaceKey): under the configured cap,
// it lowers when the provider's rejections rise (429s and 5xx as a share of a second's requests, over all
// workers together, not each one as a stop) and climbs back when they fall, so it settles near the
// provider's real limit when that is below the cap, and stays at the cap when errors are sporadic. A
// provider failing (nearly) every request is down: nobody sends until a probe, one request a second over
// all workers, gets through. When most 429s of a second carry Retry-After, the provider is paused for
// every worker for that long.
//
// Each process adds its answers locally and sends them to Redis at most every PaceFlush, getting the
// pace back: one round trip a fifth of a second, whatever the number of sends.
type Pace struct {
	b      *Bucket
	bucket string
	cap    float64
	mu     sync.Mutex
	counts [4]int64
	// requests counts the answers as requests (ObserveN calls), whatever tokens each weighs: how far a
	// share of refusals is beyond chance depends on how many requests made it (see paceScript).
	requests int64
	hint     time.Duration
	flushed  time.Time
	rate     float64 // the pace (0: none below the cap)
	down     bool
	// streak counts the refused answers (requests, whatever tokens each weighs) since the last one taken: a
	// provider that has just met its limit refuses everything from then on, and that is shared at once
	// (refresh).
	streak int64
}

// PaceEvent is a move of a shared pace.
type PaceEvent string

const (
	// PaceLowered: the provider refused more than its share; the pace lowered.
	PaceLowered PaceEvent = "lowered"
	// PaceAtCap: the pace climbed back to the configured cap (or, with no cap, is dropped).
	PaceAtCap PaceEvent = "at_cap"
	// PaceDown: the provider fails (nearly) every request: only the probe goes.
	PaceDown PaceEvent = "down"
	// PaceUp: a request was taken again after the provider was down.
	PaceUp PaceEvent = "up"
	// PacePaused: most 429s of a window carried Retry-After: every worker waits it out.
	PacePaused PaceEvent = "paused"
	// PaceRemeasured: the answers of the window that lowered the pace, counted once every process had sent
	// them, showed the provider took more than the window had counted when it was judged: the pace is
	// raised to what they show.
	PaceRemeasured PaceEvent = "remeasured"
)

// PaceReport is what a process read of a shared pace at a flush: the rate sends are paced at and whether
// the provider is down, and, when this process's answers closed the window that moved the pace, the move
// (every move is reported once, to one process).
type PaceReport struct {
	Bucket string
	// Rate is the rate in force: the pace, or the cap when it is lower (0: neither).
	Rate float64
	Down bool
	// Event is empty unless the pace moved at this flush; Was is the rate in force before it, and
	// Requests and Rejected the window that was judged.
	Event              PaceEvent
	Was                float64
	Requests, Rejected int64
}

// OnPace has f called after every flush of a shared pace of b's (from the goroutine that flushed; f must
// not block).
func (b *Bucket) OnPace(f func(PaceReport)) {
	b.mu.Lock()
	b.onPace = f
	b.mu.Unlock()
}

// PaceFlush is how often a process sends its answers to the shared pace.
const PaceFlush = 200 * time.Millisecond

// Pace returns the shared pace of the limit named bucket, whose configured cap is cap (0: none).
func (b *Bucket) Pace(bucket string, cap float64) *Pace {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.paces == nil {
		b.paces = map[string]*Pace{}
	}
	p := b.paces[bucket]
	if p == nil {
		p = &Pace{b: b, bucket: bucket}
		b.paces[bucket] = p
	}
	p.mu.Lock()
	p.cap = cap
	p.mu.Unlock()
	return p
}

// Observe counts one answer (with its Retry-After, for ThrottledFor) and, when the last flush is older than
// PaceFlush, sends the counts to Redis and reads the pace back. A Redis error is returned: the caller is
// about to fail closed anyway.
func (p *Pace) Observe(ctx context.Context, a Answer, hint time.Duration) error {
	return p.ObserveN(ctx, a, hint, 1)
}

// ObserveN is Observe for an answer that weighs n tokens of the provider's limit: a request of n messages,
// or an SMS of n segments where the limit counts segments. The pace is in the limit's tokens, so what the
// provider took is counted in them too.
func (p *Pace) ObserveN(ctx context.Context, a Answer, hint time.Duration, n int64) error {
	p.mu.Lock()
	p.counts[a] += max(1, n)
	p.requests++
	p.hint = max(p.hint, hint)
	if a == Taken {
		p.streak = 0
	} else {
		p.streak++
	}
	p.mu.Unlock()
	return p.refresh(ctx, false)
}

// Flush sends the answers counted so far to the shared pace now (a run ending its chunk: its last answers
// must not wait for its next send).
func (p *Pace) Flush(ctx context.Context) error { return p.refresh(ctx, true) }

// Rate returns the rate to take tokens at: the pace or the cap, whichever is lower (0: neither).
func (p *Pace) Rate(ctx context.Context) float64 {
	p.refresh(ctx, false) //nolint:errcheck // a stale pace is the last one read; the claim fails closed
	p.mu.Lock()
	defer p.mu.Unlock()
	return inForce(p.rate, p.cap)
}

// Down reports whether the provider is down (nine requests in ten failing with 5xx or a dead connection,
// not throttled) as of the last flush.
func (p *Pace) Down(ctx context.Context) bool {
	p.refresh(ctx, false) //nolint:errcheck // as Rate
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// WasDown says whether the provider was down as this process last read the shared pace (no read now).
func (p *Pace) WasDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// Probe asks for the one request a second that may go to a provider that is down, over all workers.
func (p *Pace) Probe(ctx context.Context) (bool, error) { return p.ProbeEvery(ctx, time.Second) }

// ProbeEvery asks for the one request every that may go to a provider that is down, over all workers (it
// holds back Probe's for as long).
func (p *Pace) ProbeEvery(ctx context.Context, every time.Duration) (bool, error) {
	ok, err := p.b.rdb.SetNX(ctx, state.PaceProbeKey(p.bucket), "1", every).Result()
	if err != nil {
		return false, fmt.Errorf("pace probe %s: %w", p.bucket, err)
	}
	return ok, nil
}

func (p *Pace) refresh(ctx context.Context, force bool) error {
	p.mu.Lock()
	now := p.b.now()
	since := now.Sub(p.flushed)
	// Answers mostly refused go at once (at most every PaceFlush/16): every process must learn of a
	// provider's limit before it spends more requests on it. So does a run of refusals in a row, whatever
	// was taken before it: a provider that has just met its limit refuses all that follows, and the
	// answers taken since the last flush (up to PaceFlush of them) must not hold that back until the
	// refusals outnumber a third of them.
	refused := p.counts[Throttled] + p.counts[ThrottledFor] + p.counts[Failed]
	inARow := refused > 0 && p.streak >= paceUrgent
	urgent := (refused >= paceUrgent && refused*4 > refused+p.counts[Taken] || inARow) && since >= PaceFlush/16
	if !force && !urgent && since < PaceFlush {
		p.mu.Unlock()
		return nil
	}
	counts, requests, hint := p.counts, p.requests, p.hint
	p.counts, p.requests, p.hint, p.flushed = [4]int64{}, 0, 0, now
	cap := p.cap
	p.mu.Unlock()
	run := 0
	if inARow {
		run = 1
	}
	res, err := paceScript.Run(ctx, p.b.rdb, []string{state.PaceKey(p.bucket), state.PauseKey(p.bucket)},
		now.UnixMilli(), counts[Taken], counts[Throttled], counts[ThrottledFor], counts[Failed], hint.Milliseconds(), cap,
		paceJudgeAt, paceThrottled, paceFailing, paceEarly, paceDownAt, paceBinding, PaceFlush.Milliseconds(), run, paceHangSpan.Milliseconds(), requests).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		// The counts are given back for the next flush: an answer is never lost to a Redis hiccup.
		p.mu.Lock()
		for i := range counts {
			p.counts[i] += counts[i]
		}
		p.requests += requests
		p.hint = max(p.hint, hint)
		p.mu.Unlock()
		return fmt.Errorf("pace %s: %w", p.bucket, err)
	}
	if len(res) == 6 {
		rate, _ := res[0].(string)
		down, _ := res[1].(int64)
		ev, _ := res[2].(string)
		was, _ := res[3].(string)
		requests, _ := res[4].(int64)
		rejected, _ := res[5].(int64)
		var r, w float64
		fmt.Sscan(rate, &r) //nolint:errcheck // "0" when unparsable: no pace
		fmt.Sscan(was, &w)  //nolint:errcheck // as rate
		p.mu.Lock()
		p.rate, p.down = r, down == 1
		p.mu.Unlock()
		p.b.mu.Lock()
		f := p.b.onPace
		p.b.mu.Unlock()
		if f != nil {
			rep := PaceReport{Bucket: p.bucket, Rate: inForce(r, cap), Down: down == 1, Event: PaceEvent(ev)}
			if rep.Event != "" {
				rep.Was, rep.Requests, rep.Rejected = inForce(w, cap), requests, rejected
			}
			f(rep)
		}
	}
	return nil
}

// inForce is the rate sends are paced at: the pace or the cap, whichever is lower (0: neither).
func inForce(pace, cap float64) float64 {
	switch {
	case pace > 0 && cap > 0:
		return math.Min(pace, cap)
	case pace > 0:
		return pace
	}
	return cap
}

// The pace's rules. A window of answers (over all workers) is judged when it is a second old, or early,
// from an eighth of PaceFlush on, when it already shows the provider refusing a large share.
const (
	paceJudgeAt   = 20   // requests a window needs before its share of rejections is judged
	paceThrottled = 0.03 // more 429s than this share (beyond chance, see paceScript): the pace lowers
	paceFailing   = 0.20 // more 5xx than this share (beyond chance): the pace lowers
	paceEarly     = 0.25 // more rejections than this share: judged before the second is over
	paceDownAt    = 5    // requests a window needs, all failing, to call the provider down
	// paceHangSpan is how long a window of failures only, too few for paceDownAt, stays open: a provider
	// that hangs fails each request at its timeout, a few a second at most.
	paceHangSpan = 10 * time.Second
	paceBinding  = 0.8 // the pace climbs only while the sends reach this share of it
	paceUrgent   = 10  // refused answers of a process that are sent to the pace before PaceFlush is up
)

// paceScript adds a process's counts to the current window and, when the window is due (see the rules
// above), judges it and moves the pace:
//
//   - rejections above their share (by more than a standard deviation of a window of that size, so that
//     the few requests of a campaign's last moments do not lower it by chance): the pace lowers to 0.9 of the rate the provider took (the first time,
//     from no pace and no cap, that is its limit as measured, and every worker waits for the end of the
//     window's second, which the provider spent), never below 0.9 of half the pace in one step, and not again
//     for windows begun within a second of it (their answers are those of requests sent at the old pace,
//     and a provider counting over a sliding second still counts those);
//   - otherwise, while the sends reach the pace, it climbs by 5 % (and one) a second, 10, 20 then 40 % after
//     three, five and seven seconds in a row without a refusal (see climb), until the cap,
//     where it is dropped (no pace below the cap); a pace below paceJudgeAt climbs on the requests a
//     second holds, fewer than a judged window needs (it would never climb again otherwise);
//   - nine in ten requests failing (5xx, not 429: a 429 says the provider is up) is a provider down (a
//     decrease in the second before is undone: it was the outage beginning), judged as soon as
//     paceDownAt answers of the window show it (from an eighth of PaceFlush on); the first request it
//     takes again ends that, at once;
//   - most 429s of the window carrying Retry-After pause the provider for every worker;
//   - a lowering is measured again once every process has sent what it counted before it: refused answers
//     reach the window at once but taken ones every PaceFlush, so a window judged early (a burst refused
//     in its first tenth of a second) held all of the refusals and only the taken answers some processes
//     had sent by then. The taken answers that come in until PaceFlush and a half after sending resumed
//     (the end of the first measure's pause) count for the lowered window, less what the new pace could
//     have sent since; when they show the provider took more, the pace is raised to what the lowering
//     would have made of them (three workers were held at 56/s by a limit of 800, then climbed for 50 s);
//   - a window is judged early only when it holds a third of a second's worth of the pace in force, and
//     when more than a quarter of it was refused, or its rejections are beyond their share and the
//     answers that came last end with a run of paceUrgent refusals in a row;
//   - what the provider took is what it took over the window's second, or, when more, the share it took of
//     what was sent times the pace: a window judged early on a cluster of refusals, or one that began in a
//     wait, held less than a second's worth of sends (three workers against a limit of 100 saw their pace
//     halved on 22 refusals of 64 again and again);
//   - a window no answer came into for two seconds is left unjudged (a new one begins), and a pace left
//     from traffic over a minute ago is forgotten: the next campaign measures the provider afresh.
//
// KEYS[1] -> pace:<bucket> (hash: rate, start, last, ok, thr, thrh, fail, hint, down, downat, cool, prev, and the
// lowered window measured again: mfrom, mat, mgo, mok, mcur, mrej; up, the clean seconds in a row)
// KEYS[2] -> limiter:pause:<bucket> (holds when the pause began, unix ms)
// ARGV[1] -> now, unix ms
// ARGV[2..5] -> taken, throttled, throttled with a hint, failed
// ARGV[6] -> the longest hint, ms
// ARGV[7] -> the configured cap (0: none)
// ARGV[8..14] -> paceJudgeAt, paceThrottled, paceFailing, paceEarly, paceDownAt, paceBinding, PaceFlush ms
// ARGV[15] -> "1" when these answers end with a run of paceUrgent refusals in a row
// ARGV[16] -> paceHangSpan ms
// ARGV[17] -> how many requests these answers are (each weighs its tokens in ARGV[2..5]; absent: one a token)
//
// Returns {rate as a string ("0": no pace below the cap), 1 when down, the move ("" or a PaceEvent), the
// rate before it, the judged window's requests and rejections}.
var paceScript = redis.NewScript(pauseLua + `
-- More than share of n, by more than chance makes: a standard deviation of the count at that share (a
-- window of 200 requests with 8 429s is not a provider refusing more than 3 %; one with 16 is). Chance is
-- over requests, not tokens: a window of 4 e-mail requests of 1,000 recipients with one refused is one
-- refusal in 4, not 1,000 in 4,000. grain, the tokens a request of the window weighs on average, is set
-- below once the window is counted.
-- A few refused requests are no evidence of a limit in a window of few requests (a second of ten e-mail
-- requests with one 429 is a tenth, yet 2 % of requests refused at random do that in one second of five,
-- and two in one of sixty): at least two refused requests are, and three in a window of fewer than 20.
local grain = 1
local function beyond(x, n, share)
  x, n = x / grain, n / grain
  local least = 1.5
  if n < 19.5 then least = 2.5 end
  return x >= least and x > n * share + math.sqrt(n * share * (1 - share))
end
-- The rate a provider took in a window of span ms with ok taken and rejected refused, while the pace in
-- force was cur: what it took over the window's second (or its span, when longer), or, when more, the
-- share it took of what was sent times the pace. The second says too little when less than a second's
-- worth was sent in it: a window judged early on a cluster of refusals, or one that began in a wait.
local function took(ok, rejected, span, cur)
  local r = ok / math.max(1, span / 1000)
  if cur > 0 then r = math.max(r, cur * ok / math.max(1, ok + rejected)) end
  return r
end
-- The pace a lowering sets, from the pace in force cur (0: none, nor a cap) and the window it judged:
-- 0.9 of what the provider took, and at least 0.9 of half of cur.
local function lowerTo(ok, rejected, span, cur)
  local from = took(ok, rejected, span, cur)
  if cur > 0 then from = math.max(math.min(cur, from), cur / 2) end
  return math.max(1, from * 0.9)
end
local now = tonumber(ARGV[1])
local h = KEYS[1]
local st = redis.call("HMGET", h, "rate", "start", "last", "ok", "thr", "thrh", "fail", "hint", "down", "cool", "prev",
  "mfrom", "mat", "mgo", "mok", "mcur", "mrej", "up", "req")
local rate = tonumber(st[1]) or 0
local start = tonumber(st[2]) or now
local last = tonumber(st[3]) or now
-- A window no answer came into for two seconds (the sends stopped, or waited out a pause) is left
-- unjudged: judged now, its second would stretch over the silence and show a rate the provider never
-- set. A new one begins with these answers.
-- A window of failures only is kept through up to paceHangSpan of silence: a provider that hangs fails each
-- request only at its timeout, seconds apart.
local failingOnly = (tonumber(st[4]) or 0) == 0 and (tonumber(st[5]) or 0) + (tonumber(st[6]) or 0) == 0 and (tonumber(st[7]) or 0) > 0
local fresh = now - last > 2000 and not (failingOnly and now - last <= tonumber(ARGV[16]))
if fresh then start = now end
local function counted(i) if fresh then return 0 end return tonumber(st[i]) or 0 end
local ok = counted(4) + tonumber(ARGV[2])
local thr = counted(5) + tonumber(ARGV[3])
local thrh = counted(6) + tonumber(ARGV[4])
local fail = counted(7) + tonumber(ARGV[5])
local hint = math.max(counted(8), tonumber(ARGV[6]))
local addedReq = tonumber(ARGV[17] or "")
local req = counted(19)
local down = st[9] == "1"
local cool = tonumber(st[10]) or 0
local prev = tonumber(st[11]) or 0
local mfrom, mat, mgo = tonumber(st[12]) or 0, tonumber(st[13]) or 0, tonumber(st[14]) or 0
local mok, mcur, mrej = (tonumber(st[15]) or 0) + tonumber(ARGV[2]), tonumber(st[16]) or 0, tonumber(st[17]) or 0
local up = tonumber(st[18]) or 0
local cap = tonumber(ARGV[7])
local judgeAt, maxThr, maxFail, early, downAt, binding, flush =
  tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local was, ev = rate, ""
-- The climb is 5 % a second, and 10, 20, then 40 % after three, five and seven seconds in a row without
-- a single refusal: near the provider's limit a few refusals come before the steps grow; far under it
-- (after an outage, a burst of 429s, a limit raised again) the pace gets back within seconds instead of
-- half a minute.
local function climb(refused)
  local step = 0.05
  if up >= 7 then step = 0.4 elseif up >= 5 then step = 0.2 elseif up >= 3 then step = 0.1 end
  rate = rate * (1 + step) + 1
  if refused == 0 then up = up + 1 else up = 0 end
  if cap > 0 and rate >= cap then
    rate = 0
    ev = "at_cap"
  end
end
-- A pace left from traffic over a minute ago is forgotten: what the provider counted then is long gone,
-- and the next campaign measures it afresh instead of climbing from an old incident's low.
if rate > 0 and not down and now - last > 60000 then
  rate, prev, mat, up = 0, 0, 0, 0
end
-- The lowered window measured again, once every process has sent what it counted before the lowering.
if mat > 0 and now >= mgo + flush * 1.5 then
  if rate > 0 and not down then
    local fixed = lowerTo(math.max(0, mok - rate * (now - mgo) / 1000), mrej, mat - mfrom, mcur)
    -- Raised when that is worth a move (not by a fraction of a request a second).
    if fixed > rate * 1.01 + 1 then
      was = rate
      rate = fixed
      if cap > 0 and rate >= cap then rate = 0 end
      ev = "remeasured"
    end
  end
  mat = 0
end
local added = tonumber(ARGV[2]) + tonumber(ARGV[3]) + tonumber(ARGV[4]) + tonumber(ARGV[5])
if added > 0 then last = now end
-- A process that does not count requests (an earlier version) counts each token as one.
req = req + (addedReq or added)
local total = ok + thr + thrh + fail
if req > 0 and total > req then grain = total / req end
local elapsed = now - start
local rejected = thr + thrh + fail
local due = elapsed >= 1000
-- A window of failures only, too few to judge, is kept open (up to paceHangSpan) until it holds enough to
-- call the provider down, or an answer taken or throttled ends it: a provider that hangs gives a few
-- failures a second at most (each at its request's timeout), never downAt within one second, and was never
-- called down while every request to it failed.
if due and not down and ok == 0 and thr + thrh == 0 and fail > 0 and req < downAt and elapsed < tonumber(ARGV[16]) then due = false end
-- Judged early only on a window that holds enough of a second: with a pace in force, a third of a
-- second's worth of it (a window of a few dozen answers, most of them one process's refusals sent at
-- once while the others' accepted answers wait for their flush, would cut the pace deep for nothing:
-- 24 refused of 64 at a pace of 234 did, with a quarter).
local earlyAt = judgeAt
if rate > 0 then earlyAt = math.max(judgeAt, rate / 3) elseif cap > 0 then earlyAt = math.max(judgeAt, cap / 3) end
-- And on a few requests at least (downAt): a third of a second of e-mail is three requests of a hundred
-- recipients, and a window judged on them would be lowered, not called down, by an outage's first failures.
if not due and elapsed >= flush / 8 and total >= earlyAt and req >= downAt and rejected > total * early then due = true end
-- A process whose answers end with a run of refusals in a row (the provider has met its limit and
-- refuses all that follows) has the window judged at once when its rejections are already beyond their
-- share: waiting for them to be a quarter of it lets every process spend a few hundred more requests.
if not due and ARGV[15] == "1" and elapsed >= flush / 8 and total >= earlyAt and req >= downAt and
  (beyond(thr + thrh, total, maxThr) or beyond(fail, total, maxFail)) then due = true end
-- A provider failing (nearly) every request is judged down as soon as downAt answers show it, not at the
-- end of the window's second: a recipient's retries, with their back-offs, can all be spent in less than
-- a second, and an outage must cost nobody an attempt.
if not due and not down and elapsed >= flush / 8 and req >= downAt and fail * 10 >= total * 9 then due = true end
if down and ok > 0 then
  -- A request taken: the provider is back.
  down = false
  due = true
  ev = "up"
end
if due then
  if not down and req >= downAt and fail * 10 >= total * 9 then
    down = true
    ev = "down"
    up = 0
    redis.call("HSET", h, "downat", now)
    -- A decrease just before was the outage beginning, not the provider's limit: undone.
    if now < cool + 1000 then rate = prev end
  end
  -- The rate the provider took: over the window's second, or its answers' span when that was longer.
  local okRate = ok / math.max(1, (last - start) / 1000)
  if not down and total >= judgeAt then
    if beyond(thr + thrh, total, maxThr) or beyond(fail, total, maxFail) then
      if start >= cool then
        -- From the pace in force (the cap when there is no pace below it).
        local cur = rate
        if cur <= 0 then cur = cap end
        prev = rate
        rate = lowerTo(ok, rejected, last - start, cur)
        cool = now + 1000
        ev = "lowered"
        up = 0
        mfrom, mat, mgo, mok, mcur, mrej = start, now, now, ok, math.max(0, cur), rejected
        if cur <= 0 then
          -- The first measure of a provider with no cap: it took what it takes in a second, and goes on
          -- refusing until that second is over. Nobody sends until then.
          local rest = start + 1000 - now
          if rest > 0 then pause(KEYS[2], rest, ARGV[1]) end
          mgo = math.max(now, start + 1000)
        end
      end
    elseif rate > 0 and okRate >= rate * binding then
      climb(rejected)
    end
  elseif not down and total > 0 and rate > 0 and rate < judgeAt then
    -- A pace under judgeAt a second never fills a window that can be judged: it may not lower further
    -- on so few requests, but it climbs back while the sends reach it and the rejections are within
    -- their share, or it would stay there for good.
    if okRate >= rate * binding and not beyond(thr + thrh, total, maxThr) and not beyond(fail, total, maxFail) then
      climb(rejected)
    end
  end
  if total > 0 and thrh * 2 > total then
    if hint < 1 then hint = 1000 end
    if pause(KEYS[2], hint, ARGV[1]) and ev == "" then ev = "paused" end
  end
  redis.call("HSET", h, "rate", tostring(rate), "start", now, "last", now, "ok", 0, "thr", 0, "thrh", 0, "fail", 0,
    "hint", 0, "down", down and "1" or "0", "cool", cool, "prev", prev, "up", up, "req", 0)
else
  redis.call("HSET", h, "start", start, "last", last, "ok", ok, "thr", thr, "thrh", thrh, "fail", fail, "hint", hint, "req", req)
  if rate ~= tonumber(st[1] or 0) then redis.call("HSET", h, "rate", tostring(rate), "prev", prev) end
end
if mat > 0 then
  redis.call("HSET", h, "mfrom", mfrom, "mat", mat, "mgo", mgo, "mok", mok, "mcur", mcur, "mrej", mrej)
elseif tonumber(st[13]) then
  redis.call("HDEL", h, "mfrom", "mat", "mgo", "mok", "mcur", "mrej")
end
redis.call("PEXPIRE", h, 3600000)
if ev == "" then return {tostring(rate), down and 1 or 0, "", "0", 0, 0} end
return {tostring(rate), down and 1 or 0, ev, tostring(was), total, rejected}`)
