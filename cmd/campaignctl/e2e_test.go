package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds campaignctl once per test run.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "campaignctl-e2e")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "campaignctl")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		// The port is free until someone listens on it: the kernel may offer it again before the process it
		// is meant for has started (a worker given the same port for metrics and pprof could not start).
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
}

// handedOut holds the addresses freeAddr gave in this test binary.
var handedOut sync.Map

// e2eEnv is the environment every process of one end-to-end run shares.
type e2eEnv struct {
	t   *testing.T
	bin string
	env []string
}

func (e *e2eEnv) run(args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, args...)
	cmd.Env = e.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code <= 0 {
		e.t.Fatalf("campaignctl %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (e *e2eEnv) mustRun(args ...string) string {
	e.t.Helper()
	out, errs, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("campaignctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// start runs a long-lived campaignctl process until the test ends (SIGTERM, then wait).
func (e *e2eEnv) start(name string, args ...string) *bytes.Buffer {
	e.t.Helper()
	cmd := exec.Command(e.bin, args...)
	cmd.Env = e.env
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt) //nolint:errcheck
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }() //nolint:errcheck
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
		}
		if e.t.Failed() {
			e.t.Logf("%s output:\n%s", name, tail(logs.String(), 3000))
		}
	})
	return &logs
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// TestEndToEndSMSCampaign runs the built binary: consents imported from CSV, codes generated, a
// 5,000-recipient campaign launched and sent by two worker processes through the Twilio sandbox (with
// 1 % 503 and 0.2 % 429 injected). From the provider's side: every eligible number got exactly one
// message, nobody without consent got one, every code is unique, and the rate cap held.
func TestEndToEndSMSCampaign(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	const eligible = 5000
	const rate = 2500.0
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	sandboxAddr := freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"TWILIO_ACCOUNT_SID=ACe2e0000000000000000000000000000", "TWILIO_AUTH_TOKEN=e2etoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, fmt.Sprintf("TWILIO_RATE=%g", rate), "SENDER_IDENTITY="+testSender,
	)}

	e.mustRun("migrate")
	// 5,000 customers with ONAY, 300 with RET, 200 without any consent row.
	if _, err := db.Exec(ctx, `CREATE TABLE customers AS
		SELECT 'c' || i AS user_id, '0532 ' || lpad(i::text, 7, '0') AS phone, 'Müşteri' || i AS first_name
		FROM generate_series(1, 5500) i; GRANT SELECT ON customers TO campaignctl_audience`); err != nil {
		t.Fatal(err)
	}
	csv := filepath.Join(t.TempDir(), "consents.csv")
	var b strings.Builder
	b.WriteString("recipient,type,recipient_type,status,source,consent_date\n")
	for i := 1; i <= 5300; i++ {
		status := "ONAY"
		if i > eligible {
			status = "RET"
		}
		fmt.Fprintf(&b, "+90532%07d,MESAJ,BIREYSEL,%s,HS_WEB,2026-01-15 10:30:00\n", i, status)
	}
	if err := os.WriteFile(csv, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	e.mustRun("iys", "import", csv)
	e.mustRun("codes", "generate", "--pool", "e2e", "--count", "5000", "--prefix", "E2E-")
	audience := filepath.Join(t.TempDir(), "audience.sql")
	os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600) //nolint:errcheck

	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--fail-503", "0.01", "--fail-429", "0.002")
	waitFor(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + sandboxAddr + "/_sandbox/stats")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	e.start("worker 1", "worker", "--concurrency", "8")
	e.start("worker 2", "worker", "--concurrency", "8")

	// --watch with --json: the launch returns when the campaign is over, and stdout holds the launch
	// report alone (the progress and the campaign's end go to stderr).
	out := e.mustRun("launch", "--name", "e2e", "--channel", "sms", "--audience", audience, "--code-pool", "e2e",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--yes", "--json", "--watch")
	var rep struct {
		ID       int64            `json:"id"`
		Eligible int64            `json:"eligible"`
		Excluded map[string]int64 `json:"excluded"`
		Batches  int              `json:"batches"`
		Enqueued int              `json:"enqueued"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	if rep.ID == 0 || rep.Eligible != eligible || rep.Excluded["consent_ret"] != 300 || rep.Excluded["no_consent"] != 200 ||
		rep.Batches != campaign.SpreadBatches || rep.Enqueued != campaign.SpreadBatches {
		// 5000 eligible spread over 64 batches of 79 (one run each), not 10 of 500.
		t.Fatalf("launch report %+v", rep)
	}

	var st map[string]any
	waitFor(t, 90*time.Second, func() bool {
		out := e.mustRun("status", fmt.Sprint(rep.ID), "--json")
		st = map[string]any{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		return st["state"] == "completed"
	})
	for k, want := range map[string]float64{"planned": eligible, "sent": eligible, "pending": 0, "failed": 0, "unknown": 0, "dlq": 0, "eligible": eligible, "audience": 5500} {
		if st[k] != want {
			t.Errorf("status %s = %v, want %v", k, st[k], want)
		}
	}

	resp, err := http.Get("http://" + sandboxAddr + "/_sandbox/messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var msgs []sandbox.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	perTo := map[string]int{}
	codes := map[string]bool{}
	codeRE := regexp.MustCompile(`kodunuz (E2E-[A-Z0-9]+)$`)
	for _, m := range msgs {
		perTo[m.To]++
		mm := codeRE.FindStringSubmatch(m.Body)
		if mm == nil {
			t.Fatalf("message %q carries no code", m.Body)
		}
		if codes[mm[1]] {
			t.Errorf("code %s sent twice", mm[1])
		}
		codes[mm[1]] = true
	}
	if len(msgs) != eligible || len(perTo) != eligible {
		t.Errorf("sandbox accepted %d messages to %d numbers, want %d each", len(msgs), len(perTo), eligible)
	}
	for i := 1; i <= 5500; i++ {
		to := fmt.Sprintf("+90532%07d", i)
		want := 0
		if i <= eligible {
			want = 1
		}
		if perTo[to] != want {
			t.Fatalf("%s got %d messages, want %d", to, perTo[to], want)
		}
	}

	// The cap held over both workers: no one-second window above the rate plus the bucket's burst.
	sort.Slice(msgs, func(i, j int) bool { return msgs[i].At.Before(msgs[j].At) })
	maxIn := 0
	for i, j := 0, 0; j < len(msgs); j++ {
		for msgs[j].At.Sub(msgs[i].At) >= time.Second {
			i++
		}
		maxIn = max(maxIn, j-i+1)
	}
	if limit := int(rate*1.1) + 5; maxIn > limit {
		t.Errorf("%d messages within one second; the cap is %g/s", maxIn, rate)
	}
	t.Logf("5000 messages, busiest second %d (cap %g/s)", maxIn, rate)
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// smsSandboxEnv prepares an SMS run of the built binary: its own database and Redis DB, Twilio settings
// pointing at a sandbox (started with sandboxArgs and waited for) under TWILIO_RATE rate, the demo seed's
// customers for n eligible recipients and the audience query over them. The workers are the caller's.
func smsSandboxEnv(t *testing.T, n int, rate string, sandboxArgs ...string) (e *e2eEnv, sandboxAddr, audience string) {
	t.Helper()
	_, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	sandboxAddr = freeAddr(t)
	e = &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"TWILIO_ACCOUNT_SID=ACsms0000000000000000000000000000", "TWILIO_AUTH_TOKEN=smstoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, "TWILIO_RATE="+rate, "SENDER_IDENTITY="+testSender,
	)}
	e.mustRun("migrate")
	e.mustRun("demo", "seed", "--users", strconv.Itoa(chaosUsersFor(n)), "--pool", "demo")
	audience = writeFile(t, "audience.sql", "SELECT user_id, phone, first_name FROM customers")
	e.start("sandbox", append([]string{"sandbox", "--addr", sandboxAddr}, sandboxArgs...)...)
	waitFor(t, 10*time.Second, func() bool { _, err := chaosAccepted(sandboxAddr); return err == nil })
	return e, sandboxAddr, audience
}

// launchSMS launches an SMS campaign of the audience with the demo pool's codes, no frequency cap, and
// message after the sender's prefix; it returns the campaign's ID and the batches enqueued.
func launchSMS(e *e2eEnv, name, audience, message string, flags ...string) (id string, enqueued int) {
	e.t.Helper()
	out := e.mustRun(append([]string{"launch", "--name", name, "--channel", "sms", "--audience", audience, "--code-pool", "demo",
		"--message", testPrefix + message, "--frequency-cap", "0", "--yes", "--json"}, flags...)...)
	var rep struct {
		ID       int64 `json:"id"`
		Enqueued int   `json:"enqueued"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		e.t.Fatalf("launch --json: %v\n%s", err, out)
	}
	return strconv.FormatInt(rep.ID, 10), rep.Enqueued
}
