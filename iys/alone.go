package iys

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// runAlone makes the runs of job for brand (a push, a sync) take turns: it holds a Postgres advisory
// lock until release is called. A run that finds the lock held logs that it waits, and waits for it (or
// for ctx). Two pushes at once would otherwise read the same waiting refusals and send each of them twice;
// two syncs would apply the same pages and could leave the older cursor.
//
// The lock is a transaction's (pg_advisory_xact_lock), held open on a connection of its own, outside the
// pool: the run's own statements still find the pool's connections (a pool of one included), and a
// pooler in transaction mode keeps the transaction on one server connection, which a session's lock
// would not be. If that connection dies during the run (a Postgres restart), the run goes on without the
// lock, and a run started meanwhile may overlap it: both kinds of request are idempotent in İYS (V2 adds,
// pulls stored with their cursor), so an overlap costs requests, not registrations.
func runAlone(ctx context.Context, db *pgxpool.Pool, c *Client, job string) (release func(), err error) {
	conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("iys %s: connect for its lock: %w", job, err)
	}
	fail := func(what string, err error) (func(), error) {
		conn.Close(context.Background()) //nolint:errcheck // closing the connection ends its transaction and lock
		return nil, fmt.Errorf("iys %s: %s: %w", job, what, err)
	}
	// A server (a database, a role) that ends idle transactions would end this one, and the lock with it,
	// while the run works on other connections: not on this connection.
	if _, err := conn.Exec(ctx, `BEGIN`); err != nil {
		return fail("take its lock", err)
	}
	if _, err := conn.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`); err != nil {
		return fail("take its lock", err)
	}
	const key = `hashtext('campaignctl iys ' || $1), hashtext($2)`
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(`+key+`)`, job, c.BrandCode()).Scan(&got); err != nil {
		return fail("take its lock", err)
	}
	if !got {
		c.log.Info("another iys "+job+" of this brand is running: waiting for it to finish", "brand", c.BrandCode())
		start := time.Now()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_xact_lock(`+key+`)`, job, c.BrandCode()); err != nil {
			return fail("wait for the other run to finish", err)
		}
		c.log.Info("the other iys "+job+" finished", "brand", c.BrandCode(), "waited", time.Since(start).Round(time.Millisecond).String())
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // closing the connection below ends it anyway
		conn.Close(ctx)            //nolint:errcheck
	}, nil
}
