package twilio_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twilio/twilio-go/client"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/twilio"
)

const (
	testSID   = "ACtest00000000000000000000000001"
	testToken = "s3cretTok3nValue"
	testFrom  = "+14155550100"
	testTo    = "+905551234567"
)

// newSandbox starts a Twilio sandbox that accepts only the test credentials.
func newSandbox(t testing.TB, opts sandbox.Options) (*sandbox.Server, *httptest.Server) {
	t.Helper()
	opts.TwilioAccountSID, opts.TwilioAuthToken = testSID, testToken
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv
}

func newProvider(t testing.TB, baseURL string, edit ...func(*twilio.Config)) *twilio.Provider {
	t.Helper()
	cfg := twilio.Config{AccountSID: testSID, AuthToken: testToken, From: testFrom, BaseURL: baseURL, Timeout: 2 * time.Second}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := twilio.New(cfg)
	if err != nil {
		t.Fatalf("new provider: %v", err)
	}
	return p
}

// providerError asserts that err is a *providers.Error free of secrets and of the recipient, and
// returns it.
func providerError(t *testing.T, err error, to string) *providers.Error {
	t.Helper()
	return providertest.Error(t, err, "twilio", testToken, to, strings.TrimPrefix(to, "+"))
}

func TestSendSuccess(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{})
	p := newProvider(t, srv.URL)
	if p.Name() != "twilio" {
		t.Errorf("Name() = %q", p.Name())
	}
	body := "Merhaba! Kodunuz: ABC123"
	res, err := p.Send(context.Background(), providers.Message{To: testTo, Body: body, CampaignID: 7, UserID: "u1"})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	msgs := s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("sandbox recorded %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	want := providers.Result{MessageID: m.SID, Segments: 1}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if m.To != testTo || m.From != testFrom || m.Body != body || m.AccountSID != testSID || !strings.HasPrefix(m.SID, "SM") {
		t.Errorf("recorded %+v", m)
	}
}

func TestSendSegments(t *testing.T) {
	_, srv := newSandbox(t, sandbox.Options{})
	p := newProvider(t, srv.URL)
	tests := []struct {
		body string
		want int
	}{
		{strings.Repeat("a", 160), 1},
		{strings.Repeat("a", 161), 2},
		{strings.Repeat("ş", 70), 1},
		{strings.Repeat("ş", 71), 2},
		{"İndirim kodunuz ABC123. " + strings.Repeat("Çok güzel ", 10), 2}, // 124 UCS-2 units: 67 + 57
	}
	for _, tt := range tests {
		res, err := p.Send(context.Background(), providers.Message{To: testTo, Body: tt.body})
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		if res.Segments != tt.want {
			t.Errorf("%d characters: %d segments, want %d", len([]rune(tt.body)), res.Segments, tt.want)
		}
	}
}

func TestSendPermanentRecipientErrors(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{})
	p := newProvider(t, srv.URL)
	for _, code := range []int{21211, 21408, 21606, 21608, 21610, 21614, 21635} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			to := fmt.Sprintf("+9055500%d", code)
			_, err := p.Send(context.Background(), providers.Message{To: to, Body: "hi"})
			pe := providerError(t, err, to)
			if pe.Class != providers.Permanent || pe.Code != code || pe.Status != http.StatusBadRequest || pe.Message == "" {
				t.Errorf("got %+v, want permanent, http 400, code %d, a message", pe, code)
			}
			// Only an opt-out (the recipient's STOP) speaks of consent: it is the person's refusal.
			if pe.OptedOut != (code == 21610) || pe.NoConsent {
				t.Errorf("code %d: OptedOut %v NoConsent %v", code, pe.OptedOut, pe.NoConsent)
			}
		})
	}
	// Invalid numbers are refused the same way.
	_, err := p.Send(context.Background(), providers.Message{To: "05551234567", Body: "hi"})
	if pe := providerError(t, err, "05551234567"); pe.Class != providers.Permanent || pe.Code != 21211 {
		t.Errorf("non-E.164 To: %+v", pe)
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("sandbox recorded %d messages, want 0", n)
	}
}

