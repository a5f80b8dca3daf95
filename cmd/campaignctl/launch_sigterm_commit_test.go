package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testpg"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// TestLaunchStoppedDuringItsCommitDoesNotSayNothingWasWritten stops a launch (SIGTERM: Ctrl-C, a deploy,
// a CI timeout) while its plan's COMMIT is on its way. Here the COMMIT waits for a synchronous standby that
// is not answering (synchronous_standby_names names one that is gone); in the field the same window is any
// slow COMMIT (a WAL fsync on a busy disk). pgx answers the cancelled context by closing the connection
// and sending a cancel request, but a COMMIT the server is running cannot be taken back: Postgres says
// "canceling wait for synchronous replication ... the transaction has already committed locally". So the
// campaign exists, running, its recipients planned and its codes taken from the pool, none of its batches
// queued. The launch tells the operator "launch interrupted: nothing was written or sent". Told that, the
// operator launches again (the name is refused, the codes are gone from the pool) or, under another name,
// plans the same audience a second time, while the first campaign sits running for the next `resume` (or
// the UI's) to send it.
func TestLaunchStoppedDuringItsCommitDoesNotSayNothingWasWritten(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a private Postgres; skipped in -short mode")
	}
	srv := testpg.Start(t)
	db, dbURL := srv.Migrated("launchcommit")
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	// From the last two statements on, every commit waits for a standby that never answers.
	for _, sql := range append(threeCustomers("X1", "X2", "X3"),
		`ALTER SYSTEM SET synchronous_standby_names = 'gone'`, `SELECT pg_reload_conf()`) {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		db.Exec(context.Background(), `ALTER SYSTEM RESET synchronous_standby_names`) //nolint:errcheck
		db.Exec(context.Background(), `SELECT pg_reload_conf()`)                      //nolint:errcheck
	})
	count := func(sql string) int64 {
		var n int64
		if err := db.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}

	bin := binary(t)
	audience := filepath.Join(t.TempDir(), "a.sql")
	os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600) //nolint:errcheck
	env := append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender)
	args := []string{"launch", "--name", "yaz", "--channel", "sms", "--audience", audience, "--code-pool", "small",
		"--message", testPrefix + "Merhaba {{.first_name}} {{.code}}", "--yes"}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The launch's backend has its COMMIT and waits for the standby.
	waitFor(t, 60*time.Second, func() bool {
		var n int64
		db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND pid <> pg_backend_pid() AND wait_event = 'SyncRep'`).Scan(&n) //nolint:errcheck
		return n > 0
	})
	cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
	werr := cmd.Wait()

	var state string
	db.QueryRow(ctx, `SELECT state FROM campaigns WHERE name = 'yaz'`).Scan(&state) //nolint:errcheck
	planned := count(`SELECT count(*) FROM campaign_recipients`)
	coded := count(`SELECT count(*) FROM campaign_recipients WHERE code IS NOT NULL`)
	queued := count(`SELECT count(*) FROM campaign_batches WHERE enqueued_at IS NOT NULL`)
	t.Logf("launch: %v; stderr: %q; campaign yaz: %q, %d recipients (%d with a code), %d batches queued", werr,
		strings.TrimSpace(stderr.String()), state, planned, coded, queued)
	if state == "" {
		t.Skip("the COMMIT did not go through: nothing to check")
	}
	if strings.Contains(stderr.String(), "nothing was written") {
		// What the operator does next, having been told nothing was written: the same launch again.
		db.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`) //nolint:errcheck
		db.Exec(ctx, `SELECT pg_reload_conf()`)                      //nolint:errcheck
		again := exec.Command(bin, args...)
		again.Env = env
		out, _ := again.CombinedOutput()
		t.Fatalf("the launch said %q, but campaign yaz is %s with %d recipients planned and %d codes reserved, no batch queued;\n"+
			"launching it again (exit %d): %s", strings.TrimSpace(stderr.String()), state, planned, coded, again.ProcessState.ExitCode(), strings.TrimSpace(string(out)))
	}
	// The operator is told what there is and how to finish it.
	if !strings.Contains(stderr.String(), "campaignctl resume 1") {
		t.Fatalf("the launch of campaign 1 (written, %s, not queued) said %q: it must name the campaign and how to send it (`campaignctl resume 1`)",
			state, strings.TrimSpace(stderr.String()))
	}
}
