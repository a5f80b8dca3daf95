package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/worker"

	"github.com/campaignctl/campaignctl/internal/testlog"
)

// uiServer is a `campaignctl ui` (or another serving command) running in-process.
type uiServer struct {
	base   string // http://127.0.0.1:PORT
	stderr *testlog.Buffer
	stop   func() error // cancels the command's context (as SIGTERM does) and returns what it returned
}

var uiURLRe = regexp.MustCompile(`http://(\S+?)/`)

// uiStart runs `campaignctl ui ARGS` in-process on a fresh command tree, as run() does, but with a context
// the test cancels, and returns once it has printed its URL.
func uiStart(t *testing.T, env map[string]string, args ...string) *uiServer {
	t.Helper()
	return serveInProcess(t, env, uiURLRe, append([]string{"ui"}, args...)...)
}

// serveInProcess runs the serving command of args in-process, as uiStart does, and returns once its
// stderr matches urlRe, whose first group is the host:port it listens on.
func serveInProcess(t *testing.T, env map[string]string, urlRe *regexp.Regexp, args ...string) *uiServer {
	t.Helper()
	name := args[0]
	errb := &testlog.Buffer{}
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: errb, getenv: func(k string) string { return env[k] }}
	root := a.newRootCmd()
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(errb)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	var (
		once   sync.Once
		result error
	)
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(20 * time.Second):
				t.Errorf("%s did not stop within 20s of its context being cancelled\n%s", name, errb)
			}
		})
		return result
	}
	t.Cleanup(func() { stop() }) //nolint:errcheck // checked by the tests that care

	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := urlRe.FindStringSubmatch(errb.String()); m != nil {
			host, port, err := net.SplitHostPort(m[1])
			if err != nil {
				t.Fatalf("%s printed a URL without a port: %s", name, errb)
			}
			if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
				host = "127.0.0.1"
			}
			return &uiServer{base: "http://" + net.JoinHostPort(host, port), stderr: errb, stop: stop}
		}
		select {
		case err := <-done:
			t.Fatalf("%s exited before serving: %v\n%s", name, err, errb)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no URL within 20s:\n%s", name, errb)
		}
	}
}

// uiDo sends one request and returns the status, headers and body.
func uiDo(t *testing.T, method, url string, hdr map[string]string, auth ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if len(auth) == 2 {
		req.SetBasicAuth(auth[0], auth[1])
	}
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// uiEnqueue puts campaign batches on the campaigns queue, as launch does.
func uiEnqueue(t *testing.T, rdb *redis.Client, campaignID int64, batches ...int) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(rdb)
	for _, b := range batches {
		task, err := worker.NewBatchTask(campaignID, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task); err != nil {
			t.Fatalf("enqueue batch %d: %v", b, err)
		}
	}
}

type uiQueue struct {
	Queue   string `json:"queue"`
	Size    int    `json:"size"`
	Pending int    `json:"pending"`
	Paused  bool   `json:"paused"`
}

type uiTask struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Payload string `json:"payload"`
}

func uiDecode(t *testing.T, what, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%s: not the JSON asynqmon answers (%v): %.300s", what, err, body)
	}
}

func TestUIPayloadFormatter(t *testing.T) {
	t.Parallel()
	task, err := worker.NewBatchTask(42, 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		typ, payload, want string
	}{
		{task.Type(), string(task.Payload()), "campaign 42, batch 7"},
		{worker.TaskBatch, `{"campaign_id":1}`, `{"campaign_id":1}`}, // not a whole batch payload: shown as it is
		{worker.TaskBatch, `not json`, `not json`},
		{"other:type", `{"campaign_id":1,"batch":2}`, `{"campaign_id":1,"batch":2}`},
		{"other:type", "\x00\x01", "non-printable bytes"},
	} {
		if got := uiPayloadFormatter.FormatPayload(tt.typ, []byte(tt.payload)); got != tt.want {
			t.Errorf("FormatPayload(%q, %q) = %q, want %q", tt.typ, tt.payload, got, tt.want)
		}
	}
}

