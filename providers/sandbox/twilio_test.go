package sandbox_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const (
	testSID   = "ACsandbox0001"
	testToken = "token123"
)

// answer is a decoded sandbox response.
type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func postMessage(t *testing.T, srv *httptest.Server, user, pass string, form url.Values) answer {
	t.Helper()
	return postMessageTo(t, srv, "/2010-04-01/Accounts/"+user+"/Messages.json", user, pass, form)
}

func postMessageTo(t *testing.T, srv *httptest.Server, path, user, pass string, form url.Values) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if user != "" || pass != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("post message: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			t.Fatalf("decode %q: %v", raw, err)
		}
	}
	return a
}

func message(to, body string) url.Values {
	return url.Values{"To": {to}, "From": {"+14155550100"}, "Body": {body}}
}

func newTwilioSandbox(t *testing.T, opts sandbox.Options) (*sandbox.Server, *httptest.Server) {
	t.Helper()
	if opts.TwilioAccountSID == "" {
		opts.TwilioAccountSID, opts.TwilioAuthToken = testSID, testToken
	}
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv
}

func TestTwilioCreateMessage(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{})
	a := postMessage(t, srv, testSID, testToken, message("+905551234567", "Merhaba, kodunuz ABC123"))
	if a.status != http.StatusCreated {
		t.Fatalf("status %d, body %s", a.status, a.raw)
	}
	sid, _ := a.body["sid"].(string)
	if !regexp.MustCompile(`^SM[0-9a-f]{32}$`).MatchString(sid) {
		t.Errorf("sid %q is not SM + 32 hex digits", sid)
	}
	if _, err := time.Parse(time.RFC1123Z, a.body["date_created"].(string)); err != nil {
		t.Errorf("date_created: %v", err)
	}
	want := map[string]any{
		"account_sid":           testSID,
		"api_version":           "2010-04-01",
		"body":                  "Merhaba, kodunuz ABC123",
		"date_sent":             nil,
		"direction":             "outbound-api",
		"error_code":            nil,
		"error_message":         nil,
		"from":                  "+14155550100",
		"messaging_service_sid": nil,
		"num_media":             "0",
		"num_segments":          "1",
		"price":                 nil,
		"price_unit":            "USD",
		"status":                "queued",
		"to":                    "+905551234567",
		"uri":                   "/2010-04-01/Accounts/" + testSID + "/Messages/" + sid + ".json",
	}
	got := make(map[string]any)
	for k := range want {
		got[k] = a.body[k]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("201 body (-want +got):\n%s", diff)
	}

	msgs := s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("recorded %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if m.SID != sid || m.To != "+905551234567" || m.Body != "Merhaba, kodunuz ABC123" || m.NumSegments != 1 || m.Status != "queued" || m.AccountSID != testSID {
		t.Errorf("recorded %+v", m)
	}
}

func TestTwilioSegmentsInResponse(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{})
	tests := []struct {
		body string
		want string
	}{
		{strings.Repeat("a", 160), "1"},
		{strings.Repeat("a", 161), "2"},
		// 86 characters with Turkish letters outside GSM-7: UCS-2, 67 per part.
		{"Şahane fırsat! İndirim kodunuz: ABC123. Son gün yarın, kaçırmayın, mağazada görüşürüz.", "2"},
		{"Şahane fırsat!", "1"},
	}
	for _, tt := range tests {
		a := postMessage(t, srv, testSID, testToken, message("+905551234567", tt.body))
		if a.status != http.StatusCreated || a.body["num_segments"] != tt.want {
			t.Errorf("body of %d chars: status %d, num_segments %v, want 201 and %q", len([]rune(tt.body)), a.status, a.body["num_segments"], tt.want)
		}
	}
}

