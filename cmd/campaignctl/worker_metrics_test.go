package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// A bad --metrics-addr is bad usage (exit 2), before anything is opened; an address that cannot be
// listened on is a failure (exit 1), and no worker runs.
func TestWorkerMetricsAddrIsValidated(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"9090", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:99999", "http://127.0.0.1:9090"} {
		_, stderr, code := cli(t, map[string]string{}, "worker", "--metrics-addr", bad)
		if code != 2 || !strings.Contains(stderr, "--metrics-addr") {
			t.Errorf("--metrics-addr %q: exit %d, stderr %q; want exit 2 naming the flag", bad, code, stderr)
		}
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	env := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": redisURL,
		"TWILIO_ACCOUNT_SID": "ACe2e0000000000000000000000000000", "TWILIO_AUTH_TOKEN": "t", "TWILIO_FROM": "+905550000000",
		"TWILIO_BASE_URL": "http://127.0.0.1:1"}
	type result struct {
		stderr string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		_, stderr, code := cli(t, env, "worker", "--metrics-addr", taken.Addr().String())
		done <- result{stderr, code}
	}()
	select {
	case r := <-done:
		if r.code != 1 || !strings.Contains(r.stderr, "--metrics-addr "+taken.Addr().String()) {
			t.Fatalf("address in use: exit %d, stderr %q; want exit 1 naming the address", r.code, r.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker started although its metrics address was taken")
	}
}

// The built binary: `worker --metrics-addr` serves campaignctl's families with the exact counts of a
// campaign it sent, the campaign's progress while it runs, Asynq's queue gauges, /healthz and /readyz.
func TestWorkerMetricsEndpointOfTheBinary(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary; skipped in -short mode")
	}
	const eligible = 30
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	sb := httptest.NewServer(sandbox.New(sandbox.Options{}))
	defer sb.Close()
	env := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": redisURL,
		"TWILIO_ACCOUNT_SID": "ACe2e0000000000000000000000000000", "TWILIO_AUTH_TOKEN": "e2etoken", "TWILIO_FROM": "+905550000000",
		"TWILIO_BASE_URL": sb.URL, "SENDER_IDENTITY": testSender}
	if _, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE customers AS
		SELECT 'c' || i AS user_id, '+90532' || lpad(i::text, 7, '0') AS phone, 'Ad' || i AS first_name
		FROM generate_series(1, %d) i; GRANT SELECT ON customers TO campaignctl_audience`, eligible)); err != nil {
		t.Fatal(err)
	}
	var consents strings.Builder
	consents.WriteString("recipient,type,recipient_type,status,source,consent_date\n")
	for i := 1; i <= eligible; i++ {
		fmt.Fprintf(&consents, "+90532%07d,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00\n", i)
	}
	if _, stderr, code := cli(t, env, "iys", "import", writeFile(t, "consents.csv", consents.String())); code != 0 {
		t.Fatalf("iys import: exit %d: %s", code, stderr)
	}
	if _, stderr, code := cli(t, env, "codes", "generate", "--pool", "m", "--count", strconv.Itoa(eligible)); code != 0 {
		t.Fatalf("codes generate: exit %d: %s", code, stderr)
	}
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	// 10 a second: the campaign runs for about 3 s, long enough to see its progress.
	out, stderr, code := cli(t, env, "launch", "--name", "metrics", "--channel", "sms", "--audience", audience, "--code-pool", "m",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--rate", "10", "--yes", "--json")
	if code != 0 {
		t.Fatalf("launch: exit %d: %s", code, stderr)
	}
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int64 `json:"eligible"`
		Batches  int   `json:"batches"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Eligible != eligible {
		t.Fatalf("launch report %s (%v)", out, err)
	}

	addr := freeAddr(t)
	procEnv := os.Environ()
	for k, v := range env {
		procEnv = append(procEnv, k+"="+v)
	}
	e := &e2eEnv{t: t, bin: binary(t), env: procEnv}
	pprofAddr := freeAddr(t)
	e.start("worker", "worker", "--concurrency", "2", "--metrics-addr", addr, "--pprof-addr", pprofAddr)
	base := "http://" + addr
	waitFor(t, 20*time.Second, func() bool {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})

	// diag says where the campaign stands, for a failure message.
	diag := func() string {
		var b strings.Builder
		var state string
		db.QueryRow(ctx, `SELECT state FROM campaigns WHERE id = $1`, rep.ID).Scan(&state) //nolint:errcheck
		fmt.Fprintf(&b, "campaign %d is %s;", rep.ID, state)
		rows, err := db.Query(ctx, `SELECT status, count(*) FROM campaign_recipients WHERE campaign_id = $1 GROUP BY status`, rep.ID)
		if err == nil {
			for rows.Next() {
				var st string
				var n int64
				rows.Scan(&st, &n) //nolint:errcheck
				fmt.Fprintf(&b, " %s %d", st, n)
			}
			rows.Close()
		}
		for _, line := range strings.Split(scrape(t, base+"/metrics"), "\n") {
			if strings.HasPrefix(line, "campaignctl_sends_total") || strings.HasPrefix(line, "campaignctl_campaign_recipients") || strings.HasPrefix(line, "asynq_tasks_enqueued_total") {
				b.WriteString("\n" + line)
			}
		}
		return b.String()
	}
	until := func(timeout time.Duration, what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(timeout); !cond(); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v; %s", what, timeout, diag())
			}
		}
	}

	// Profiles, for `go tool pprof`, on their own loopback address.
	if body := scrape(t, "http://"+pprofAddr+"/debug/pprof/"); !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ on --pprof-addr: %.200s", body)
	}

	// While it runs: its progress, read from the Redis counters.
	campaignLabel := fmt.Sprintf(`{campaign="%d",status=`, rep.ID)
	until(20*time.Second, "progress of the running campaign", func() bool {
		sent, ok := sample(scrape(t, base+"/metrics"), "campaignctl_campaign_recipients"+campaignLabel+`"sent"}`)
		return ok && sent > 0
	})
	body := scrape(t, base+"/metrics")
	if planned, _ := sample(body, "campaignctl_campaign_recipients"+campaignLabel+`"planned"}`); planned != eligible {
		t.Errorf("campaign progress: planned %v, want %d", planned, eligible)
	}

	// Once it is done: exact counts.
	until(30*time.Second, "campaign completed", func() bool {
		var state string
		db.QueryRow(ctx, `SELECT state FROM campaigns WHERE id = $1`, rep.ID).Scan(&state) //nolint:errcheck
		return state == "completed"
	})
	body = scrape(t, base+"/metrics")
	for series, want := range map[string]float64{
		`campaignctl_sends_total{channel="sms",outcome="sent",provider="twilio"}`:       eligible,
		`campaignctl_sends_total{channel="sms",outcome="failed",provider="twilio"}`:     0,
		`campaignctl_sends_total{channel="sms",outcome="unknown",provider="twilio"}`:    0,
		`campaignctl_provider_request_duration_seconds_count{provider="twilio"}`:        eligible,
		`campaignctl_limiter_wait_seconds_count{key_kind="campaign",provider="twilio"}`: eligible,
		`campaignctl_limiter_wait_seconds_count{key_kind="provider",provider="twilio"}`: eligible,
		`campaignctl_claims_refused_total`:                                              0,
		`campaignctl_retries_total{provider="twilio",reason="5xx"}`:                     0,
		`asynq_queue_size{queue="campaigns"}`:                                           0,
		`asynq_tasks_enqueued_total{queue="campaigns",state="pending"}`:                 0,
		`asynq_queue_paused_total{queue="campaigns"}`:                                   0,
	} {
		got, ok := sample(body, series)
		if !ok || got != want {
			t.Errorf("%s = %v (exported: %v), want %v", series, got, ok, want)
		}
	}
	if processed, ok := sample(body, `asynq_tasks_processed_total{queue="campaigns"}`); !ok || processed < float64(rep.Batches) {
		t.Errorf("asynq_tasks_processed_total = %v (exported: %v), want at least %d batches", processed, ok, rep.Batches)
	}
	// The waits are recorded, and the cap held: 30 messages at 10/s take about 3 s. How much of that the
	// limiter waited depends on how long the sends themselves took (on a loaded machine, nearly all of it).
	var took float64
	if err := db.QueryRow(ctx, `SELECT extract(epoch FROM finished_at - started_at) FROM campaigns WHERE id = $1`, rep.ID).Scan(&took); err != nil {
		t.Fatal(err)
	}
	if wait, _ := sample(body, `campaignctl_limiter_wait_seconds_sum{key_kind="campaign",provider="twilio"}`); wait <= 0 || took < 2.5 || (wait < 1 && took < 5) {
		t.Errorf("campaign limiter waited %vs in all for 30 messages at 10/s, which took %vs; want about 3 s in all", wait, took)
	}
	// Finished campaigns leave the progress gauges.
	if strings.Contains(body, "campaignctl_campaign_recipients"+campaignLabel) {
		t.Errorf("a completed campaign is still reported")
	}
	if got := len(sb.Config.Handler.(*sandbox.Server).Messages()); got != eligible {
		t.Errorf("sandbox accepted %d messages, want %d", got, eligible)
	}
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz: %d", resp.StatusCode)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// sample finds series (name and labels exactly as exposed, labels sorted) in a text exposition.
func sample(body, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), series+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		return v, err == nil
	}
	return 0, false
}
