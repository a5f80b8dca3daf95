package twilio

import (
	"errors"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/twilio/twilio-go/client"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := map[string]time.Duration{
		"":     0,
		"1":    time.Second,
		" 30 ": 30 * time.Second,
		"-5":   0,
		"soon": 0,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Minute).Format(http.TimeFormat):     0,
	}
	for in, want := range tests {
		if got := wire.ParseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestRedact(t *testing.T) {
	p := &Provider{token: "tok3nValue"}
	tests := []struct {
		in, to     string
		fromTwilio bool
		want       string
	}{
		{"The 'To' number +905551234567 is not valid", "+905551234567", true, "The 'To' number [to] is not valid"},
		{"number 905551234567 unreachable", "+905551234567", true, "number [to] unreachable"},
		{"reformatted +90 555 123 45 67 refused", "+905551234567", true, "reformatted [number] refused"},
		{"dotted 0555.123.45.67 refused", "+905551234567", true, "dotted 0[to] refused"},
		{"auth tok3nValue leaked", "", false, "auth [token] leaked"},
		{`Post "https://api.twilio.com/2010-04-01/Accounts/AC12345678901/Messages.json": EOF`, "+905551234567", false,
			`Post "https://api.twilio.com/2010-04-01/Accounts/AC12345678901/Messages.json": EOF`},
	}
	for _, tt := range tests {
		if got := p.redact(tt.in, tt.to, tt.fromTwilio); got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	err := p.redactErr(errors.New("to +905551234567"), "+905551234567")
	if err.Error() != "to [to]" || errors.Unwrap(err) == nil {
		t.Errorf("redactErr: %q, unwrap %v", err, errors.Unwrap(err))
	}
}

func TestWritten(t *testing.T) {
	tests := []struct {
		name   string
		events func(r *recorder)
		want   bool
	}{
		{"no connection", func(r *recorder) {}, false},
		{"connected, write failed", func(r *recorder) {
			r.GotConn(httptrace.GotConnInfo{})
			r.WroteRequest(httptrace.WroteRequestInfo{Err: errors.New("broken pipe")})
		}, false},
		{"written", func(r *recorder) {
			r.GotConn(httptrace.GotConnInfo{})
			r.WroteRequest(httptrace.WroteRequestInfo{})
		}, true},
		{"failed on a reused connection, written on a new one", func(r *recorder) {
			r.GotConn(httptrace.GotConnInfo{Reused: true})
			r.WroteRequest(httptrace.WroteRequestInfo{Err: errors.New("EOF")})
			r.GotConn(httptrace.GotConnInfo{})
			r.WroteRequest(httptrace.WroteRequestInfo{})
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{}
			tt.events(r)
			if got := r.Written(); got != tt.want {
				t.Errorf("Written() = %v, want %v", got, tt.want)
			}
		})
	}
}

// A write still in progress when the round trip failed is waited for.
func TestWrittenWaitsForPendingWrite(t *testing.T) {
	for _, writeErr := range []error{nil, errors.New("use of closed network connection")} {
		r := &recorder{}
		r.GotConn(httptrace.GotConnInfo{})
		done := make(chan bool)
		go func() { done <- r.Written() }()
		r.WroteRequest(httptrace.WroteRequestInfo{Err: writeErr})
		select {
		case got := <-done:
			if want := writeErr == nil; got != want {
				t.Errorf("write error %v: Written() = %v, want %v", writeErr, got, want)
			}
		case <-time.After(wire.PendingWriteWait / 2):
			t.Fatalf("Written() did not return after the write report")
		}
	}
}

func TestClassify(t *testing.T) {
	p := &Provider{token: "tok3nValue"}
	answered := func(status int, retryAfter string) *recorder {
		r := &recorder{status: status, retryAfter: retryAfter}
		r.GotConn(httptrace.GotConnInfo{})
		r.WroteRequest(httptrace.WroteRequestInfo{})
		return r
	}
	tests := []struct {
		name  string
		rec   *recorder
		err   error
		class providers.Class
		code  int
		retry time.Duration
	}{
		{"local bad password", &recorder{},
			&client.TwilioRestError{Status: 400, Code: 21224, Message: "Invalid Password. Illegal chars"}, providers.Permanent, 21224, 0},
		{"429 by status", answered(429, "3"), &client.TwilioRestError{}, providers.Transient, 0, 3 * time.Second},
		{"20429 by code", answered(400, ""), &client.TwilioRestError{Status: 400, Code: 20429}, providers.Transient, 20429, 0},
		{"21611 queue full", answered(400, ""), &client.TwilioRestError{Status: 400, Code: 21611}, providers.Transient, 21611, 0},
		{"503 with retry-after", answered(503, "2"), &client.TwilioRestError{Status: 503, Code: 20503}, providers.Transient, 20503, 2 * time.Second},
		{"opted out", answered(400, ""), &client.TwilioRestError{Status: 400, Code: 21610}, providers.Permanent, 21610, 0},
		{"other 4xx", answered(403, ""), &client.TwilioRestError{Status: 403, Code: 20008}, providers.Permanent, 20008, 0},
		{"html 502", answered(502, ""), errors.New("error decoding the response for an HTTP error code: 502"), providers.Transient, 0, 0},
		{"cut 201", answered(201, ""), errors.New("unexpected EOF"), providers.Ambiguous, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pe *providers.Error
			if !errors.As(p.classify(tt.rec, tt.err, "+905551234567"), &pe) {
				t.Fatal("not a *providers.Error")
			}
			if pe.Class != tt.class || pe.Code != tt.code || pe.RetryAfter != tt.retry {
				t.Errorf("got %+v, want class %v code %d retry %v", pe, tt.class, tt.code, tt.retry)
			}
		})
	}
}
