package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// FrequencyKey is the Redis key that marks an address as recently messaged on a channel, across
// campaigns. Its value is the campaign that messaged it, its TTL the cap.
func FrequencyKey(ch campaign.Channel, address string) string {
	return "freq:" + string(ch) + ":" + address
}

// frequencyCap enforces "at most one commercial message per person and channel per cap" at send time.
// It is taken after the recipient's claim, so a redelivered batch of the same campaign finds its own mark
// and goes on, while another campaign finds it and skips the person.
type frequencyCap struct {
	rdb redis.UniversalClient
}

// take marks address for campaign c, or reports that another campaign messaged it within the cap.
func (f frequencyCap) take(ctx context.Context, c *campaign.Campaign, address string) (capped bool, err error) {
	if c.FrequencyCap <= 0 {
		return false, nil
	}
	owner := strconv.FormatInt(c.ID, 10)
	v, err := frequencyScript.Run(ctx, f.rdb, []string{FrequencyKey(c.Channel, address)}, owner, c.FrequencyCap.Milliseconds()).Text()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("frequency cap: %w", err)
	}
	return v != owner, nil
}

// release removes campaign c's mark on address when nothing reached the person.
func (f frequencyCap) release(ctx context.Context, c *campaign.Campaign, address string) error {
	if c.FrequencyCap <= 0 {
		return nil
	}
	err := releaseScript.Run(ctx, f.rdb, []string{FrequencyKey(c.Channel, address)}, strconv.FormatInt(c.ID, 10)).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("frequency cap: %w", err)
	}
	return nil
}

// KEYS[1] -> freq:<channel>:<address>
// ARGV[1] -> the campaign taking it
// ARGV[2] -> the cap in milliseconds
// Returns the campaign that holds the mark when it is another one, nil when the mark is (now) ours.
var frequencyScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v and v ~= ARGV[1] then return v end
if not v then redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2]) end
return false`)