func TestSendWrongToken(t *testing.T) {
	_, srv := newSandbox(t, sandbox.Options{})
	p := newProvider(t, srv.URL, func(c *twilio.Config) { c.AuthToken = "wrongToken1" })
	_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
	pe := providerError(t, err, testTo)
	if pe.Class != providers.Permanent || pe.Code != 20003 || pe.Status != http.StatusUnauthorized {
		t.Errorf("got %+v, want permanent 401 code 20003", pe)
	}
	if strings.Contains(err.Error(), "wrongToken1") {
		t.Errorf("error shows the token: %v", err)
	}
}

func TestSendTransientAnswers(t *testing.T) {
	tests := []struct {
		name       string
		faults     sandbox.Faults
		status     int
		code       int
		retryAfter time.Duration
	}{
		{"429", sandbox.Faults{Rate429: 1}, 429, 20429, time.Second},
		{"500 json", sandbox.Faults{Rate500: 1}, 500, 20500, 0},
		{"503 json", sandbox.Faults{Rate503: 1}, 503, 20503, 0},
		{"503 html", sandbox.Faults{RateRaw503: 1}, 503, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, srv := newSandbox(t, sandbox.Options{Faults: tt.faults})
			p := newProvider(t, srv.URL)
			_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
			pe := providerError(t, err, testTo)
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Code: pe.Code, RetryAfter: pe.RetryAfter, Class: pe.Class}
			want := providers.Error{Provider: "twilio", Status: tt.status, Code: tt.code, RetryAfter: tt.retryAfter, Class: providers.Transient}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if len(s.Messages()) != 0 {
				t.Errorf("sandbox recorded a refused message")
			}
		})
	}
}

func TestSendServerRateLimit(t *testing.T) {
	_, srv := newSandbox(t, sandbox.Options{TwilioRate: 2})
	p := newProvider(t, srv.URL)
	var ok, limited int
	for range 10 {
		_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
		if err == nil {
			ok++
			continue
		}
		pe := providerError(t, err, testTo)
		if pe.Class != providers.Transient || pe.Code != 20429 || pe.RetryAfter != time.Second {
			t.Errorf("rate-limited send: %+v", pe)
		}
		limited++
	}
	if ok == 0 || limited == 0 {
		t.Errorf("%d sent, %d limited; want both", ok, limited)
	}
}

func TestSendTimeoutIsAmbiguous(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{Faults: sandbox.Faults{RateTimeout: 1}})
	p := newProvider(t, srv.URL, func(c *twilio.Config) { c.Timeout = 200 * time.Millisecond })
	start := time.Now()
	_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
	pe := providerError(t, err, testTo)
	if pe.Class != providers.Ambiguous || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want ambiguous with no status and a transport error", pe)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Send took %v with a 200ms timeout", d)
	}
	// The sandbox did accept it: this is exactly why a resend would be a double send.
	if msgs := s.Messages(); len(msgs) != 1 || msgs[0].To != testTo {
		t.Errorf("sandbox recorded %+v, want the one message", msgs)
	}
}

func TestSendResetIsAmbiguous(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{Faults: sandbox.Faults{RateReset: 1}})
	p := newProvider(t, srv.URL)
	_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
	pe := providerError(t, err, testTo)
	if pe.Class != providers.Ambiguous || pe.Status != 0 {
		t.Errorf("got %+v, want ambiguous", pe)
	}
	if st := s.Stats(); st.Resets != 1 {
		t.Errorf("sandbox saw %d resets, want 1", st.Resets)
	}
}

func TestSendClosedPortIsTransient(t *testing.T) {
	addr := providertest.ClosedAddr(t)
	p := newProvider(t, "http://"+addr)
	_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
	pe := providerError(t, err, testTo)
	if pe.Class != providers.Transient || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want transient with a transport error", pe)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("the dial error %v is not reachable with errors.As", err)
	}
}