// TestUIServesAsynqmon runs `campaignctl ui` in-process on loopback against a Redis with campaign batches
// queued: the asynqmon page and its API answer, campaign payloads are readable, the queue can be paused
// (not read-only), and neither a cross-site request nor a request under another host name gets through.
func TestUIServesAsynqmon(t *testing.T) {
	t.Parallel()
	rdb, redisURL := testredis.New(t)
	uiEnqueue(t, rdb, 42, 7, 8, 9)
	env := map[string]string{"REDIS_URL": redisURL}
	ui := uiStart(t, env, "--addr", "127.0.0.1:0")
	if s := ui.stderr.String(); !strings.Contains(s, "Asynq web UI at http://127.0.0.1:") {
		t.Errorf("stderr does not give the URL: %s", s)
	}

	code, hdr, body := uiDo(t, "GET", ui.base+"/", nil)
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, "<title>Asynq - Monitoring</title>") || !strings.Contains(body, `<div id="root">`) {
		t.Fatalf("GET /: %d %s, not the asynqmon page: %.500s", code, hdr.Get("Content-Type"), body)
	}
	// The page's scripts are served from the embedded build, at the paths the page names.
	script := regexp.MustCompile(`src="(/static/js/main\.[0-9a-f]+\.chunk\.js)"`).FindStringSubmatch(body)
	if script == nil {
		t.Fatalf("GET /: no main script in the page: %.800s", body)
	}
	if code, hdr, js := uiDo(t, "GET", ui.base+script[1], nil); code != 200 || !strings.Contains(hdr.Get("Content-Type"), "javascript") || len(js) < 10000 {
		t.Fatalf("GET %s: %d %s, %d bytes", script[1], code, hdr.Get("Content-Type"), len(js))
	}

	code, _, body = uiDo(t, "GET", ui.base+"/api/queues", nil)
	var queues struct{ Queues []uiQueue }
	uiDecode(t, "GET /api/queues", body, &queues)
	if code != 200 || len(queues.Queues) != 1 || queues.Queues[0].Queue != worker.Queue || queues.Queues[0].Pending != 3 {
		t.Fatalf("GET /api/queues: %d %+v, want the %q queue with 3 pending batches", code, queues.Queues, worker.Queue)
	}

	code, _, body = uiDo(t, "GET", ui.base+"/api/queues/campaigns/pending_tasks", nil)
	var pending struct{ Tasks []uiTask }
	uiDecode(t, "pending tasks", body, &pending)
	payloads := map[string]string{}
	for _, task := range pending.Tasks {
		payloads[task.ID] = task.Payload
	}
	want := map[string]string{"42:7": "campaign 42, batch 7", "42:8": "campaign 42, batch 8", "42:9": "campaign 42, batch 9"}
	if code != 200 || len(payloads) != 3 {
		t.Fatalf("pending tasks: %d %+v", code, pending.Tasks)
	}
	for id, p := range want {
		if payloads[id] != p {
			t.Errorf("task %s shows payload %q, want %q", id, payloads[id], p)
		}
	}
	code, _, body = uiDo(t, "GET", ui.base+"/api/queues/campaigns/tasks/42:8", nil)
	var one uiTask
	uiDecode(t, "task 42:8", body, &one)
	if code != 200 || one.Payload != "campaign 42, batch 8" || one.Type != worker.TaskBatch {
		t.Errorf("GET task 42:8: %d %+v", code, one)
	}

	// A cross-site page cannot make the operator's browser change anything.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	paused := func() bool {
		t.Helper()
		qi, err := insp.GetQueueInfo(worker.Queue)
		if err != nil {
			t.Fatal(err)
		}
		return qi.Paused
	}
	if code, _, body := uiDo(t, "POST", ui.base+"/api/queues/campaigns:pause", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden || paused() {
		t.Fatalf("cross-site pause: %d %q, paused %v; want 403 and the queue running", code, body, paused())
	}
	// Nor can a page under another name that resolves to 127.0.0.1 (DNS rebinding) read anything.
	if code, _, body := uiDo(t, "GET", ui.base+"/api/queues", map[string]string{"Host": "rebind.evil.example"}); code != http.StatusForbidden || strings.Contains(body, worker.Queue) {
		t.Fatalf("GET under Host rebind.evil.example: %d %q; want 403", code, body)
	}
	if code, _, _ := uiDo(t, "GET", ui.base+"/api/queues", map[string]string{"Host": "localhost"}); code != 200 {
		t.Fatalf("GET under Host localhost: %d; want 200", code)
	}
	// Without --read-only the UI may pause and resume the queue (what --read-only is to prevent).
	if code, _, body := uiDo(t, "POST", ui.base+"/api/queues/campaigns:pause", map[string]string{"Origin": ui.base, "Sec-Fetch-Site": "same-origin"}); code != http.StatusNoContent || !paused() {
		t.Fatalf("same-origin pause: %d %q, paused %v; want 204 and the queue paused", code, body, paused())
	}
	if code, _, body := uiDo(t, "POST", ui.base+"/api/queues/campaigns:resume", nil); code != http.StatusNoContent || paused() {
		t.Fatalf("resume: %d %q, paused %v", code, body, paused())
	}

	if err := ui.stop(); err != nil {
		t.Fatalf("ui returned %v after its context was cancelled; want a clean stop", err)
	}
	if !strings.Contains(ui.stderr.String(), "Asynq web UI stopped") {
		t.Errorf("stderr does not say the UI stopped: %s", ui.stderr)
	}
	// The port may be another parallel test's by now (the kernel hands a freed port out again): what must
	// not answer there is the UI.
	if resp, err := (&http.Client{Timeout: time.Second}).Get(ui.base + "/api/queues"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), worker.Queue) {
			t.Errorf("the UI still answers after it stopped: %d %s", resp.StatusCode, body)
		}
	}
}

