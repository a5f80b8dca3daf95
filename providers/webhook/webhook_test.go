package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/webhook"
)

const (
	testSecret = "whsec-0123456789abcdef-sandbox"
	testTo     = "+905551234567"
)

func newSandbox(t *testing.T, opts sandbox.Options) (*sandbox.Server, string) {
	t.Helper()
	opts.WebhookSecret = testSecret
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL + "/webhook"
}

func newProvider(t *testing.T, url string, edit ...func(*webhook.Config)) *webhook.Provider {
	t.Helper()
	cfg := webhook.Config{URL: url, Secret: testSecret, Timeout: 2 * time.Second}
	for _, f := range edit {
		f(&cfg)
	}
	p, err := webhook.New(cfg)
	if err != nil {
		t.Fatalf("new provider: %v", err)
	}
	return p
}

func message(to string) providers.Message {
	return providers.Message{To: to, Subject: "İndirim", Body: "Kodunuz: ABC123", Data: map[string]string{"code": "ABC123"}, CampaignID: 7, UserID: "u1"}
}

// providerError asserts that err is a *providers.Error from "webhook" free of the secret, the recipient
// and anything else given, and returns it.
func providerError(t *testing.T, err error, secrets ...string) *providers.Error {
	t.Helper()
	return providertest.Error(t, err, "webhook", append([]string{testSecret, testTo}, secrets...)...)
}

