package iys

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// runAlone makes the runs of job for brand (a push, a sync) take turns: it holds a Postgres advisory
// lock, on a connection of its own, until release is called. A run that finds the lock held logs that it
// waits, and waits for it (or for ctx). Two pushes at once would otherwise read the same waiting refusals
// and send each of them twice; two syncs would apply the same pages and could leave the older cursor.
//
// The lock lives as long as the connection: if Postgres restarts during the run, the run goes on without
// it, and a run started meanwhile may overlap it. Both kinds of request are idempotent in İYS (V2 adds,
// pulls stored with their cursor), so an overlap costs requests, not registrations.
func runAlone(ctx context.Context, db *pgxpool.Pool, c *Client, job string) (release func(), err error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("iys %s: %w", job, err)
	}
	const key = `hashtext('campaignctl iys ' || $1), hashtext($2)`
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+key+`)`, job, c.BrandCode()).Scan(&got); err != nil {
		conn.Release()
		return nil, fmt.Errorf("iys %s: take its lock: %w", job, err)
	}
	if !got {
		c.log.Info("another iys "+job+" of this brand is running: waiting for it to finish", "brand", c.BrandCode())
		start := time.Now()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(`+key+`)`, job, c.BrandCode()); err != nil {
			// A canceled wait leaves the connection's state unknown: it is not given back to the pool.
			conn.Hijack().Close(context.Background()) //nolint:errcheck
			return nil, fmt.Errorf("iys %s: wait for the other run to finish: %w", job, err)
		}
		c.log.Info("the other iys "+job+" finished", "brand", c.BrandCode(), "waited", time.Since(start).Round(time.Millisecond))
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(`+key+`)`, job, c.BrandCode()); err != nil {
			conn.Hijack().Close(ctx) //nolint:errcheck // closing the session drops its locks
			return
		}
		conn.Release()
	}, nil
}