func TestUIReadOnlyRefusesChanges(t *testing.T) {
	t.Parallel()
	rdb, redisURL := testredis.New(t)
	uiEnqueue(t, rdb, 5, 1, 2)
	ui := uiStart(t, map[string]string{"REDIS_URL": redisURL}, "--read-only")
	if !strings.Contains(ui.stderr.String(), "read-only") {
		t.Errorf("stderr does not say read-only: %s", ui.stderr)
	}
	_, _, page := uiDo(t, "GET", ui.base+"/", nil)
	if !strings.Contains(page, `FLAG_READ_ONLY="true"`) {
		t.Errorf("the page does not tell the app it is read-only (its buttons stay): %.600s", page)
	}
	for _, req := range []struct{ method, path string }{
		{"POST", "/api/queues/campaigns:pause"},
		{"DELETE", "/api/queues/campaigns/pending_tasks/5:1"},
		{"POST", "/api/queues/campaigns/pending_tasks:archive_all"},
		{"DELETE", "/api/queues/campaigns"},
	} {
		code, _, body := uiDo(t, req.method, ui.base+req.path, nil)
		if code != http.StatusMethodNotAllowed || !strings.Contains(body, "read-only") {
			t.Errorf("%s %s in read-only mode: %d %q; want 405", req.method, req.path, code, body)
		}
	}
	qi, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(worker.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if qi.Paused || qi.Pending != 2 || qi.Archived != 0 {
		t.Fatalf("read-only UI changed the queue: paused %v, pending %d, archived %d", qi.Paused, qi.Pending, qi.Archived)
	}
	if code, _, body := uiDo(t, "GET", ui.base+"/api/queues/campaigns/pending_tasks", nil); code != 200 || !strings.Contains(body, "campaign 5, batch 2") {
		t.Errorf("read-only UI does not show the tasks: %d %.300s", code, body)
	}
}

// TestUIFlagsAndCredentialsAreValidated: anything but loopback needs credentials; bad flags and bad
// credentials exit 2 saying what to do, and the password is never printed.
func TestUIFlagsAndCredentialsAreValidated(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pa55"
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // the umask may have taken bits off
			t.Fatal(err)
		}
		return p
	}
	worldReadable := file("world", "ops:"+secret+"\n", 0o644)
	empty := file("empty", "\n", 0o600)
	noColon := file("nocolon", secret+"\n", 0o600)
	noPassword := file("nopw", "ops:\n", 0o600)
	twoLines := file("two", "ops:"+secret+"\nops2:"+secret+"\n", 0o600)
	// Redis is not reachable: a refusal must come before any connection (and a missed one fails with exit 1).
	base := map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}
	withEnv := func(kv ...string) map[string]string {
		m := map[string]string{"REDIS_URL": base["REDIS_URL"]}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	both := []string{"--basic-auth-file", uiAuthEnv}
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		says []string
	}{
		{"every interface without credentials", base, []string{"--addr", "0.0.0.0:0"}, append(both, "not a loopback address")},
		{"all interfaces, empty host", base, []string{"--addr", ":8080"}, both},
		{"LAN IP without credentials", base, []string{"--addr", "192.0.2.10:8080"}, both},
		{"IPv6 any without credentials", base, []string{"--addr", "[::]:8080"}, both},
		{"host name without credentials", base, []string{"--addr", "ui.internal.example:8080"}, both},
		{"no port", base, []string{"--addr", "127.0.0.1"}, []string{"--addr", "host:port"}},
		{"bad port", base, []string{"--addr", "127.0.0.1:99999"}, []string{"--addr", "host:port"}},
		{"world-readable file", base, []string{"--addr", "0.0.0.0:0", "--basic-auth-file", worldReadable}, []string{"other users", "chmod 600 " + worldReadable}},
		{"empty file", base, []string{"--basic-auth-file", empty}, []string{"empty", "user:password"}},
		{"no colon", base, []string{"--basic-auth-file", noColon}, []string{"no ':'", "user:password"}},
		{"no password", base, []string{"--basic-auth-file", noPassword}, []string{"password is empty"}},
		{"two lines", base, []string{"--basic-auth-file", twoLines}, []string{"more than one line"}},
		{"missing file", base, []string{"--basic-auth-file", filepath.Join(dir, "absent")}, []string{"--basic-auth-file", "no such file"}},
		{"directory", base, []string{"--basic-auth-file", dir}, []string{"not a regular file"}},
		{"malformed env", withEnv(uiAuthEnv, secret), []string{"--addr", "0.0.0.0:0"}, []string{uiAuthEnv, "user:password"}},
		{"env without user", withEnv(uiAuthEnv, ":"+secret), nil, []string{uiAuthEnv, "user is empty"}},
		{"prometheus without scheme", base, []string{"--prometheus-addr", "prometheus:9090"}, []string{"--prometheus-addr", "http://127.0.0.1:9090"}},
		{"prometheus with secret", base, []string{"--prometheus-addr", "ftp://u:" + secret + "@prom"}, []string{"--prometheus-addr"}},
		// asynqmon writes the address into its pages: before, this one's password was in every page served.
		{"prometheus with credentials", base, []string{"--prometheus-addr", "https://u:" + secret + "@prom:9090"}, []string{"--prometheus-addr", "user name or password", "every page"}},
		{"argument", base, []string{"extra"}, []string{"unknown command"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := cli(t, tt.env, append([]string{"ui"}, tt.args...)...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			for _, s := range tt.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr)
				}
			}
			if strings.Contains(stdout+stderr, secret) {
				t.Errorf("the password is printed:\n%s", stderr)
			}
		})
	}

	// Valid flags but no Redis: exit 1, saying where and what to do (and nothing is served).
	if _, stderr, code := cli(t, base, "ui", "--addr", "127.0.0.1:0"); code != 1 || !strings.Contains(stderr, "Redis is not reachable at 127.0.0.1:1") || !strings.Contains(stderr, "REDIS_URL") {
		t.Errorf("ui without Redis: exit %d, stderr %q; want 1 naming the address and REDIS_URL", code, stderr)
	}

	// --help: shown, with examples and both ways to give credentials, and never the password.
	stdout, stderr, code := cli(t, withEnv(uiAuthEnv, "ops:"+secret), "ui", "--help")
	for _, s := range []string{"Examples:", "--addr", "--read-only", "--basic-auth-file", "--prometheus-addr", uiAuthEnv, "127.0.0.1:8080"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("ui --help does not mention %q:\n%s", s, stdout)
		}
	}
	if code != 0 || strings.Contains(stdout+stderr, secret) {
		t.Errorf("ui --help: exit %d, or it shows the password:\n%s", code, stdout)
	}
	if stdout, _, _ := cli(t, nil, "--help"); !regexp.MustCompile(`(?m)^\s+ui\s`).MatchString(stdout) {
		t.Errorf("campaignctl --help does not list ui (still hidden?):\n%s", stdout)
	}
}

