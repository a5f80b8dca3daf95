package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers/receipts"
	"github.com/campaignctl/campaignctl/providers/sandbox"

	"github.com/campaignctl/campaignctl/internal/testlog"
)

// The pushback flags reach the sandbox: its control API reports the limits and outage windows they set.
func TestSandboxPushbackFlags(t *testing.T) {
	addr := providertest.ClosedAddr(t)
	var logs testlog.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &logs, stderr: &logs, getenv: func(string) string { return "" }}
	root := a.newRootCmd()
	root.SetArgs([]string{"sandbox", "--addr", addr,
		"--limit", "twilio=3", "--limit", "sendgrid,fcm=40", "--limit-concurrency", "all=7", "--limit-segments", "twilio=9",
		"--outage", "webhook=30s@1m/reset", "--outage", "netgsm=5s", "--outage", "sendgrid=2s@2031-01-02T03:04:05Z/hang"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sandbox: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("sandbox did not stop")
		}
		if t.Failed() {
			t.Logf("sandbox output:\n%s", logs.String())
		}
	})

	get := func(path string, v any) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + path)
			if err == nil {
				defer resp.Body.Close()
				if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				return
			}
			select {
			case err := <-done:
				t.Fatalf("sandbox ended: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox did not answer: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var limits map[string]sandbox.Limit
	get("/_sandbox/limits", &limits)
	want := map[string]sandbox.Limit{
		"twilio":   {Rate: 3, Concurrency: 7, Segments: 9},
		"netgsm":   {Concurrency: 7},
		"sendgrid": {Rate: 40, Concurrency: 7},
		"fcm":      {Rate: 40, Concurrency: 7},
		"webhook":  {Concurrency: 7},
	}
	for api, l := range want {
		if limits[api] != l {
			t.Errorf("%s limit %+v, want %+v", api, limits[api], l)
		}
	}
	var ws []sandbox.OutageWindow
	get("/_sandbox/outages", &ws)
	if len(ws) != 3 {
		t.Fatalf("outages %+v", ws)
	}
	hook, netgsm, sg := ws[0], ws[1], ws[2]
	if hook.API != "webhook" || hook.Mode != sandbox.OutageReset || hook.State != "scheduled" ||
		hook.Start.Before(started.Add(time.Minute)) || hook.Start.After(time.Now().Add(time.Minute)) || hook.End.Sub(hook.Start) != 30*time.Second {
		t.Errorf("webhook window %+v", hook)
	}
	if netgsm.API != "netgsm" || netgsm.Mode != sandbox.Outage503 || netgsm.State != "active" || netgsm.End.Sub(netgsm.Start) != 5*time.Second {
		t.Errorf("netgsm window %+v", netgsm)
	}
	if sg.API != "sendgrid" || sg.Mode != sandbox.OutageHang || !sg.Start.Equal(time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)) || sg.End.Sub(sg.Start) != 2*time.Second {
		t.Errorf("sendgrid window %+v", sg)
	}
}

