package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// EpochKey holds the Redis epoch: a random value written once, so that it changes exactly when Redis
// loses its data (restarted without persistence, flushed, failed over to an empty replica). A chunk lease
// in Postgres records the epoch its claims were taken under, and a claim is only taken while the epoch is
// still the one its lease recorded. So when a run dies holding a lease, the next run knows whether the
// claims it finds (or does not find) are complete: same epoch, a missing claim means never sent; another
// epoch, a missing claim proves nothing and the recipient becomes unknown.
const EpochKey = "campaignctl:epoch"

// Epoch returns the current Redis epoch, creating it when Redis has none (first use, or data lost).
func Epoch(ctx context.Context, rdb redis.UniversalClient) (string, error) {
	v, err := epochScript.Run(ctx, rdb, []string{EpochKey}, randomToken()).Text()
	if err != nil {
		return "", fmt.Errorf("redis epoch: %w", err)
	}
	return v, nil
}

// KEYS[1] -> campaignctl:epoch
// ARGV[1] -> a fresh random value, used when there is none
var epochScript = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v then return v end
redis.call("SET", KEYS[1], ARGV[1])
return ARGV[1]`)

// randomToken returns a short random identifier (epochs, lease tokens).
func randomToken() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; the clock keeps the token unique enough.
		return strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	return hex.EncodeToString(b[:])
}

// HaltKey is set while a campaign is paused or cancelled. The claim script reads it, so a pause stops new
// sends on every worker before their next claim (well within a second), not only at the next chunk.
func HaltKey(campaignID int64) string {
	return "campaign:" + strconv.FormatInt(campaignID, 10) + ":halt"
}

// Halt sets the campaign's halt key to why ("paused", "cancelled") for ttl.
func Halt(ctx context.Context, rdb redis.UniversalClient, campaignID int64, why string, ttl time.Duration) error {
	if err := rdb.Set(ctx, HaltKey(campaignID), why, ttl).Err(); err != nil {
		return fmt.Errorf("halt campaign %d in Redis: %w", campaignID, err)
	}
	return nil
}

// Unhalt removes the campaign's halt key.
func Unhalt(ctx context.Context, rdb redis.UniversalClient, campaignID int64) error {
	if err := rdb.Del(ctx, HaltKey(campaignID)).Err(); err != nil {
		return fmt.Errorf("unhalt campaign %d in Redis: %w", campaignID, err)
	}
	return nil
}

// Errors of the claim script: nothing was written.
var (
	// errEpoch: Redis lost its data since the run leased its chunk.
	errEpoch = errors.New("Redis lost its data (its epoch changed) since this chunk was leased")
	// errHalted: the campaign was paused or cancelled.
	errHalted = errors.New("campaign halted")
)

// scriptError maps the claim script's error replies to errEpoch and errHalted.
func scriptError(err error) error {
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), "CAMPAIGNCTL_EPOCH"):
		return errEpoch
	case strings.Contains(err.Error(), "CAMPAIGNCTL_HALT"):
		return errHalted
	}
	return err
}
