package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/supervisor"
	"github.com/campaignctl/campaignctl/worker"

	"github.com/campaignctl/campaignctl/internal/testlog"
)

// Bad flags are refused with exit 2 and the fix, before anything is started.
func TestWorkersFlagsAreValidated(t *testing.T) {
	t.Parallel()
	twilio := map[string]string{"TWILIO_ACCOUNT_SID": "ACx", "TWILIO_AUTH_TOKEN": "secret-token", "TWILIO_FROM": "+905550000000",
		// nothing listens here: validation must fail before any connection is tried
		"DATABASE_URL": "postgres://u:pw@127.0.0.1:1/x", "REDIS_URL": "redis://127.0.0.1:1/0"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--min", "-1"}, twilio, "--min -1: give 0 or more worker processes, e.g. --min 1"},
		{[]string{"--max", "0"}, twilio, "--max 0: give 1 or more worker processes, e.g. --max 8"},
		{[]string{"--min", "5", "--max", "2"}, twilio, "--min 5 is above --max 2: give --min ≤ --max"},
		{[]string{"--max", "100000"}, twilio, "--max 100000: at most 1000 worker processes"},
		{[]string{"--interval", "0s"}, twilio, "--interval 0s: give a positive duration, e.g. --interval 5s"},
		{[]string{"--cooldown", "-1s"}, twilio, "--cooldown -1s: give zero or more"},
		{[]string{"--shutdown-timeout", "0s"}, twilio, "--shutdown-timeout 0s: give 1s to 1h"},
		{[]string{"--shutdown-timeout", "-1s"}, twilio, "--shutdown-timeout -1s: give 1s to 1h"},
		{[]string{"--concurrency", "0"}, twilio, "--concurrency 0: give 1 to 1000"},
		{[]string{"--provider-timeout", "1ms"}, twilio, "--provider-timeout 1ms: give 100ms to 5m"},
		{[]string{"extra"}, twilio, "give worker flags after --"},
		{[]string{"--max", "2", "--", "--metrics-addr", "127.0.0.1:9100"}, twilio, "every worker would listen on the same address"},
		{[]string{"--max", "2", "--", "--pprof-addr=127.0.0.1:6060"}, twilio, "--pprof-addr after --: every worker would listen on the same address"},
		{[]string{"--max", "2"}, map[string]string{}, "no provider is configured"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, stderr, code := cli(t, tc.env, append([]string{"workers"}, tc.args...)...)
			if code != 2 || !strings.Contains(stderr, tc.want) || out != "" {
				t.Errorf("workers %v: exit %d, stdout %q, stderr %q; want exit 2 saying %q", tc.args, code, out, stderr, tc.want)
			}
			if strings.Contains(stderr, "secret-token") || strings.Contains(stderr, ":pw@") {
				t.Errorf("a secret was printed: %s", stderr)
			}
		})
	}
	help, _, code := cli(t, nil, "workers", "--help")
	for _, want := range []string{"--min", "--max", "--cooldown", "ceil(backlog / --concurrency)", "Examples:", "campaignctl workers --min 1 --max 8"} {
		if code != 0 || !strings.Contains(help, want) {
			t.Errorf("workers --help (exit %d) lacks %q", code, want)
		}
	}
}

// supervisorLines are the supervisor's own JSON log lines with message msg.
func supervisorLines(out, msg string) []map[string]any {
	var lines []map[string]any
	for _, l := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["component"] == "supervisor" && m["msg"] == msg {
			lines = append(lines, m)
		}
	}
	return lines
}

// childrenOf lists the live (not zombie) processes whose parent is pid, from /proc.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			kids = append(kids, child)
		}
	}
	slices.Sort(kids)
	return kids
}

