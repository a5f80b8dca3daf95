package receipts_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/campaignctl/campaignctl/providers/receipts"
)

const (
	twilioToken = "s3cretTok3nValue"
	messageSID  = "SM0123456789abcdef0123456789abcdef"
)

// sink records what it is given; err, when set, is returned instead.
type sink struct {
	mu    sync.Mutex
	calls [][]receipts.Receipt
	err   error
}

func (s *sink) Record(_ context.Context, rs []receipts.Receipt) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.calls = append(s.calls, rs)
	return nil
}

func (s *sink) all() []receipts.Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []receipts.Receipt
	for _, c := range s.calls {
		out = append(out, c...)
	}
	return out
}

// sign is X-Twilio-Signature as Twilio documents it, written out independently of the code under test.
func sign(token, fullURL string, form url.Values) string {
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := fullURL
	for _, k := range keys {
		s += k + form.Get(k)
	}
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(s))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func callbackForm(status, code string) url.Values {
	f := url.Values{
		"MessageSid":    {messageSID},
		"SmsSid":        {messageSID},
		"MessageStatus": {status},
		"SmsStatus":     {status},
		"AccountSid":    {"ACtest00000000000000000000000001"},
		"From":          {"+14155550100"},
		"To":            {"+905551234567"},
		"ApiVersion":    {"2010-04-01"},
	}
	if code != "" {
		f.Set("ErrorCode", code)
	}
	return f
}

// twilioRequest is a callback POST to target (what the server sees); sig is its X-Twilio-Signature, ""
// for none.
func twilioRequest(target string, form url.Values, sig string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if sig != "" {
		r.Header.Set("X-Twilio-Signature", sig)
	}
	return r
}

func serve(h http.Handler, r *http.Request) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// ignoreAt leaves Receipt.At out of a comparison where it is the arrival time.
var ignoreAt = cmpopts.IgnoreFields(receipts.Receipt{}, "At")

func TestTwilioStatuses(t *testing.T) {
	const public = "https://hooks.example.com"
	tests := []struct {
		status, code string
		want         *receipts.Receipt // nil: ignored
	}{
		{"sent", "", &receipts.Receipt{Status: receipts.StatusSent}},
		{"delivered", "", &receipts.Receipt{Status: receipts.StatusDelivered}},
		{"undelivered", "30003", &receipts.Receipt{Status: receipts.StatusUndelivered, Error: "twilio 30003: unreachable destination handset"}},
		{"undelivered", "30099", &receipts.Receipt{Status: receipts.StatusUndelivered, Error: "twilio 30099"}},
		{"failed", "30001", &receipts.Receipt{Status: receipts.StatusFailed, Error: "twilio 30001: queue overflow"}},
		{"canceled", "", &receipts.Receipt{Status: receipts.StatusFailed, Error: "canceled"}},
		{"queued", "", nil},
		{"sending", "", nil},
		{"read", "", nil},
		{"something_new", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.status+tt.code, func(t *testing.T) {
			var sk sink
			h := receipts.TwilioHandler(twilioToken, public, &sk, nil)
			path := "/twilio/status?campaign_id=42&user_id=u-7&campaign_nonce=mab3c1"
			form := callbackForm(tt.status, tt.code)
			code := serve(h, twilioRequest("http://10.0.0.5:8080"+path, form, sign(twilioToken, public+path, form)))
			if code != http.StatusNoContent {
				t.Fatalf("status %d, want 204", code)
			}
			got := sk.all()
			st := h.Stats()
			if tt.want == nil {
				if len(got) != 0 {
					t.Errorf("recorded %+v, want nothing", got)
				}
				name := tt.status
				if name == "something_new" {
					name = "other"
				}
				if st.Ignored[name] != 1 || st.Accepted != 1 || st.Receipts != 0 {
					t.Errorf("stats %+v, want 1 accepted and ignored[%s] = 1", st, name)
				}
				return
			}
			want := *tt.want
			want.Provider, want.MessageID, want.CampaignID, want.UserID, want.CampaignNonce = "twilio", messageSID, 42, "u-7", "mab3c1"
			want.Address = "+905551234567" // the callback's To
			want.EventID = messageSID + ":" + tt.status
			if diff := cmp.Diff([]receipts.Receipt{want}, got, ignoreAt); diff != "" {
				t.Errorf("receipts (-want +got):\n%s", diff)
			}
			if got[0].At.IsZero() {
				t.Error("At is zero")
			}
			if st.Accepted != 1 || st.Receipts != 1 || len(st.Rejected) != 0 {
				t.Errorf("stats %+v, want 1 accepted, 1 receipt", st)
			}
		})
	}
}

