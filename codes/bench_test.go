package codes_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// BenchmarkGenerate adds a million codes to a new pool, and a million to a pool that grows by a million
// each time (the unique index holds at least a million more codes each run). Run it with
//
//	go test ./codes -run '^$' -bench Generate -benchtime 1x
func BenchmarkGenerate(b *testing.B) {
	const count = 1_000_000
	db, _ := testdb.New(b)
	ctx := context.Background()
	runs := 0
	for _, pass := range []string{"new pool", "existing pool"} {
		b.Run(pass, func(b *testing.B) {
			for b.Loop() {
				runs++
				pool := "bench-existing"
				if pass == "new pool" {
					pool = fmt.Sprint("bench-", runs)
				}
				start := time.Now()
				rep, err := codes.Generate(ctx, db, codes.GenerateOptions{Pool: pool, Count: count})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/count, "ns/code")
				b.Logf("%s: %+v in %v", pass, rep, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}
