// Command campaignctl plans, sends and operates bulk promo-code campaigns.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/redis/go-redis/v9"
)

func main() {
	// go-redis prints its own lines (a failed dial, a pool's retries) with the standard logger, unmasked and
	// unstructured, before the command's own error names the problem and its fix: they go to debug.
	redis.SetLogger(redisLog{})
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

// redisLog hands go-redis's lines to slog's default logger at debug level (dropped unless enabled).
type redisLog struct{}

func (redisLog) Printf(ctx context.Context, format string, v ...any) {
	slog.Default().DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
