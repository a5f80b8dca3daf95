package sendgrid_test

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
	"github.com/campaignctl/campaignctl/providers/sendgrid"
)

func TestBadRequestNamesField(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	bad := msg(2)
	bad.To = "ayse.yilmaz@@example"
	ms := []providers.Message{msg(1), bad}
	pe := providerError(t, second(p.SendBatch(context.Background(), ms)), ms...)
	if pe.Class != providers.Permanent || pe.Status != 400 || pe.AccountLevel() ||
		pe.Message != "personalizations.1.to.0.email: Does not contain a valid address." {
		t.Errorf("got %+v", pe)
	}
	if n := len(h.sb.Messages()); n != 0 {
		t.Errorf("recorded %d", n)
	}
}

func TestAccountErrors(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	wrong := "SG.wrongKey.ZYXWVUTSRQPONMLKJIHGFEDCBA9876543210"
	for name, p := range map[string]*sendgrid.Provider{
		"401": newProvider(t, h.srv.URL, func(c *sendgrid.Config) { c.APIKey = wrong }),
		"403": newProvider(t, h.srv.URL, func(c *sendgrid.Config) { c.From = "unverified+shop@shop.example" }),
	} {
		t.Run(name, func(t *testing.T) {
			m := msg(1)
			pe := providerError(t, second(p.Send(context.Background(), m)), m)
			want, _ := strconv.Atoi(name)
			if pe.Class != providers.Permanent || pe.Status != want || !pe.AccountLevel() || pe.Message == "" {
				t.Errorf("got %+v, want permanent, account-level %d", pe, want)
			}
			if strings.Contains(pe.Error(), wrong) || strings.Contains(pe.Error(), "wrongKey") {
				t.Errorf("error shows the key: %v", pe)
			}
		})
	}
}

func TestTooLarge(t *testing.T) {
	// The sandbox alone: the harness would copy the 31 MB body once more.
	srv := httptest.NewServer(sandbox.New(sandbox.Options{SendGridAPIKey: testKey}))
	defer srv.Close()
	p := newProvider(t, srv.URL)
	m := msg(1)
	m.HTML = ""
	m.Body = strings.Repeat("x", 31<<20)
	pe := providerError(t, second(p.Send(context.Background(), m)), m)
	if pe.Class != providers.Permanent || pe.Status != 413 || pe.Message != "content too large" {
		t.Errorf("got %+v", pe)
	}
}

func TestTransientAnswers(t *testing.T) {
	tests := []struct {
		name       string
		faults     sandbox.Faults
		status     int
		retryAfter time.Duration
		message    string
	}{
		{"429", sandbox.Faults{Rate429: 1}, 429, time.Second, "too many requests"},
		{"500", sandbox.Faults{Rate500: 1}, 500, 0, "internal server error"},
		{"503", sandbox.Faults{Rate503: 1}, 503, 0, "service unavailable"},
		{"503 html", sandbox.Faults{RateRaw503: 1}, 503, 0, "service unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, sandbox.Options{Faults: tt.faults})
			p := newProvider(t, h.srv.URL)
			ms := []providers.Message{msg(1), msg(2)}
			pe := providerError(t, second(p.SendBatch(context.Background(), ms)), ms...)
			// X-RateLimit-Reset is a whole second: the wait until then is between one and two seconds.
			if pe.RetryAfter < tt.retryAfter || pe.RetryAfter > 2*tt.retryAfter {
				t.Errorf("RetryAfter %v, want %v to %v", pe.RetryAfter, tt.retryAfter, 2*tt.retryAfter)
			}
			got := providers.Error{Provider: pe.Provider, Status: pe.Status, Class: pe.Class, Message: pe.Message}
			want := providers.Error{Provider: "sendgrid", Status: tt.status, Class: providers.Transient, Message: tt.message}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", pe, diff)
			}
			if len(h.sb.Messages()) != 0 {
				t.Errorf("sandbox recorded a refused message")
			}
		})
	}
}

// X-RateLimit-Reset is a Unix time; RetryAfter is the wait until then.
func TestRetryAfterFromReset(t *testing.T) {
	reset := time.Now().Unix() + 5
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Limit", "600")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"errors":[{"field":null,"message":"too many requests"}]}`))
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL)
	m := msg(1)
	pe := providerError(t, second(p.Send(context.Background(), m)), m)
	if pe.Class != providers.Transient || pe.RetryAfter <= 3*time.Second || pe.RetryAfter > 5*time.Second {
		t.Errorf("got %+v, want transient with RetryAfter in (3s, 5s]", pe)
	}
}

func TestServerRateLimit(t *testing.T) {
	h := newHarness(t, sandbox.Options{SendGridRate: 2})
	p := newProvider(t, h.srv.URL)
	var ok, limited int
	for i := range 10 {
		m := msg(i)
		_, err := p.Send(context.Background(), m)
		if err == nil {
			ok++
			continue
		}
		pe := providerError(t, err, m)
		if pe.Class != providers.Transient || pe.Status != 429 || pe.RetryAfter < time.Second || pe.RetryAfter > 2*time.Second {
			t.Errorf("rate-limited send: %+v", pe)
		}
		limited++
	}
	if ok == 0 || limited == 0 {
		t.Errorf("%d sent, %d limited; want both", ok, limited)
	}
}

func TestTimeoutAfterWriteIsAmbiguous(t *testing.T) {
	h := newHarness(t, sandbox.Options{Faults: sandbox.Faults{RateTimeout: 1}})
	p := newProvider(t, h.srv.URL, func(c *sendgrid.Config) { c.Timeout = 200 * time.Millisecond })
	ms := []providers.Message{msg(1), msg(2)}
	start := time.Now()
	pe := providerError(t, second(p.SendBatch(context.Background(), ms)), ms...)
	if pe.Class != providers.Ambiguous || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want ambiguous with a transport error", pe)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("SendBatch took %v with a 200ms timeout", d)
	}
	// The sandbox did accept them: exactly why a resend would be a double send.
	if got := h.sb.Messages(); len(got) != 2 || !got[0].Hung {
		t.Errorf("recorded %+v, want both messages, hung", got)
	}
}

