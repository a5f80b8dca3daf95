package push_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/push"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const (
	testProject = "campaignctl-demo"
	testToken   = "dKx3s1Q9RZ2:APA91bHv7sandboxDeviceToken0000000001"
)

// env is a sandbox behind a recorder that keeps every access token it saw, so that tests can check that
// none leaks into an error.
type env struct {
	s       *sandbox.Server
	srv     *httptest.Server
	saPath  string
	mu      sync.Mutex
	bearers map[string]bool
	// handler, when set, answers instead of the sandbox; it returns false to let the sandbox answer.
	handler func(w http.ResponseWriter, r *http.Request) bool
}

func newEnv(t *testing.T, opts sandbox.Options) *env {
	t.Helper()
	e := &env{s: sandbox.New(opts), bearers: map[string]bool{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			e.mu.Lock()
			e.bearers[tok] = true
			e.mu.Unlock()
		}
		e.mu.Lock()
		h := e.handler
		e.mu.Unlock()
		if h != nil && h(w, r) {
			return
		}
		e.s.ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	e.saPath = filepath.Join(t.TempDir(), "sa.json")
	if err := sandbox.WriteServiceAccount(e.saPath, e.srv.URL, testProject); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) intercept(h func(w http.ResponseWriter, r *http.Request) bool) {
	e.mu.Lock()
	e.handler = h
	e.mu.Unlock()
}

func (e *env) provider(t *testing.T, edit ...func(*push.Config)) *push.Provider {
	t.Helper()
	cfg := push.Config{ProjectID: testProject, CredentialsFile: e.saPath, BaseURL: e.srv.URL, Timeout: 2 * time.Second}
	for _, f := range edit {
		f(&cfg)
	}
	p, err := push.New(cfg)
	if err != nil {
		t.Fatalf("new provider: %v", err)
	}
	return p
}

// secrets returns what must never appear in an error: the private key (each line of its PEM body), every
// access token seen, and the device token.
func (e *env) secrets(t *testing.T, to string) []string {
	t.Helper()
	var sa struct {
		PrivateKey string `json:"private_key"`
	}
	data, err := os.ReadFile(e.saPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &sa); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(sa.PrivateKey, "\n") {
		if len(line) > 20 && !strings.HasPrefix(line, "-----") {
			out = append(out, line)
		}
	}
	e.mu.Lock()
	for tok := range e.bearers {
		out = append(out, tok)
	}
	e.mu.Unlock()
	if to != "" {
		out = append(out, to)
	}
	return out
}

// providerError asserts that err is a *providers.Error from "fcm" free of secrets, and returns it.
func (e *env) providerError(t *testing.T, err error, to string) *providers.Error {
	t.Helper()
	return providertest.Error(t, err, "fcm", e.secrets(t, to)...)
}

func TestSendSuccess(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	p := e.provider(t)
	if p.Name() != "fcm" {
		t.Errorf("Name() = %q", p.Name())
	}
	res, err := p.Send(context.Background(), providers.Message{
		To: testToken, Subject: "İndirim", Body: "Kodunuz: ABC123", Data: map[string]string{"code": "ABC123"},
		CampaignID: 7, UserID: "u1",
	})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	msgs := e.s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("sandbox recorded %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if want := "projects/" + testProject + "/messages/" + m.SID; res.MessageID != want {
		t.Errorf("MessageID %q, want %q", res.MessageID, want)
	}
	got := sandbox.Message{Provider: m.Provider, AccountSID: m.AccountSID, To: m.To, Subject: m.Subject, Body: m.Body, Status: m.Status}
	want := sandbox.Message{Provider: "fcm", AccountSID: testProject, To: testToken, Subject: "İndirim", Body: "Kodunuz: ABC123", Status: "accepted"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("recorded (-want +got):\n%s", diff)
	}
}

// The request body is exactly FCM's shape, a data-only message omits the notification, and the token is
// a bearer token.
func TestSendRequestShape(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	var bodies []map[string]any
	var paths []string
	e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, ":send") {
			return false
		}
		var v map[string]any
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			t.Errorf("decode body: %v", err)
		}
		bodies = append(bodies, v)
		paths = append(paths, r.Method+" "+r.URL.Path+" "+strings.SplitN(r.Header.Get("Authorization"), " ", 2)[0])
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"name":"projects/x/messages/1"}`))
		return true
	})
	p := e.provider(t)
	for _, m := range []providers.Message{
		{To: testToken, Subject: "t", Body: "b", Data: map[string]string{"k": "v"}},
		{To: testToken, Data: map[string]string{"k": "v"}},
	} {
		if _, err := p.Send(context.Background(), m); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	want := []map[string]any{
		{"message": map[string]any{"token": testToken, "notification": map[string]any{"title": "t", "body": "b"}, "data": map[string]any{"k": "v"}}},
		{"message": map[string]any{"token": testToken, "data": map[string]any{"k": "v"}}},
	}
	if diff := cmp.Diff(want, bodies); diff != "" {
		t.Errorf("bodies (-want +got):\n%s", diff)
	}
	wantPath := "POST /v1/projects/" + testProject + "/messages:send Bearer"
	if diff := cmp.Diff([]string{wantPath, wantPath}, paths); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

// One token serves every send, concurrent or not: the token endpoint is asked once.
func TestTokenFetchedOnceAndReused(t *testing.T) {
	e := newEnv(t, sandbox.Options{Latency: 2 * time.Millisecond})
	p := e.provider(t)
	const n = 50
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := p.Send(context.Background(), providers.Message{To: fmt.Sprintf("device-%03d", i), Body: fmt.Sprintf("kod %d", i)})
			ids[i], errs[i] = res.MessageID, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("send %d: %v", i, err)
		}
	}
	for i := range 5 {
		if _, err := p.Send(context.Background(), providers.Message{To: fmt.Sprintf("device-late-%d", i), Body: "hi"}); err != nil {
			t.Errorf("sequential send: %v", err)
		}
	}
	if st := e.s.FCMStats(); st.TokenRequests != 1 || st.TokensIssued != 1 || st.Unauthenticated != 0 {
		t.Errorf("FCM stats %+v, want one token request and one token", st)
	}
	byName := map[string]sandbox.Message{}
	for _, m := range e.s.Messages() {
		byName["projects/"+testProject+"/messages/"+m.SID] = m
	}
	if len(byName) != n+5 {
		t.Fatalf("sandbox recorded %d distinct messages, want %d", len(byName), n+5)
	}
	for i, id := range ids {
		if m, ok := byName[id]; !ok || m.To != fmt.Sprintf("device-%03d", i) || m.Body != fmt.Sprintf("kod %d", i) {
			t.Errorf("send %d: id %q maps to %+v", i, id, m)
		}
	}
}

func TestSendFCMErrors(t *testing.T) {
	tests := []struct {
		token      string
		status     int
		class      providers.Class
		badAddress bool
		account    bool
		retryAfter time.Duration
		code       string
	}{
		{"unregistered-1", 404, providers.Permanent, true, false, 0, "UNREGISTERED"},
		{"mismatch-1", 403, providers.Permanent, true, false, 0, "SENDER_ID_MISMATCH"},
		{"invalid-1", 400, providers.Permanent, false, false, 0, "INVALID_ARGUMENT"},
		// The project's APNs or web push credentials: this token waits alone (RecipientLimited), for
		// ten minutes; neither the account (Android tokens go on) nor the token is at fault.
		{"thirdparty-1", 401, providers.Transient, false, false, 10 * time.Minute, "THIRD_PARTY_AUTH_ERROR"},
		{"quota-1", 429, providers.Transient, false, false, time.Second, "QUOTA_EXCEEDED"},
		{"unavailable-1", 503, providers.Transient, false, false, time.Second, "UNAVAILABLE"},
		{"internal-1", 500, providers.Transient, false, false, 0, "INTERNAL"},
		{"bad token with spaces", 400, providers.Permanent, false, false, 0, "INVALID_ARGUMENT"},
	}
	e := newEnv(t, sandbox.Options{})
	p := e.provider(t)
	for _, tt := range tests {
		t.Run(tt.code+"/"+tt.token, func(t *testing.T) {
			_, err := p.Send(context.Background(), providers.Message{To: tt.token, Subject: "s", Body: "b"})
			pe := e.providerError(t, err, tt.token)
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Class: pe.Class, BadAddress: pe.BadAddress, RetryAfter: pe.RetryAfter}
			want := providers.Error{Provider: "fcm", Status: tt.status, Class: tt.class, BadAddress: tt.badAddress, RetryAfter: tt.retryAfter}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if pe.AccountLevel() != tt.account {
				t.Errorf("AccountLevel() = %v, want %v", pe.AccountLevel(), tt.account)
			}
			if pe.RecipientLimited != (tt.code == "THIRD_PARTY_AUTH_ERROR") {
				t.Errorf("RecipientLimited = %v", pe.RecipientLimited)
			}
			if !strings.HasPrefix(pe.Message, tt.code+":") {
				t.Errorf("Message %q does not start with %s", pe.Message, tt.code)
			}
		})
	}
	if n := len(e.s.Messages()); n != 0 {
		t.Errorf("sandbox recorded %d messages, want 0", n)
	}
	// A THIRD_PARTY_AUTH_ERROR is not a refused access token: no new token was fetched for it.
	if st := e.s.FCMStats(); st.TokenRequests != 1 {
		t.Errorf("%d token requests, want 1", st.TokenRequests)
	}
}

func TestSendInvalidPayload(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	p := e.provider(t)
	for name, m := range map[string]providers.Message{
		"too big":      {To: testToken, Body: strings.Repeat("x", 4000), Data: map[string]string{"k": strings.Repeat("y", 200)}},
		"reserved key": {To: testToken, Body: "hi", Data: map[string]string{"from": "x"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Send(context.Background(), m)
			pe := e.providerError(t, err, m.To)
			if pe.Class != providers.Permanent || pe.Status != 400 || pe.BadAddress || pe.AccountLevel() || !strings.HasPrefix(pe.Message, "INVALID_ARGUMENT") {
				t.Errorf("got %+v, want permanent 400 INVALID_ARGUMENT, not a bad address", pe)
			}
		})
	}
	_, err := p.Send(context.Background(), providers.Message{Body: "no token"})
	if pe := e.providerError(t, err, ""); pe.Class != providers.Permanent {
		t.Errorf("empty token: %+v", pe)
	}
}

func TestSendFaults(t *testing.T) {
	tests := []struct {
		name       string
		faults     sandbox.Faults
		status     int
		class      providers.Class
		retryAfter time.Duration
		recorded   int
	}{
		{"429", sandbox.Faults{Rate429: 1}, 429, providers.Transient, time.Second, 0},
		{"500", sandbox.Faults{Rate500: 1}, 500, providers.Transient, 0, 0},
		{"503", sandbox.Faults{Rate503: 1}, 503, providers.Transient, time.Second, 0},
		{"503 html", sandbox.Faults{RateRaw503: 1}, 503, providers.Transient, 0, 0},
		{"timeout", sandbox.Faults{RateTimeout: 1}, 0, providers.Ambiguous, 0, 1},
		{"reset", sandbox.Faults{RateReset: 1}, 0, providers.Ambiguous, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, sandbox.Options{Faults: tt.faults})
			p := e.provider(t, func(c *push.Config) { c.Timeout = 300 * time.Millisecond })
			start := time.Now()
			_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
			pe := e.providerError(t, err, testToken)
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Class: pe.Class, RetryAfter: pe.RetryAfter}
			want := providers.Error{Provider: "fcm", Status: tt.status, Class: tt.class, RetryAfter: tt.retryAfter}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if tt.class == providers.Ambiguous && pe.Err == nil {
				t.Errorf("ambiguous error without the transport error")
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Send took %v with a 300ms timeout", d)
			}
			if n := len(e.s.Messages()); n != tt.recorded {
				t.Errorf("sandbox recorded %d messages, want %d", n, tt.recorded)
			}
		})
	}
}

func TestSendServerRateLimit(t *testing.T) {
	e := newEnv(t, sandbox.Options{FCMRate: 2})
	p := e.provider(t)
	var ok, limited int
	for range 10 {
		_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
		if err == nil {
			ok++
			continue
		}
		pe := e.providerError(t, err, testToken)
		if pe.Class != providers.Transient || pe.Status != 429 || pe.RetryAfter != time.Second || !strings.HasPrefix(pe.Message, "QUOTA_EXCEEDED") {
			t.Errorf("rate-limited send: %+v", pe)
		}
		limited++
	}
	if ok == 0 || limited == 0 {
		t.Errorf("%d sent, %d limited; want both", ok, limited)
	}
}

// Every Send classifies its own answer, even when concurrent sends get different ones.
func TestSendConcurrentMixedFaults(t *testing.T) {
	e := newEnv(t, sandbox.Options{Faults: sandbox.Faults{Rate429: 0.3, Rate503: 0.3}})
	p := e.provider(t)
	const n = 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for i := range n {
		wg.Go(func() {
			to := fmt.Sprintf("device-%03d", i)
			kind := "unregistered"
			if i%2 == 0 {
				kind = "device"
			}
			to = kind + "-" + to
			res, err := p.Send(context.Background(), providers.Message{To: to, Body: "hi"})
			if err == nil {
				if kind != "device" || res.MessageID == "" {
					t.Errorf("send %d succeeded with %+v", i, res)
				}
				mu.Lock()
				sent++
				mu.Unlock()
				return
			}
			var pe *providers.Error
			if !errors.As(err, &pe) {
				t.Errorf("send %d: %v", i, err)
				return
			}
			switch {
			case pe.Status == 429 && pe.Class == providers.Transient && pe.RetryAfter == time.Second && !pe.BadAddress:
			case pe.Status == 503 && pe.Class == providers.Transient && pe.RetryAfter == time.Second && !pe.BadAddress:
			case pe.Status == 404 && pe.Class == providers.Permanent && pe.BadAddress && kind == "unregistered":
			default:
				t.Errorf("send %d (%s): inconsistent error %+v", i, kind, pe)
			}
		})
	}
	wg.Wait()
	if got := len(e.s.Messages()); got != sent {
		t.Errorf("sandbox recorded %d, provider reported %d sent", got, sent)
	}
	if st := e.s.FCMStats(); st.TokenRequests != 1 {
		t.Errorf("%d token requests, want 1", st.TokenRequests)
	}
}

// A token the sandbox no longer honours is replaced once, and the message goes through.
func TestRevokedTokenIsReplaced(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	p := e.provider(t)
	if _, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "1"}); err != nil {
		t.Fatal(err)
	}
	e.s.RevokeFCMTokens()
	if _, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "2"}); err != nil {
		t.Fatalf("send after revocation: %v", err)
	}
	if _, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "3"}); err != nil {
		t.Fatal(err)
	}
	want := sandbox.FCMStats{TokenRequests: 2, TokensIssued: 2, Unauthenticated: 1}
	if diff := cmp.Diff(want, e.s.FCMStats()); diff != "" {
		t.Errorf("FCM stats (-want +got):\n%s", diff)
	}
	if n := len(e.s.Messages()); n != 3 {
		t.Errorf("%d messages recorded, want 3", n)
	}
}

// When FCM keeps refusing fresh tokens, Send gives up after one retry with an account-level error.
func TestUnauthenticatedTwiceIsPermanent(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, ":send") {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}`))
		return true
	})
	p := e.provider(t)
	_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
	pe := e.providerError(t, err, testToken)
	if pe.Class != providers.Permanent || pe.Status != 401 || !pe.AccountLevel() || !strings.Contains(pe.Message, "GOOGLE_APPLICATION_CREDENTIALS") {
		t.Errorf("got %+v, want permanent, account-level 401 naming GOOGLE_APPLICATION_CREDENTIALS", pe)
	}
	if st := e.s.FCMStats(); st.TokenRequests != 2 {
		t.Errorf("%d token requests, want 2 (the first and one replacement)", st.TokenRequests)
	}
}

