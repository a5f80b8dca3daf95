package state

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// RefusalsHeldKey is a sorted set of the webhooks processes whose spool holds refusals Postgres could not
// take yet (a provider's unsubscribes, one-click refusals, RET replies received while it was away), each
// scored with the time, by Redis's clock in milliseconds, until which its note holds. While one holds,
// workers lease nothing to send: the consents they would read are missing those refusals.
const RefusalsHeldKey = "campaignctl:refusals:held"

// RefusalsHeldGenKey counts the notes written to RefusalsHeldKey (each new one and each renewal): a worker
// that reads it before and after a consent read knows whether a refusal was spooled meanwhile, even if its
// note was gone again by the second look (RefusalsHeldNow).
const RefusalsHeldGenKey = "campaignctl:refusals:held:gen"

// noteHeld adds or renews holder's note until ttl from now by Redis's clock, drops the notes that ran out,
// and counts the note.
var noteHeld = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call("INCR", KEYS[2])
return 1`)

// countHeld counts the notes that still hold by Redis's clock, and returns the count of notes written.
var countHeld = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf"), tonumber(redis.call("GET", KEYS[2]) or "0")}`)

// NoteRefusalsHeld notes that holder's spool holds refusals, for ttl unless renewed (a process that
// died with its spool full does not hold the workers for longer).
func NoteRefusalsHeld(ctx context.Context, rdb redis.UniversalClient, holder string, ttl time.Duration) error {
	return noteHeld.Run(ctx, rdb, []string{RefusalsHeldKey, RefusalsHeldGenKey}, holder, ttl.Milliseconds()).Err()
}

// HeldRefusals is what RefusalsHeldNow read: whether a note holds, and how many notes were written so far
// (0 after Redis lost its data).
type HeldRefusals struct {
	Held bool
	Gen  int64
}

// RefusalsHeldNow reads whether some webhooks process's spool holds refusals that Postgres has not taken
// yet, and the count of notes written.
func RefusalsHeldNow(ctx context.Context, rdb redis.UniversalClient) (HeldRefusals, error) {
	vs, err := countHeld.Run(ctx, rdb, []string{RefusalsHeldKey, RefusalsHeldGenKey}).Int64Slice()
	if err != nil {
		return HeldRefusals{}, err
	}
	if len(vs) != 2 {
		return HeldRefusals{}, fmt.Errorf("refusals held: unexpected answer %v", vs)
	}
	return HeldRefusals{Held: vs[0] > 0, Gen: vs[1]}, nil
}

// ClearRefusalsHeld removes holder's note: its spool is empty.
func ClearRefusalsHeld(ctx context.Context, rdb redis.UniversalClient, holder string) error {
	return rdb.ZRem(ctx, RefusalsHeldKey, holder).Err()
}
