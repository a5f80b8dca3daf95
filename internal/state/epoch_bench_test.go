package state

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

type benchRecipient struct{ UserID, Address string }

// benchCampaign is an SMS campaign of n recipients, without a database: the claim scripts need only its ID,
// channel, cap and creation time.
func benchCampaign(n int) (*campaign.Campaign, []benchRecipient) {
	c := &campaign.Campaign{ID: 7, Channel: campaign.ChannelSMS, CreatedAt: time.Now(), FrequencyCap: campaign.DefaultFrequencyCap}
	all := make([]benchRecipient, n)
	for i := range all {
		all[i] = benchRecipient{UserID: fmt.Sprintf("u%d", i), Address: fmt.Sprintf("+90532%07d", i)}
	}
	return c, all
}

// What it would cost to make every claim durable instead (WAIT for a replica before the provider call),
// against what the epoch check costs: private redis-server processes, a master and, where named, a
// replica connected to it directly. Run them with
//
//	go test ./internal/state -run '^$' -bench 'ClaimDurable|EpochCheck|ConnectCheck' -benchtime 2s
//
// BenchmarkClaimDurable takes SMS claims (the claim script of BenchmarkClaimSend, the previous answer
// written in the same call) on the master: alone; with a replica; with a replica and WAIT 1 in the same
// round trip (pipelined after the script); with a replica and WAIT 1 as a round trip of its own.
func BenchmarkClaimDurable(b *testing.B) {
	for _, tc := range []struct {
		name    string
		replica bool
		wait    string // "", "pipelined", "separate"
	}{
		{"master alone", false, ""},
		{"with a replica", true, ""},
		{"with a replica, WAIT 1 pipelined", true, "pipelined"},
		{"with a replica, WAIT 1 separate", true, "separate"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, all := benchCampaign(2000)
			ctx := context.Background()
			master := testredis.StartServer(b)
			if tc.replica {
				master.StartDirectReplica(b)
			}
			rdb := redis.NewClient(&redis.Options{Addr: master.Addr(), OnConnect: CheckEpochOnConnect(nil, nil)})
			defer rdb.Close()
			cl := New(rdb, 45*24*time.Hour)
			epoch, err := Epoch(ctx, rdb)
			if err != nil {
				b.Fatal(err)
			}
			if err := claimSendScript.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			g := Guard{Epoch: epoch, Halt: HaltKey(c.ID), CheckHalt: true}
			nonce := Nonce(c)
			var prev *Answer
			i := 0
			for b.Loop() {
				r := all[i%len(all)]
				key := fmt.Sprintf("%s:%d", ClaimKey(c.ID, r.UserID), i/len(all))
				mine := InFlightValue(time.Now(), "bench")
				sc := SendClaim{Key: key, Value: mine, Addr: r.Address}
				var got Claimed
				switch tc.wait {
				case "pipelined":
					keys, args := cl.claimSendArgs(c, nonce, sc, g, prev, "limiter:pause:provider:test", time.Now())
					pipe := rdb.Pipeline()
					res := claimSendScript.EvalSha(ctx, pipe, keys, args...)
					w := pipe.Do(ctx, "WAIT", 1, 1000)
					if _, err := pipe.Exec(ctx); err != nil {
						b.Fatal(err)
					}
					if n, _ := w.Int(); n != 1 {
						b.Fatalf("WAIT answered %d replicas", n)
					}
					vals, err := res.Slice()
					if err != nil {
						b.Fatal(err)
					}
					got, err = decodeClaimed(vals, nonce)
					if err != nil {
						b.Fatal(err)
					}
				default:
					got, err = cl.ClaimSend(ctx, c, nonce, sc, g, prev, "limiter:pause:provider:test", time.Now())
					if err != nil {
						b.Fatal(err)
					}
					if tc.wait == "separate" {
						if n, err := rdb.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
							b.Fatalf("WAIT answered %d replicas (%v)", n, err)
						}
					}
				}
				if got.Result != Ours {
					b.Fatalf("claim %d: %+v", i, got)
				}
				prev = &Answer{Key: key, InFlight: mine, Value: SentValue("SM0123456789abcdef0123456789abcdef", 1)}
				i++
			}
		})
	}
}

