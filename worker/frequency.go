package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// FrequencyKey is the Redis key that marks an address as recently messaged on a channel, across
// campaigns. Its value is "<campaign id>:<nonce>|<unix ms of the send>".
func FrequencyKey(ch campaign.Channel, address string) string {
	return "freq:" + string(ch) + ":" + address
}

// frequencyCap enforces "at most one commercial message per person and channel within the cap" at send
// time. Every send leaves a mark, whatever its own campaign's cap; each campaign then judges a mark by its
// own cap (a campaign with a 1 h cap is not held back by a send 5 hours ago, one with 24 h is). The mark is
// taken after the recipient's claim, so a redelivered batch of the same campaign finds its own mark and
// goes on.
type frequencyCap struct {
	rdb redis.UniversalClient
}

// markTTL keeps marks long enough for the default cap and for the campaign's own.
func markTTL(c *campaign.Campaign) time.Duration {
	return max(campaign.DefaultFrequencyCap, c.FrequencyCap)
}

func markOwner(c *campaign.Campaign, nonce string) string {
	return strconv.FormatInt(c.ID, 10) + ":" + nonce
}

// take marks address for campaign c at now, or reports that another campaign sent to it within c's cap.
func (f frequencyCap) take(ctx context.Context, c *campaign.Campaign, nonce, address string, now time.Time) (capped bool, err error) {
	_, err = frequencyScript.Run(ctx, f.rdb, []string{FrequencyKey(c.Channel, address)},
		markOwner(c, nonce), now.UnixMilli(), c.FrequencyCap.Milliseconds(), markTTL(c).Milliseconds()).Text()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("frequency cap: %w", err)
	}
	return true, nil
}

// release removes campaign c's mark on address when nothing reached the person.
func (f frequencyCap) release(ctx context.Context, c *campaign.Campaign, nonce, address string) error {
	err := releaseMarkScript.Run(ctx, f.rdb, []string{FrequencyKey(c.Channel, address)}, markOwner(c, nonce)+"|").Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("frequency cap: %w", err)
	}
	return nil
}

// KEYS[1] -> freq:<channel>:<address>
// ARGV[1] -> owner "<campaign id>:<nonce>"
// ARGV[2] -> now, unix ms
// ARGV[3] -> the checking campaign's cap in ms (0: never capped, but the mark is still left)
// ARGV[4] -> the mark's TTL in ms
// Returns the other campaign's mark when the address is capped, nil when the mark is (now) ours.
var frequencyScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v then
  local owner, ts = string.match(v, "^(.*)|(%d+)$")
  if owner == ARGV[1] then return false end
  if ts and tonumber(ARGV[2]) - tonumber(ts) < tonumber(ARGV[3]) then return v end
end
redis.call("SET", KEYS[1], ARGV[1] .. "|" .. ARGV[2], "PX", ARGV[4])
return false`)

// KEYS[1] -> freq:<channel>:<address>
// ARGV[1] -> "<owner>|", the prefix of our own mark
var releaseMarkScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0`)

// takeMany is take for many addresses in one round trip; capped[i] says whether addrs[i] is capped.
func (f frequencyCap) takeMany(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string, now time.Time) ([]bool, error) {
	pipe := f.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(addrs))
	for i, a := range addrs {
		cmds[i] = frequencyScript.Eval(ctx, pipe, []string{FrequencyKey(c.Channel, a)},
			markOwner(c, nonce), now.UnixMilli(), c.FrequencyCap.Milliseconds(), markTTL(c).Milliseconds())
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("frequency cap: %w", err)
	}
	capped := make([]bool, len(addrs))
	for i, cmd := range cmds {
		_, err := cmd.Text()
		switch {
		case errors.Is(err, redis.Nil):
		case err == nil:
			capped[i] = true
		default:
			return nil, fmt.Errorf("frequency cap: %w", err)
		}
	}
	return capped, nil
}

// releaseMany is release for many addresses in one round trip.
func (f frequencyCap) releaseMany(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string) error {
	if len(addrs) == 0 {
		return nil
	}
	pipe := f.rdb.Pipeline()
	for _, a := range addrs {
		releaseMarkScript.Eval(ctx, pipe, []string{FrequencyKey(c.Channel, a)}, markOwner(c, nonce)+"|")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("frequency cap: %w", err)
	}
	return nil
}
