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
// same campaign finds its own mark and goes on.

// markTTL keeps a day's marks long enough for the default cap and for the campaign's own, counted from
// the end of the day.
func markTTL(c *campaign.Campaign) time.Duration {
	return max(campaign.DefaultFrequencyCap, c.FrequencyCap) + markDay
}

func markOwner(c *campaign.Campaign, nonce string) string {
	return strconv.FormatInt(c.ID, 10) + ":" + nonce
}

// ReleaseMarks removes campaign c's marks on addrs when nothing reached those people, in one round trip. Marks are looked for in the day of now and
// the day before (a send that straddled midnight).
func (s *Store) ReleaseMarks(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string, now time.Time) error {
	if len(addrs) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
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
