package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// The frequency cap, "at most one commercial message per person and channel within the cap", is kept at
// send time by the marks. Every send leaves a mark, whatever its own campaign's cap; each campaign then
// judges a mark by its own cap (a campaign with a 1 h cap is not held back by a send 5 hours ago, one with
// 24 h is). The mark is taken with the recipient's claim (claimSendScript), so a redelivered batch of the
// same campaign finds its own mark and goes on; the mark then moves to the claim's time (the latest
// message counts), the one it replaced kept beside it until the send is known to have gone (ReleaseMarks).

// markTTL keeps a day's marks long enough for the default cap, for the campaign's own and for the longest
// of the campaigns that may still send (a campaign scheduled days ahead judges them by its cap when it
// starts), counted from the end of the day.
func markTTL(c *campaign.Campaign) time.Duration {
	return max(campaign.DefaultFrequencyCap, c.FrequencyCap, c.MarksJudgedFor) + markDay
}

func markOwner(c *campaign.Campaign, nonce string) string {
	return strconv.FormatInt(c.ID, 10) + ":" + nonce
}

// ReleaseMarks takes back the marks campaign c's claims taken at now left on addrs, when nothing reached
// those people, in one round trip. Only a mark those claims wrote goes, and the mark it replaced comes
// back: an earlier send's of the campaign (a send whose answer was lost, resent by `resume
// --resend-unknown`: it may have reached the person), or another campaign's. Marks are looked for in the
// day of now and the day before (a send that straddled midnight).
func (s *Store) ReleaseMarks(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string, now time.Time) error {
	if len(addrs) == 0 {
		return nil
	}
	mark := markOwner(c, nonce) + "|" + strconv.FormatInt(now.UnixMilli(), 10) // as the claim scripts write it
	pipe := s.rdb.Pipeline()
	for _, a := range addrs {
		releaseMarkScript.Eval(ctx, pipe, markKeys(c.Channel, a, now, markDay), mark, a)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("frequency cap: %w", err)
	}
	return nil
}

// The marks a claim replaced are kept in the field "<address>\0" of the same day's hash, the latest
// first, separated by ";" (a mark holds none), at most keptMarks of them (when full, the oldest stays and
// the one above it goes: the mark before a burst of overlapping claims outlives the burst): a claim pushes
// the mark it replaces; a release of the current mark pops it back; a release of a mark a later claim replaced since
// (claims of two campaigns in flight together) takes it out of the list, so that the later claim's release
// puts back the mark before it. However the claims of an address overlap and whatever order their
// releases come in, the mark left is that of the latest claim whose message may have gone.
const keptMarks = 4

// markFuncs defines the Lua functions of the claim scripts that take marks:
//
// take_mark(first, last, addr, owner, mark, now, cap, ttl) reads the address's marks in the day hashes
// KEYS[first..last], today's first. It returns another campaign's mark within cap (then nothing is
// written), or nil after moving today's mark to mark, the mark it replaces kept (keep_mark). A campaign's
// own mark does not cap it (a batch run again, a resend of an unknown send), and moves as well: the latest
// message counts; another campaign's mark kept beside an own one (replaced by it, or written back beside
// it after a loss) still caps it within the cap. ttl is a day longer than any cap needs: renewing it only once an hour of that margin is
// used spares a write for nearly every mark, and a mark still outlives every cap that judges it.
//
// keep_mark(key, addr, m) pushes m on the address's kept marks (see keptMarks).
var markFuncs = `
local function keep_mark(key, addr, m)
  local f = addr .. "\0"
  local kept = redis.call("HGET", key, f)
  local list = {m}
  if kept then
    local all = {}
    for x in string.gmatch(kept, "[^;]+") do all[#all + 1] = x end
    -- Full: the oldest stays (the mark before the claims that overlap now, often a message that went);
    -- the one above it goes.
    local n = math.min(#all, ` + strconv.Itoa(keptMarks) + ` - 2)
    for i = 1, n do list[#list + 1] = all[i] end
    if #all > n then list[#list + 1] = all[#all] end
  end
  redis.call("HSET", key, f, table.concat(list, ";"))
end

local function take_mark(first, last, addr, owner, mark, now, cap, ttl)
  -- No mark hash (a transactional campaign): never capped, and no mark left.
  if last < first then return nil end
  local today
  for i = first, last do
    local m = redis.call("HGET", KEYS[i], addr)
    if i == first then today = m end
    if m then
      local o, ts = string.match(m, "^(.*)|(%d+)$")
      if cap > 0 and o ~= owner and ts and now - tonumber(ts) < cap then return m end
      if o == owner then
        -- Its own mark: another campaign's message it replaced (or one written back beside it after a
        -- loss) may still be within the cap.
        local kept = redis.call("HGET", KEYS[i], addr .. "\0")
        if kept then
          for x in string.gmatch(kept, "[^;]+") do
            local ko, kts = string.match(x, "^(.*)|(%d+)$")
            if cap > 0 and ko ~= owner and kts and now - tonumber(kts) < cap then return x end
          end
        end
      end
    end
  end
  if today ~= mark then
    if today then keep_mark(KEYS[first], addr, today) end
    redis.call("HSET", KEYS[first], addr, mark)
    if redis.call("PTTL", KEYS[first]) < ttl - 3600000 then redis.call("PEXPIRE", KEYS[first], ttl) end
  end
  return nil
end
`

// KEYS    -> the mark hashes to look in
// ARGV[1] -> "<owner>|<ms>", the mark the claims wrote
// ARGV[2] -> the address (the field; "<address>\0" holds the marks claims replaced, see keptMarks)
var releaseMarkScript = redis.NewScript(`
local kf = ARGV[2] .. "\0"
for _, k in ipairs(KEYS) do
  local cur = redis.call("HGET", k, ARGV[2])
  local kept = redis.call("HGET", k, kf)
  if cur == ARGV[1] then
    if kept then
      local top, rest = string.match(kept, "^([^;]+);?(.*)$")
      redis.call("HSET", k, ARGV[2], top)
      if rest == "" then redis.call("HDEL", k, kf) else redis.call("HSET", k, kf, rest) end
    else
      redis.call("HDEL", k, ARGV[2])
    end
  elseif kept then
    -- A later claim replaced this mark: it is no longer what that claim would put back.
    local list = {}
    for x in string.gmatch(kept, "[^;]+") do
      if x ~= ARGV[1] then list[#list + 1] = x end
    end
    if #list == 0 then redis.call("HDEL", k, kf) else redis.call("HSET", k, kf, table.concat(list, ";")) end
  end
end
return 0`)