func TestTwilioAuth(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{})
	tests := []struct {
		name, path, user, pass string
	}{
		{"wrong token", "", testSID, "wrong1"},
		{"no credentials", "/2010-04-01/Accounts/" + testSID + "/Messages.json", "", ""},
		{"other account", "", "ACother", testToken},
		{"username differs from path", "/2010-04-01/Accounts/" + testSID + "/Messages.json", "ACother", testToken},
		{"non-alphanumeric token", "", testSID, "token-123"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = "/2010-04-01/Accounts/" + tt.user + "/Messages.json"
			}
			a := postMessageTo(t, srv, path, tt.user, tt.pass, message("+905551234567", "hi"))
			want := map[string]any{"code": 20003.0, "message": "Authenticate", "more_info": "https://www.twilio.com/docs/errors/20003", "status": 401.0}
			if a.status != http.StatusUnauthorized {
				t.Errorf("status %d, want 401", a.status)
			}
			if diff := cmp.Diff(want, a.body); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

// With no configured credentials any alphanumeric pair is accepted, as long as the username is the
// account in the path.
func TestTwilioAuthOpen(t *testing.T) {
	s := sandbox.New(sandbox.Options{})
	srv := httptest.NewServer(s)
	defer srv.Close()
	if a := postMessage(t, srv, "ACany", "whatever9", message("+905551234567", "hi")); a.status != http.StatusCreated {
		t.Errorf("any credentials: status %d, want 201", a.status)
	}
	a := postMessageTo(t, srv, "/2010-04-01/Accounts/ACpath/Messages.json", "ACany", "whatever9", message("+905551234567", "hi"))
	if a.status != http.StatusUnauthorized {
		t.Errorf("username differs from path: status %d, want 401", a.status)
	}
}

func TestTwilioValidation(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{})
	tests := []struct {
		name string
		form url.Values
		code float64
	}{
		{"missing To", url.Values{"From": {"+14155550100"}, "Body": {"hi"}}, 21604},
		{"To not E.164", message("05551234567", "hi"), 21211},
		{"To with letters", message("+90555abc4567", "hi"), 21211},
		{"no sender", url.Values{"To": {"+905551234567"}, "Body": {"hi"}}, 21603},
		{"no body", url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}}, 21602},
		{"body over 1600 characters", message("+905551234567", strings.Repeat("ş", 1601)), 21617},
		{"magic 21211", message("+905550021211", "hi"), 21211},
		{"magic 21408", message("+905550021408", "hi"), 21408},
		{"magic 21606", message("+905550021606", "hi"), 21606},
		{"magic 21608", message("+905550021608", "hi"), 21608},
		{"magic 21610", message("+905550021610", "hi"), 21610},
		{"magic 21614", message("+905550021614", "hi"), 21614},
		{"magic 21635", message("+905550021635", "hi"), 21635},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := postMessage(t, srv, testSID, testToken, tt.form)
			if a.status != http.StatusBadRequest || a.body["code"] != tt.code || a.body["status"] != 400.0 {
				t.Errorf("got %d %s, want 400 with code %v", a.status, a.raw, tt.code)
			}
			if a.body["more_info"] == "" || a.body["message"] == "" {
				t.Errorf("error body lacks more_info or message: %s", a.raw)
			}
		})
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("recorded %d messages, want none", n)
	}
	// A number next to the magic ones is an ordinary recipient.
	if a := postMessage(t, srv, testSID, testToken, message("+905550021612", "hi")); a.status != http.StatusCreated {
		t.Errorf("+905550021612: status %d, want 201", a.status)
	}
	// A 1600-character body is still accepted.
	if a := postMessage(t, srv, testSID, testToken, message("+905551234567", strings.Repeat("ş", 1600))); a.status != http.StatusCreated {
		t.Errorf("1600 characters: status %d, want 201", a.status)
	}
}

