package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/worker"
)

// A real Sentinel fails a master over to a replica that lagged behind it: the last claim written on the
// master never reached the replica, while the epoch had. The client REDIS_URL=redis+sentinel://... builds
// follows the master, and the first command it runs on the new master already finds the epoch renewed (its
// connection checked it before carrying anything), so no claim can be taken there under the old epoch.
func TestSentinelFailoverToALaggingReplicaRenewsTheEpoch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master := testredis.StartServer(t)
	replica := master.StartReplica(t)
	sentinel := testredis.StartSentinel(t, "campaigns", master, 1)
	rdb, _, err := redisClient(fmt.Sprintf("redis+sentinel://%s/campaigns/0", sentinel.Addr()), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	e0, err := worker.Epoch(ctx, rdb)
	if err != nil {
		t.Fatalf("the epoch, read through Sentinel: %v", err)
	}
	if err := replica.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	replica.Lag()
	claim := worker.ClaimKey(1, "u1")
	if err := rdb.Set(ctx, claim, "n/s|SM1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}

	master.Kill()
	if err := sentinel.WaitMaster(ctx, "campaigns", replica.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	var e1 string
	deadline := time.Now().Add(15 * time.Second)
	for {
		e1, err = rdb.Get(ctx, worker.EpochKey).Result()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no answer through Sentinel after the failover: %v", err)
	}
	if e1 == e0 {
		t.Fatalf("epoch %q on the promoted replica, as on the master that died: a claim under it would be taken although the claims of its last moments are gone", e1)
	}
	if n, err := rdb.Exists(ctx, claim).Result(); err != nil || n != 0 {
		t.Fatalf("the claim written after the replica fell behind is still there (%d, %v): the replica did not lag", n, err)
	}
	if e, err := worker.Epoch(ctx, rdb); err != nil || e != e1 {
		t.Fatalf("Epoch on the new master: %q (%v), want %q", e, err, e1)
	}
}

// REDIS_URL naming a replica is refused on the first command, with the reason.
func TestRedisURLOfAReplicaIsRefused(t *testing.T) {
	t.Parallel()
	replica := testredis.StartServer(t).StartReplica(t)
	clients := map[string]func(string) (*redis.Client, string, error){
		"a worker's":                     func(u string) (*redis.Client, string, error) { return redisClient(u, nil) },
		"a launch's (it makes no epoch)": queueRedisClient,
	}
	for name, client := range clients {
		rdb, _, err := client(replica.URL())
		if err != nil {
			t.Fatal(err)
		}
		err = rdb.Ping(context.Background()).Err()
		rdb.Close()
		if !errors.Is(err, worker.ErrNotMaster) {
			t.Errorf("PING through %s client of a replica: %v, want ErrNotMaster", name, err)
		}
	}
	// The master itself is fine for a launch, and keeps no epoch of it.
	master := testredis.StartServer(t)
	rdb, _, err := queueRedisClient(master.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING through a launch's client of a master: %v", err)
	}
	if n, err := rdb.DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Fatalf("a launch's connection wrote %d keys (%v)", n, err)
	}
}