// TestWorkersSupervisorEndToEnd runs the built binary: a running campaign of 4 batches whose provider (the
// sandbox) takes a second per message, and `campaignctl workers --min 1 --max 3 --concurrency 1`. The
// supervisor scales from 1 to 3 at once for the backlog; once the campaign is cancelled and the queue is
// empty it scales back to 1, one worker per cooldown, with SIGTERM; a worker killed with SIGKILL is started
// again; SIGTERM to the supervisor stops everything and exits 0. Processes are counted from /proc, not
// only from the logs.
func TestWorkersSupervisorEndToEnd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	_, dbURL := testdb.New(t)
	rdb, redisURL := testredis.New(t)
	sandboxAddr := freeAddr(t)
	const authToken = "workerse2esecrettoken7"
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"TWILIO_ACCOUNT_SID=ACworkers00000000000000000000000000", "TWILIO_AUTH_TOKEN="+authToken, "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, "SENDER_IDENTITY="+testSender,
	)}
	e.mustRun("demo", "seed", "--users", strconv.Itoa(chaosUsersFor(2000)), "--pool", "demo")
	audience := writeFile(t, "audience.sql", "SELECT user_id, phone, first_name FROM customers")
	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--latency", "1s")
	id, enqueued := launchSMS(e, "workers-e2e", audience, "Merhaba {{.first_name}}, kodunuz {{.code}}", "--batch-size", "500")
	if enqueued != 4 {
		t.Fatalf("launch: %d batches enqueued, want 4", enqueued)
	}

	logs := &testlog.Buffer{}
	sup := exec.Command(e.bin, "workers", "--min", "1", "--max", "3", "--concurrency", "1",
		"--interval", "250ms", "--cooldown", "2s", "--shutdown-timeout", "5s", "--provider-timeout", "5s")
	sup.Env = e.env
	sup.Stdout, sup.Stderr = logs, logs
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { sup.Wait(); close(exited) }() //nolint:errcheck // the exit code is read from ProcessState
	seen := map[int]bool{}
	t.Cleanup(func() {
		// Never leave a process behind: SIGTERM, then SIGKILL the supervisor and every worker seen.
		sup.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Errorf("supervisor still running 30s after SIGTERM")
			for _, pid := range childrenOf(t, sup.Process.Pid) {
				seen[pid] = true
			}
			sup.Process.Kill() //nolint:errcheck
			<-exited
		}
		for pid := range seen {
			if syscall.Kill(pid, 0) == nil {
				t.Errorf("worker %d outlived the supervisor; killing it", pid)
				syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck
			}
		}
		if t.Failed() {
			t.Logf("supervisor and worker output:\n%s", tail(logs.String(), 8000))
		}
	})
	workers := func(n int) func() bool {
		return func() bool {
			kids := childrenOf(t, sup.Process.Pid)
			for _, k := range kids {
				seen[k] = true
			}
			return len(kids) == n
		}
	}

	// Up from --min to --max at once: 4 batches want 4 slots of one batch each.
	waitFor(t, 20*time.Second, func() bool { return len(supervisorLines(logs.String(), "scale up")) > 0 })
	up := supervisorLines(logs.String(), "scale up")[0]
	if up["from"] != 1.0 || up["to"] != 3.0 || up["reason"] != supervisor.ReasonBacklog || up["need"] != 4.0 {
		t.Errorf("first scale up %v; want from=1 to=3 need=4 reason=backlog", up)
	}
	waitFor(t, 20*time.Second, workers(3))
	// The pool holds at --max while the campaign sends (a message a second per worker).
	waitFor(t, 20*time.Second, func() bool {
		for _, l := range supervisorLines(logs.String(), "hold") {
			if l["reason"] == supervisor.ReasonMax {
				return true
			}
		}
		return false
	})

	// The queue empties: everything scales back to --min, one worker per cooldown, each stopped
	// gracefully.
	e.mustRun("cancel", id, "--wait", "20s")
	waitFor(t, 30*time.Second, func() bool {
		downs := supervisorLines(logs.String(), "scale down")
		return len(downs) == 2 && workers(1)()
	})
	downs := supervisorLines(logs.String(), "scale down")
	if downs[0]["from"] != 3.0 || downs[0]["to"] != 2.0 || downs[1]["to"] != 1.0 || downs[1]["reason"] != supervisor.ReasonIdle {
		t.Errorf("scale downs %v; want 3→2 then 2→1, reason idle", downs)
	}
	t1, err1 := time.Parse(time.RFC3339Nano, fmt.Sprint(downs[0]["time"]))
	t2, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(downs[1]["time"]))
	// The log lines are stamped a moment after each decision, and under the race detector on a busy machine
	// that moment reached 130 ms (1.87 s between the stamps): allow half a second. Without the cooldown the
	// second would come one interval (250 ms) after the first.
	if err1 != nil || err2 != nil || t2.Sub(t1) < 1500*time.Millisecond {
		t.Errorf("scale downs at %v and %v (%v, %v): one per cooldown of 2s", downs[0]["time"], downs[1]["time"], err1, err2)
	}
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(worker.Queue)
	if err != nil || info.Pending+info.Active+info.Retry+info.Scheduled != 0 {
		t.Errorf("queue after the cancel: %+v, %v; want empty", info, err)
	}
	waitFor(t, 20*time.Second, func() bool { return len(supervisorLines(logs.String(), "worker stopped")) == 2 })
	for _, l := range supervisorLines(logs.String(), "worker stopped") {
		if l["exit"] != "exit status 0" {
			t.Errorf("a worker stopped with SIGTERM: %v; want exit status 0", l)
		}
	}

	// A worker killed with SIGKILL is started again, and counted.
	victim := childrenOf(t, sup.Process.Pid)[0]
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		kids := childrenOf(t, sup.Process.Pid)
		for _, k := range kids {
			seen[k] = true
		}
		return len(kids) == 1 && kids[0] != victim && len(supervisorLines(logs.String(), "worker restarted")) == 1
	})
	if r := supervisorLines(logs.String(), "worker restarted")[0]; r["restarts"] != 1.0 {
		t.Errorf("restart logged as %v; want restarts=1", r)
	}
	if c := supervisorLines(logs.String(), "worker exited without being asked; restarting it"); len(c) != 1 || c[0]["pid"] != float64(victim) {
		t.Errorf("crash logged as %v; want one line for pid %d", c, victim)
	}

	// The supervisor counts itself among those on the queue while it runs, and leaves when it stops.
	ctx := context.Background()
	if n, err := rdb.ZCard(ctx, state.SupervisorsKey).Result(); err != nil || n != 1 {
		t.Errorf("%s holds %d supervisors (%v) while one runs, want 1", state.SupervisorsKey, n, err)
	}

	// SIGTERM: every worker stopped, exit 0.
	if err := sup.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("supervisor still running 30s after SIGTERM")
	}
	if code := sup.ProcessState.ExitCode(); code != 0 {
		t.Errorf("supervisor exited with %d after SIGTERM, want 0", code)
	}
	for pid := range seen {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker %d still alive after the supervisor exited", pid)
		}
	}
	if n, err := rdb.ZCard(ctx, state.SupervisorsKey).Result(); err != nil || n != 0 {
		t.Errorf("%s holds %d supervisors (%v) after the only one stopped, want 0: the others would count it for three intervals more", state.SupervisorsKey, n, err)
	}
	if len(supervisorLines(logs.String(), "supervisor stopped")) != 1 {
		t.Errorf("no \"supervisor stopped\" line")
	}
	if strings.Contains(logs.String(), authToken) || strings.Contains(logs.String(), redisURL) && strings.Contains(redisURL, "@") {
		t.Errorf("a secret appears in the output")
	}
	t.Logf("workers seen: %d; %d scale ups, %d scale downs, %d restarts",
		len(seen), len(supervisorLines(logs.String(), "scale up")), len(downs), len(supervisorLines(logs.String(), "worker restarted")))
}

// worker's own flags are checked before anything is opened: a bad value exits 2 naming it and the fix.
func TestWorkerFlagErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TWILIO_ACCOUNT_SID": "ACx", "TWILIO_AUTH_TOKEN": "secret-token", "TWILIO_FROM": "+905550000000",
		"DATABASE_URL": "postgres://u:pw@127.0.0.1:1/x", "REDIS_URL": "redis://127.0.0.1:1/0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory-limit", "-1"}, "--memory-limit -1: give MiB (e.g. 80), or 0 for none"},
		{[]string{"--pprof-addr", "0.0.0.0:6060"}, "bind them to a loopback address, e.g. 127.0.0.1:6060"},
		{[]string{"--pprof-addr", "nope"}, "--pprof-addr \"nope\" is not host:port"},
	} {
		out, stderr, code := cli(t, env, append([]string{"worker"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) || out != "" {
			t.Errorf("worker %v: exit %d, stdout %q, stderr %q; want exit 2 saying %q", tc.args, code, out, stderr, tc.want)
		}
	}
}