func TestTwilioMessagingService(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{})
	a := postMessage(t, srv, testSID, testToken, url.Values{"To": {"+905551234567"}, "MessagingServiceSid": {"MG123"}, "Body": {"hi"}})
	if a.status != http.StatusCreated || a.body["status"] != "accepted" || a.body["messaging_service_sid"] != "MG123" || a.body["from"] != nil {
		t.Errorf("got %d %s", a.status, a.raw)
	}
	if m := s.Messages(); len(m) != 1 || m[0].From != "MG123" {
		t.Errorf("recorded %+v", m)
	}
}

func TestTwilioNotFoundAndMethod(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{})
	resp, err := srv.Client().Get(srv.URL + "/2010-04-01/Accounts/" + testSID + "/Messages.json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET Messages.json: %d, want 405", resp.StatusCode)
	}
	a := postMessageTo(t, srv, "/2010-04-01/Accounts/"+testSID+"/Calls.json", testSID, testToken, nil)
	if a.status != http.StatusNotFound || a.body["code"] != 20404.0 {
		t.Errorf("unknown resource: %d %s", a.status, a.raw)
	}
}

func TestTwilioRateLimit(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{TwilioRate: 5})
	var created, limited int
	for range 30 {
		a := postMessage(t, srv, testSID, testToken, message("+905551234567", "hi"))
		switch a.status {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			limited++
			if a.header.Get("Retry-After") != "1" || a.body["code"] != 20429.0 || a.body["status"] != 429.0 {
				t.Errorf("429 answer: Retry-After %q, body %s", a.header.Get("Retry-After"), a.raw)
			}
		default:
			t.Fatalf("status %d: %s", a.status, a.raw)
		}
	}
	// The bucket holds 5; refills during the loop add a few at most.
	if created < 5 || created > 15 || limited == 0 {
		t.Errorf("created %d, limited %d; want 5..15 created and some limited", created, limited)
	}
	st := s.Stats()
	if st.Accepted != created || st.ByStatus[429] != limited || st.ByCode[20429] != limited || st.Requests != 30 {
		t.Errorf("stats %+v, created %d, limited %d", st, created, limited)
	}
	// Another account has its own bucket.
	s2 := sandbox.New(sandbox.Options{TwilioRate: 1})
	srv2 := httptest.NewServer(s2)
	defer srv2.Close()
	for _, acct := range []string{"ACone", "ACtwo"} {
		if a := postMessage(t, srv2, acct, "tok", message("+905551234567", "hi")); a.status != http.StatusCreated {
			t.Errorf("%s first request: %d, want 201", acct, a.status)
		}
	}
}

func TestTwilioFaults(t *testing.T) {
	tests := []struct {
		name   string
		faults sandbox.Faults
		status int
		code   float64 // 0: not JSON
	}{
		{"429", sandbox.Faults{Rate429: 1}, 429, 20429},
		{"500", sandbox.Faults{Rate500: 1}, 500, 20500},
		{"503", sandbox.Faults{Rate503: 1}, 503, 20503},
		{"raw 503", sandbox.Faults{RateRaw503: 1}, 503, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, srv := newTwilioSandbox(t, sandbox.Options{Faults: tt.faults})
			a := postMessage(t, srv, testSID, testToken, message("+905551234567", "hi"))
			if a.status != tt.status {
				t.Fatalf("status %d, want %d", a.status, tt.status)
			}
			if tt.code == 0 {
				if !strings.Contains(a.raw, "<html>") || a.body != nil {
					t.Errorf("raw 503 body %q, want HTML", a.raw)
				}
			} else if a.body["code"] != tt.code || a.body["status"] != float64(tt.status) {
				t.Errorf("body %s, want code %v", a.raw, tt.code)
			}
			if tt.status == 429 && a.header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After %q, want 1", a.header.Get("Retry-After"))
			}
			if len(s.Messages()) != 0 {
				t.Errorf("a refused message was recorded")
			}
			// Clearing the faults lets the next request through.
			s.SetFaults(sandbox.Faults{})
			if a := postMessage(t, srv, testSID, testToken, message("+905551234567", "hi")); a.status != http.StatusCreated {
				t.Errorf("after clearing faults: %d", a.status)
			}
		})
	}
}

