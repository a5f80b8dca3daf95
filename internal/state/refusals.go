package state

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// RefusalsHeldKey is a sorted set of the webhooks processes whose spool holds refusals Postgres could not
// take yet (a provider's unsubscribes, one-click refusals, RET replies received while it was away), each
// scored with the time, by Redis's clock in milliseconds, until which its note holds. While one holds,
// workers lease nothing to send: the consents they would read are missing those refusals.
const RefusalsHeldKey = "campaignctl:refusals:held"

// noteHeld adds or renews holder's note until ttl from now by Redis's clock, and drops the notes that ran out.
var noteHeld = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1`)

// countHeld counts the notes that still hold by Redis's clock.
var countHeld = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf")`)

// NoteRefusalsHeld notes that holder's spool holds refusals, for ttl unless renewed (a process that
// died with its spool full does not hold the workers for longer).
func NoteRefusalsHeld(ctx context.Context, rdb redis.UniversalClient, holder string, ttl time.Duration) error {
	return noteHeld.Run(ctx, rdb, []string{RefusalsHeldKey}, holder, ttl.Milliseconds()).Err()
}

// ClearRefusalsHeld removes holder's note: its spool is empty.
func ClearRefusalsHeld(ctx context.Context, rdb redis.UniversalClient, holder string) error {
	return rdb.ZRem(ctx, RefusalsHeldKey, holder).Err()
}

// RefusalsHeld says whether some webhooks process's spool holds refusals that Postgres has not taken yet.
func RefusalsHeld(ctx context.Context, rdb redis.UniversalClient) (bool, error) {
	n, err := countHeld.Run(ctx, rdb, []string{RefusalsHeldKey}).Int64()
	return n > 0, err
}
