package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A push campaign launched on an audience database of its own (AUDIENCE_DATABASE_URL), before any worker
// runs; then five people switch push off in the app. The worker reads the opt-ins again from the same
// audience database when it sends: the five get nothing and the report says revoked. Before, the launch's
// reading stood, and all were sent.
func TestEndToEndPushOptInWithdrawnBeforeTheSend(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	_, dbURL := testdb.New(t)
	audience, audienceURL := testdb.New(t) // the shop's database: the devices live only here
	ctx := context.Background()
	e, sandboxAddr, dir := pushE2E(t, "DATABASE_URL="+dbURL, "AUDIENCE_DATABASE_URL="+audienceURL)
	e.mustRun("migrate")
	for _, sql := range []string{
		`CREATE TABLE devices AS SELECT i AS id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 30) i`,
		`ALTER TABLE devices ADD PRIMARY KEY (id)`,
		`GRANT SELECT ON devices TO campaignctl_audience`,
	} {
		if _, err := audience.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	pushSQL := filepath.Join(dir, "push.sql")
	os.WriteFile(pushSQL, []byte("SELECT id AS user_id, push_token, push_opt_in FROM devices;\n"), 0o600) //nolint:errcheck
	out := e.mustRun("launch", "--name", "optin", "--channel", "push", "--audience", pushSQL, "--subject", "Merhaba",
		"--message", "Size özel bir fırsat", "--frequency-cap", "0", "--yes", "--json")
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int64 `json:"eligible"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Eligible != 30 {
		t.Fatalf("launch: %+v (%v)\n%s", rep, err, out)
	}
	if _, err := audience.Exec(ctx, `UPDATE devices SET push_opt_in = false WHERE id <= 5`); err != nil {
		t.Fatal(err)
	}

	e.start("sandbox", "sandbox", "--addr", sandboxAddr)
	waitFor(t, 10*time.Second, func() bool { return listening(sandboxAddr) })
	e.start("worker", "worker", "--concurrency", "2")
	id := fmt.Sprint(rep.ID)
	waitFor(t, 60*time.Second, func() bool {
		var st map[string]any
		json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st) //nolint:errcheck
		return st["state"] == "completed"
	})
	got := map[string]int{}
	for _, m := range sandboxMessages(t, sandboxAddr) {
		if m.Provider == "fcm" {
			got[m.To]++
		}
	}
	for i := 1; i <= 30; i++ {
		want := 1
		if i <= 5 {
			want = 0
		}
		if n := got[fmt.Sprintf("tok-%d", i)]; n != want {
			t.Errorf("tok-%d got %d notifications, want %d", i, n, want)
		}
	}
	var st struct {
		Skipped         int64            `json:"skipped"`
		SkippedByReason map[string]int64 `json:"skipped_by_reason"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.SkippedByReason["revoked"] != 5 {
		t.Fatalf("status: %+v; want the 5 who switched push off skipped as revoked", st)
	}
}
