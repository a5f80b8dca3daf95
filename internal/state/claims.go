package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// Store reads and writes the send path's state in Redis. Claims are kept ttl (longer than any campaign).
type Store struct {
	rdb redis.UniversalClient
	ttl time.Duration
}

// New returns a Store on rdb whose claims live ttl.
func New(rdb redis.UniversalClient, ttl time.Duration) *Store { return &Store{rdb: rdb, ttl: ttl} }

// Client is the Redis client the store uses.
func (c *Store) Client() redis.UniversalClient { return c.rdb }

// Guard is what a claim must still hold true when it is taken: the Redis epoch its lease recorded, that
// its lease was not taken over, and, for a send, that the campaign is not halted.
type Guard struct {
	Epoch string
	// Fence is the FenceKey of the run's lease: once another run has fenced it to take the chunk over
	// (Store.Fence), no claim of this run is taken any more. Empty: no lease to fence.
	Fence     string
	Halt      string // the campaign's HaltKey
	CheckHalt bool
}

// fence is g's fence key, or one that is never written when g has none.
func (g Guard) fence() string {
	if g.Fence == "" {
		return FenceKey("")
	}
	return g.Fence
}

// Take sets the claim to val if it does not exist (or belongs to another campaign of the same ID). It
// returns ("", true) when the claim is now ours, or the existing value (without its nonce) and false.
// When Redis lost its data since the lease (ErrEpoch) or, with checkHalt, the campaign is halted
// (ErrHalted), nothing is written. An existing claim is reported whatever the guard says: it is a fact.
func (c *Store) Take(ctx context.Context, key, nonce, val string, g Guard) (string, bool, error) {
	check := "0"
	if g.CheckHalt {
		check = "1"
	}
	old, err := takeScript.Run(ctx, c.rdb, []string{key, EpochKey, g.Halt, g.fence()},
		nonce+"/"+val, c.ttl.Milliseconds(), nonce+"/", g.Epoch, check).Text()
	if errors.Is(err, redis.Nil) {
		return "", true, nil
	}
	if err != nil {
		if se := scriptError(err); se != err {
			return "", false, se
		}
		return "", false, fmt.Errorf("claim %s: %w", key, err)
	}
	return strings.TrimPrefix(old, nonce+"/"), false, nil
}

// takeScript is SET NX that also returns the value it found, in one atomic round trip, with the guards
// read before anything is written. A value that does not start
// with this campaign's nonce is a leftover of an earlier campaign with the same ID, and is replaced.
// A value equal to the one being written is ours already: a client that retried the script after a lost
// reply must not take its own claim for someone else's.
//
// KEYS[1] -> sent:<campaign>:<user>
// KEYS[2] -> campaignctl:epoch
// KEYS[3] -> campaign:<id>:halt
// KEYS[4] -> fence:<lease token> of the run's lease
// ARGV[1] -> the claim value, nonce included
// ARGV[2] -> TTL in milliseconds
// ARGV[3] -> the nonce prefix ("<nonce>/")
// ARGV[4] -> the epoch the run's lease recorded
// ARGV[5] -> "1" to refuse while the campaign is halted
// Every released version writes the nonce, so a value without this campaign's nonce is never this
// campaign's: reading it as ours would record a send that never happened.
var takeScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[3])) == ARGV[3] then
  if v == ARGV[1] then return false end
  return v
end
if redis.call("GET", KEYS[2]) ~= ARGV[4] then return redis.error_reply("CAMPAIGNCTL_EPOCH changed") end
if redis.call("EXISTS", KEYS[4]) == 1 then return redis.error_reply("CAMPAIGNCTL_FENCED") end
if ARGV[5] == "1" and redis.call("EXISTS", KEYS[3]) == 1 then return redis.error_reply("CAMPAIGNCTL_HALT") end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return false`)

// Settle records the provider's answer in a claim we hold, keeping its TTL.
//
// Compare-and-set: only over our own pending value, and if the key vanished meanwhile (expired, evicted,
// lost in a failover) it is written again with the full TTL, so the answer is never lost silently.
func (c *Store) Settle(ctx context.Context, key, nonce, inflight, val string) error {
	ok, err := settleScript.Run(ctx, c.rdb, []string{key}, nonce+"/"+val, nonce+"/"+inflight, c.ttl.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("settle claim %s: %w", key, err)
	}
	if ok == 0 {
		return fmt.Errorf("settle claim %s: the claim was taken over by another value", key)
	}
	return nil
}

// KEYS[1] -> sent:<campaign>:<user>
// ARGV[1] -> the answer to record, nonce included
// ARGV[2] -> the pending value this worker wrote, nonce included
// ARGV[3] -> TTL in milliseconds, for a claim that vanished
var settleScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v and v ~= ARGV[2] then return 0 end
if v then
  redis.call("SET", KEYS[1], ARGV[1], "KEEPTTL")
else
  redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[3])
end
return 1`)

