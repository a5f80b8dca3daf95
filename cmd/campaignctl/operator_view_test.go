package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// The operator's view of the demo, through the commands: status --json says why a campaign waits
// (scheduled, outside its window, paused), and report lists every demo customer once.
func TestOperatorViewOfTheDemo(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary")
	}
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender)}
	e.mustRun("migrate")
	e.mustRun("demo", "seed", "--users", "300", "--pool", "demo")
	audience := filepath.Join(t.TempDir(), "audience.sql")
	os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600) //nolint:errcheck
	launchedAt := map[string]string{}                                                         // start_at of launch --json, by campaign
	launch := func(name string, extra ...string) string {
		t.Helper()
		out := e.mustRun(append([]string{"launch", "--name", name, "--channel", "sms", "--audience", audience,
			"--message", testPrefix + "Merhaba {{.first_name}}", "--frequency-cap", "0", "--yes", "--json"}, extra...)...)
		var rep struct {
			ID      int64
			StartAt string `json:"start_at"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
			t.Fatalf("launch: %v %s", err, out)
		}
		id := fmt.Sprint(rep.ID)
		launchedAt[id] = rep.StartAt
		return id
	}
	waiting := func(id string) (string, string) {
		t.Helper()
		var st struct {
			StartAt string `json:"start_at"`
			Waiting *struct {
				Reason, Until string
			} `json:"waiting"`
		}
		if err := json.Unmarshal([]byte(e.mustRun("status", id, "--json")), &st); err != nil {
			t.Fatal(err)
		}
		if launchedAt[id] != st.StartAt {
			t.Errorf("campaign %s: launch --json says start_at %q, status --json %q: both are in UTC", id, launchedAt[id], st.StartAt)
		}
		if st.Waiting == nil {
			return "", ""
		}
		return st.Waiting.Reason, st.Waiting.Until
	}
	// --at in a zone that is not UTC: the JSON of launch and of status both give the moment in UTC.
	istanbul, err := time.LoadLocation("Europe/Istanbul")
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().In(istanbul).Add(3 * time.Hour)
	scheduled := launch("scheduled", "--at", later.Format("2006-01-02 15:04"), "--tz", "Europe/Istanbul")
	if at := launchedAt[scheduled]; !strings.HasSuffix(at, "Z") {
		t.Errorf("launch --json --at … --tz Europe/Istanbul: start_at %q, want it in UTC", at)
	}
	closedFrom := time.Now().In(time.UTC).Add(2 * time.Hour)
	windowed := launch("windowed", "--window", closedFrom.Format("15:04")+"-"+closedFrom.Add(time.Hour).Format("15:04"), "--tz", "UTC")
	paused := launch("paused")
	e.mustRun("pause", paused)
	if r, until := waiting(scheduled); r != "scheduled" || until == "" {
		t.Errorf("a campaign launched --at three hours ahead: waiting %q until %q", r, until)
	}
	if r, _ := waiting(paused); r != "paused" {
		t.Errorf("a paused campaign: waiting %q", r)
	}
	// The window needs a running worker to be told apart from no_worker: one that can send nothing (its
	// provider points nowhere; every campaign here is held before a send).
	e.env = append(e.env, "TWILIO_ACCOUNT_SID=ACview00000000000000000000000000", "TWILIO_AUTH_TOKEN=viewtoken",
		"TWILIO_FROM=+905550000000", "TWILIO_BASE_URL=http://127.0.0.1:1", "TWILIO_RATE=0")
	e.start("worker", "worker", "--concurrency", "1")
	waitFor(t, 15*time.Second, func() bool { r, _ := waiting(windowed); return r == "window_closed" })

	// report: every demo customer of the first campaign once, planned or excluded.
	var customers, users int
	db.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT user_id) FROM customers`).Scan(&customers, &users) //nolint:errcheck
	rows, err := csv.NewReader(strings.NewReader(e.mustRun("report", paused))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rows[1:] {
		seen[r[0]]++
	}
	delete(seen, "") // rows without a user_id (excluded as missing_user_id)
	if len(rows)-1 != customers || len(seen) > users || len(seen) < users-1 {
		t.Fatalf("report: %d rows for %d users, want each of the %d demo customers once (%d users)", len(rows)-1, len(seen), customers, users)
	}
}