// Twilio signs the URL it called; behind a proxy that is not the URL the server sees.
func TestTwilioBehindProxy(t *testing.T) {
	form := callbackForm("delivered", "")
	const (
		internal = "http://10.0.0.5:8080"
		path     = "/twilio/status?campaign_id=9"
	)
	tests := []struct {
		name, public, signedURL string
		want                    int
	}{
		{"public origin", "https://hooks.example.com", "https://hooks.example.com" + path, http.StatusNoContent},
		{"public origin, trailing slash", "https://hooks.example.com/", "https://hooks.example.com" + path, http.StatusNoContent},
		{"prefix the proxy strips", "https://example.com/campaignctl", "https://example.com/campaignctl" + path, http.StatusNoContent},
		{"explicit default port", "https://hooks.example.com", "https://hooks.example.com:443" + path, http.StatusNoContent},
		{"signed for the internal URL", "https://hooks.example.com", internal + path, http.StatusForbidden},
		{"signed without the query", "https://hooks.example.com", "https://hooks.example.com/twilio/status", http.StatusForbidden},
		{"other host", "https://hooks.example.com", "https://evil.example.com" + path, http.StatusForbidden},
		{"no public URL: the request's own", "", internal + path, http.StatusNoContent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sk sink
			h := receipts.TwilioHandler(twilioToken, tt.public, &sk, nil)
			code := serve(h, twilioRequest(internal+path, form, sign(twilioToken, tt.signedURL, form)))
			if code != tt.want {
				t.Fatalf("status %d, want %d", code, tt.want)
			}
			if n := len(sk.all()); (tt.want == http.StatusNoContent) != (n == 1) {
				t.Errorf("recorded %d receipts", n)
			}
			if tt.want == http.StatusNoContent && sk.all()[0].CampaignID != 9 {
				t.Errorf("CampaignID %d, want 9", sk.all()[0].CampaignID)
			}
		})
	}
}

func TestTwilioForged(t *testing.T) {
	const public = "https://hooks.example.com"
	const path = "/twilio/status"
	var logs bytes.Buffer
	var sk sink
	h := receipts.TwilioHandler(twilioToken, public, &sk, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))

	form := callbackForm("delivered", "")
	good := sign(twilioToken, public+path, form)
	tampered := callbackForm("delivered", "")
	tampered.Set("To", "+905559999999")
	extra := callbackForm("delivered", "")
	extra.Set("ErrorCode", "30003")

	tests := []struct {
		name   string
		form   url.Values
		sig    string
		reason string
	}{
		{"no signature", form, "", receipts.ReasonUnsigned},
		{"garbage signature", form, "bm90IGEgc2lnbmF0dXJl", receipts.ReasonBadSignature},
		{"other token", form, sign("otherToken123", public+path, form), receipts.ReasonBadSignature},
		{"tampered form", tampered, good, receipts.ReasonBadSignature},
		{"field added", extra, good, receipts.ReasonBadSignature},
		{"other status", callbackForm("undelivered", ""), good, receipts.ReasonBadSignature},
	}
	for _, tt := range tests {
		if code := serve(h, twilioRequest("http://10.0.0.5"+path, tt.form, tt.sig)); code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tt.name, code)
		}
	}
	if got := sk.all(); len(got) != 0 {
		t.Errorf("forged requests recorded %+v", got)
	}
	want := receipts.Stats{
		Ignored:  map[string]int64{},
		Rejected: map[string]int64{receipts.ReasonUnsigned: 1, receipts.ReasonBadSignature: 5},
	}
	if diff := cmp.Diff(want, h.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	// The genuine request still goes through.
	if code := serve(h, twilioRequest("http://10.0.0.5"+path, form, good)); code != http.StatusNoContent {
		t.Errorf("genuine request: status %d, want 204", code)
	}
	for _, secret := range []string{twilioToken, good, "+905551234567", "+905559999999"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("log contains %q:\n%s", secret, logs.String())
		}
	}
}

// An empty auth token would let anyone sign; the handler refuses everything instead.
func TestTwilioEmptyToken(t *testing.T) {
	var sk sink
	h := receipts.TwilioHandler("", "https://hooks.example.com", &sk, nil)
	form := callbackForm("delivered", "")
	if code := serve(h, twilioRequest("/s", form, sign("", "https://hooks.example.com/s", form))); code != http.StatusForbidden {
		t.Errorf("status %d, want 403", code)
	}
}

