package demo_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/demo"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// BenchmarkSeed seeds a million users into a fresh database, then seeds them again. Run it with
//
//	go test ./internal/demo -run '^$' -bench Seed -benchtime 1x
func BenchmarkSeed(b *testing.B) {
	const users = 1_000_000
	db, _ := testdb.New(b)
	for _, pass := range []string{"fresh", "again"} {
		b.Run(pass, func(b *testing.B) {
			for b.Loop() {
				start := time.Now()
				rep, err := demo.Seed(context.Background(), db, demo.SeedOptions{Users: users})
				if err != nil {
					b.Fatal(err)
				}
				b.Logf("%s: %+v in %v", pass, rep, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}