// Release deletes a claim we hold whose send was definitely not accepted, so a retry may send.
// Only our own pending value is deleted (compare-and-delete), never an answer.
func (c *Store) Release(ctx context.Context, key, nonce, inflight string) error {
	if err := releaseScript.Run(ctx, c.rdb, []string{key}, nonce+"/"+inflight).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("release claim %s: %w", key, err)
	}
	return nil
}

// KEYS[1] -> sent:<campaign>:<user>
// ARGV[1] -> the pending value this worker wrote
var releaseScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0`)

// ForgetUnanswered deletes the claims of users of campaign c that hold no provider answer (unknown, or
// claimed and never answered), so that `resume --resend-unknown` can send them again. Claims that do hold
// an answer are kept: a recipient whose claim says sent is recorded as sent by the next run, not resent.
// A claim in flight taken less than grace ago (by Redis's clock) is kept too, and its user returned in
// kept: the call it was taken for may still be under way (its worker judged dead while it was only slow
// or cut off from Postgres), and its answer may still come; resent now, the recipient could get two
// messages.
func (s *Store) ForgetUnanswered(ctx context.Context, c *campaign.Campaign, users []string, grace time.Duration) (kept []string, err error) {
	rdb := s.rdb
	nonce := Nonce(c)
	const page = 500
	for start := 0; start < len(users); start += page {
		some := users[start:min(start+page, len(users))]
		pipe := rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(some))
		for i, u := range some {
			cmds[i] = forgetScript.Eval(ctx, pipe, []string{ClaimKey(c.ID, u)}, nonce+"/", grace.Milliseconds()) // Eval: a pipeline cannot fall back from EVALSHA
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return kept, fmt.Errorf("forget unanswered claims of campaign %d: %w", c.ID, err)
		}
		for i, cmd := range cmds {
			if n, _ := cmd.Int(); n == 2 {
				kept = append(kept, some[i])
			}
		}
	}
	return kept, nil
}

// KEYS[1] -> sent:<campaign>:<user>
// ARGV[1] -> "<nonce>/"
// ARGV[2] -> the grace in ms: a claim in flight younger than this is kept
// Returns 1 when the claim was deleted, 2 when it is in flight and kept, 0 otherwise.
var forgetScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if not v then return 0 end
local p = string.len(ARGV[1])
if string.sub(v, 1, p) ~= ARGV[1] then return redis.call("DEL", KEYS[1]) end
local kind = string.sub(v, p + 1, p + 1)
if kind == "c" then
  local at = tonumber(string.match(v, "^c|(%d+)", p + 1))
  if at then
    local t = redis.call("TIME")
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if now - at < tonumber(ARGV[2]) then return 2 end
  end
end
if kind == "u" or kind == "c" then return redis.call("DEL", KEYS[1]) end
return 0`)

// SettleMany records answers in claims we hold, in one script call (see Settle). It fails when a claim
// was taken over by another value (the others are written all the same).
func (c *Store) SettleMany(ctx context.Context, keys []string, nonce string, inflight, vals []string) error {
	if len(keys) == 0 {
		return nil
	}
	args := make([]any, 0, 1+2*len(keys))
	args = append(args, c.ttl.Milliseconds())
	// The claims of one request hold one pending value and get one answer: each argument is made once
	// and repeated, not made again for every recipient.
	var in, val any
	for i := range keys {
		if i == 0 || inflight[i] != inflight[i-1] {
			in = nonce + "/" + inflight[i]
		}
		if i == 0 || vals[i] != vals[i-1] {
			val = nonce + "/" + vals[i]
		}
		args = append(args, in, val)
	}
	lost, err := settleManyScript.Run(ctx, c.rdb, keys, args...).Int()
	if err != nil {
		return fmt.Errorf("settle claims: %w", err)
	}
	if lost > 0 {
		return fmt.Errorf("settle claims: %d of %d were taken over by another value", lost, len(keys))
	}
	return nil
}