// Malformed pushback flags, and a negative latency or receipt delay, are bad usage (exit 2), refused
// before anything listens.
func TestSandboxPushbackFlagsRefused(t *testing.T) {
	addr := providertest.ClosedAddr(t)
	for _, args := range [][]string{
		{"--limit", "twilio=-1"},
		{"--limit", "twillio=5"},
		{"--limit", "twilio"},
		{"--limit", "twilio=1.5"},
		{"--limit-segments", "sendgrid=5"},
		{"--limit-concurrency", "all=x"},
		{"--limit", "all=2000000"},
		{"--outage", "twilio=0s"},
		{"--outage", "twilio=5s/boom"},
		{"--outage", "twilio=5s@yesterday"},
		{"--outage", "twilio"},
		{"--outage", "nobody=5s"},
		{"--latency", "-20ms"},
		{"--receipt-delay", "-1s"},
	} {
		type result struct {
			stderr string
			code   int
		}
		res := make(chan result, 1)
		go func() {
			_, stderr, code := cli(t, nil, append([]string{"sandbox", "--addr", addr}, args...)...)
			res <- result{stderr, code}
		}()
		select {
		case r := <-res:
			if r.code != 2 || !strings.Contains(r.stderr, args[0]+" ") {
				t.Errorf("%v: exit %d, stderr %q; want 2 naming the flag", args, r.code, r.stderr)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%v: the sandbox started", args)
		}
	}
}

func TestSandboxHelpDescribesPushback(t *testing.T) {
	stdout, _, code := cli(t, nil, "sandbox", "--help")
	for _, s := range []string{"--limit twilio=800", "--limit-concurrency", "--limit-segments", "--outage twilio=20s@10s",
		"/_sandbox/limits", "/_sandbox/outages/stop", "/_sandbox/timeline", "no Retry-After", "raw_503", "reset", "hang"} {
		if code != 0 || !strings.Contains(stdout, s) {
			t.Errorf("sandbox --help (exit %d) does not mention %q", code, s)
		}
	}
}

// --twilio-inbound-url makes POST /_sandbox/twilio/inbound post a signed incoming SMS there, which
// receipts.TwilioInboundHandler, verifying with the same TWILIO_AUTH_TOKEN, takes as a refusal.
func TestSandboxTwilioInboundFlag(t *testing.T) {
	const token = "inboundToken0001"
	refusals := make(chan receipts.Refusal, 4)
	recv := httptest.NewUnstartedServer(nil)
	base := "http://" + recv.Listener.Addr().String()
	recv.Config.Handler = receipts.TwilioInboundHandler(token, base, nil, receipts.RefusalSinkFunc(func(_ context.Context, rs []receipts.Refusal) error {
		for _, r := range rs {
			refusals <- r
		}
		return nil
	}), nil)
	recv.Start()
	defer recv.Close()

	addr := providertest.ClosedAddr(t)
	var logs testlog.Buffer
	env := map[string]string{"TWILIO_AUTH_TOKEN": token, "TWILIO_ACCOUNT_SID": "ACinbound0001"}
	a := &app{stdin: strings.NewReader(""), stdout: &logs, stderr: &logs, getenv: func(k string) string { return env[k] }}
	root := a.newRootCmd()
	root.SetArgs([]string{"sandbox", "--addr", addr, "--twilio-inbound-url", base + "/twilio/inbound"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sandbox: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("sandbox did not stop")
		}
		if t.Failed() {
			t.Logf("sandbox output:\n%s", logs.String())
		}
	})

	body := `{"from":"+905321234567","to":"+908501234567","body":"iptal"}`
	var resp *http.Response
	for deadline := time.Now().Add(5 * time.Second); ; {
		var err error
		if resp, err = http.Post("http://"+addr+"/_sandbox/twilio/inbound", "application/json", strings.NewReader(body)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox did not answer: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer resp.Body.Close()
	var res sandbox.TwilioInboundResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusOK || res.Status != http.StatusOK {
		t.Fatalf("control: %d %+v (%v)", resp.StatusCode, res, err)
	}
	select {
	case r := <-refusals:
		if r.Address != "+905321234567" || r.Keyword != "IPTAL" || r.EventID != res.MessageSID || r.Kind != receipts.RefusalInbound {
			t.Errorf("refusal %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no refusal recorded")
	}
	if res.Form["AccountSid"] != "ACinbound0001" {
		t.Errorf("AccountSid %q", res.Form["AccountSid"])
	}
	if strings.Contains(logs.String(), token) {
		t.Errorf("the sandbox printed the token:\n%s", logs.String())
	}
}

// Without a token to sign with, --twilio-inbound-url is bad usage, refused before anything listens.
func TestSandboxTwilioInboundFlagNeedsToken(t *testing.T) {
	addr := providertest.ClosedAddr(t)
	type result struct {
		stderr string
		code   int
	}
	res := make(chan result, 1)
	go func() {
		_, stderr, code := cli(t, nil, "sandbox", "--addr", addr, "--twilio-inbound-url", "http://127.0.0.1:8090/twilio/inbound")
		res <- result{stderr, code}
	}()
	select {
	case r := <-res:
		if r.code != 2 || !strings.Contains(r.stderr, "TWILIO_AUTH_TOKEN") {
			t.Errorf("exit %d, stderr %q; want 2 naming TWILIO_AUTH_TOKEN", r.code, r.stderr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox started without a token")
	}
}

func TestSandboxHelpDescribesRefusals(t *testing.T) {
	stdout, _, code := cli(t, nil, "sandbox", "--help")
	for _, s := range []string{"--twilio-inbound-url", "/_sandbox/twilio/inbound", "/_sandbox/sendgrid/events", "spamreport"} {
		if code != 0 || !strings.Contains(stdout, s) {
			t.Errorf("sandbox --help (exit %d) does not mention %q", code, s)
		}
	}
}