func TestTwilioTimeoutFaultRecordsThenHangs(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{Faults: sandbox.Faults{RateTimeout: 1}})
	c := srv.Client()
	c.Timeout = 200 * time.Millisecond
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/"+testSID+"/Messages.json",
		strings.NewReader(message("+905551234567", "hi").Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(testSID, testToken)
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got an answer %d, want a timeout", resp.StatusCode)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || !msgs[0].Hung {
		t.Errorf("recorded %+v, want one hung message", msgs)
	}
	if st := s.Stats(); st.Accepted != 1 || st.Hung != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestTwilioResetFault(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{Faults: sandbox.Faults{RateReset: 1}})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/"+testSID+"/Messages.json",
		strings.NewReader(message("+905551234567", "hi").Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(testSID, testToken)
	resp, err := srv.Client().Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got an answer %d, want a closed connection", resp.StatusCode)
	}
	if st := s.Stats(); st.Resets != 1 || st.Accepted != 0 || len(s.Messages()) != 0 {
		t.Errorf("stats %+v, messages %d", st, len(s.Messages()))
	}
}

func TestTwilioLatency(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{Latency: 50 * time.Millisecond})
	start := time.Now()
	if a := postMessage(t, srv, testSID, testToken, message("+905551234567", "hi")); a.status != http.StatusCreated {
		t.Fatalf("status %d", a.status)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("answered after %v, want at least the 50ms latency", d)
	}
}

// BenchmarkTwilioCreateMessage measures the sandbox's throughput over loopback with parallel clients.
func BenchmarkTwilioCreateMessage(b *testing.B) {
	s := sandbox.New(sandbox.Options{TwilioAccountSID: testSID, TwilioAuthToken: testToken})
	srv := httptest.NewServer(s)
	defer srv.Close()
	tr := srv.Client().Transport.(*http.Transport)
	tr.MaxIdleConnsPerHost = 256
	body := message("+905551234567", "Merhaba, kodunuz ABC123").Encode()
	u := srv.URL + "/2010-04-01/Accounts/" + testSID + "/Messages.json"
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.SetBasicAuth(testSID, testToken)
			resp, err := srv.Client().Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
	if got := len(s.Messages()); got < b.N {
		b.Fatalf("recorded %d of %d", got, b.N)
	}
}

// BenchmarkTwilioHandler measures the sandbox's own work for one accepted message, without the network
// and net/http's connection handling: what a message costs it on top of reading and writing HTTP.
func BenchmarkTwilioHandler(b *testing.B) {
	s := sandbox.New(sandbox.Options{TwilioAccountSID: testSID, TwilioAuthToken: testToken})
	tmpl, err := http.NewRequest(http.MethodPost, "http://sandbox/2010-04-01/Accounts/"+testSID+"/Messages.json", nil)
	if err != nil {
		b.Fatal(err)
	}
	tmpl.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	tmpl.SetBasicAuth(testSID, testToken)
	rest := "&From=%2B905550000000&Body=" + url.QueryEscape("Merhaba Ali, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin")
	w := &discardWriter{header: http.Header{}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		body := "To=%2B90532" + strconv.Itoa(1_000_000+i) + rest
		w.serve(b, s, tmpl, strings.NewReader(body), len(body), http.StatusCreated)
	}
}

// discardWriter is an http.ResponseWriter that keeps only the status.
type discardWriter struct {
	header http.Header
	status int
}

// serve has h answer a copy of tmpl with body (of n bytes) into w, and fails b unless it answers want.
func (w *discardWriter) serve(b *testing.B, h http.Handler, tmpl *http.Request, body io.Reader, n int, want int) {
	r := *tmpl
	r.Body = io.NopCloser(body)
	r.ContentLength = int64(n)
	clear(w.header)
	w.status = 0
	h.ServeHTTP(w, &r)
	if w.status != want {
		b.Fatalf("status %d, want %d", w.status, want)
	}
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