func TestTokenEndpointFailures(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		body       string
		retryAfter string
		wantStatus int
		class      providers.Class
		wantRetry  time.Duration
		account    bool
	}{
		{"503", 503, `{"error":"temporarily_unavailable"}`, "2", 503, providers.Transient, 2 * time.Second, false},
		{"429", 429, `{"error":"rate_limit_exceeded"}`, "", 429, providers.Transient, 0, false},
		{"400 invalid_grant", 400, `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`, "", 401, providers.Permanent, 0, true},
		{"401", 401, `{"error":"unauthorized_client"}`, "", 401, providers.Permanent, 0, true},
		{"404 html", 404, `<html>no</html>`, "", 401, providers.Permanent, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, sandbox.Options{})
			e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path != "/token" {
					return false
				}
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
				return true
			})
			p := e.provider(t)
			_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
			pe := e.providerError(t, err, testToken)
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Class: pe.Class, RetryAfter: pe.RetryAfter}
			want := providers.Error{Provider: "fcm", Status: tt.wantStatus, Class: tt.class, RetryAfter: tt.wantRetry}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if pe.AccountLevel() != tt.account {
				t.Errorf("AccountLevel() = %v, want %v", pe.AccountLevel(), tt.account)
			}
			if !strings.Contains(pe.Message, "token endpoint answered "+fmt.Sprint(tt.status)) {
				t.Errorf("Message %q does not name the token endpoint's answer", pe.Message)
			}
			if st := e.s.Stats(); st.Requests != 0 {
				t.Errorf("%d sends reached FCM without a token", st.Requests)
			}

			// A refusal is given again, without asking, for a second (then two, four, ... up to a minute):
			// every Send asked the endpoint again, 40 requests a second from two workers. Once that wait is
			// over and the endpoint has recovered, the next Send gets a token.
			var asked atomic.Int32
			e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path == "/token" {
					asked.Add(1)
				}
				return false
			})
			for range 20 {
				if _, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"}); err == nil {
					t.Fatal("a send went through within the refusal's wait")
				}
			}
			if n := asked.Load(); n != 0 {
				t.Errorf("the token endpoint was asked %d times within a second of its refusal; want none", n)
			}
			time.Sleep(1100 * time.Millisecond)
			if _, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"}); err != nil {
				t.Errorf("send after the token endpoint recovered: %v", err)
			}
			if n := asked.Load(); n != 1 {
				t.Errorf("the token endpoint was asked %d times after the wait; want 1", n)
			}
		})
	}
}

