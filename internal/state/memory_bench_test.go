package state

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// BenchmarkMemoryARecipient measures what a recipient of an SMS campaign leaves in Redis once sent: its
// claim sent:<campaign>:<user> (a key of its own with its 45-day expiry, holding the provider's answer)
// and its frequency mark (a field of a day's shard hash). The claims and marks are taken by the claim
// script of the send path, each answer written by the next call as a run does, on a private redis-server,
// so used_memory counts them alone. Run it with
//
//	go test ./internal/state -run '^$' -bench MemoryARecipient -benchtime 1x
//
// B/recipient is all of it; claims-B/recipient and marks-B/recipient split it (the marks' hashes are
// deleted and memory read again).
func BenchmarkMemoryARecipient(b *testing.B) {
	const n = 100_000
	c, all := benchCampaign(n)
	ctx := context.Background()
	srv := testredis.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), OnConnect: CheckEpochOnConnect(nil, nil)})
	defer rdb.Close()
	cl := New(rdb, 45*24*time.Hour)
	used := func() int64 {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatal(err)
		}
		v, err := strconv.ParseInt(testredis.InfoField(info, "used_memory"), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	var total, claims, marks int64
	for b.Loop() {
		b.StopTimer()
		if err := srv.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		epoch, err := Epoch(ctx, rdb)
		if err != nil {
			b.Fatal(err)
		}
		g := Guard{Epoch: epoch, Halt: HaltKey(c.ID), CheckHalt: true}
		nonce := Nonce(c)
		now := time.Now()
		before := used()
		b.StartTimer()
		var prev *Answer
		for i, r := range all {
			key := ClaimKey(c.ID, r.UserID)
			mine := InFlightValue(now, "bench-host:12345")
			got, err := cl.ClaimSend(ctx, c, nonce, SendClaim{Key: key, Value: mine, Addr: r.Address}, g, prev, "limiter:pause:provider:test", now)
			if err != nil || got.Result != Ours {
				b.Fatalf("claim %d: %+v %v", i, got, err)
			}
			// A Twilio message SID, different for each message.
			sid := "SM" + strconv.FormatInt(int64(0x1000000000000000)+int64(i)*7919, 16) + "0123456789abcdef"
			prev = &Answer{Key: key, InFlight: mine, Value: SentValue(sid, 1)}
		}
		b.StopTimer()
		after := used()
		var cursor uint64
		for {
			keys, next, err := rdb.Scan(ctx, cursor, "freq:*", 1000).Result()
			if err != nil {
				b.Fatal(err)
			}
			if len(keys) > 0 {
				if err := rdb.Del(ctx, keys...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		noMarks := used()
		total, claims, marks = after-before, noMarks-before, after-noMarks
		if k, err := rdb.DBSize(ctx).Result(); err != nil || k < n {
			b.Fatalf("%d keys after the marks went, want the %d claims at least (%v)", k, n, err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total)/n, "B/recipient")
	b.ReportMetric(float64(claims)/n, "claims-B/recipient")
	b.ReportMetric(float64(marks)/n, "marks-B/recipient")
}