func TestSendContextDone(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{})
	p := newProvider(t, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Send(ctx, providers.Message{To: testTo, Body: "hi"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	var pe *providers.Error
	if errors.As(err, &pe) {
		t.Errorf("err is a *providers.Error %+v; a context done before sending is not", pe)
	}
	if providers.ClassOf(err) != providers.Transient {
		t.Errorf("ClassOf = %v, want transient", providers.ClassOf(err))
	}
	if st := s.Stats(); st.Requests != 0 {
		t.Errorf("sandbox saw %d requests, want 0", st.Requests)
	}
}

func TestSendConcurrent(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{Latency: 2 * time.Millisecond})
	p := newProvider(t, srv.URL)
	const n = 50
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := p.Send(context.Background(), providers.Message{To: fmt.Sprintf("+9055510%05d", i), Body: fmt.Sprintf("kod %d", i)})
			ids[i], errs[i] = res.MessageID, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("send %d: %v", i, err)
		}
	}
	bySID := make(map[string]sandbox.Message)
	for _, m := range s.Messages() {
		bySID[m.SID] = m
	}
	if len(bySID) != n {
		t.Fatalf("sandbox recorded %d distinct messages, want %d", len(bySID), n)
	}
	for i, id := range ids {
		m, ok := bySID[id]
		if !ok || m.Body != fmt.Sprintf("kod %d", i) || m.To != fmt.Sprintf("+9055510%05d", i) {
			t.Errorf("send %d: id %q maps to %+v", i, id, m)
		}
	}
	if st := s.Stats(); st.Duplicates != 0 || st.Accepted != n {
		t.Errorf("stats %+v", st)
	}
}

// Under concurrency each Send must classify its own request: a mix of faults and successes must never
// hand one call another call's status.
func TestSendConcurrentMixedFaults(t *testing.T) {
	s, srv := newSandbox(t, sandbox.Options{Faults: sandbox.Faults{Rate429: 0.3, Rate503: 0.3}})
	p := newProvider(t, srv.URL)
	const n = 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for i := range n {
		wg.Go(func() {
			to := fmt.Sprintf("+9055520%05d", i)
			res, err := p.Send(context.Background(), providers.Message{To: to, Body: "hi"})
			if err == nil {
				if res.MessageID == "" {
					t.Errorf("success without an id")
				}
				mu.Lock()
				sent++
				mu.Unlock()
				return
			}
			var pe *providers.Error
			if !errors.As(err, &pe) || pe.Class != providers.Transient {
				t.Errorf("send %d: %v, want transient", i, err)
				return
			}
			switch {
			case pe.Status == 429 && pe.Code == 20429 && pe.RetryAfter == time.Second:
			case pe.Status == 503 && pe.Code == 20503 && pe.RetryAfter == 0:
			default:
				t.Errorf("send %d: inconsistent error %+v", i, pe)
			}
		})
	}
	wg.Wait()
	if got := len(s.Messages()); got != sent {
		t.Errorf("sandbox recorded %d, provider reported %d sent", got, sent)
	}
}

func TestSendUnexpectedAnswers(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		class   providers.Class
		status  int
	}{
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://elsewhere.invalid/", http.StatusFound)
		}, providers.Permanent, 302},
		{"201 with a cut body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "500")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"sid":"SM`))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}, providers.Ambiguous, 201},
		{"201 without sid", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"status":"queued"}`))
		}, providers.Ambiguous, 201},
		{"502 json without twilio fields", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(`{"error":"upstream"}`))
		}, providers.Transient, 502},
		{"404 html", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "<html>not here</html>", http.StatusNotFound)
		}, providers.Permanent, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			p := newProvider(t, srv.URL)
			_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
			pe := providerError(t, err, testTo)
			if pe.Class != tt.class || pe.Status != tt.status {
				t.Errorf("got %+v, want %v with status %d", pe, tt.class, tt.status)
			}
		})
	}
}

