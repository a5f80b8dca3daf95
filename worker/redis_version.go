package worker

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/state"
)

// CheckRedisVersion refuses a Redis older than 7.0: the claim scripts take a free claim and read a
// taken one in one call (SET NX GET), which older servers reject as a syntax error in the middle of a
// batch. Checked once when a worker starts, so the message says what to do before anything is claimed.
func CheckRedisVersion(ctx context.Context, rdb redis.UniversalClient) error {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis: reading its version: %w", err)
	}
	return checkVersionInfo(info)
}

// checkVersionInfo judges the redis_version in INFO's server section.
func checkVersionInfo(info string) error {
	v := redisVersion(info)
	major, _, _ := strings.Cut(v, ".")
	if n, err := strconv.Atoi(major); err != nil || n < 7 {
		if v == "" {
			v = "of unknown version"
		}
		return fmt.Errorf("Redis %s is too old: workers need Redis 7.0 or later (the claim scripts use SET NX GET); upgrade the server REDIS_URL points at. Nothing was claimed or sent", v)
	}
	return nil
}

// redisVersion is the redis_version field of INFO's server section ("" when absent).
func redisVersion(info string) string { return state.InfoField(info, "redis_version") }
