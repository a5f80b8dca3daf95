package sandbox

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newClocked is a sandbox whose limits, outages and timeline read a clock the test moves.
func newClocked(t *testing.T, opts Options) (*Server, *httptest.Server, *fakeClock) {
	t.Helper()
	s := New(opts)
	c := &fakeClock{t: time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)}
	s.now, s.epoch = c.now, c.now()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv, c
}

// reply is an answer as a test reads it; err is set when the connection failed instead.
type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

func do(t *testing.T, c *http.Client, req *http.Request) reply {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{err: err}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func sms(t *testing.T, srv *httptest.Server, body string) reply {
	t.Helper()
	form := url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}, "Body": {body}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/ACtest1/Messages.json", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ACtest1", "token1")
	return do(t, &http.Client{Timeout: 2 * time.Second}, req)
}

// twilio429 checks a refusal over a hidden limit: Twilio's 429 body with code 20429 and no Retry-After.
func twilio429(t *testing.T, r reply) {
	t.Helper()
	if r.err != nil || r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "" {
		t.Fatalf("want 429 without Retry-After, got %d %v Retry-After %q", r.status, r.err, r.header.Get("Retry-After"))
	}
	var b struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  int    `json:"status"`
	}
	if err := json.Unmarshal([]byte(r.body), &b); err != nil || b.Code != 20429 || b.Status != 429 || b.Message != "Too Many Requests" {
		t.Errorf("429 body %s", r.body)
	}
}

// The window admits no more than the limit over any one second, and exactly the limit in every second
// when pushed harder: the property the pushback scenarios measure.
func TestSlidingWindowHoldsEverySecond(t *testing.T) {
	epoch := time.Unix(1_770_000_000, 0)
	now := epoch
	clock := func() time.Time { return now }
	var w slidingWindow
	const limit = 50
	var admitted []time.Time
	for i := range 5000 { // one attempt a millisecond for 5 s, with a jitter of up to 0.7 ms
		now = epoch.Add(time.Duration(i)*time.Millisecond + time.Duration(i*7919%700)*time.Microsecond)
		at, ok, free := w.take(clock, epoch, 1, limit)
		if !at.Equal(now) {
			t.Fatalf("stamp %v, want %v", at, now)
		}
		if ok {
			admitted = append(admitted, at)
		} else if !free.After(now) || free.After(now.Add(time.Second)) {
			t.Fatalf("refused at %v: frees at %v", now, free)
		}
	}
	for i, a := range admitted {
		n := 0
		for _, b := range admitted[:i+1] {
			if b.After(a.Add(-time.Second)) {
				n++
			}
		}
		if n > limit {
			t.Fatalf("%d admitted in the second up to %v, limit %d", n, a, limit)
		}
	}
	perSecond := make(map[int64]int)
	for _, a := range admitted {
		perSecond[a.Unix()]++
	}
	for sec := epoch.Unix(); sec < epoch.Unix()+5; sec++ {
		if perSecond[sec] != limit {
			t.Errorf("second %d: %d admitted, want %d", sec-epoch.Unix(), perSecond[sec], limit)
		}
	}

	// Weights: a unit of 3 does not fit into 2 left; a unit larger than the limit passes an empty window.
	var sw slidingWindow
	now = epoch
	for _, c := range []struct {
		n  int
		ok bool
	}{{4, true}, {3, false}, {1, true}, {1, false}} {
		if _, ok, _ := sw.take(clock, epoch, c.n, 5); ok != c.ok {
			t.Errorf("take %d: %v, want %v", c.n, ok, c.ok)
		}
	}
	now = epoch.Add(time.Second)
	if _, ok, _ := sw.take(clock, epoch, 9, 5); !ok {
		t.Error("a unit over the limit into an empty window was refused")
	}
	if _, ok, _ := sw.take(clock, epoch, 1, 5); ok {
		t.Error("admitted after the oversized unit in the same second")
	}
}