// A key the sandbox does not know for this service account (rotated, or the file edited) is refused by
// the token endpoint: account-level, never retried.
func TestWrongKeyIsRefused(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	var sa map[string]any
	data, err := os.ReadFile(e.saPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &sa); err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(other)
	sa["private_key"] = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	data, _ = json.Marshal(sa)
	if err := os.WriteFile(e.saPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.provider(t)
	_, err = p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
	pe := e.providerError(t, err, testToken)
	if pe.Class != providers.Permanent || !pe.AccountLevel() || !strings.Contains(pe.Message, "invalid_grant") {
		t.Errorf("got %+v, want a permanent account-level invalid_grant", pe)
	}
	if st := e.s.FCMStats(); st.TokensRefused != 1 || st.TokensIssued != 0 {
		t.Errorf("FCM stats %+v", st)
	}
}

func TestTokenEndpointUnreachableIsTransient(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	addr := providertest.ClosedAddr(t)
	if err := sandbox.WriteServiceAccount(e.saPath, "http://"+addr, testProject); err != nil {
		t.Fatal(err)
	}
	p := e.provider(t)
	_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
	pe := e.providerError(t, err, testToken)
	if pe.Class != providers.Transient || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want transient with the transport error", pe)
	}
}

func TestSendClosedPortIsTransient(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	addr := providertest.ClosedAddr(t)
	p := e.provider(t, func(c *push.Config) { c.BaseURL = "http://" + addr })
	_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
	pe := e.providerError(t, err, testToken)
	if pe.Class != providers.Transient || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want transient with a transport error", pe)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("the dial error %v is not reachable with errors.As", err)
	}
}