// TestUICredentials: with credentials every request needs HTTP Basic auth, on the network and on loopback.
func TestUICredentials(t *testing.T) {
	t.Parallel()
	rdb, redisURL := testredis.New(t)
	uiEnqueue(t, rdb, 3, 1)
	const user, secret = "ops", "s3cr3t:Pa55 word" // a colon and a space in the password are allowed
	authFile := filepath.Join(t.TempDir(), "ui.auth")
	if err := os.WriteFile(authFile, []byte(user+":"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"file, every interface", map[string]string{"REDIS_URL": redisURL}, []string{"--addr", "0.0.0.0:0", "--basic-auth-file", authFile}},
		{"environment, loopback", map[string]string{"REDIS_URL": redisURL, uiAuthEnv: user + ":" + secret}, []string{"--addr", "127.0.0.1:0"}},
		{"file wins over environment", map[string]string{"REDIS_URL": redisURL, uiAuthEnv: "other:password"}, []string{"--addr", "127.0.0.1:0", "--basic-auth-file", authFile}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ui := uiStart(t, tt.env, tt.args...)
			for _, path := range []string{"/", "/api/queues", "/queues/campaigns", "/static/js/nothing.js"} {
				code, hdr, body := uiDo(t, "GET", ui.base+path, nil)
				if code != http.StatusUnauthorized || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Basic realm=") || strings.Contains(body, "Asynq") {
					t.Errorf("GET %s without credentials: %d, WWW-Authenticate %q; want 401 and a Basic challenge", path, code, hdr.Get("WWW-Authenticate"))
				}
			}
			for _, bad := range [][2]string{{user, "wrong"}, {"admin", secret}, {user, secret + "x"}, {user, ""}} {
				if code, _, _ := uiDo(t, "GET", ui.base+"/api/queues", nil, bad[0], bad[1]); code != http.StatusUnauthorized {
					t.Errorf("GET /api/queues as %q with a wrong password: %d, want 401", bad[0], code)
				}
			}
			code, _, body := uiDo(t, "GET", ui.base+"/", nil, user, secret)
			if code != 200 || !strings.Contains(body, "<title>Asynq - Monitoring</title>") {
				t.Errorf("GET / with credentials: %d %.200s", code, body)
			}
			code, _, body = uiDo(t, "GET", ui.base+"/api/queues/campaigns/pending_tasks", nil, user, secret)
			if code != 200 || !strings.Contains(body, "campaign 3, batch 1") {
				t.Errorf("GET pending tasks with credentials: %d %.300s", code, body)
			}
			// With credentials the host name does not matter (a rebinding page has no password).
			if code, _, _ := uiDo(t, "GET", ui.base+"/api/queues", map[string]string{"Host": "ui.example"}, user, secret); code != 200 {
				t.Errorf("GET with credentials under another host name: %d, want 200", code)
			}
			if err := ui.stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}
			logs := ui.stderr.String()
			if strings.Contains(logs, secret) || strings.Contains(logs, "Pa55") {
				t.Errorf("the password is in the output:\n%s", logs)
			}
			if !strings.Contains(logs, `basic auth as "ops"`) {
				t.Errorf("stderr does not say the UI needs a login: %s", logs)
			}
		})
	}
}

