package worker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// Frequency marks say that an address was recently messaged on a channel, across campaigns. They live in
// Redis hashes, one per channel, UTC day and shard: field = address, value = "<campaign id>:<nonce>|<unix ms
// of the send>". A hash of a few dozen small fields is stored compactly (listpack), about 45 bytes a mark
// against some 130 for a key of its own, and a day's hashes expire together once no cap can reach them.
const (
	markShards = 8192
	markDay    = 24 * time.Hour
)

// FrequencyKey is the hash that holds address's mark on channel ch for the UTC day of t.
func FrequencyKey(ch campaign.Channel, address string, t time.Time) string {
	return markKey(ch, markShard(address), t.UnixMilli()/markDay.Milliseconds())
}

func markShard(address string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(address)) //nolint:errcheck // hashes never fail
	return h.Sum32() % markShards
}

func markKey(ch campaign.Channel, shard uint32, day int64) string {
	return "freq:" + string(ch) + ":" + strconv.FormatInt(day, 10) + ":" + strconv.FormatUint(uint64(shard), 10)
}

// markKeys are the hashes a check at now with cap must read, today's first (the one a new mark goes to).
func markKeys(ch campaign.Channel, address string, now time.Time, cap time.Duration) []string {
	shard := markShard(address)
	today := now.UnixMilli() / markDay.Milliseconds()
	first := (now.UnixMilli() - cap.Milliseconds()) / markDay.Milliseconds()
	keys := []string{markKey(ch, shard, today)}
	for d := today - 1; d >= first; d-- {
		keys = append(keys, markKey(ch, shard, d))
	}
	return keys
}

// frequencyCap enforces "at most one commercial message per person and channel within the cap" at send
// time. Every send leaves a mark, whatever its own campaign's cap; each campaign then judges a mark by its
// own cap (a campaign with a 1 h cap is not held back by a send 5 hours ago, one with 24 h is). The mark is
// taken with the recipient's claim (claimSendScript), so a redelivered batch of the same campaign finds its
// own mark and goes on.
type frequencyCap struct {
	rdb redis.UniversalClient
}

// markTTL keeps a day's marks long enough for the default cap and for the campaign's own, counted from
// the end of the day.
func markTTL(c *campaign.Campaign) time.Duration {
	return max(campaign.DefaultFrequencyCap, c.FrequencyCap) + markDay
}

func markOwner(c *campaign.Campaign, nonce string) string {
	return strconv.FormatInt(c.ID, 10) + ":" + nonce
}

// release removes campaign c's mark on address when nothing reached the person.
func (f frequencyCap) release(ctx context.Context, c *campaign.Campaign, nonce, address string, now time.Time) error {
	return f.releaseMany(ctx, c, nonce, []string{address}, now)
}

// releaseMany is release for many addresses in one round trip. Marks are looked for in the day of now and
// the day before (a send that straddled midnight).
func (f frequencyCap) releaseMany(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string, now time.Time) error {
	if len(addrs) == 0 {
		return nil
	}
	pipe := f.rdb.Pipeline()
	for _, a := range addrs {
		releaseMarkScript.Eval(ctx, pipe, markKeys(c.Channel, a, now, markDay), markOwner(c, nonce)+"|", a)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("frequency cap: %w", err)
	}
	return nil
}

// KEYS    -> the mark hashes to look in
// ARGV[1] -> "<owner>|", the prefix of our own mark
// ARGV[2] -> the address (the field)
var releaseMarkScript = redis.NewScript(`
for _, k in ipairs(KEYS) do
  local v = redis.call("HGET", k, ARGV[2])
  if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
    redis.call("HDEL", k, ARGV[2])
  end
end
return 0`)
