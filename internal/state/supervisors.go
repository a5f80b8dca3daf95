package state

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// SupervisorsKey is the sorted set of the worker supervisors (campaignctl workers) that size a pool from
// the batch queue: member = the supervisor's name, score = when it last looked, in Redis's milliseconds.
const SupervisorsKey = "campaignctl:supervisors"

// Supervisors records that the supervisor name looks at the queue now and returns how many supervisors
// looked within alive, itself included: each sizes its own pool to its share of what the queue needs, so
// that two or more on one queue (two machines) do not each start a whole pool. Redis's clock is used, so
// the machines' clocks need not agree. One that stopped looking (killed, cut off) drops out after alive,
// and the others take its share.
func Supervisors(ctx context.Context, rdb redis.Scripter, name string, alive time.Duration) (int, error) {
	n, err := supervisorsScript.Run(ctx, rdb, []string{SupervisorsKey}, name, alive.Milliseconds()).Int()
	if err != nil {
		return 0, fmt.Errorf("supervisors: %w", err)
	}
	return max(1, n), nil
}

// LeaveSupervisors takes the supervisor name out of the set at once, when it stops: the others take its
// share at their next look.
func LeaveSupervisors(ctx context.Context, rdb redis.Cmdable, name string) error {
	return rdb.ZRem(ctx, SupervisorsKey, name).Err()
}

// KEYS[1] -> campaignctl:supervisors
// ARGV[1] -> the supervisor's name
// ARGV[2] -> how long a look counts, in ms
var supervisorsScript = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local alive = tonumber(ARGV[2])
redis.call("ZADD", KEYS[1], now, ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", "(" .. (now - alive))
redis.call("PEXPIRE", KEYS[1], 2 * alive)
return redis.call("ZCARD", KEYS[1])`)