func TestTwilioMalformed(t *testing.T) {
	const public = "https://hooks.example.com"
	var sk sink
	h := receipts.TwilioHandler(twilioToken, public, &sk, nil)
	noSID := callbackForm("delivered", "")
	noSID.Del("MessageSid")
	noSID.Del("SmsSid")
	badCode := callbackForm("undelivered", "x1")

	tests := []struct {
		name string
		path string
		form url.Values
		want int
	}{
		{"no MessageSid", "/s", noSID, http.StatusBadRequest},
		{"ErrorCode not a number", "/s", badCode, http.StatusBadRequest},
		{"campaign_id not a number", "/s?campaign_id=abc", callbackForm("delivered", ""), http.StatusBadRequest},
	}
	for _, tt := range tests {
		if code := serve(h, twilioRequest(tt.path, tt.form, sign(twilioToken, public+tt.path, tt.form))); code != tt.want {
			t.Errorf("%s: status %d, want %d", tt.name, code, tt.want)
		}
	}
	// Not a POST.
	r := httptest.NewRequest(http.MethodGet, "/s", nil)
	if code := serve(h, r); code != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", code)
	}
	// Too large.
	big := callbackForm("delivered", "")
	big.Set("Body", strings.Repeat("x", 70<<10))
	if code := serve(h, twilioRequest("/s", big, sign(twilioToken, public+"/s", big))); code != http.StatusRequestEntityTooLarge {
		t.Errorf("large form: status %d, want 413", code)
	}
	if got := h.Stats().Rejected[receipts.ReasonMalformed]; got != 5 {
		t.Errorf("malformed count %d, want 5", got)
	}
	if len(sk.all()) != 0 {
		t.Errorf("malformed requests recorded %+v", sk.all())
	}
}

// A sink failure answers 500, so Twilio sends the callback again.
func TestTwilioSinkError(t *testing.T) {
	const public = "https://hooks.example.com"
	sk := &sink{err: errors.New("database down")}
	h := receipts.TwilioHandler(twilioToken, public, sk, nil)
	h.SetStoreWait(300 * time.Millisecond) // an outage longer than the wait
	form := callbackForm("delivered", "")
	if code := serve(h, twilioRequest("/s", form, sign(twilioToken, public+"/s", form))); code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", code)
	}
	if st := h.Stats(); st.SinkErrors != 1 || st.Accepted != 0 || st.Receipts != 0 {
		t.Errorf("stats %+v, want 1 sink error and nothing accepted", st)
	}
}

// Requests and Stats run concurrently (go test -race checks the counters).
func TestTwilioConcurrent(t *testing.T) {
	const public = "https://hooks.example.com"
	var sk sink
	h := receipts.TwilioHandler(twilioToken, public, &sk, nil)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			form := callbackForm("delivered", "")
			sig := sign(twilioToken, public+"/s", form)
			if i%2 == 1 {
				sig = "forged"
			}
			serve(h, twilioRequest("/s", form, sig))
			_ = h.Stats()
		})
	}
	wg.Wait()
	if st := h.Stats(); st.Accepted != 10 || st.Receipts != 10 || st.Rejected[receipts.ReasonBadSignature] != 10 {
		t.Errorf("stats %+v, want 10 accepted and 10 bad_signature", st)
	}
}

// A webhooks process with the wrong auth token (or checking the wrong URL) refuses every callback: each
// refusal says what to check, and once the first requests have all failed, an error says that receipts
// and refusals are being lost. Before, only a warning a request, the same as for a forged one.
func TestTwilioWrongTokenIsCalledOut(t *testing.T) {
	const public = "https://hooks.example.com"
	const path = "/twilio/status"
	var logs bytes.Buffer
	var sk sink
	h := receipts.TwilioHandler("notTheAccountsToken", public, &sk, slog.New(slog.NewTextHandler(&logs, nil)))
	form := callbackForm("delivered", "")
	signed := sign(twilioToken, public+path, form) // as Twilio signs, with the account's token
	for i := range 12 {
		if code := serve(h, twilioRequest("http://10.0.0.5"+path, form, signed)); code != http.StatusForbidden {
			t.Fatalf("request %d: %d, want 403", i, code)
		}
		if i == 0 && strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("one refused request raised the alarm:\n%s", logs.String())
		}
	}
	out := logs.String()
	if n := strings.Count(out, "level=ERROR"); n != 1 || !strings.Contains(out, "TWILIO_AUTH_TOKEN") || !strings.Contains(out, "lost") {
		t.Errorf("%d errors in the log, want 1 naming TWILIO_AUTH_TOKEN and the loss:\n%s", n, out)
	}
	if strings.Count(out, "hint=") != 12 {
		t.Errorf("not every refusal says what to check:\n%s", out)
	}
	if strings.Contains(out, "notTheAccountsToken") {
		t.Errorf("the token is in the log:\n%s", out)
	}
}