// The SDK's URL says api.twilio.com; the request must still reach BaseURL, with Basic auth and the
// account's path, and be the request twilio-go's own client would send: a form POST with its
// User-Agent, the form's fields and nothing else.
func TestSendRewritesHost(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		_ = r.ParseForm()
		got.PostForm = r.PostForm
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"sid":"SM00000000000000000000000000000001","num_segments":"1"}`))
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL+"/")
	if _, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	user, pass, _ := got.BasicAuth()
	if got.Host != strings.TrimPrefix(srv.URL, "http://") || got.URL.Path != "/2010-04-01/Accounts/"+testSID+"/Messages.json" ||
		user != testSID || pass != testToken || got.PostForm.Get("From") != testFrom || got.PostForm.Get("To") != testTo {
		t.Errorf("request: host %q path %q user %q form %v", got.Host, got.URL.Path, user, got.PostForm)
	}
	ua := "twilio-go/" + client.LibraryVersion + " (" + runtime.GOOS + " " + runtime.GOARCH + ") go/" + runtime.Version()
	if got.Method != http.MethodPost || got.Header.Get("Content-Type") != "application/x-www-form-urlencoded" ||
		got.Header.Get("User-Agent") != ua || got.URL.RawQuery != "" || len(got.PostForm) != 3 || got.PostForm.Get("Body") != "hi" {
		t.Errorf("request: %s, Content-Type %q, User-Agent %q (want %q), query %q, form %v", got.Method,
			got.Header.Get("Content-Type"), got.Header.Get("User-Agent"), ua, got.URL.RawQuery, got.PostForm)
	}
}

func TestNewValidates(t *testing.T) {
	valid := twilio.Config{AccountSID: testSID, AuthToken: testToken, From: testFrom}
	tests := []struct {
		name string
		edit func(*twilio.Config)
		want string // substring of the error; "" means valid
	}{
		{"valid", func(*twilio.Config) {}, ""},
		{"alphanumeric sender", func(c *twilio.Config) { c.From = "ACME Shop" }, ""},
		{"sandbox url", func(c *twilio.Config) { c.BaseURL = "http://127.0.0.1:8025" }, ""},
		{"no sid", func(c *twilio.Config) { c.AccountSID = "" }, "TWILIO_ACCOUNT_SID"},
		{"bad sid", func(c *twilio.Config) { c.AccountSID = "AC-1" }, "TWILIO_ACCOUNT_SID"},
		{"no token", func(c *twilio.Config) { c.AuthToken = "" }, "TWILIO_AUTH_TOKEN"},
		{"bad token", func(c *twilio.Config) { c.AuthToken = "s3cret/Tok3n+Value" }, "TWILIO_AUTH_TOKEN"},
		{"no sender", func(c *twilio.Config) { c.From = "" }, "TWILIO_FROM"},
		{"bad number", func(c *twilio.Config) { c.From = "05551234567" }, "TWILIO_FROM"},
		{"sender id too long", func(c *twilio.Config) { c.From = "ACME Shop Online" }, "TWILIO_FROM"},
		{"sender id of digits", func(c *twilio.Config) { c.From = "12345" }, "TWILIO_FROM"},
		{"url scheme", func(c *twilio.Config) { c.BaseURL = "ftp://localhost" }, "TWILIO_BASE_URL"},
		{"url path", func(c *twilio.Config) { c.BaseURL = "http://localhost:8025/twilio" }, "TWILIO_BASE_URL"},
		{"url credentials", func(c *twilio.Config) { c.BaseURL = "http://user:" + testToken + "@localhost/x" }, "TWILIO_BASE_URL"},
		{"url unparsable", func(c *twilio.Config) { c.BaseURL = "http://[::1" + testToken }, "TWILIO_BASE_URL"},
		{"negative timeout", func(c *twilio.Config) { c.Timeout = -time.Second }, "timeout"},
		{"callback not a URL", func(c *twilio.Config) { c.StatusCallback = "hooks.example.com/twilio/status" }, "TWILIO_STATUS_CALLBACK"},
		{"callback unparsable", func(c *twilio.Config) { c.StatusCallback = "https://[::1/status?key=" + testToken }, "TWILIO_STATUS_CALLBACK"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.edit(&cfg)
			p, err := twilio.New(cfg)
			if tt.want == "" {
				if err != nil || p == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New succeeded, want an error mentioning %s", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %s", err, tt.want)
			}
			for _, secret := range []string{testToken, "s3cret/Tok3n+Value"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows the token", err)
				}
			}
		})
	}
}

// twilio-go never closes the body of an error answer and stops reading a success body at the end of the
// JSON value. With a chunked answer that would strand the connection until the timeout; Send must keep
// reusing one connection instead.
func TestSendReusesConnections(t *testing.T) {
	for _, status := range []int{http.StatusCreated, http.StatusTooManyRequests, http.StatusBadRequest} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				w.(http.Flusher).Flush() // no Content-Length: the body is chunked
				if status == http.StatusCreated {
					_, _ = w.Write([]byte(`{"sid":"SM00000000000000000000000000000001","num_segments":"1"}`))
				} else {
					fmt.Fprintf(w, `{"code":21211,"message":"Invalid","more_info":"","status":%d}`, status)
				}
				// The JSON value is complete, but the chunked body ends a little later, as over a slow
				// network: a reader that stops at the end of the value never sees the end of the body.
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}))
			var conns sync.Map
			srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
				if st == http.StateNew {
					conns.Store(c, true)
				}
			}
			srv.Start()
			defer srv.Close()
			p := newProvider(t, srv.URL)
			for range 5 {
				_, _ = p.Send(context.Background(), providers.Message{To: testTo, Body: "hi"})
			}
			n := 0
			conns.Range(func(any, any) bool { n++; return true })
			if n != 1 {
				t.Errorf("5 sends opened %d connections, want 1", n)
			}
		})
	}
}

// Warm opens the connections the next sends use: after Warm(n), n sends at once to the sandbox open none
// of their own, and a Warm after them opens none either, their connections being idle again
// (providers.Warmer).
func TestWarmOpensTheConnectionsOfTheNextSends(t *testing.T) {
	const n = 3
	srv := providertest.NewCountingServer(t, sandbox.New(sandbox.Options{TwilioAccountSID: testSID, TwilioAuthToken: testToken}), nil)
	p := newProvider(t, srv.URL)
	var _ providers.Warmer = p
	if err := p.Warm(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got := srv.Opened(n); got != n {
		t.Fatalf("Warm(%d) opened %d connections", n, got)
	}
	var sends sync.WaitGroup
	for i := range n {
		sends.Go(func() {
			m := benchMsg
			m.To = fmt.Sprintf("+90532000%04d", i)
			if _, err := p.Send(context.Background(), m); err != nil {
				t.Error(err)
			}
		})
	}
	sends.Wait()
	if got := srv.Opened(n); got != n {
		t.Errorf("%d sends after Warm(%d) opened %d connections of their own", n, n, got-n)
	}
	if err := p.Warm(context.Background(), n); err != nil || srv.Opened(n) != n {
		t.Errorf("Warm(%d) after the sends opened %d more (%v)", n, srv.Opened(n)-n, err)
	}
}

// An answer that echoes the request (a proxy's error page, a gateway that quotes what it refused) shows
// neither the credentials (the auth token, nor the Basic header's base64, which decodes to the account
// SID and the token), nor the recipient, nor another person's number or address the body carried. Before,
// the base64 credentials of an echoed Authorization header reached the worker's log and launch's error.
func TestAnAnswerThatEchoesTheRequestShowsNoCredentialNorAddress(t *testing.T) {
	const other, mail = "+905329876543", "ayse.kaya@example.com"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]any{"code": 20003, "status": 401,
			"message": "Authenticate " + r.Header.Get("Authorization") + " for " + r.PostForm.Encode()})
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL)
	_, err := p.Send(context.Background(), providers.Message{To: testTo, Body: "Merhaba, arkadaşın " + other + " (" + mail + ") seni davet etti"})
	basic := base64.StdEncoding.EncodeToString([]byte(testSID + ":" + testToken))
	pe := providertest.Error(t, err, "twilio", testToken, basic, testTo, strings.TrimPrefix(testTo, "+"), other, strings.TrimPrefix(other, "+"),
		mail, url.QueryEscape(mail), url.QueryEscape(other))
	if !strings.Contains(pe.Reason(), "Basic [secret]") {
		t.Errorf("reason %q: want the echoed credentials shown as Basic [secret]", pe.Reason())
	}
}
