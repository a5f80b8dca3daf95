package sandbox

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twilio/twilio-go/client"
)

// The sandbox signs as Twilio does: twilio-go's validator accepts it, for the URL with its query.
func TestTwilioSignatureMatchesTwilioGo(t *testing.T) {
	form := url.Values{
		"MessageSid": {"SM0123"}, "MessageStatus": {"delivered"}, "To": {"+905551234567"},
		"From": {"+14155550100"}, "AccountSid": {"AC1"}, "ApiVersion": {"2010-04-01"}, "Body": {"a b&c=d ş"},
	}
	const cb = "http://127.0.0.1:8080/twilio/status?campaign_id=42&user_id=u%207"
	sig := twilioSignature("token123", cb, form)
	v := client.NewRequestValidator("token123")
	if !v.ValidateBody(cb, []byte(form.Encode()), sig) {
		t.Error("twilio-go refuses the sandbox's signature")
	}
	other := client.NewRequestValidator("token124")
	if other.ValidateBody(cb, []byte(form.Encode()), sig) {
		t.Error("twilio-go accepts the signature with another token")
	}
}

var loopbackCases = map[string]bool{
	"http://127.0.0.1:9000/cb":   true,
	"https://localhost/cb":       true,
	"http://LOCALHOST:1/cb":      true,
	"http://[::1]:9000/cb":       true,
	"http://127.8.9.10/cb":       true,
	"http://10.0.0.1/cb":         false,
	"http://example.com/cb":      false,
	"http://localhost.evil.com/": false,
	"ftp://127.0.0.1/cb":         false,
	"http://u:p@127.0.0.1/cb":    false,
	"127.0.0.1/cb":               false,
	"":                           false,
}

func TestLoopbackURL(t *testing.T) {
	for raw, want := range loopbackCases {
		if got := loopbackURL(raw); got != want {
			t.Errorf("loopbackURL(%q) = %v, want %v", raw, got, want)
		}
	}
}

// The status callbacks' check remembers the last endpoint's verdict: asked of the same endpoint with
// another query, or of endpoints one after the other, it answers what loopbackURL does.
func TestCallbackCheckAnswersAsLoopbackURL(t *testing.T) {
	var c callbackCheck
	for range 2 {
		for raw, want := range loopbackCases {
			for _, q := range []string{"", "?c=1&u=u1", "?c=1&u=u2", "#f"} {
				if got := c.ok(raw + q); got != want {
					t.Errorf("ok(%q) = %v, want %v", raw+q, got, want)
				}
			}
		}
	}
	// A query or fragment never makes an endpoint another one: credentials or a host after "?" are
	// the query's.
	for raw, want := range map[string]bool{
		"http://127.0.0.1:9000/cb?u=@example.com": true,
		"http://example.com/cb?http://127.0.0.1/": false,
		"http://127.0.0.1:9000/cb#@example.com":   true,
	} {
		if got := c.ok(raw); got != want || got != loopbackURL(raw) {
			t.Errorf("ok(%q) = %v, want %v", raw, got, want)
		}
	}
}

// The dialer refuses what the URL check would have let through if a name resolved elsewhere.
func TestLoopbackClientRefusesOtherAddresses(t *testing.T) {
	_, err := loopbackClient().Get("http://192.0.2.1/cb")
	if err == nil || !strings.Contains(err.Error(), "refusing to dial non-loopback") {
		t.Errorf("dial 192.0.2.1: %v, want a refusal", err)
	}
}

// Past maxPendingReceipts the send still succeeds at once; the message just gets no callbacks.
func TestReceiptQueueBounded(t *testing.T) {
	s := New(Options{ReceiptDelay: time.Hour})
	s.receipts.slots = make(chan struct{}, 2)
	srv := httptest.NewServer(s)
	defer srv.Close()
	for range 5 {
		form := url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}, "Body": {"hi"}, "StatusCallback": {"http://127.0.0.1:1/cb"}}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/AC1/Messages.json", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("AC1", "token1")
		start := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || time.Since(start) > time.Second {
			t.Fatalf("send: %d after %v", resp.StatusCode, time.Since(start))
		}
	}
	want := ReceiptStats{Scheduled: 2, Dropped: 3, Pending: 2}
	if got := s.ReceiptStats(); got != want {
		t.Errorf("receipt stats %+v, want %+v", got, want)
	}
}
