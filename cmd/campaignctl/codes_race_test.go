package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/codes"
)

// procResult is how one campaignctl process ended.
type procResult struct {
	stdout, stderr string
	code           int
}

// raceProcesses starts one campaignctl process per argument list while the test holds the lock that code
// writers and the launch planner's reservation take (codes.WriteLockKey), waits until every process is
// queued for it, and lets them all go at once: launches and code writers contend at the reservation
// itself, not at start-up. It returns how each process ended.
func raceProcesses(t *testing.T, e *e2eEnv, db *pgxpool.Pool, argv ...[]string) []procResult {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(codes.WriteLockKey)); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(codes.WriteLockKey)) //nolint:errcheck
		}
	}
	defer unlock()

	res := make([]procResult, len(argv))
	var running atomic.Int64
	var done sync.WaitGroup
	for i, args := range argv {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(pctx, e.bin, args...)
		cmd.Env = e.env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		running.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			defer running.Add(-1)
			cmd.Wait() //nolint:errcheck
			res[i] = procResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var queued int64
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = $1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int64(codes.WriteLockKey)).Scan(&queued); err != nil {
			t.Fatal(err)
		}
		if queued == int64(len(argv)) {
			break
		}
		if running.Load() < int64(len(argv)) || time.Now().After(deadline) {
			unlock()
			done.Wait()
			t.Fatalf("%d of %d processes queued for the code lock; they ended: %+v", queued, len(argv), res)
		}
		time.Sleep(time.Millisecond) // polling pg_locks: the only way to see a lock queue
	}
	unlock()
	done.Wait()
	return res
}

// checkCodesHeldOnce checks over the whole database that no code is held by two recipients, that no held
// code is also free (above its pool's cursor, or released), and that the pools' counts add up: every code
// is held by one recipient or free.
func checkCodesHeldOnce(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	for _, c := range []struct{ what, sql string }{
		{"code ids held twice", `SELECT count(*) - count(DISTINCT code_id) FROM campaign_recipients WHERE code_id IS NOT NULL`},
		{"codes held twice", `SELECT count(*) - count(DISTINCT code) FROM campaign_recipients WHERE code IS NOT NULL`},
		{"held codes above their pool's cursor", `SELECT count(*) FROM campaign_recipients r JOIN promo_codes p ON p.id = r.code_id
			JOIN code_pools cp ON cp.name = p.pool WHERE p.id > cp.next_id`},
		{"held codes also released", `SELECT count(*) FROM campaign_recipients r JOIN released_codes rc ON rc.code_id = r.code_id`},
		{"codes neither held nor free", `SELECT count(*) FROM promo_codes p JOIN code_pools cp ON cp.name = p.pool
			WHERE p.id <= cp.next_id AND NOT EXISTS (SELECT 1 FROM released_codes rc WHERE rc.code_id = p.id)
			  AND NOT EXISTS (SELECT 1 FROM campaign_recipients r WHERE r.code_id = p.id)`},
		{"recipients of campaigns that do not exist", `SELECT count(*) FROM campaign_recipients r
			WHERE NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.id = r.campaign_id)`},
	} {
		var n int64
		if err := db.QueryRow(context.Background(), c.sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d %s", n, c.what)
		}
	}
}