// KEYS -> the claims
// ARGV[1] -> TTL in ms, for a claim that vanished
// then per claim: the pending value this worker wrote, and the answer (nonces included)
// Returns how many claims held another value (left alone).
var settleManyScript = redis.NewScript(`
local lost = 0
for i, k in ipairs(KEYS) do
  local inflight, val = ARGV[2 * i], ARGV[2 * i + 1]
  -- One write in the usual case (our pending value becomes the answer); what it replaced decides the rest.
  local v = redis.call("SET", k, val, "KEEPTTL", "GET")
  if not v then
    redis.call("PEXPIRE", k, ARGV[1])
  elseif v ~= inflight and v ~= val then
    redis.call("SET", k, v, "KEEPTTL")
    lost = lost + 1
  end
end
return lost`)

// ReleaseMany deletes claims we hold whose sends were definitely not accepted, in one round trip.
func (c *Store) ReleaseMany(ctx context.Context, keys []string, nonce string, inflight []string) error {
	if len(keys) == 0 {
		return nil
	}
	pipe := c.rdb.Pipeline()
	for i, k := range keys {
		releaseScript.Eval(ctx, pipe, []string{k}, nonce+"/"+inflight[i])
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("release claims: %w", err)
	}
	return nil
}

// StillGuarded says whether claims taken under g may still be sent under, a while after they were taken
// (a stall, a second wait for tokens): the epoch is the same, the run's lease is not fenced, and (with
// CheckHalt) the campaign is not halted. ErrEpoch, ErrFenced or ErrHalted when not: a pause or cancel
// whose halt Redis wrote after the claims must still stop their sends, as Pause promises once it returned.
func (c *Store) StillGuarded(ctx context.Context, g Guard) error {
	pipe := c.rdb.Pipeline()
	epoch := pipe.Get(ctx, EpochKey)
	fenced := pipe.Exists(ctx, g.fence())
	var halted *redis.IntCmd
	if g.CheckHalt {
		halted = pipe.Exists(ctx, g.Halt)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("claims' guard: %w", err)
	}
	switch {
	case epoch.Val() != g.Epoch:
		return ErrEpoch
	case fenced.Val() == 1:
		return ErrFenced
	case halted != nil && halted.Val() == 1:
		return ErrHalted
	}
	return nil
}

// SendClaim is one recipient's claim for a send, with its frequency mark.
type SendClaim struct {
	Key   string // ClaimKey
	Value string // the in-flight value (InFlightValue), without the nonce
	Addr  string
}

// Answer is a provider's answer still to be written into its claim (values without the nonce).
type Answer struct {
	Key      string
	InFlight string // the claim's in-flight value the answer replaces
	Value    string // the answer
}

// Result is what a claim for a send found.
type Result byte

const (
	// Ours: the claim is ours now, and the address's frequency mark taken.
	Ours Result = 'o'
	// Taken: the claim exists already (Claimed.Old holds its value, nonce removed).
	Taken Result = 'x'
	// Capped: the address has another campaign's mark within this campaign's cap (Claimed.Old holds the
	// mark); the claim now records the skip.
	Capped Result = 'c'
	// Paused: the provider is paused for Claimed.Pause; nothing was written.
	Paused Result = 'p'
)

// Claimed is what a claim for a send found.
type Claimed struct {
	Result Result
	Old    string
	Pause  time.Duration
}

