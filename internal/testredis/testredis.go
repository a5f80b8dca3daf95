// Package testredis lends each test a Redis logical database of its own (1 to 15) on the shared local
// server, so that Asynq's fixed key names, claims and buckets of parallel tests never meet. DB 0 is left to
// the demo and to operators; the lease keys that arbitrate between test processes live in DB 0 under the
// prefix "campaignctl:testdb:". Nothing here runs FLUSHALL on the shared server: a lent DB is emptied with
// FLUSHDB. Tests that must freeze or empty a whole Redis start a private server (StartServer).
package testredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Addr is the Redis server tests use; TEST_REDIS_ADDR overrides it.
func Addr() string {
	if a := os.Getenv("TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

const leaseTTL = 30 * time.Minute

// New leases a Redis DB for t, empties it, and returns a client on it and its redis:// URL. The lease is
// released when the test ends.
func New(t testing.TB) (*redis.Client, string) {
	t.Helper()
	ctx := context.Background()
	ctl := redis.NewClient(&redis.Options{Addr: Addr(), DB: 0})
	if err := ctl.Ping(ctx).Err(); err != nil {
		ctl.Close()
		t.Fatalf("testredis: Redis is not reachable at %s (%v); run scripts/test.sh, which installs and starts it", Addr(), err)
	}
	owner := randomHex(8)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		for db := 1; db <= 15; db++ {
			key := fmt.Sprintf("campaignctl:testdb:%d", db)
			ok, err := ctl.SetNX(ctx, key, owner, leaseTTL).Result()
			if err != nil {
				ctl.Close()
				t.Fatalf("testredis: lease: %v", err)
			}
			if !ok {
				continue
			}
			rdb := redis.NewClient(&redis.Options{Addr: Addr(), DB: db})
			if err := rdb.FlushDB(ctx).Err(); err != nil {
				t.Fatalf("testredis: flushdb: %v", err)
			}
			t.Cleanup(func() {
				rdb.FlushDB(context.Background()) //nolint:errcheck
				rdb.Close()
				if v, _ := ctl.Get(context.Background(), key).Result(); v == owner {
					ctl.Del(context.Background(), key)
				}
				ctl.Close()
			})
			return rdb, fmt.Sprintf("redis://%s/%d", Addr(), db)
		}
		if time.Now().After(deadline) {
			ctl.Close()
			t.Fatalf("testredis: no free Redis DB (1-15) after 5 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) //nolint:errcheck
	return hex.EncodeToString(b)
}