func TestResetIsAmbiguous(t *testing.T) {
	h := newHarness(t, sandbox.Options{Faults: sandbox.Faults{RateReset: 1}})
	p := newProvider(t, h.srv.URL)
	m := msg(1)
	pe := providerError(t, second(p.Send(context.Background(), m)), m)
	if pe.Class != providers.Ambiguous || pe.Status != 0 {
		t.Errorf("got %+v, want ambiguous", pe)
	}
	if st := h.sb.Stats(); st.Resets != 1 {
		t.Errorf("sandbox saw %d resets", st.Resets)
	}
}

func TestConnectionRefusedIsTransient(t *testing.T) {
	addr := providertest.ClosedAddr(t)
	p := newProvider(t, "http://"+addr)
	m := msg(1)
	pe := providerError(t, second(p.Send(context.Background(), m)), m)
	if pe.Class != providers.Transient || pe.Status != 0 || pe.Err == nil {
		t.Errorf("got %+v, want transient with a transport error", pe)
	}
	var opErr *net.OpError
	if !errors.As(pe, &opErr) {
		t.Errorf("the dial error %v is not reachable with errors.As", pe)
	}
}

func TestContextDoneBeforeSend(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Send(ctx, msg(1))
	if !errors.Is(err, context.Canceled) || providers.ClassOf(err) != providers.Transient {
		t.Fatalf("err %v, want context.Canceled, transient", err)
	}
	if st := h.sb.Stats(); st.Requests != 0 {
		t.Errorf("sandbox saw %d requests", st.Requests)
	}
}

func TestUnexpectedAnswers(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		class   providers.Class
		status  int
		message string
	}{
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://elsewhere.invalid/", http.StatusFound)
		}, providers.Permanent, 302, "unexpected redirect: check SENDGRID_BASE_URL"},
		{"404 html", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "<html>not here</html>", http.StatusNotFound)
		}, providers.Permanent, 404, "not found: check SENDGRID_BASE_URL"},
		{"502 from a proxy", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}, providers.Transient, 502, "bad gateway"},
		// SendGrid's texts may quote addresses and (never seen, but cheap to guard) the key.
		{"400 quoting addresses", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"errors":[{"field":"personalizations.1.to","message":"We found the first duplicate instance of [%s] in the personalizations.1.to field."},`+
				`{"field":null,"message":"key %s rejected for other@example.org"}]}`, msg(1).To, testKey)
		}, providers.Permanent, 400, "personalizations.1.to: We found the first duplicate instance of [[to]] in the personalizations.1.to field.; key [api key] rejected for [address]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			p := newProvider(t, srv.URL)
			ms := []providers.Message{msg(1), msg(2)}
			pe := providerError(t, second(p.SendBatch(context.Background(), ms)), ms...)
			if pe.Class != tt.class || pe.Status != tt.status || pe.Message != tt.message {
				t.Errorf("got %+v, want %v, status %d, message %q", pe, tt.class, tt.status, tt.message)
			}
		})
	}
}

// Under concurrency with faults each call classifies its own answer.
func TestConcurrentMixedFaults(t *testing.T) {
	h := newHarness(t, sandbox.Options{Faults: sandbox.Faults{Rate429: 0.3, Rate503: 0.3}})
	p := newProvider(t, h.srv.URL)
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for g := range 40 {
		wg.Go(func() {
			ms := []providers.Message{msg(2 * g), msg(2*g + 1)}
			_, err := p.SendBatch(context.Background(), ms)
			if err == nil {
				mu.Lock()
				sent += 2
				mu.Unlock()
				return
			}
			var pe *providers.Error
			if !errors.As(err, &pe) {
				t.Errorf("batch %d: %v", g, err)
				return
			}
			switch {
			case pe.Class == providers.Transient && pe.Status == 429 && pe.RetryAfter >= time.Second:
			case pe.Class == providers.Transient && pe.Status == 503 && pe.RetryAfter == 0:
			default:
				t.Errorf("batch %d: inconsistent error %+v", g, pe)
			}
		})
	}
	wg.Wait()
	if got := len(h.sb.Messages()); got != sent {
		t.Errorf("sandbox recorded %d, provider reported %d sent", got, sent)
	}
}

// A SendGrid answer that quotes the request (a proxy's error page, a gateway that echoes what it refused)
// shows neither the API key nor any recipient's address, nor a phone number or address the messages
// carried. Before, only the recipients' own addresses were masked: the audience values of every
// personalization (a phone column, say) reached the worker's log, `status`, and `report`'s reasons.
func TestAnAnswerThatEchoesTheRequestShowsNoKeyNorAddress(t *testing.T) {
	const phone, mail = "+905329876543", "ayse.kaya@example.com"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]any{{"field": nil,
			"message": "bad request from " + r.Header.Get("Authorization") + ": " + string(body)}}})
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL)
	ms := []providers.Message{msg(1), msg(2)}
	for i := range ms {
		ms[i].Body += " Arkadaşın " + phone + " (" + mail + ") seni davet etti."
	}
	_, err := p.SendBatch(context.Background(), ms)
	pe := providertest.Error(t, err, "sendgrid", testKey, "campaignctlTestKey", ms[0].To, ms[1].To, phone, strings.TrimPrefix(phone, "+"), mail)
	if pe.Class != providers.Permanent {
		t.Errorf("class %v, want permanent", pe.Class)
	}
}