func TestSendUnexpectedAnswers(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		class  providers.Class
	}{
		{"200 without name", 200, `{}`, providers.Ambiguous},
		{"200 not json", 200, `ok`, providers.Ambiguous},
		{"redirect", 302, ``, providers.Permanent},
		{"502 html", 502, `<html>bad gateway</html>`, providers.Transient},
		{"404 without FcmError", 404, `{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND"}}`, providers.Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, sandbox.Options{})
			e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
				if !strings.HasSuffix(r.URL.Path, ":send") {
					return false
				}
				if tt.status == 302 {
					w.Header().Set("Location", "http://elsewhere.invalid/")
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
				return true
			})
			p := e.provider(t)
			_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"})
			pe := e.providerError(t, err, testToken)
			if pe.Class != tt.class || pe.Status != tt.status || pe.BadAddress {
				t.Errorf("got %+v, want %v with status %d and no bad address", pe, tt.class, tt.status)
			}
		})
	}
}

func TestSendContextDone(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	p := e.provider(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Send(ctx, providers.Message{To: testToken, Body: "hi"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	var pe *providers.Error
	if errors.As(err, &pe) {
		t.Errorf("err is a *providers.Error %+v; a context done before sending is not", pe)
	}
	if st := e.s.FCMStats(); st.TokenRequests != 0 {
		t.Errorf("%d token requests, want 0", st.TokenRequests)
	}
}

// A caller that gives up while the token endpoint is slow gets its context error at once; the fetch goes
// on and its token serves the next Send.
func TestContextDoneWhileFetchingToken(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	release := make(chan struct{})
	e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/token" {
			<-release
		}
		return false
	})
	p := e.provider(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.Send(ctx, providers.Message{To: testToken, Body: "hi"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Send returned after %v", d)
	}
	close(release)
	if _, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi"}); err != nil {
		t.Fatalf("next send: %v", err)
	}
	if st := e.s.FCMStats(); st.TokenRequests != 1 {
		t.Errorf("%d token requests, want 1", st.TokenRequests)
	}
	if n := len(e.s.Messages()); n != 1 {
		t.Errorf("%d messages recorded, want 1", n)
	}
}

func TestNewValidation(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := sandbox.WriteServiceAccount(good, "http://127.0.0.1:1", "from-file"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	var sa map[string]any
	if err := json.Unmarshal(data, &sa); err != nil {
		t.Fatal(err)
	}
	key := sa["private_key"].(string)
	keyLine := strings.Split(key, "\n")[1]
	write := func(name string, edit func(map[string]any)) string {
		m := map[string]any{}
		for k, v := range sa {
			m[k] = v
		}
		edit(m)
		b, _ := json.Marshal(m)
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	raw := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	tests := []struct {
		name string
		cfg  push.Config
		want string
	}{
		{"no file", push.Config{ProjectID: "p"}, "GOOGLE_APPLICATION_CREDENTIALS"},
		{"missing file", push.Config{ProjectID: "p", CredentialsFile: filepath.Join(dir, "nope.json")}, "GOOGLE_APPLICATION_CREDENTIALS"},
		{"not json", push.Config{ProjectID: "p", CredentialsFile: raw("bad.json", "{\"private_key\": \""+keyLine)}, "GOOGLE_APPLICATION_CREDENTIALS"},
		{"no project", push.Config{CredentialsFile: write("noproj.json", func(m map[string]any) { delete(m, "project_id") })}, "FCM_PROJECT_ID"},
		{"bad project", push.Config{ProjectID: "a/b", CredentialsFile: good}, "FCM_PROJECT_ID"},
		{"no email", push.Config{ProjectID: "p", CredentialsFile: write("noemail.json", func(m map[string]any) { delete(m, "client_email") })}, "client_email"},
		{"no key", push.Config{ProjectID: "p", CredentialsFile: write("nokey.json", func(m map[string]any) { delete(m, "private_key") })}, "private_key"},
		{"key not pem", push.Config{ProjectID: "p", CredentialsFile: write("notpem.json", func(m map[string]any) { m["private_key"] = keyLine })}, "PEM"},
		{"user credentials", push.Config{ProjectID: "p", CredentialsFile: write("user.json", func(m map[string]any) { m["type"] = "authorized_user" })}, "service-account"},
		{"bad token uri", push.Config{ProjectID: "p", CredentialsFile: write("uri.json", func(m map[string]any) { m["token_uri"] = "ftp://x" })}, "token_uri"},
		{"bad base url", push.Config{ProjectID: "p", CredentialsFile: good, BaseURL: "ftp://u:pw@x"}, "FCM_BASE_URL"},
		{"negative timeout", push.Config{ProjectID: "p", CredentialsFile: good, Timeout: -time.Second}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := push.New(tt.cfg)
			if err == nil {
				t.Fatalf("New succeeded: %+v", p)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %s", err, tt.want)
			}
			if strings.Contains(err.Error(), keyLine) || strings.Contains(err.Error(), "pw") {
				t.Errorf("error %q shows a secret", err)
			}
		})
	}

	// The project comes from the file when Config has none.
	if _, err := push.New(push.Config{CredentialsFile: good}); err != nil {
		t.Errorf("project from the file: %v", err)
	}
}

// An FCM answer that quotes the request (its Authorization header, the data's audience values) shows
// neither the access token nor a phone number or address the data carried. Before, a 401 that quoted
// "Bearer <token>" put the live access token in the worker's log, `status`, and the DLQ's last error.
func TestAnAnswerThatEchoesTheRequestShowsNoTokenNorAddress(t *testing.T) {
	const phone, mail = "+905329876543", "ayse.kaya@example.com"
	e := newEnv(t, sandbox.Options{})
	e.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, ":send") {
			return false
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": 401, "status": "UNAUTHENTICATED",
			"message": "Request had invalid authentication credentials: " + r.Header.Get("Authorization") + " for " + string(body)}})
		return true
	})
	p := e.provider(t)
	_, err := p.Send(context.Background(), providers.Message{To: testToken, Body: "hi", Data: map[string]string{"phone": phone, "email": mail}})
	pe := providertest.Error(t, err, "fcm", append(e.secrets(t, testToken), phone, strings.TrimPrefix(phone, "+"), mail)...)
	e.mu.Lock()
	seen := len(e.bearers)
	e.mu.Unlock()
	if seen == 0 || !strings.Contains(pe.Message, "Bearer [secret]") {
		t.Errorf("message %q (%d tokens seen): want the echoed token shown as Bearer [secret]", pe.Message, seen)
	}
}