// ClaimSend takes a send's claim and its frequency mark in one script call (claimSendScript), first writing
// prev (the answer to the run's previous send, when not yet written) and, with pauseKey set, checking the
// provider's pause. Returns ErrEpoch or ErrHalted when the guard refuses (prev is written all the same).
func (c *Store) ClaimSend(ctx context.Context, camp *campaign.Campaign, nonce string, sc SendClaim, g Guard, prev *Answer, pauseKey string, now time.Time) (Claimed, error) {
	keys, args := c.claimSendArgs(camp, nonce, sc, g, prev, pauseKey, now)
	res, err := claimSendScript.Run(ctx, c.rdb, keys, args...).Slice()
	if err != nil {
		return Claimed{}, fmt.Errorf("claim %s: %w", sc.Key, err)
	}
	return decodeClaimed(res, nonce)
}

// ClaimWindow claims the recipients of a window of sends about to go out together, in one script call:
// it first writes prev, the answers to the window before (whatever happens next), then, with pauseKey
// set, checks the provider's pause (pause > 0: nothing claimed), then claims all of scs, or (ErrEpoch,
// ErrHalted) none.
func (c *Store) ClaimWindow(ctx context.Context, camp *campaign.Campaign, nonce string, scs []SendClaim, g Guard, prev []Answer, pauseKey string, now time.Time) (cls []Claimed, pause time.Duration, err error) {
	if len(scs) == 0 && len(prev) == 0 {
		return nil, 0, nil
	}
	check, checkPause := "0", "0"
	if g.CheckHalt {
		check = "1"
	}
	if pauseKey != "" {
		checkPause = "1"
	} else {
		pauseKey = g.Halt // any key will do: it is not read
	}
	// The recipients of a window or a request are claimed with one value, and the answers of a window
	// replace one: each is sent once, not once a recipient (the script's arguments are strings it must
	// take in one by one). A call whose claims or answers differ sends them each.
	value, perClaim := sharedValue(len(scs), func(i int) string { return scs[i].Value })
	inflight, perAnswer := sharedValue(len(prev), func(i int) string { return prev[i].InFlight })
	days := campaignMarkDays(camp, now)
	marks := len(days)
	keys := make([]string, 0, 4+len(prev)+len(scs)*(1+marks))
	keys = append(keys, EpochKey, g.Halt, pauseKey, g.fence())
	args := make([]any, 0, 14+2*len(prev)+2*len(scs))
	args = append(args, nonce+"/", c.ttl.Milliseconds(), g.Epoch, check, markOwner(camp, nonce), now.UnixMilli(), marks, camp.FrequencyCap.Milliseconds(), markTTL(camp).Milliseconds(), nonce+"/"+ReasonValue(Skipped, campaign.ReasonFrequencyCap),
		checkPause, len(prev), prefixed(nonce, value, perClaim), prefixed(nonce, inflight, perAnswer))
	for _, a := range prev {
		keys = append(keys, a.Key)
		if perAnswer {
			args = append(args, nonce+"/"+a.InFlight)
		}
		args = append(args, nonce+"/"+a.Value)
	}
	for _, sc := range scs {
		keys = append(keys, sc.Key)
		keys = days.appendKeys(keys, sc.Addr)
		if perClaim {
			args = append(args, nonce+"/"+sc.Value)
		}
		args = append(args, sc.Addr)
	}
	res, err := claimManyScript.Run(ctx, c.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, 0, fmt.Errorf("claims: %w", err)
	}
	switch {
	case len(res) == 1 && res[0] == "e":
		return nil, 0, ErrEpoch
	case len(res) == 1 && res[0] == "h":
		return nil, 0, ErrHalted
	case len(res) == 1 && res[0] == "f":
		return nil, 0, ErrFenced
	case len(res) == 2 && res[0] == "p":
		ms, _ := strconv.ParseInt(res[1], 10, 64)
		return nil, time.Duration(ms) * time.Millisecond, nil
	}
	if len(res) != len(scs) {
		return nil, 0, fmt.Errorf("claims: the script answered %d results for %d recipients", len(res), len(scs))
	}
	out := make([]Claimed, len(scs))
	for i, r := range res {
		switch {
		case r == "o":
			out[i].Result = Ours
		case strings.HasPrefix(r, "x"):
			out[i] = Claimed{Result: Taken, Old: strings.TrimPrefix(r[1:], nonce+"/")}
		case strings.HasPrefix(r, "c"):
			out[i] = Claimed{Result: Capped, Old: r[1:]}
		default:
			return nil, 0, fmt.Errorf("claims: the script answered %q", r)
		}
	}
	return out, 0, nil
}

