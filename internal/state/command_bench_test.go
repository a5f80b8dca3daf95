package state

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// BenchmarkClaimCommandsRedisCPU asks what the claims of a window of 8 SMS (DefaultSendWindow) would cost
// Redis if they travelled otherwise than in the claim script: the same commands a recipient needs, its claim
// (SET NX GET PX) and the answer written into the claim of the window before (SET KEEPTTL GET), sent
// one window a round trip as a pipeline, as a MULTI/EXEC transaction, as a script without the guards,
// and as the claim script itself (ClaimWindow, a transactional campaign: no frequency marks). "round trip"
// is a PING a call: what a round trip costs the server whatever it carries. It reports the server's CPU a
// recipient (redis-cpu-ns/recipient, from INFO cpu), on a private redis-server. Run it with
//
//	go test ./internal/state -run '^$' -bench ClaimCommandsRedisCPU -benchtime 30000x
func BenchmarkClaimCommandsRedisCPU(b *testing.B) {
	const window = 8
	ctx := context.Background()
	srv := testredis.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), OnConnect: CheckEpochOnConnect(nil, nil)})
	defer rdb.Close()
	ttl := (45 * 24 * time.Hour).Milliseconds()
	const pending, answer = "n0nce/c|1765000000000|w1", "n0nce/s|SM0123456789abcdef0123456789abcdef|1"
	// keys returns the claim keys of window i of a run (named apart for each sub-benchmark).
	keys := func(name string, i int) []string {
		ks := make([]string, window)
		for k := range ks {
			ks[k] = "sent:7:" + name + ":" + strconv.Itoa(i*window+k)
		}
		return ks
	}
	bench := func(name string, send func(claims, answers []string)) {
		b.Run(name, func(b *testing.B) {
			var prev []string
			i := 0
			before := redisCPU(b, rdb)
			for b.Loop() {
				claims := keys(name, i)
				send(claims, prev)
				prev = claims
				i++
			}
			b.ReportMetric((redisCPU(b, rdb)-before)*1e9/float64(i*window), "redis-cpu-ns/recipient")
		})
	}
	bench("round trip", func([]string, []string) {
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	})
	queue := func(p redis.Pipeliner, claims, answers []string) {
		for _, k := range answers {
			p.SetArgs(ctx, k, answer, redis.SetArgs{KeepTTL: true, Get: true})
		}
		for _, k := range claims {
			p.SetArgs(ctx, k, pending, redis.SetArgs{Mode: "NX", Get: true, TTL: time.Duration(ttl) * time.Millisecond})
		}
	}
	bench("pipeline", func(claims, answers []string) {
		p := rdb.Pipeline()
		queue(p, claims, answers)
		if _, err := p.Exec(ctx); err != nil && err != redis.Nil {
			b.Fatal(err)
		}
	})
	bench("MULTI-EXEC", func(claims, answers []string) {
		p := rdb.TxPipeline()
		queue(p, claims, answers)
		if _, err := p.Exec(ctx); err != nil && err != redis.Nil {
			b.Fatal(err)
		}
	})
	bare := redis.NewScript(`
local na = tonumber(ARGV[1])
for i = 1, na do redis.call("SET", KEYS[i], ARGV[3], "KEEPTTL", "GET") end
for i = na + 1, #KEYS do redis.call("SET", KEYS[i], ARGV[2], "NX", "GET", "PX", ARGV[4]) end
return 0`)
	bench("script without guards", func(claims, answers []string) {
		if err := bare.Run(ctx, rdb, append(append([]string{}, answers...), claims...), len(answers), pending, answer, ttl).Err(); err != nil {
			b.Fatal(err)
		}
	})
	c, _ := benchCampaign(0)
	c.Transactional = true
	cl := New(rdb, 45*24*time.Hour)
	epoch, err := Epoch(ctx, rdb)
	if err != nil {
		b.Fatal(err)
	}
	g := Guard{Epoch: epoch, Halt: HaltKey(c.ID), CheckHalt: true}
	nonce := Nonce(c)
	bench("claim script", func(claims, answers []string) {
		scs := make([]SendClaim, len(claims))
		for k, key := range claims {
			scs[k] = SendClaim{Key: key, Value: "c|1765000000000|w1", Addr: "+905320000000"}
		}
		prev := make([]Answer, len(answers))
		for k, key := range answers {
			prev[k] = Answer{Key: key, InFlight: "c|1765000000000|w1", Value: "s|SM0123456789abcdef0123456789abcdef|1"}
		}
		if _, _, err := cl.ClaimWindow(ctx, c, nonce, scs, g, prev, "limiter:pause:provider:test", time.Now()); err != nil {
			b.Fatal(err)
		}
	})
}

// redisCPU is the CPU time the Redis server behind rdb has used, in seconds (INFO cpu, main thread).
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	u, _ := strconv.ParseFloat(testredis.InfoField(info, "used_cpu_user_main_thread"), 64)
	s, _ := strconv.ParseFloat(testredis.InfoField(info, "used_cpu_sys_main_thread"), 64)
	return u + s
}
