package state

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// BenchmarkClaimWindowRedisCPU takes SMS claims a window of 8 at a time (DefaultSendWindow), each call
// writing the window before's answers, as a windowed run does (ClaimWindow), on a private redis-server,
// and reports the server's CPU a recipient (redis-cpu-ns/claim, from INFO cpu): what Redis spends on an
// SMS of the send path. "marketing" reads and leaves the frequency marks (the default cap reaches two day
// hashes); "transactional" has none, so the difference is what the marks cost. Run it with
//
//	go test ./internal/state -run '^$' -bench ClaimWindowRedisCPU -benchtime 30000x
func BenchmarkClaimWindowRedisCPU(b *testing.B) {
	b.Run("marketing", func(b *testing.B) { benchClaimWindow(b, false) })
	b.Run("transactional", func(b *testing.B) { benchClaimWindow(b, true) })
}

func benchClaimWindow(b *testing.B, transactional bool) {
	const window = 8
	c, all := benchCampaign(200_000)
	c.Transactional = transactional
	ctx := context.Background()
	srv := testredis.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), OnConnect: CheckEpochOnConnect(nil, nil)})
	defer rdb.Close()
	cl := New(rdb, 45*24*time.Hour)
	epoch, err := Epoch(ctx, rdb)
	if err != nil {
		b.Fatal(err)
	}
	g := Guard{Epoch: epoch, Halt: HaltKey(c.ID), CheckHalt: true}
	nonce := Nonce(c)
	var prev []Answer
	scs := make([]SendClaim, window)
	claims, i := 0, 0
	before := redisCPU(b, rdb)
	for b.Loop() {
		mine := InFlightValue(time.Now(), "bench")
		for k := range scs {
			r := all[i%len(all)]
			scs[k] = SendClaim{Key: ClaimKey(c.ID, r.UserID) + ":" + strconv.Itoa(i/len(all)), Value: mine, Addr: r.Address}
			i++
		}
		cls, pause, err := cl.ClaimWindow(ctx, c, nonce, scs, g, prev, "limiter:pause:provider:test", time.Now())
		if err != nil || pause > 0 {
			b.Fatalf("window: %v %v", pause, err)
		}
		prev = prev[:0]
		for k, got := range cls {
			if got.Result != Ours {
				b.Fatalf("claim %d: %+v", k, got)
			}
			prev = append(prev, Answer{Key: scs[k].Key, InFlight: mine, Value: SentValue("SM0123456789abcdef0123456789abcdef", 1)})
		}
		claims += window
	}
	b.ReportMetric((redisCPU(b, rdb)-before)*1e9/float64(claims), "redis-cpu-ns/claim")
}