func TestSendSuccess(t *testing.T) {
	s, url := newSandbox(t, sandbox.Options{})
	p := newProvider(t, url)
	if p.Name() != "webhook" {
		t.Errorf("Name() = %q", p.Name())
	}
	res, err := p.Send(context.Background(), message(testTo))
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	msgs := s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("sandbox recorded %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if res.MessageID != m.SID || !strings.HasPrefix(m.SID, "wh_") {
		t.Errorf("MessageID %q, sandbox id %q", res.MessageID, m.SID)
	}
	got := sandbox.Message{Provider: m.Provider, To: m.To, Subject: m.Subject, Body: m.Body, Status: m.Status}
	want := sandbox.Message{Provider: "webhook", To: testTo, Subject: "İndirim", Body: "Kodunuz: ABC123", Status: "accepted"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("recorded (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sandbox.WebhookStats{Requests: 1, Accepted: 1}, s.WebhookStats()); diff != "" {
		t.Errorf("webhook stats (-want +got):\n%s", diff)
	}
}

// A receiver of our own sees the documented request, and Verify accepts it.
func TestRequestVerifies(t *testing.T) {
	var (
		mu     sync.Mutex
		header http.Header
		body   []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		header, body = r.Header.Clone(), b
		mu.Unlock()
		if err := webhook.Verify(testSecret, r.Header, b, time.Now(), 0); err != nil {
			http.Error(w, `{"error":"bad signature"}`, http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL)
	before := time.Now().Unix()
	res, err := p.Send(context.Background(), message(testTo))
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	// A 204 has no id: the Idempotency-Key stands in.
	if res.MessageID != "7:u1" {
		t.Errorf("MessageID %q, want the Idempotency-Key 7:u1", res.MessageID)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := header.Get("Idempotency-Key"); got != "7:u1" {
		t.Errorf("Idempotency-Key %q", got)
	}
	if got := header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	ts, err := strconv.ParseInt(header.Get("X-Campaignctl-Timestamp"), 10, 64)
	if err != nil || ts < before || ts > time.Now().Unix() {
		t.Errorf("timestamp %q", header.Get("X-Campaignctl-Timestamp"))
	}
	sig := header.Get("X-Campaignctl-Signature")
	if !strings.HasPrefix(sig, "v1=") || len(sig) != 3+64 {
		t.Errorf("signature %q, want v1= and 64 hex digits", sig)
	}
	if sig != webhook.Sign(testSecret, time.Unix(ts, 0), body) {
		t.Errorf("signature does not match Sign")
	}
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"campaign_id": float64(7), "user_id": "u1", "to": testTo, "subject": "İndirim",
		"body": "Kodunuz: ABC123", "data": map[string]any{"code": "ABC123"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_760_000_000, 0)
	body := []byte(`{"campaign_id":7,"user_id":"u1","to":"+905551234567"}`)
	signed := func(secret string, at time.Time, body []byte) http.Header {
		h := http.Header{}
		h.Set("X-Campaignctl-Timestamp", strconv.FormatInt(at.Unix(), 10))
		h.Set("X-Campaignctl-Signature", webhook.Sign(secret, at, body))
		return h
	}
	tampered := append([]byte{}, body...)
	tampered[len(tampered)-3] = '8'
	rotated := signed(testSecret, now, body)
	rotated.Set("X-Campaignctl-Signature", webhook.Sign("old-secret", now, body)+", "+rotated.Get("X-Campaignctl-Signature"))
	badTS := signed(testSecret, now, body)
	badTS.Set("X-Campaignctl-Timestamp", "12abc")
	noSig := signed(testSecret, now, body)
	noSig.Del("X-Campaignctl-Signature")
	// The timestamp is part of what is signed: moving it forward breaks the signature.
	movedTS := signed(testSecret, now.Add(-time.Hour), body)
	movedTS.Set("X-Campaignctl-Timestamp", strconv.FormatInt(now.Unix(), 10))

	tests := []struct {
		name   string
		secret string
		header http.Header
		body   []byte
		want   error
	}{
		{"valid", testSecret, signed(testSecret, now, body), body, nil},
		{"valid, 4 minutes old", testSecret, signed(testSecret, now.Add(-4*time.Minute), body), body, nil},
		{"one of several signatures", testSecret, rotated, body, nil},
		{"tampered body", testSecret, signed(testSecret, now, body), tampered, webhook.ErrBadSignature},
		{"wrong secret", testSecret, signed("another-secret", now, body), body, webhook.ErrBadSignature},
		{"moved timestamp", testSecret, movedTS, body, webhook.ErrBadSignature},
		{"old timestamp", testSecret, signed(testSecret, now.Add(-6*time.Minute), body), body, webhook.ErrStale},
		{"future timestamp", testSecret, signed(testSecret, now.Add(6*time.Minute), body), body, webhook.ErrStale},
		{"malformed timestamp", testSecret, badTS, body, webhook.ErrBadTimestamp},
		{"no signature", testSecret, noSig, body, webhook.ErrMissingSignature},
		{"no headers", testSecret, http.Header{}, body, webhook.ErrMissingSignature},
		{"empty secret", "", signed("", now, body), body, webhook.ErrNoSecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := webhook.Verify(tt.secret, tt.header, tt.body, now, 0); !errors.Is(err, tt.want) {
				t.Errorf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
	// The tolerance is the caller's to choose.
	if err := webhook.Verify(testSecret, signed(testSecret, now.Add(-time.Minute), body), body, now, 30*time.Second); !errors.Is(err, webhook.ErrStale) {
		t.Errorf("30s tolerance, 1 minute old: %v", err)
	}
}

func TestWrongSecretIsRefused(t *testing.T) {
	s, url := newSandbox(t, sandbox.Options{})
	p := newProvider(t, url, func(c *webhook.Config) { c.Secret = "not-the-secret" })
	_, err := p.Send(context.Background(), message(testTo))
	pe := providerError(t, err, "not-the-secret")
	if pe.Class != providers.Permanent || pe.Status != 401 || !pe.AccountLevel() || !strings.Contains(pe.Message, "WEBHOOK_SECRET") {
		t.Errorf("got %+v, want permanent account-level 401 naming WEBHOOK_SECRET", pe)
	}
	if diff := cmp.Diff(sandbox.WebhookStats{Requests: 1, BadSignature: 1}, s.WebhookStats()); diff != "" {
		t.Errorf("webhook stats (-want +got):\n%s", diff)
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("sandbox recorded %d messages", n)
	}
}

func TestSendErrorAnswers(t *testing.T) {
	tests := []struct {
		to         string
		status     int
		class      providers.Class
		retryAfter time.Duration
	}{
		{"status-408", 408, providers.Transient, 0},
		{"status-429", 429, providers.Transient, time.Second},
		{"status-500", 500, providers.Transient, 0},
		{"status-502", 502, providers.Transient, 0},
		{"status-503", 503, providers.Transient, time.Second},
		{"status-400", 400, providers.Permanent, 0},
		{"status-404", 404, providers.Permanent, 0},
		{"status-410", 410, providers.Permanent, 0},
		{"status-422", 422, providers.Permanent, 0},
	}
	s, url := newSandbox(t, sandbox.Options{})
	p := newProvider(t, url)
	for _, tt := range tests {
		t.Run(tt.to, func(t *testing.T) {
			_, err := p.Send(context.Background(), message(tt.to))
			pe := providerError(t, err)
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Class: pe.Class, RetryAfter: pe.RetryAfter}
			want := providers.Error{Provider: "webhook", Status: tt.status, Class: tt.class, RetryAfter: tt.retryAfter}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if !strings.Contains(pe.Message, "refused") {
				t.Errorf("Message %q lacks the receiver's explanation", pe.Message)
			}
		})
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("sandbox recorded %d messages", n)
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
		{"503", sandbox.Faults{Rate503: 1}, 503, providers.Transient, 0, 0},
		{"503 html", sandbox.Faults{RateRaw503: 1}, 503, providers.Transient, 0, 0},
		{"hang", sandbox.Faults{RateTimeout: 1}, 0, providers.Ambiguous, 0, 1},
		{"reset", sandbox.Faults{RateReset: 1}, 0, providers.Ambiguous, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := newSandbox(t, sandbox.Options{Faults: tt.faults})
			p := newProvider(t, url, func(c *webhook.Config) { c.Timeout = 300 * time.Millisecond })
			start := time.Now()
			_, err := p.Send(context.Background(), message(testTo))
			pe := providerError(t, err)
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Class: pe.Class, RetryAfter: pe.RetryAfter}
			want := providers.Error{Provider: "webhook", Status: tt.status, Class: tt.class, RetryAfter: tt.retryAfter}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if tt.class == providers.Ambiguous && pe.Err == nil {
				t.Errorf("ambiguous error without the transport error")
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Send took %v with a 300ms timeout", d)
			}
			if n := len(s.Messages()); n != tt.recorded {
				t.Errorf("sandbox recorded %d messages, want %d", n, tt.recorded)
			}
		})
	}
}

func TestSendUnexpectedAnswers(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		id      string
		class   providers.Class
		status  int
	}{
		{"200 with a numeric id", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"id":42}`))
		}, "42", 0, 0},
		{"202 not json", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte(`queued`))
		}, "7:u1", 0, 0},
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://elsewhere.invalid/", http.StatusTemporaryRedirect)
		}, "", providers.Permanent, 307},
		{"500 quoting the recipient", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":"cannot deliver to `+testTo+`"}`, http.StatusInternalServerError)
		}, "", providers.Transient, 500},
		{"hang after the body is read", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			<-r.Context().Done()
		}, "", providers.Ambiguous, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			p := newProvider(t, srv.URL, func(c *webhook.Config) { c.Timeout = 300 * time.Millisecond })
			res, err := p.Send(context.Background(), message(testTo))
			if tt.id != "" {
				if err != nil || res.MessageID != tt.id {
					t.Errorf("got %+v, %v; want MessageID %q", res, err, tt.id)
				}
				return
			}
			pe := providerError(t, err)
			if pe.Class != tt.class || pe.Status != tt.status {
				t.Errorf("got %+v, want %v with status %d", pe, tt.class, tt.status)
			}
		})
	}
}

