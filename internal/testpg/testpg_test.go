package testpg_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/internal/testpg"
)

// The helper's promise, which the crash tests of the send path stand on: with the WAL writer held, a crash
// takes back a commit made with synchronous_commit off and keeps a durable one, and a durable commit also
// makes every commit before it durable (the WAL is one sequence).
func TestCrashTakesBackOnlyWhatNoDurableCommitFollowed(t *testing.T) {
	srv := testpg.Start(t)
	ctx := context.Background()
	url := srv.URL("postgres")
	exec := func(sql string) {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE t (k text PRIMARY KEY)`)
	srv.HoldWAL()
	exec(`BEGIN; SET LOCAL synchronous_commit = off; INSERT INTO t VALUES ('async, then durable'); COMMIT`)
	exec(`INSERT INTO t VALUES ('durable')`)
	exec(`BEGIN; SET LOCAL synchronous_commit = off; INSERT INTO t VALUES ('async, last'); COMMIT`)
	srv.Crash()
	srv.Restart()

	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT k FROM t ORDER BY k`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"async, then durable": true, "durable": true}
	if len(got) != len(want) || !want[got[0]] || !want[got[1]] {
		t.Fatalf("after the crash the table holds %q, want exactly the durable row and the async one a durable commit followed\n%s", got, srv.Log())
	}
}
