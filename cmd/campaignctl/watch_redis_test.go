package main

import (
	"bytes"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// cutProxy forwards TCP to target until cut is called: then it closes every connection and refuses new ones.
func cutProxy(t *testing.T, target string) (addr string, cut func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			go io.Copy(u, c) //nolint:errcheck
			go io.Copy(c, u) //nolint:errcheck
		}
	}()
	return l.Addr().String(), func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
}

// watchThroughACut runs campaignctl with args, its Redis behind a proxy that is cut after warm; the command
// must keep watching through the cut, say that Redis is unreachable, and leave with exit 0 at Ctrl-C.
func watchThroughACut(t *testing.T, env map[string]string, warm time.Duration, args ...string) (stdout, stderr string) {
	t.Helper()
	u, err := url.Parse(env["REDIS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	addr, cut := cutProxy(t, u.Host)
	u.Host = addr
	cmd := exec.Command(binary(t), args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "REDIS_URL="+u.String())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(warm)
	cut()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		t.Fatalf("%v ended when Redis went away: exit %d\nstdout: %s\nstderr: %s", args, cmd.ProcessState.ExitCode(), out.String(), tail(errb.String(), 1500))
	case <-time.After(6 * time.Second):
	}
	cmd.Process.Signal(os.Interrupt) //nolint:errcheck
	<-done
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(errb.String(), "Redis is unreachable") || !strings.Contains(errb.String(), "stopped watching") {
		t.Fatalf("%v through a cut of Redis, then Ctrl-C: exit %d, stderr %s; want exit 0, the cut said, and the way back", args, code, tail(errb.String(), 1500))
	}
	return out.String(), errb.String()
}

// status --watch outlives Redis going away mid-watch: its figures come from Postgres alone meanwhile, as
// plain status's do. Before, the first poll that failed ended it with exit 1 and asynq's error.
func TestAWatchOutlivesRedisGoingAway(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	watchThroughACut(t, env, 3*time.Second, "status", id, "--watch")
}

// launch --watch: the launch succeeded (its report is on stdout), then Redis goes away during the watch.
// Before, it exited 1, which a script reads as a failed launch, though the campaign was running.
func TestALaunchWatchOutlivesRedisGoingAway(t *testing.T) {
	t.Parallel()
	env, _, _ := reportEnv(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers WHERE user_id IN ('a', 'b', 'c')")
	out, _ := watchThroughACut(t, env, 4*time.Second, "launch", "--name", "ikinci", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--frequency-cap", "0", "--yes", "--json", "--watch")
	if !strings.Contains(out, `"id"`) {
		t.Fatalf("no launch report on stdout: %s", out)
	}
}

// status --watch starts while Redis is unreachable, as status without --watch answers then: it shows
// Postgres's figures, says Redis is unreachable, and goes on. Before, it refused to start (exit 1).
func TestAWatchStartsWhileRedisIsUnreachable(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	cmd := exec.Command(binary(t), "status", id, "--watch")
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "REDIS_URL=redis://"+dead+"/0")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		t.Fatalf("status --watch with Redis unreachable ended: exit %d\nstderr: %s", cmd.ProcessState.ExitCode(), tail(errb.String(), 1500))
	case <-time.After(8 * time.Second):
	}
	cmd.Process.Signal(os.Interrupt) //nolint:errcheck
	<-done
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(errb.String(), "Redis is unreachable") {
		t.Fatalf("status --watch started with Redis unreachable, then Ctrl-C: exit %d, stderr %s; want exit 0 and the outage said", code, tail(errb.String(), 1500))
	}
}