// Two `campaignctl launch` processes on one pool, let go at the reservation at the same instant: when the
// pool covers one launch only, one succeeds and the other exits 2 saying how many codes are missing, with
// no campaign written; when it covers both, both succeed, also with `codes generate` and `codes import`
// processes adding to the same pool at the same instant (the import offering codes the launches give
// out). No code is ever held twice, and `codes stats` adds up.
func TestLaunchProcessesRacingOnOnePool(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs campaignctl processes; skipped in -short mode")
	}
	env, _ := badInputDB(t)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const size = 300
	for _, sql := range []string{
		fmt.Sprintf(`CREATE TABLE crowd AS SELECT 'k' || i AS user_id, '+90533' || lpad(i::text, 7, '0') AS phone, 'Ad' || i AS first_name
		 FROM generate_series(1, %d) i`, size),
		`GRANT SELECT ON crowd TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM crowd`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(), "DATABASE_URL="+env["DATABASE_URL"], "REDIS_URL="+env["REDIS_URL"],
		"SENDER_IDENTITY="+testSender)}
	audience := writeFile(t, "crowd.sql", "SELECT user_id, phone, first_name FROM crowd ORDER BY user_id")
	launch := func(name, pool string) []string {
		return []string{"launch", "--name", name, "--channel", "sms", "--audience", audience, "--code-pool", pool,
			"--message", testPrefix + "Merhaba {{.first_name}} {{.code}}", "--yes", "--json"}
	}
	campaignNamed := func(name string) int64 {
		var n int64
		if err := db.QueryRow(ctx, `SELECT count(*) FROM campaigns WHERE name = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	for round := 1; round <= 2; round++ {
		pool := fmt.Sprintf("one%d", round)
		e.mustRun("codes", "generate", "--pool", pool, "--count", fmt.Sprint(size+size/2))
		names := []string{pool + "-a", pool + "-b"}
		res := raceProcesses(t, e, db, launch(names[0], pool), launch(names[1], pool))
		won := -1
		for i, r := range res {
			switch r.code {
			case 0:
				var rep struct{ ID int64 }
				if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.ID == 0 || won >= 0 {
					t.Fatalf("round %d: launch %s exit 0, printed %q (another succeeded: %v)", round, names[i], r.stdout, won >= 0)
				}
				won = i
			case 2:
				want := fmt.Sprintf(`code pool %q has %d free codes but %d recipients are eligible: %d codes missing`, pool, size/2, size, size/2)
				if !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, "SQLSTATE") {
					t.Errorf("round %d: refused launch %s said %q; want %q", round, names[i], r.stderr, want)
				}
				if r.stdout != "" {
					t.Errorf("round %d: refused launch %s printed %q", round, names[i], r.stdout)
				}
				if campaignNamed(names[i]) != 0 {
					t.Errorf("round %d: refused launch %s left its campaign", round, names[i])
				}
			default:
				t.Errorf("round %d: launch %s exit %d, want 0 or 2\nstdout: %s\nstderr: %s", round, names[i], r.code, r.stdout, r.stderr)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: no launch succeeded: %+v", round, res)
		}
		want := []map[string]any{{"pool": pool, "total": float64(size + size/2), "free": float64(size / 2), "reserved": float64(size)}}
		if diff := cmp.Diff(want, poolStatsJSON(t, env, "--pool", pool)); diff != "" {
			t.Errorf("round %d: codes stats --json (-want +got):\n%s", round, diff)
		}
		checkCodesHeldOnce(t, db)
	}

	// The pool covers both launches; codes generate and codes import race them on it.
	e.mustRun("codes", "generate", "--pool", "both", "--count", fmt.Sprint(2*size))
	var file strings.Builder
	rows, err := db.Query(ctx, `SELECT code FROM promo_codes WHERE pool = 'both' ORDER BY id LIMIT 10`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		rows.Scan(&c) //nolint:errcheck
		fmt.Fprintln(&file, c)
	}
	rows.Close()
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&file, "IMP-%04d\n", i)
	}
	codesFile := filepath.Join(t.TempDir(), "codes.txt")
	if err := os.WriteFile(codesFile, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	res := raceProcesses(t, e, db, launch("both-a", "both"), []string{"codes", "generate", "--pool", "both", "--count", "100"},
		launch("both-b", "both"), []string{"codes", "import", "--pool", "both", codesFile})
	for i, r := range res {
		if r.code != 0 {
			t.Errorf("process %d exit %d\nstdout: %s\nstderr: %s", i, r.code, r.stdout, r.stderr)
		}
	}
	if res[1].stdout != "pool both: 100 new codes\n" || res[3].stdout != "pool both: 60 codes read, 50 new, 10 already known\n" {
		t.Errorf("generate printed %q, import %q", res[1].stdout, res[3].stdout)
	}
	want := []map[string]any{{"pool": "both", "total": float64(2*size + 150), "free": 150.0, "reserved": float64(2 * size)}}
	if diff := cmp.Diff(want, poolStatsJSON(t, env, "--pool", "both")); diff != "" {
		t.Errorf("codes stats --json (-want +got):\n%s", diff)
	}
	checkCodesHeldOnce(t, db)
}
