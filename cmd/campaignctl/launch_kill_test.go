package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestLaunchKilledAtAnyPointPlansNobodyTwice kills launches with SIGKILL at points spread over the whole
// plan (before the audience query returns, while rows stream, during the set-based statements, around
// the commit, during the enqueue). After each kill the campaign either does not exist at all (the plan is
// one transaction: launching again under the same name works) or exists with every eligible recipient
// planned exactly once, and `resume` queues what the launch did not. No code is ever held twice.
func TestLaunchKilledAtAnyPointPlansNobodyTwice(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills processes; skipped in -short mode")
	}
	env, _ := badInputDB(t)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const eligible = 3000
	for _, sql := range []string{
		`CREATE TABLE big AS SELECT 'k' || i AS user_id, '+90533' || lpad(i::text, 7, '0') AS phone, 'Ad' || i AS first_name
		 FROM generate_series(1, 4000) i`,
		`GRANT SELECT ON big TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM big WHERE substr(user_id, 2)::int <= 3000`,
		`INSERT INTO iys_sync_state (source, last_success_at) VALUES ('import', now()) ON CONFLICT (brand_code, source) DO UPDATE SET last_success_at = now()`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	bin := binary(t)
	e := &e2eEnv{t: t, bin: bin, env: append(os.Environ(), "DATABASE_URL="+env["DATABASE_URL"], "REDIS_URL="+env["REDIS_URL"], "SENDER_IDENTITY="+testSender)}
	e.mustRun("codes", "generate", "--pool", "kill", "--count", "40000")
	audience := filepath.Join(t.TempDir(), "a.sql")
	// pg_sleep holds the first row back a little, so early kills land inside the audience query.
	os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM big, pg_sleep(0.05) ORDER BY user_id"), 0o600) //nolint:errcheck
	args := func(name string) []string {
		return []string{"launch", "--name", name, "--channel", "sms", "--audience", audience, "--code-pool", "kill",
			"--message", testPrefix + "Merhaba {{.first_name}} {{.code}}", "--yes", "--json"}
	}

	// How long a whole launch takes here, to spread the kills over it.
	start := time.Now()
	e.mustRun(args("timing")...)
	whole := time.Since(start)

	for i := 0; i < 10; i++ {
		name := fmt.Sprintf("killed-%d", i)
		cmd := exec.Command(bin, args(name)...)
		cmd.Env = e.env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(whole * time.Duration(i+1) / 10)
		cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
		cmd.Wait()                          //nolint:errcheck
		// The killed process's backend may still be finishing a COMMIT it had received; wait for it.
		waitFor(t, 30*time.Second, func() bool {
			var busy int64
			db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND pid <> pg_backend_pid() AND state NOT IN ('idle')`).Scan(&busy) //nolint:errcheck
			return busy == 0
		})

		var id int64
		err := db.QueryRow(ctx, `SELECT id FROM campaigns WHERE name = $1`, name).Scan(&id)
		if err != nil {
			// Killed before the commit: nothing of it may remain, and the same name launches afresh.
			t.Logf("kill %d: before the commit", i)
			out := e.mustRun(args(name)...)
			var rep struct{ ID int64 }
			json.Unmarshal([]byte(out), &rep) //nolint:errcheck
			id = rep.ID
		} else {
			// Killed after the commit: resume queues whatever the launch had not.
			t.Logf("kill %d: after the commit", i)
			out := e.mustRun("resume", fmt.Sprint(id))
			if !strings.Contains(out, "batches re-enqueued") {
				t.Fatalf("resume after kill %d: %s", i, out)
			}
		}
		var planned, distinct int64
		if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT user_id) FROM campaign_recipients WHERE campaign_id = $1`, id).Scan(&planned, &distinct); err != nil {
			t.Fatal(err)
		}
		if planned != eligible || distinct != eligible {
			t.Fatalf("kill %d (%v into the launch): campaign %d planned %d rows for %d users, want %d each",
				i, whole*time.Duration(i+1)/10, id, planned, distinct, eligible)
		}
		out := e.mustRun("status", fmt.Sprint(id), "--json")
		var st map[string]any
		json.Unmarshal([]byte(out), &st) //nolint:errcheck
		if st["pending"] != float64(eligible) {
			t.Fatalf("kill %d: status %v", i, st)
		}
		if err := db.QueryRow(ctx, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1 AND enqueued_at IS NULL`, id).Scan(&planned); err != nil || planned != 0 {
			t.Fatalf("kill %d: %d batches never queued after resume (%v)", i, planned, err)
		}
	}
	var dup int64
	if err := db.QueryRow(ctx, `SELECT count(*) - count(DISTINCT code) FROM campaign_recipients WHERE code IS NOT NULL`).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	if dup != 0 {
		t.Fatalf("%d codes are held by more than one recipient", dup)
	}
	var orphans int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients r WHERE NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.id = r.campaign_id)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Fatalf("%d recipients of campaigns that do not exist", orphans)
	}
}