// sharedValue returns the value every one of n items has (v(i)), or ("", true) when they differ.
func sharedValue(n int, v func(int) string) (string, bool) {
	if n == 0 {
		return "", false
	}
	first := v(0)
	for i := 1; i < n; i++ {
		if v(i) != first {
			return "", true
		}
	}
	return first, false
}

// prefixed is value with the nonce, or "" when each item carries its own (each).
func prefixed(nonce, value string, each bool) string {
	if each {
		return ""
	}
	return nonce + "/" + value
}

// claimManyScript is claimSendScript for the recipients of one request, or of a window of sends, guarded
// once for all, after writing the answers to the window before.
//
// KEYS[1] -> campaignctl:epoch
// KEYS[2] -> campaign:<id>:halt
// KEYS[3] -> limiter:pause:provider:<name> (read only when ARGV[11] is "1")
// KEYS[4] -> fence:<lease token> of the run's lease
// then the ARGV[12] claims whose answers are written first
// then per recipient: its claim, followed by its ARGV[7] mark hashes (today's first)
// ARGV[1] -> "<nonce>/"
// ARGV[2] -> claim TTL in ms
// ARGV[3] -> the epoch the run's lease recorded
// ARGV[4] -> "1" to refuse while the campaign is halted
// ARGV[5] -> the mark owner "<campaign id>:<nonce>"
// ARGV[6] -> now, unix ms
// ARGV[7] -> how many mark hashes each recipient has
// ARGV[8] -> the campaign's cap in ms
// ARGV[9] -> the TTL of a day's mark hash in ms
// ARGV[10] -> the claim value of a capped recipient, nonce included
// ARGV[11] -> "1" to refuse (writing nothing but the answers) while the provider is paused
// ARGV[12] -> how many answers come first
// ARGV[13] -> the pending claim value of every recipient (nonce included), or "" when each has its own
// ARGV[14] -> the in-flight value every answer replaces (nonce included), or "" when each has its own
// then per answer: its in-flight value (only when ARGV[14] is "") and the answer (nonces included)
// then per recipient: its pending claim value (only when ARGV[13] is "") and its address
//
// Returns {"p", ms} (paused), {"e"}, {"f"} or {"h"} (nothing claimed; the answers are written all the
// same), or
// one result per recipient: "o" (ours), "x<value>" (an existing claim) or "c<mark>" (capped; the claim
// records the skip).
var claimManyScript = redis.NewScript(markFuncs + `
local na = tonumber(ARGV[12])
local ttl = ARGV[2]
local shared = ARGV[14]
local a = 15
for i = 1, na do
  local inflight = shared
  if shared == "" then inflight = ARGV[a]; a = a + 1 end
  local key, val = KEYS[4 + i], ARGV[a]
  a = a + 1
  -- One write in the usual case; what it replaced decides whether it stands (as in settleManyScript).
  local pv = redis.call("SET", key, val, "KEEPTTL", "GET")
  if not pv then
    redis.call("PEXPIRE", key, ttl)
  elseif pv ~= inflight and pv ~= val then
    redis.call("SET", key, pv, "KEEPTTL")
  end
end
if ARGV[11] == "1" then
  local pt = redis.call("PTTL", KEYS[3])
  if pt > 0 then return {"p", tostring(pt)} end
end
if redis.call("GET", KEYS[1]) ~= ARGV[3] then return {"e"} end
if redis.call("EXISTS", KEYS[4]) == 1 then return {"f"} end
if ARGV[4] == "1" and redis.call("EXISTS", KEYS[2]) == 1 then return {"h"} end
local m = tonumber(ARGV[7])
local first = 5 + na
local n = (#KEYS - first + 1) / (1 + m)
local prefix = ARGV[1]
local p = string.len(prefix)
local owner = ARGV[5]
local mark = owner .. "|" .. ARGV[6]
local now = tonumber(ARGV[6])
local cap = tonumber(ARGV[8])
local ttlMarks = tonumber(ARGV[9])
local same = ARGV[13]
local out = {}
for i = 0, n - 1 do
  local k = first + i * (1 + m)
  local val = same
  if same == "" then val = ARGV[a]; a = a + 1 end
  local addr = ARGV[a]
  a = a + 1
  -- SET NX GET: one call takes a free claim and returns a taken one's value (Redis 7).
  local v = redis.call("SET", KEYS[k], val, "NX", "GET", "PX", ttl)
  if v and v ~= val and string.sub(v, 1, p) == prefix then
    out[i + 1] = "x" .. v
  else
    if v and v ~= val then redis.call("SET", KEYS[k], val, "PX", ttl) end
    local capped = take_mark(k + 1, k + m, addr, owner, mark, now, cap, ttlMarks)
    if capped then
      redis.call("SET", KEYS[k], ARGV[10], "KEEPTTL")
      out[i + 1] = "c" .. capped
    else
      out[i + 1] = "o"
    end
  end
end
return out`)

