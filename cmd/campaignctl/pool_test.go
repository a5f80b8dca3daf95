package main

import (
	"context"
	"io"
	"testing"

	"github.com/campaignctl/campaignctl/worker"
)

// A worker's engine pool is worker.EngineConns connections unless DATABASE_URL sets pool_max_conns, which
// wins; the other commands keep pgx's default. (Mutation: a size that overrides the URL's pool_max_conns
// leaves an operator no way to size the pool.)
func TestTheEnginePoolIsSizedUnlessTheURLSaysSo(t *testing.T) {
	t.Parallel()
	env, _ := badInputEnv(t)
	url := env["DATABASE_URL"]
	a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	for _, tc := range []struct {
		name     string
		url      string
		maxConns int32
		want     func(got int32) bool
		says     string
	}{
		{"a worker", url, worker.EngineConns, func(got int32) bool { return got == worker.EngineConns }, "worker.EngineConns"},
		{"a worker, the URL's size", url + "&pool_max_conns=5", worker.EngineConns, func(got int32) bool { return got == 5 }, "the URL's 5"},
		{"another command", url, 0, func(got int32) bool { return got >= 4 }, "pgx's default, 4 at least"},
	} {
		pool, err := a.openDB(context.Background(), tc.url, "DATABASE_URL", tc.maxConns)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := pool.Config().MaxConns
		pool.Close()
		if !tc.want(got) {
			t.Errorf("%s: a pool of %d connections, want %s", tc.name, got, tc.says)
		}
	}
}