func TestSendClosedPortIsTransient(t *testing.T) {
	addr := providertest.ClosedAddr(t)
	// The query may hold a credential of the receiver's; it must not show in the error.
	p := newProvider(t, "http://hook:pwsecret456@"+addr+"/hook?token=querysecret123")
	_, err := p.Send(context.Background(), message(testTo))
	pe := providerError(t, err, "querysecret123", "pwsecret456")
	if pe.Class != providers.Transient || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want transient with a transport error", pe)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("the dial error %v is not reachable with errors.As", err)
	}
}

func TestSendWithoutUserID(t *testing.T) {
	s, url := newSandbox(t, sandbox.Options{})
	p := newProvider(t, url)
	m := message(testTo)
	m.UserID = ""
	_, err := p.Send(context.Background(), m)
	if pe := providerError(t, err); pe.Class != providers.Permanent {
		t.Errorf("got %+v, want permanent", pe)
	}
	if st := s.Stats(); st.Requests != 0 {
		t.Errorf("%d requests reached the receiver", st.Requests)
	}
}

func TestSendContextDone(t *testing.T) {
	s, url := newSandbox(t, sandbox.Options{})
	p := newProvider(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Send(ctx, message(testTo))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	var pe *providers.Error
	if errors.As(err, &pe) {
		t.Errorf("err is a *providers.Error %+v", pe)
	}
	if st := s.Stats(); st.Requests != 0 {
		t.Errorf("%d requests reached the receiver", st.Requests)
	}
}

func TestSendConcurrent(t *testing.T) {
	s, url := newSandbox(t, sandbox.Options{Latency: 2 * time.Millisecond, Faults: sandbox.Faults{Rate503: 0.3}})
	p := newProvider(t, url)
	const n = 50
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := message(fmt.Sprintf("+9055510%05d", i))
			m.UserID = fmt.Sprintf("u%d", i)
			res, err := p.Send(context.Background(), m)
			ids[i], errs[i] = res.MessageID, err
		})
	}
	wg.Wait()
	sent := 0
	bySID := map[string]sandbox.Message{}
	for _, m := range s.Messages() {
		bySID[m.SID] = m
	}
	for i, err := range errs {
		if err != nil {
			var pe *providers.Error
			if !errors.As(err, &pe) || pe.Class != providers.Transient || pe.Status != 503 {
				t.Errorf("send %d: %v, want a transient 503", i, err)
			}
			continue
		}
		sent++
		if m, ok := bySID[ids[i]]; !ok || m.To != fmt.Sprintf("+9055510%05d", i) {
			t.Errorf("send %d: id %q maps to %+v", i, ids[i], m)
		}
	}
	if len(bySID) != sent {
		t.Errorf("sandbox recorded %d, provider reported %d sent", len(bySID), sent)
	}
	if st := s.WebhookStats(); st.Rejected() != 0 || st.Requests != n {
		t.Errorf("webhook stats %+v: every request must verify", st)
	}
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  webhook.Config
		want string
	}{
		{"no url", webhook.Config{Secret: testSecret}, "WEBHOOK_URL"},
		{"no secret", webhook.Config{URL: "https://hooks.example.com/campaign"}, "WEBHOOK_SECRET"},
		{"bad scheme", webhook.Config{URL: "ftp://hooks.example.com/?key=querysecret123", Secret: testSecret}, "WEBHOOK_URL"},
		{"no host", webhook.Config{URL: "https:///x", Secret: testSecret}, "WEBHOOK_URL"},
		{"negative timeout", webhook.Config{URL: "https://hooks.example.com/", Secret: testSecret, Timeout: -1}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := webhook.New(tt.cfg)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %s", err, tt.want)
			}
			if strings.Contains(err.Error(), testSecret) || strings.Contains(err.Error(), "querysecret123") {
				t.Errorf("error %q shows a secret", err)
			}
		})
	}
}