func (c *Store) claimSendArgs(camp *campaign.Campaign, nonce string, sc SendClaim, g Guard, prev *Answer, pauseKey string, now time.Time) ([]string, []any) {
	check := "0"
	if g.CheckHalt {
		check = "1"
	}
	checkPause := "0"
	if pauseKey != "" {
		checkPause = "1"
	} else {
		pauseKey = g.Halt // any key will do: it is not read
	}
	prevKey, prevInFlight, prevVal := sc.Key, "", ""
	if prev != nil {
		prevKey, prevInFlight, prevVal = prev.Key, nonce+"/"+prev.InFlight, nonce+"/"+prev.Value
	}
	keys := append([]string{sc.Key, EpochKey, g.Halt, pauseKey, prevKey, g.fence()}, campaignMarkDays(camp, now).appendKeys(nil, sc.Addr)...)
	return keys, []any{nonce + "/" + sc.Value, c.ttl.Milliseconds(), nonce + "/", g.Epoch, check, checkPause, prevInFlight, prevVal,
		markOwner(camp, nonce), now.UnixMilli(), camp.FrequencyCap.Milliseconds(), markTTL(camp).Milliseconds(), sc.Addr,
		nonce + "/" + ReasonValue(Skipped, campaign.ReasonFrequencyCap)}
}

func decodeClaimed(res []any, nonce string) (Claimed, error) {
	if len(res) < 2 {
		return Claimed{}, fmt.Errorf("claim script answered %v", res)
	}
	kind, _ := res[1].(string)
	var arg string
	if len(res) > 2 {
		arg, _ = res[2].(string)
	}
	switch kind {
	case "o":
		return Claimed{Result: Ours}, nil
	case "x":
		return Claimed{Result: Taken, Old: strings.TrimPrefix(arg, nonce+"/")}, nil
	case "c":
		return Claimed{Result: Capped, Old: arg}, nil
	case "p":
		ms, _ := strconv.ParseInt(arg, 10, 64)
		return Claimed{Result: Paused, Pause: time.Duration(ms) * time.Millisecond}, nil
	case "e":
		return Claimed{}, ErrEpoch
	case "h":
		return Claimed{}, ErrHalted
	case "f":
		return Claimed{}, ErrFenced
	}
	return Claimed{}, fmt.Errorf("claim script answered %v", res)
}

