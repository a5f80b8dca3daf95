package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
}

func postJSON(t *testing.T, url, body string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestControlMessagesAndStats(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{})
	for _, to := range []string{"+905551111111", "+905552222222", "+905551111111", "+905550021610"} {
		postMessage(t, srv, testSID, testToken, message(to, "kod "+to))
	}

	var all []sandbox.Message
	getJSON(t, srv.URL+"/_sandbox/messages", &all)
	if diff := cmp.Diff(s.Messages(), all, cmpopts.EquateApproxTime(time.Millisecond)); diff != "" {
		t.Errorf("/_sandbox/messages differs from Messages() (-want +got):\n%s", diff)
	}
	var gotTo []string
	for _, m := range all {
		gotTo = append(gotTo, m.To)
	}
	if diff := cmp.Diff([]string{"+905551111111", "+905552222222", "+905551111111"}, gotTo); diff != "" {
		t.Errorf("recipients in order (-want +got):\n%s", diff)
	}

	var one []sandbox.Message
	getJSON(t, srv.URL+"/_sandbox/messages?to=%2B905552222222", &one)
	if len(one) != 1 || one[0].Body != "kod +905552222222" {
		t.Errorf("?to= filter: %+v", one)
	}

	var st sandbox.Stats
	getJSON(t, srv.URL+"/_sandbox/stats", &st)
	want := sandbox.Stats{
		Requests: 4, Accepted: 3, Rejected: 1,
		ByStatus: map[int]int{400: 1}, ByCode: map[int]int{21610: 1},
		Recipients: 2, Duplicates: 1,
		FirstAcceptedAt: all[0].At, LastAcceptedAt: all[2].At,
	}
	if !all[0].At.Before(all[2].At) && !all[0].At.Equal(all[2].At) {
		t.Errorf("acceptance times out of order: %v then %v", all[0].At, all[2].At)
	}
	if diff := cmp.Diff(want, st, cmpopts.EquateApproxTime(time.Millisecond)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}

	if code := postJSON(t, srv.URL+"/_sandbox/reset", ""); code != http.StatusNoContent {
		t.Errorf("reset: %d", code)
	}
	var empty []sandbox.Message
	getJSON(t, srv.URL+"/_sandbox/messages", &empty)
	if empty == nil || len(empty) != 0 {
		t.Errorf("after reset: %v, want an empty JSON array", empty)
	}
	if st := s.Stats(); st.Requests != 0 || st.Accepted != 0 || len(st.ByStatus) != 0 || !st.FirstAcceptedAt.IsZero() {
		t.Errorf("stats after reset: %+v", st)
	}
}

func TestControlFaults(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{})
	if code := postJSON(t, srv.URL+"/_sandbox/faults", `{"rate_503":1}`); code != http.StatusOK {
		t.Fatalf("set faults: %d", code)
	}
	var f sandbox.Faults
	getJSON(t, srv.URL+"/_sandbox/faults", &f)
	if diff := cmp.Diff(sandbox.Faults{Rate503: 1}, f); diff != "" {
		t.Errorf("faults (-want +got):\n%s", diff)
	}
	if a := postMessage(t, srv, testSID, testToken, message("+905551234567", "hi")); a.status != http.StatusServiceUnavailable {
		t.Errorf("with rate_503=1: %d", a.status)
	}
	// The body replaces the faults: fields left out are cleared.
	if code := postJSON(t, srv.URL+"/_sandbox/faults", `{"rate_500":0}`); code != http.StatusOK {
		t.Fatalf("clear faults: %d", code)
	}
	if a := postMessage(t, srv, testSID, testToken, message("+905551234567", "hi")); a.status != http.StatusCreated {
		t.Errorf("after clearing: %d", a.status)
	}
	for _, bad := range []string{`{"rate_429":1.5}`, `{"rate_500":-0.1}`, `{"rate_typo":1}`, `not json`} {
		if code := postJSON(t, srv.URL+"/_sandbox/faults", bad); code != http.StatusBadRequest {
			t.Errorf("POST faults %s: %d, want 400", bad, code)
		}
	}
}

func TestConcurrentRequests(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{Latency: 5 * time.Millisecond})
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			to := "+9055512" + string(rune('0'+i%10)) + "0000"
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/"+testSID+"/Messages.json",
				strings.NewReader(message(to, "hi").Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.SetBasicAuth(testSID, testToken)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Errorf("post: %v", err) // not Fatal: this is not the test's goroutine
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if st.Accepted != n || st.Requests != n || st.Recipients != 10 || st.Duplicates != 10 || len(s.Messages()) != n {
		t.Errorf("stats %+v, messages %d", st, len(s.Messages()))
	}
}

func TestLogsMaskPhonesAndHideToken(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, srv := newTwilioSandbox(t, sandbox.Options{Logger: logger})
	postMessage(t, srv, testSID, testToken, message("+905551234567", "hi"))
	postMessage(t, srv, testSID, "wrongtoken", message("+905551234567", "hi"))
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if !strings.Contains(out, "+905*****4567") {
		t.Errorf("log lacks the masked number:\n%s", out)
	}
	for _, secret := range []string{"+905551234567", testToken, "wrongtoken"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// ListenAndServe must return once ctx is done, even with a request held by the timeout fault.
func TestListenAndServeShutsDown(t *testing.T) {
	addr := providertest.ClosedAddr(t)

	s := sandbox.New(sandbox.Options{Faults: sandbox.Faults{RateTimeout: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sandbox.ListenAndServe(ctx, addr, s) }()

	// Wait until it answers.
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/_sandbox/stats")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox did not start: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	hung := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/2010-04-01/Accounts/ACx/Messages.json",
			strings.NewReader(message("+905551234567", "hi").Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("ACx", "tok")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = errors.New("answered")
		}
		hung <- err
	}()
	for len(s.Messages()) == 0 {
		select {
		case err := <-hung:
			t.Fatalf("hung request ended early: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("ListenAndServe did not return after cancel")
	}
	select {
	case err := <-hung:
		if err == nil || err.Error() == "answered" {
			t.Errorf("hung request: %v, want a dropped connection", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("hung request was not released")
	}
}

func TestListenAndServeBadAddress(t *testing.T) {
	err := sandbox.ListenAndServe(context.Background(), "256.0.0.1:bad", sandbox.New(sandbox.Options{}))
	if err == nil {
		t.Fatal("want an error for a bad address")
	}
}
