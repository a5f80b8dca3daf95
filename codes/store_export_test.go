package codes

import (
	"context"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
)

// GenerateWithRandom is Generate with worker i reading its random bytes from random(i), so tests can force
// collisions.
func GenerateWithRandom(ctx context.Context, pool *pgxpool.Pool, opts GenerateOptions, random func(worker int) io.Reader) (GenerateReport, error) {
	return generate(ctx, pool, opts, random)
}