// Twilio's segment limit counts the segments of valid messages: two 2-segment messages fill 4 of 5,
// a third does not fit, a 1-segment one does, and the next second takes them again.
func TestTwilioSegmentLimit(t *testing.T) {
	s, srv, clock := newClocked(t, Options{Limits: map[string]Limit{"twilio": {Segments: 5}}})
	twoSegments := strings.Repeat("a", 161)
	for i, c := range []struct {
		body string
		want int
	}{{twoSegments, 201}, {twoSegments, 201}, {twoSegments, 429}, {"kod", 201}, {"kod", 429}} {
		r := sms(t, srv, c.body)
		if c.want == 429 {
			twilio429(t, r)
		} else if r.status != c.want {
			t.Fatalf("message %d: %d %s, want %d", i, r.status, r.body, c.want)
		}
	}
	// An invalid message is refused for itself, before the segments are counted.
	if r := sms(t, srv, ""); r.status != http.StatusBadRequest {
		t.Errorf("empty body: %d", r.status)
	}
	if n := len(s.Messages()); n != 3 {
		t.Errorf("recorded %d messages, want 3", n)
	}
	clock.advance(time.Second)
	if r := sms(t, srv, twoSegments); r.status != http.StatusCreated {
		t.Errorf("next second: %d %s", r.status, r.body)
	}
	tl, err := s.TimelineOf("twilio", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tl.Seconds) != 2 || tl.Seconds[0].Segments != 5 || tl.Seconds[0].Accepted != 3 ||
		tl.Seconds[0].RefusedBy["segments"] != 2 || tl.Seconds[0].RefusedBy["request"] != 1 || tl.Seconds[1].Segments != 2 {
		t.Errorf("timeline %+v", tl.Seconds)
	}
}

// Every API refuses everything during its outage window, with its own 503 and no Retry-After, and
// answers as before once the window is over; other APIs are not touched.
func TestOutageWindowPerAPI(t *testing.T) {
	s, srv, clock := newClocked(t, Options{WebhookSecret: "hooksecret"})
	requests := map[string]func() *http.Request{
		"twilio": func() *http.Request {
			form := url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}, "Body": {"kod"}}
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/ACtest1/Messages.json", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.SetBasicAuth("ACtest1", "token1")
			return req
		},
		"netgsm": func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/sms/rest/v2/send",
				strings.NewReader(`{"msgheader":"ACME","iysfilter":"0","messages":[{"msg":"kod","no":"5551234567"}]}`))
			req.SetBasicAuth("user", "pass")
			return req
		},
		"sendgrid": func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v3/mail/send", strings.NewReader(
				`{"from":{"email":"shop@example.com"},"subject":"s","content":[{"type":"text/plain","value":"v"}],"personalizations":[{"to":[{"email":"a@example.com"}]}]}`))
			req.Header.Set("Authorization", "Bearer SG.key")
			return req
		},
		// Without a token FCM says 401 and the webhook receiver, unsigned, 401: the outage answers first.
		"fcm": func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/projects/p1/messages:send", strings.NewReader(`{"message":{"token":"t"}}`))
			return req
		},
		"webhook": func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhook", strings.NewReader(`{"to":"x"}`))
			return req
		},
	}
	normal := map[string]int{"twilio": 201, "netgsm": 200, "sendgrid": 202, "fcm": 401, "webhook": 401}
	down := map[string]string{ // a piece of each API's own 503 body
		"twilio": `"code":20503`, "netgsm": `"code":"101"`, "sendgrid": `"message":"service unavailable"`,
		"fcm": `"status":"UNAVAILABLE"`, "webhook": `"error":"service unavailable"`,
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for _, name := range APIs {
		t.Run(name, func(t *testing.T) {
			s.Reset()
			ws, err := s.StartOutage(OutagePlan{Only: name, After: time.Second, Duration: 2 * time.Second})
			if err != nil || len(ws) != 1 || ws[0].State != "scheduled" {
				t.Fatalf("start: %v %+v", err, ws)
			}
			if r := do(t, client, requests[name]()); r.status != normal[name] {
				t.Fatalf("before the window: %d %s", r.status, r.body)
			}
			clock.advance(time.Second)
			for range 3 {
				r := do(t, client, requests[name]())
				if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, down[name]) || r.header.Get("Retry-After") != "" {
					t.Fatalf("during the window: %d %s Retry-After %q", r.status, r.body, r.header.Get("Retry-After"))
				}
			}
			for _, other := range APIs {
				if other != name {
					if r := do(t, client, requests[other]()); r.status != normal[other] {
						t.Errorf("%s during %s's outage: %d", other, name, r.status)
					}
				}
			}
			clock.advance(2*time.Second - time.Nanosecond)
			if r := do(t, client, requests[name]()); r.status != http.StatusServiceUnavailable {
				t.Errorf("at the window's last instant: %d", r.status)
			}
			clock.advance(time.Nanosecond)
			if r := do(t, client, requests[name]()); r.status != normal[name] {
				t.Errorf("after the window: %d %s", r.status, r.body)
			}
			var win OutageWindow
			for _, w := range s.Outages() {
				if w.ID == ws[0].ID {
					win = w
				}
			}
			if win.State != "over" || win.Refused != 4 || !win.End.Equal(win.Start.Add(2*time.Second)) {
				t.Errorf("window %+v", win)
			}
			tl, _ := s.TimelineOf(name, time.Time{})
			if tl.Total.RefusedBy["outage"] != 4 || tl.Total.Requests != 6 {
				t.Errorf("timeline total %+v", tl.Total)
			}
		})
	}
	if st := s.Stats(); len(st.Outages) != len(APIs) {
		t.Errorf("stats list %d outage windows, want %d", len(st.Outages), len(APIs))
	}
}

