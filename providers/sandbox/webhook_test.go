package sandbox_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const webhookSecret = "sandbox-webhook-secret"

// hookSignature is the documented scheme, computed here on its own so that the test checks the
// receiver against the specification rather than against shared code.
func hookSignature(secret, ts string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

type hookAnswer struct {
	status int
	id     string
	err    string
	retry  string
}

func postHook(t *testing.T, url string, body []byte, edit func(h http.Header)) hookAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/webhook", strings.NewReader(string(body)))
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Campaignctl-Timestamp", ts)
	req.Header.Set("X-Campaignctl-Signature", hookSignature(webhookSecret, ts, body))
	req.Header.Set("Idempotency-Key", "7:u1")
	if edit != nil {
		edit(req.Header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		ID    string `json:"id"`
		Error string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("answer %d is not JSON: %v", resp.StatusCode, err)
	}
	return hookAnswer{resp.StatusCode, v.ID, v.Error, resp.Header.Get("Retry-After")}
}

func TestWebhookReceiver(t *testing.T) {
	s := sandbox.New(sandbox.Options{WebhookSecret: webhookSecret})
	srv := httptest.NewServer(s)
	defer srv.Close()
	body := []byte(`{"campaign_id":7,"user_id":"u1","to":"+905551234567","subject":"S","body":"B","data":{"k":"v"}}`)

	ok := postHook(t, srv.URL, body, nil)
	if ok.status != 200 || !strings.HasPrefix(ok.id, "wh_") {
		t.Fatalf("signed request: %+v", ok)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || msgs[0].SID != ok.id || msgs[0].Provider != "webhook" || msgs[0].To != "+905551234567" ||
		msgs[0].Subject != "S" || msgs[0].Body != "B" {
		t.Errorf("recorded %+v", msgs)
	}
	// Several signatures, one of them right (a secret being rotated).
	if a := postHook(t, srv.URL, body, func(h http.Header) {
		h.Set("X-Campaignctl-Signature", "v1=00ff, "+h.Get("X-Campaignctl-Signature"))
	}); a.status != 200 {
		t.Errorf("rotated signatures: %+v", a)
	}

	refusals := []struct {
		name string
		edit func(h http.Header)
		body []byte
	}{
		{"no signature", func(h http.Header) { h.Del("X-Campaignctl-Signature") }, body},
		{"no timestamp", func(h http.Header) { h.Del("X-Campaignctl-Timestamp") }, body},
		{"old timestamp", func(h http.Header) {
			ts := strconv.FormatInt(time.Now().Add(-10*time.Minute).Unix(), 10)
			h.Set("X-Campaignctl-Timestamp", ts)
			h.Set("X-Campaignctl-Signature", hookSignature(webhookSecret, ts, body))
		}, body},
		{"malformed timestamp", func(h http.Header) { h.Set("X-Campaignctl-Timestamp", "yesterday") }, body},
		{"wrong secret", func(h http.Header) {
			h.Set("X-Campaignctl-Signature", hookSignature("other", h.Get("X-Campaignctl-Timestamp"), body))
		}, body},
		{"tampered body", func(h http.Header) {
			h.Set("X-Campaignctl-Signature", hookSignature(webhookSecret, h.Get("X-Campaignctl-Timestamp"), body))
		}, []byte(strings.Replace(string(body), "+905551234567", "+905559999999", 1))},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			if a := postHook(t, srv.URL, tt.body, tt.edit); a.status != 401 || a.id != "" || !strings.HasPrefix(a.err, "invalid signature") {
				t.Errorf("%+v, want 401", a)
			}
		})
	}
	if a := postHook(t, srv.URL, []byte(`not json`), nil); a.status != 400 {
		t.Errorf("signed non-JSON: %+v", a)
	}
	if a := postHook(t, srv.URL, []byte(`{"to":"status-429"}`), nil); a.status != 429 || a.retry != "1" {
		t.Errorf("status-429: %+v", a)
	}
	if a := postHook(t, srv.URL, []byte(`{"to":"status-422"}`), nil); a.status != 422 {
		t.Errorf("status-422: %+v", a)
	}

	want := sandbox.WebhookStats{Requests: 11, Accepted: 2, MissingSignature: 2, StaleTimestamp: 2, BadSignature: 2}
	var got sandbox.WebhookStats
	getJSON(t, srv.URL+"/_sandbox/webhook/stats", &got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("webhook stats (-want +got):\n%s", diff)
	}
	if got.Rejected() != 6 {
		t.Errorf("Rejected() = %d", got.Rejected())
	}
	if st := s.Stats(); st.Rejected != 9 || st.ByStatus[401] != 6 || st.Accepted != 2 {
		t.Errorf("shared stats %+v", st)
	}
	if n := len(s.Messages()); n != 2 {
		t.Errorf("recorded %d messages, want 2", n)
	}
}

// Without a configured secret the receiver refuses everything.
func TestWebhookReceiverWithoutSecret(t *testing.T) {
	s := sandbox.New(sandbox.Options{})
	srv := httptest.NewServer(s)
	defer srv.Close()
	if a := postHook(t, srv.URL, []byte(`{"to":"x"}`), nil); a.status != 401 {
		t.Errorf("%+v, want 401", a)
	}
	if st := s.WebhookStats(); st.MissingSignature != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestWebhookReceiverFaults(t *testing.T) {
	for _, tt := range []struct {
		faults sandbox.Faults
		status int
	}{
		{sandbox.Faults{Rate429: 1}, 429},
		{sandbox.Faults{Rate500: 1}, 500},
		{sandbox.Faults{Rate503: 1}, 503},
	} {
		s := sandbox.New(sandbox.Options{WebhookSecret: webhookSecret, Faults: tt.faults})
		srv := httptest.NewServer(s)
		if a := postHook(t, srv.URL, []byte(`{"to":"x"}`), nil); a.status != tt.status {
			t.Errorf("%+v: %+v", tt.faults, a)
		}
		// Faults come after the signature check: an unsigned request still gets its 401.
		if a := postHook(t, srv.URL, []byte(`{"to":"x"}`), func(h http.Header) { h.Del("X-Campaignctl-Signature") }); a.status != 401 {
			t.Errorf("%+v unsigned: %+v", tt.faults, a)
		}
		srv.Close()
	}
}
