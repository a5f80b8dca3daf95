package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// A launch killed outright (kill -9) while its audience query runs cannot cancel the query: the server ran
// it on, up to --statement-timeout (5 minutes by default), holding a backend and whatever it reads. The
// audience session now has the server check its client every second, and the query ends within seconds of
// the kill.
func TestAKilledLaunchLeavesNoAudienceQueryRunning(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender)}
	e.mustRun("migrate")
	e.mustRun("demo", "seed", "--users", "200", "--pool", "demo")
	// Two minutes of audience query: far longer than the test, far shorter than the statement timeout.
	audience := writeFile(t, "audience.sql", "SELECT user_id, phone, first_name FROM customers WHERE pg_sleep(120) IS NOT NULL")
	launch := exec.Command(e.bin, "launch", "--name", "killed", "--channel", "sms", "--audience", audience, "--code-pool", "demo",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--frequency-cap", "0", "--yes", "--json")
	launch.Env = e.env
	if err := launch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { launch.Process.Kill(); launch.Wait() }) //nolint:errcheck
	ctx := context.Background()
	running := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'
			AND (query LIKE '%pg_sleep(120)%' OR query LIKE '%campaignctl_audience%') AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 20*time.Second, func() bool { return running() > 0 })
	if err := launch.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	launch.Wait() //nolint:errcheck // killed
	killed := time.Now()
	waitFor(t, 10*time.Second, func() bool { return running() == 0 })
	t.Logf("the audience query ended %v after the launch was killed", time.Since(killed).Round(10*time.Millisecond))
	var campaigns int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaigns`).Scan(&campaigns); err != nil || campaigns != 0 {
		t.Errorf("%d campaigns (%v) after a launch killed during its audience query, want none", campaigns, err)
	}
}