// claimSendScript takes a send's claim and its frequency mark in one atomic step.
//
// KEYS[1] -> sent:<campaign>:<user>
// KEYS[2] -> campaignctl:epoch
// KEYS[3] -> campaign:<id>:halt
// KEYS[4] -> limiter:pause:provider:<name> (read only when ARGV[6] is "1")
// KEYS[5] -> the claim of the run's previous send, whose answer ARGV[8] is written first (when ARGV[7] is set)
// KEYS[6] -> fence:<lease token> of the run's lease
// KEYS[7..] -> the mark hashes of the address for the days the campaign's cap reaches, today's first
// ARGV[1] -> the pending claim value, nonce included
// ARGV[2] -> claim TTL in ms
// ARGV[3] -> "<nonce>/"
// ARGV[4] -> the epoch the run's lease recorded
// ARGV[5] -> "1" to refuse while the campaign is halted
// ARGV[6] -> "1" to refuse (writing nothing but the previous answer) while the provider is paused
// ARGV[7], ARGV[8] -> the previous send's pending value and answer, nonce included ("" when none)
// ARGV[9] -> the mark owner "<campaign id>:<nonce>"
// ARGV[10] -> now, unix ms
// ARGV[11] -> the campaign's cap in ms (0: never capped, but the mark is still left)
// ARGV[12] -> the TTL of a day's mark hash in ms
// ARGV[13] -> the address
// ARGV[14] -> the claim value of a capped recipient (skipped, frequency_cap), nonce included
//
// Returns {settled, kind[, arg]}: settled is 1 when the previous answer is in its claim; kind is "o" (ours),
// "x" (an existing claim, arg = its value), "c" (capped, arg = the other campaign's mark), "p" (paused for
// arg ms), "e" (the epoch changed), "f" (the run's lease was taken over) or "h" (halted). As in takeScript, a value without this campaign's nonce
// is a leftover of an earlier campaign with the same ID and is replaced, and a value equal to ours is ours.
var claimSendScript = redis.NewScript(markFuncs + `
local settled = 0
if ARGV[7] ~= "" then
  -- One write in the usual case; what it replaced decides whether it stands.
  local pv = redis.call("SET", KEYS[5], ARGV[8], "KEEPTTL", "GET")
  if not pv then
    redis.call("PEXPIRE", KEYS[5], ARGV[2])
    settled = 1
  elseif pv == ARGV[7] or pv == ARGV[8] then
    settled = 1
  else
    redis.call("SET", KEYS[5], pv, "KEEPTTL")
  end
end
if ARGV[6] == "1" then
  local p = redis.call("PTTL", KEYS[4])
  if p > 0 then return {settled, "p", tostring(p)} end
end
-- SET NX GET (Redis 7): a free claim is taken in the same call that finds a taken one. The guards are
-- read after it; a refused claim is taken back before the script ends, so nothing is seen written.
local v = redis.call("SET", KEYS[1], ARGV[1], "NX", "GET", "PX", ARGV[2])
local n = string.len(ARGV[3])
if v and string.sub(v, 1, n) == ARGV[3] then
  if v ~= ARGV[1] then return {settled, "x", v} end
else
  local refused
  if redis.call("GET", KEYS[2]) ~= ARGV[4] then
    refused = "e"
  elseif redis.call("EXISTS", KEYS[6]) == 1 then
    refused = "f"
  elseif ARGV[5] == "1" and redis.call("EXISTS", KEYS[3]) == 1 then
    refused = "h"
  end
  if refused then
    if not v then redis.call("DEL", KEYS[1]) end
    return {settled, refused}
  end
  if v then redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2]) end
end
local capped = take_mark(7, #KEYS, ARGV[13], ARGV[9], ARGV[9] .. "|" .. ARGV[10], tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]))
if capped then
  redis.call("SET", KEYS[1], ARGV[14], "KEEPTTL")
  return {settled, "c", capped}
end
return {settled, "o"}`)

// NoteInFlightGrace raises the fleet's in-flight grace (InFlightGraceKey) to d if it is lower: a worker
// notes its own when it starts.
func NoteInFlightGrace(ctx context.Context, rdb redis.UniversalClient, d time.Duration) error {
	if err := raiseScript.Run(ctx, rdb, []string{InFlightGraceKey}, d.Milliseconds()).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("note the in-flight grace: %w", err)
	}
	return nil
}

// InFlightGrace is the longest in-flight grace a worker noted (NoteInFlightGrace), or 0 when none did
// (or Redis lost it).
func InFlightGrace(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	ms, err := rdb.Get(ctx, InFlightGraceKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the in-flight grace: %w", err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// KEYS[1] -> the value to raise; ARGV[1] -> the new value, kept if higher
var raiseScript = redis.NewScript(`
local v = tonumber(redis.call("GET", KEYS[1]) or "0") or 0
if tonumber(ARGV[1]) > v then redis.call("SET", KEYS[1], ARGV[1]) end
return 0`)