// BenchmarkClaimDurableParallel is BenchmarkClaimDurable with 16 claimers at once (a worker's default
// --concurrency on 2 cores), each its own recipients: ns/op is the time per claim of all of them together.
func BenchmarkClaimDurableParallel(b *testing.B) {
	for _, wait := range []bool{false, true} {
		name := "with a replica"
		if wait {
			name += ", WAIT 1 pipelined"
		}
		b.Run(name, func(b *testing.B) {
			c, all := benchCampaign(2000)
			ctx := context.Background()
			master := testredis.StartServer(b)
			master.StartDirectReplica(b)
			rdb := redis.NewClient(&redis.Options{Addr: master.Addr(), PoolSize: 32, OnConnect: CheckEpochOnConnect(nil, nil)})
			defer rdb.Close()
			cl := New(rdb, 45*24*time.Hour)
			epoch, err := Epoch(ctx, rdb)
			if err != nil {
				b.Fatal(err)
			}
			if err := claimSendScript.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			g := Guard{Epoch: epoch, Halt: HaltKey(c.ID), CheckHalt: true}
			nonce := Nonce(c)
			var next atomic.Int64
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(next.Add(1))
					r := all[i%len(all)]
					key := fmt.Sprintf("%s:%d", ClaimKey(c.ID, r.UserID), i/len(all))
					sc := SendClaim{Key: key, Value: InFlightValue(time.Now(), "bench"), Addr: r.Address}
					keys, args := cl.claimSendArgs(c, nonce, sc, g, nil, "limiter:pause:provider:test", time.Now())
					pipe := rdb.Pipeline()
					res := claimSendScript.EvalSha(ctx, pipe, keys, args...)
					var w *redis.Cmd
					if wait {
						w = pipe.Do(ctx, "WAIT", 1, 1000)
					}
					if _, err := pipe.Exec(ctx); err != nil {
						b.Error(err)
						return
					}
					if w != nil {
						if n, _ := w.Int(); n != 1 {
							b.Errorf("WAIT answered %d replicas", n)
							return
						}
					}
					if vals, err := res.Slice(); err != nil || len(vals) < 2 || vals[1] != "o" {
						b.Errorf("claim %d: %v %v", i, vals, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkEpochCheck reads the epoch as a batch run and the sweeper do: with the server check (Epoch),
// and, for comparison, the plain read of the epoch key the check replaced.
func BenchmarkEpochCheck(b *testing.B) {
	ctx := context.Background()
	master := testredis.StartServer(b)
	master.StartDirectReplica(b)
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer rdb.Close()
	if _, err := Epoch(ctx, rdb); err != nil {
		b.Fatal(err)
	}
	b.Run("Epoch", func(b *testing.B) {
		for b.Loop() {
			if _, err := Epoch(ctx, rdb); err != nil {
				b.Fatal(err)
			}
		}
	})
	plain := redis.NewScript(`
local v = redis.call("GET", KEYS[1])
if v then return v end
redis.call("SET", KEYS[1], ARGV[1])
return ARGV[1]`)
	b.Run("plain read", func(b *testing.B) {
		for b.Loop() {
			if err := plain.Run(ctx, rdb, []string{EpochKey}, "x").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkConnectCheck opens a new connection and runs one PING on it, with and without the check every
// new connection of campaignctl's clients runs (CheckEpochOnConnect).
func BenchmarkConnectCheck(b *testing.B) {
	ctx := context.Background()
	master := testredis.StartServer(b)
	master.StartDirectReplica(b)
	for _, tc := range []struct {
		name  string
		check bool
	}{{"without the check", false}, {"with the check", true}} {
		b.Run(tc.name, func(b *testing.B) {
			opt := &redis.Options{Addr: master.Addr(), PoolSize: 1, MaxIdleConns: 0}
			if tc.check {
				opt.OnConnect = CheckEpochOnConnect(nil, nil)
			}
			for b.Loop() {
				rdb := redis.NewClient(opt)
				if err := rdb.Ping(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				rdb.Close()
			}
		})
	}
}