// The other modes: an HTML 503, a reset connection, a request held until the client gives up. None is
// recorded. An outage without a duration lasts until stopped.
func TestOutageModesAndStop(t *testing.T) {
	s, srv, _ := newClocked(t, Options{})
	if _, err := s.StartOutage(OutagePlan{Only: "twilio", Mode: OutageRaw503}); err != nil {
		t.Fatal(err)
	}
	if r := sms(t, srv, "kod"); r.status != http.StatusServiceUnavailable || !strings.HasPrefix(r.body, "<html>") {
		t.Errorf("raw_503: %d %q", r.status, r.body)
	}
	if err := s.StopOutages("twilio"); err != nil {
		t.Fatal(err)
	}
	if r := sms(t, srv, "kod"); r.status != http.StatusCreated {
		t.Errorf("after stop: %d", r.status)
	}

	if _, err := s.StartOutage(OutagePlan{Only: "twilio", Mode: OutageReset}); err != nil {
		t.Fatal(err)
	}
	if r := sms(t, srv, "kod"); r.err == nil {
		t.Errorf("reset: answered %d", r.status)
	}
	_ = s.StopOutages("")

	if _, err := s.StartOutage(OutagePlan{Only: "twilio", Mode: OutageHang}); err != nil {
		t.Fatal(err)
	}
	form := url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}, "Body": {"kod"}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/ACtest1/Messages.json", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ACtest1", "token1")
	r := do(t, &http.Client{Timeout: 200 * time.Millisecond}, req)
	var ne interface{ Timeout() bool }
	if r.err == nil || !errors.As(r.err, &ne) || !ne.Timeout() {
		t.Errorf("hang: %d %v, want a client timeout", r.status, r.err)
	}
	_ = s.StopOutages("")

	if n := len(s.Messages()); n != 1 {
		t.Errorf("recorded %d messages, want the 1 sent between the outages", n)
	}
	ws := s.Outages()
	if len(ws) != 3 {
		t.Fatalf("windows %+v", ws)
	}
	for _, w := range ws {
		if w.State != "over" || w.Refused != 1 || w.End.IsZero() {
			t.Errorf("window %+v", w)
		}
	}
	// The hung request holds its place in flight until the client has gone; then it is released.
	deadline := time.Now().Add(2 * time.Second)
	for s.push.inflight[apiTwilio].Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := s.push.inflight[apiTwilio].Load(); n != 0 {
		t.Errorf("%d requests still in flight", n)
	}

	// A window not begun yet is cancelled by a stop.
	if _, err := s.StartOutage(OutagePlan{Only: "sendgrid", After: time.Hour, Duration: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_ = s.StopOutages("sendgrid")
	if len(s.Outages()) != 3 {
		t.Errorf("a scheduled window survived the stop: %+v", s.Outages())
	}
}
