package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/codes"
)

// An audience query may take a session-level advisory lock (pg_advisory_lock is executable by PUBLIC and
// allowed in a read-only transaction), here on the key the planner takes to reserve codes. A session lock
// survives the audience transaction's rollback: the audience connection went back to the pool holding it,
// and the planner's own connection then waited for it with no limit, so the launch (a dry run too) never
// ended, and every `codes generate` on the database waited with it. The audience session is now closed
// after its query: the launch ends, and no lock is left.
func TestAnAudienceQuerysSessionLockDoesNotHoldTheLaunch(t *testing.T) {
	env, count := badInputDB(t)
	db := mustConnect(t, env["DATABASE_URL"])
	ctx := context.Background()
	// Enough codes for the 3 customers.
	if _, err := db.Exec(ctx, `INSERT INTO promo_codes (pool, code) VALUES ('small', 'X3'), ('small', 'X4')`); err != nil {
		t.Fatal(err)
	}
	audience := writeFile(t, "lock.sql", fmt.Sprintf(
		`SELECT user_id, phone, first_name, pg_advisory_lock(%d)::text AS x FROM customers`, codes.WriteLockKey))
	for _, mode := range []string{"--dry-run", "--yes"} {
		type result struct {
			stdout, stderr string
			code           int
		}
		done := make(chan result, 1)
		go func() {
			stdout, stderr, code := cli(t, env, "launch", "--name", "lock"+mode, "--channel", "sms", "--audience", audience,
				"--code-pool", "small", "--message", testPrefix+"Merhaba {{.first_name}} {{.code}}", "--statement-timeout", "2s", mode)
			done <- result{stdout, stderr, code}
		}()
		select {
		case r := <-done:
			if r.code != 0 {
				t.Errorf("%s: exit %d, want 0\nstdout: %s\nstderr: %s", mode, r.code, r.stdout, r.stderr)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: the launch still runs after 20s", mode)
			// Free the test: end the sessions of this database (the holder of the lock and the waiter).
			db.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`) //nolint:errcheck
			<-done
			db = mustConnect(t, env["DATABASE_URL"])
			continue
		}
		var held int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1::bigint & 4294967295
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int64(codes.WriteLockKey)).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held != 0 {
			t.Errorf("%s: %d sessions still hold the code writers' lock after the launch", mode, held)
		}
		if _, stderr, code := cli(t, env, "codes", "generate", "--pool", "other", "--count", "1"); code != 0 {
			t.Errorf("%s: codes generate after the launch: exit %d, %s", mode, code, stderr)
		}
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 1 {
		t.Errorf("%d campaigns, want the one launched with --yes", n)
	}
}

// A float column of the audience holding NaN or Infinity (a division by zero in an analytics view, a
// 'NaN' default) is bad input, like any other value the launch cannot use: exit 2, naming the row and
// column and what to select instead. Before, it ended with exit 1 and a bare JSON encoder error.
func TestANaNInTheAudienceIsBadInput(t *testing.T) {
	env, count := badInputDB(t)
	for i, sql := range []string{
		`SELECT user_id, phone, first_name, 'NaN'::float8 AS score FROM customers`,
		`SELECT user_id, phone, first_name, 'Infinity'::float8 AS score FROM customers`,
	} {
		audience := writeFile(t, "nan.sql", sql)
		stdout, stderr, code := cli(t, env, "launch", "--name", fmt.Sprintf("nan-%d", i), "--channel", "sms", "--audience", audience,
			"--message", testPrefix+"Merhaba {{.first_name}}", "--dry-run")
		if code != 2 || !strings.Contains(stderr, "score") {
			t.Errorf("%s: exit %d, want 2 and an error naming the column score\nstdout: %s\nstderr: %s", sql, code, stdout, stderr)
		}
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Errorf("left %d campaigns", n)
	}
}