// uiChromium finds Debian's chromium, or skips the test.
func uiChromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	t.Skip("headless Chromium is not installed: apt-get install chromium (scripts/test.sh installs it)")
	return ""
}

// uiBrowse runs headless Chromium on url with extra arguments and returns its stdout.
func uiBrowse(t *testing.T, chromium, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--headless=new", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=10000"}, args...)
	cmd := exec.CommandContext(ctx, chromium, append(all, url)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, tail(errb.String(), 3000))
	}
	return out.String()
}

// TestUIInChromium runs the built binary's `ui` and loads it in headless Chromium: the JavaScript app
// renders the campaigns queue and its batches from the API. It also takes the dashboard's screenshot (written
// to docs/ui.png with UPDATE_UI_SCREENSHOT=1).
func TestUIInChromium(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	chromium := uiChromium(t)
	rdb, redisURL := testredis.New(t)
	uiEnqueue(t, rdb, 42, 1, 2, 3, 4, 5, 6, 7)
	// A later campaign that waits for its start, and a batch that used up its retries (the DLQ).
	client := asynq.NewClientFromRedisClient(rdb)
	for b := 1; b <= 4; b++ {
		task, err := worker.NewBatchTask(43, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task, asynq.ProcessIn(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := asynq.NewInspectorFromRedisClient(rdb).ArchiveTask(worker.Queue, worker.TaskID(42, 7)); err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(), "REDIS_URL="+redisURL, uiAuthEnv+"=")}
	logs := e.start("ui", "ui", "--addr", addr)
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/api/queues")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ui does not answer on %s: %v\n%s", addr, err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The queue's page: the app has fetched and drawn the pending batches, payloads formatted.
	// (The page as served holds none of these texts: only the app can have put them there.)
	text := uiText(uiBrowse(t, chromium, base+"/queues/campaigns?status=pending", "--dump-dom"))
	for _, s := range []string{"Queue name" + worker.Queue, "Pending 6", "Scheduled 4", "Archived 1",
		"campaign 42, batch 1", "campaign 42, batch 6", worker.TaskID(42, 3)} {
		if !strings.Contains(text, s) {
			t.Errorf("the rendered queue page does not show %q:\n%s", s, tail(text, 3000))
		}
	}
	if strings.Contains(text, "campaign 42, batch 7") {
		t.Errorf("the pending list shows the archived batch 7:\n%s", tail(text, 3000))
	}
	// The dashboard charts and lists the queue.
	text = uiText(uiBrowse(t, chromium, base+"/", "--dump-dom"))
	for _, s := range []string{"Queue Size", "Tasks Processed", worker.Queue + "run11"} {
		if !strings.Contains(text, s) {
			t.Errorf("the rendered dashboard does not show %q:\n%s", s, tail(text, 3000))
		}
	}

	shot := filepath.Join(t.TempDir(), "ui.png")
	if os.Getenv("UPDATE_UI_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "docs", "ui.png")
	}
	uiBrowse(t, chromium, base+"/", "--screenshot="+shot, "--window-size=1400,900")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", shot, err)
	}
	if b := img.Bounds(); b.Dx() != 1400 || b.Dy() != 900 {
		t.Errorf("screenshot is %dx%d, want 1400x900", b.Dx(), b.Dy())
	}
	if n := uiColours(img); n < 8 {
		t.Errorf("screenshot has %d colours: a blank page, not the dashboard", n)
	}
	t.Logf("screenshot: %s", shot)
}

var (
	uiScriptRe = regexp.MustCompile(`(?s)<(script|style)\b.*?</(script|style)>`)
	uiTagRe    = regexp.MustCompile(`<[^>]*>`)
)

// uiText is the text of a dumped DOM without scripts and styles, tags taken out (as textContent joins it).
func uiText(dom string) string {
	return uiTagRe.ReplaceAllString(uiScriptRe.ReplaceAllString(dom, ""), "")
}

// uiColours counts the distinct colours of an image (sampled), to tell a drawn page from a blank one.
func uiColours(img image.Image) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
		}
	}
	return len(seen)
}
