package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testlog"
	"github.com/campaignctl/campaignctl/worker"
)

// The rate a watch shows is the last few seconds' acceptances, and the ETA is the pending at that rate.
func TestWatchRateIsTheLastSecondsAcceptances(t *testing.T) {
	var r acceptRate
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if got := r.add(t0, 0); got != 0 {
		t.Fatalf("one sample: %v msg/s", got)
	}
	// 10 s of nothing (a window closed), then 100 a second: the rate says 100 within the window, not an
	// average since the start.
	r.add(t0.Add(10*time.Second), 0)
	var got float64
	for i := 1; i <= 8; i++ {
		got = r.add(t0.Add(time.Duration(10+i)*time.Second), int64(100*i))
	}
	if got < 99 || got > 101 {
		t.Fatalf("rate %v msg/s, want 100", got)
	}
	if e := eta(1000, got); e != "10s" {
		t.Fatalf("ETA of 1000 at %v/s: %s", got, e)
	}
	if e := eta(5, 0); e != "?" {
		t.Fatalf("ETA at no rate: %s", e)
	}
	// Paused (or anything else holding it): the last seconds' rate says nothing of when it ends.
	paused := worker.CampaignStatus{Waiting: &worker.Waiting{Reason: worker.WaitPaused}}
	paused.Pending = 1000
	if e := watchETA(paused, got); e != "?" {
		t.Fatalf("ETA of a paused campaign at the last seconds' %v/s: %s, want ?", got, e)
	}
}

// Ctrl-C on --watch stops the watching, not the campaign: exit 0 and the way back.
func TestWatchCtrlCDetaches(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary")
	}
	env, _ := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	out, stderr, code := cli(t, env, "launch", "--name", "w", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
	if code != 0 {
		t.Fatalf("launch: %s", stderr)
	}
	var rep struct{ ID int64 }
	json.Unmarshal([]byte(out), &rep) //nolint:errcheck
	cmd := exec.Command(binary(t), "status", fmt.Sprint(rep.ID), "--watch")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "PATH="+os.Getenv("PATH"))
	var errb testlog.Buffer // written by the command's copier while the test reads it
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, func() bool { return strings.Contains(errb.String(), "pending") })
	cmd.Process.Signal(syscall.SIGINT) //nolint:errcheck
	err := cmd.Wait()
	if err != nil || !strings.Contains(errb.String(), "keeps sending") || !strings.Contains(errb.String(), fmt.Sprintf("campaignctl pause %d", rep.ID)) ||
		strings.Contains(errb.String(), "context canceled") {
		t.Fatalf("Ctrl-C on --watch: %v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "msg/s, ETA") || !strings.Contains(errb.String(), "waiting: no_worker") {
		t.Fatalf("the progress line shows no rate, ETA or waiting reason:\n%s", errb.String())
	}
}

// status --watch --json draws its progress on stderr and prints on stdout, once the campaign is over,
// the one object status --json prints.
func TestWatchWithJSONPrintsTheStatusObject(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	out, stderr, code := cli(t, env, "launch", "--name", "wj", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
	if code != 0 {
		t.Fatalf("launch: %s", stderr)
	}
	var rep struct{ ID int64 }
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(rep.ID)
	if _, stderr, code := cli(t, env, "cancel", id); code != 0 {
		t.Fatalf("cancel: %s", stderr)
	}
	out, stderr, code = cli(t, env, "status", id, "--watch", "--json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["state"] != "cancelled" || st["id"] != float64(rep.ID) {
		t.Fatalf("status --watch --json: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
}
