package sandbox_test

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const sgTestKey = "SG.sandboxKey0001.abcdefghijklmnopqrstuvwxyz0123456789"

// sgAnswer is a decoded Mail Send response.
type sgAnswer struct {
	status int
	header http.Header
	raw    string
	errors []sgErr
}

type sgErr struct {
	Message string  `json:"message"`
	Field   *string `json:"field"`
}

func newSendGridSandbox(t *testing.T, opts sandbox.Options) (*sandbox.Server, *httptest.Server) {
	t.Helper()
	if opts.SendGridAPIKey == "" {
		opts.SendGridAPIKey = sgTestKey
	}
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv
}

// sgPost posts body (a value to encode, or raw []byte) to /v3/mail/send with the given key.
func sgPost(t *testing.T, srv *httptest.Server, key string, body any, header ...string) sgAnswer {
	t.Helper()
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v3/mail/send", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("post mail: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := sgAnswer{status: resp.StatusCode, header: resp.Header, raw: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		var eb struct{ Errors []sgErr }
		if err := json.Unmarshal(b, &eb); err != nil {
			t.Fatalf("decode %q: %v", b, err)
		}
		a.errors = eb.Errors
	}
	return a
}

type sgObj = map[string]any

// sgPersonalization is one recipient with its substitutions and custom args.
func sgPersonalization(to string, subs map[string]string, args map[string]string) sgObj {
	p := sgObj{"to": []sgObj{{"email": to}}}
	if subs != nil {
		p["substitutions"] = subs
	}
	if args != nil {
		p["custom_args"] = args
	}
	return p
}

// sgMail is a valid request: a subject, a text/plain part, from shop@example.com.
func sgMail(ps ...sgObj) sgObj {
	return sgObj{
		"from":             sgObj{"email": "shop@example.com", "name": "Shop"},
		"subject":          "Kampanya",
		"content":          []sgObj{{"type": "text/plain", "value": "Merhaba"}},
		"personalizations": ps,
	}
}

var sgIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

func TestSendGridMailSendAccepted(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	mail := sgObj{
		"from":    sgObj{"email": "shop@example.com"},
		"subject": "Fırsat -name-",
		"content": []sgObj{{"type": "text/plain", "value": "-text-"}, {"type": "text/html", "value": "<p>-html-</p>"}},
		"personalizations": []sgObj{
			sgPersonalization("ayse@example.com", map[string]string{"-text-": "Kodunuz A1 -html-", "-html-": "<b>A1</b>", "-name-": "Ayşe"}, map[string]string{"user_id": "u1"}),
			sgPersonalization("mehmet@example.com", map[string]string{"-text-": "Kodunuz B2", "-html-": "<b>B2</b>", "-name-": "Mehmet"}, map[string]string{"user_id": "u2"}),
		},
		"custom_args": sgObj{"campaign_id": "42"},
	}
	a := sgPost(t, srv, sgTestKey, mail)
	if a.status != http.StatusAccepted || a.raw != "" {
		t.Fatalf("status %d body %q, want 202 and no body", a.status, a.raw)
	}
	id := a.header.Get("X-Message-Id")
	if !sgIDPattern.MatchString(id) {
		t.Fatalf("X-Message-Id %q is not 22 base64url characters", id)
	}
	got := s.Messages()
	if len(got) != 2 {
		t.Fatalf("recorded %d messages, want 2", len(got))
	}
	for i, m := range got {
		if !strings.HasPrefix(m.SID, id+".") || m.At.IsZero() {
			t.Errorf("message %d: SID %q does not start with %q, or no time", i, m.SID, id+".")
		}
		got[i].SID, got[i].At = "", time.Time{}
	}
	// Substitutions apply once: "-html-" inside a substituted value stays as it is.
	want := []sandbox.Message{
		{Provider: "sendgrid", To: "ayse@example.com", From: "shop@example.com", Subject: "Fırsat Ayşe", Body: "Kodunuz A1 -html-", HTML: "<p><b>A1</b></p>", Status: "processed"},
		{Provider: "sendgrid", To: "mehmet@example.com", From: "shop@example.com", Subject: "Fırsat Mehmet", Body: "Kodunuz B2", HTML: "<p><b>B2</b></p>", Status: "processed"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("recorded (-want +got):\n%s", diff)
	}
	if st := s.Stats(); st.Requests != 1 || st.Accepted != 2 || st.Rejected != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestSendGridTemplateRecordsData(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	p := sgPersonalization("ayse@example.com", nil, nil)
	p["dynamic_template_data"] = sgObj{"code": "PROMO-7K2Q"}
	a := sgPost(t, srv, sgTestKey, sgObj{"from": sgObj{"email": "shop@example.com"}, "template_id": "d-123", "personalizations": []sgObj{p}})
	if a.status != http.StatusAccepted {
		t.Fatalf("status %d %s", a.status, a.raw)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || msgs[0].Body != `{"dynamic_template_data":{"code":"PROMO-7K2Q"},"template_id":"d-123"}` {
		t.Errorf("recorded %+v", msgs)
	}
}

func TestSendGridAuth(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	for name, key := range map[string]string{"missing": "", "wrong": "SG.wrong"} {
		a := sgPost(t, srv, key, sgMail(sgPersonalization("a@example.com", nil, nil)))
		if a.status != http.StatusUnauthorized || len(a.errors) != 1 || a.errors[0].Message != "authorization required" || a.errors[0].Field != nil {
			t.Errorf("%s key: %d %s, want 401 authorization required with a null field", name, a.status, a.raw)
		}
	}
	a := sgPost(t, srv, "", sgMail(sgPersonalization("a@example.com", nil, nil)), "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("u:"+sgTestKey)))
	if a.status != http.StatusUnauthorized {
		t.Errorf("basic auth: %d", a.status)
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("recorded %d messages", n)
	}

	// Without a configured key any key will do.
	s2 := sandbox.New(sandbox.Options{})
	srv2 := httptest.NewServer(s2)
	defer srv2.Close()
	if a := sgPost(t, srv2, "anything", sgMail(sgPersonalization("a@example.com", nil, nil))); a.status != http.StatusAccepted {
		t.Errorf("open sandbox: %d %s", a.status, a.raw)
	}
}

func TestSendGridValidation(t *testing.T) {
	many := func(n, recipientsEach int) []sgObj {
		ps := make([]sgObj, n)
		for i := range ps {
			var to []sgObj
			for j := range recipientsEach {
				to = append(to, sgObj{"email": fmt.Sprintf("u%d.%d@example.com", i, j)})
			}
			ps[i] = sgObj{"to": to}
		}
		return ps
	}
	edit := func(f func(m sgObj)) sgObj {
		m := sgMail(sgPersonalization("a@example.com", nil, nil))
		f(m)
		return m
	}
	tests := []struct {
		name  string
		mail  sgObj
		field string // "" for null
		msg   string // a substring of the message
	}{
		{"no personalizations", edit(func(m sgObj) { delete(m, "personalizations") }), "personalizations", "at least one personalization"},
		{"1001 personalizations", edit(func(m sgObj) { m["personalizations"] = many(1001, 1) }), "personalizations", "more than 1000 personalizations"},
		{"1001 recipients", edit(func(m sgObj) { m["personalizations"] = many(77, 13) }), "personalizations", "recipients"},
		{"no from", edit(func(m sgObj) { delete(m, "from") }), "from.email", "from object must be provided"},
		{"bad from", edit(func(m sgObj) { m["from"] = sgObj{"email": "shop"} }), "from.email", "valid address"},
		{"unicode from", edit(func(m sgObj) { m["from"] = sgObj{"email": "şop@example.com"} }), "from.email", "valid address"},
		{"no content", edit(func(m sgObj) { delete(m, "content") }), "content", "content parameter is required"},
		{"empty content", edit(func(m sgObj) { m["content"] = []sgObj{{"type": "text/plain", "value": ""}} }), "content.0.value", "at least one character"},
		{"html before text", edit(func(m sgObj) {
			m["content"] = []sgObj{{"type": "text/html", "value": "<p>x</p>"}, {"type": "text/plain", "value": "x"}}
		}), "content.1.type", "text/plain content must be first"},
		{"no subject", edit(func(m sgObj) { delete(m, "subject") }), "subject", "subject is required"},
		{"no to", edit(func(m sgObj) { m["personalizations"] = []sgObj{{"subject": "x"}} }), "personalizations.0.to", "to array is required"},
		{"bad to", edit(func(m sgObj) {
			m["personalizations"] = []sgObj{sgPersonalization("a@example.com", nil, nil), sgPersonalization("not-an-address", nil, nil)}
		}), "personalizations.1.to.0.email", "Does not contain a valid address."},
		{"duplicate across personalizations", edit(func(m sgObj) {
			m["personalizations"] = []sgObj{sgPersonalization("a@example.com", nil, nil), sgPersonalization("A@Example.com", nil, nil)}
		}), "personalizations.1.to", "first duplicate instance of [A@Example.com]"},
		{"duplicate to and cc", edit(func(m sgObj) {
			m["personalizations"] = []sgObj{{"to": []sgObj{{"email": "a@example.com"}}, "cc": []sgObj{{"email": "a@example.com"}}}}
		}), "personalizations.0.cc", "duplicate"},
		{"11 categories", edit(func(m sgObj) {
			m["categories"] = []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"}
		}), "categories", "more than 10 categories"},
		{"custom_args 10,000 bytes", edit(func(m sgObj) { m["custom_args"] = sgObj{"k": strings.Repeat("x", 9999)} }), "personalizations.0.custom_args", "10,000 bytes"},
		{"substitutions over 10,000 bytes", edit(func(m sgObj) {
			m["personalizations"] = []sgObj{sgPersonalization("a@example.com", map[string]string{"-t-": strings.Repeat("x", 9998)}, nil)}
		}), "personalizations.0.substitutions", "10,000 bytes"},
		{"send_at 73h ahead", edit(func(m sgObj) { m["send_at"] = time.Now().Add(73 * time.Hour).Unix() }), "send_at", "72 hours"},
		{"personalization send_at 73h ahead", edit(func(m sgObj) {
			m["personalizations"] = []sgObj{{"to": []sgObj{{"email": "a@example.com"}}, "send_at": time.Now().Add(73 * time.Hour).Unix()}}
		}), "personalizations.0.send_at", "72 hours"},
		{"not json", nil, "", "Bad Request"},
	}
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body any = tt.mail
			if tt.mail == nil {
				body = []byte(`{"personalizations": [`)
			}
			a := sgPost(t, srv, sgTestKey, body)
			if a.status != http.StatusBadRequest || len(a.errors) != 1 {
				t.Fatalf("status %d body %s, want 400 with one error", a.status, a.raw)
			}
			e := a.errors[0]
			field := ""
			if e.Field != nil {
				field = *e.Field
			}
			if field != tt.field || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("error field %q message %q, want field %q and a message with %q", field, e.Message, tt.field, tt.msg)
			}
		})
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("recorded %d messages from invalid requests", n)
	}

	// The limits themselves are allowed.
	ok := []sgObj{
		edit(func(m sgObj) { m["personalizations"] = many(1000, 1) }),
		edit(func(m sgObj) { m["personalizations"] = many(100, 10) }),
		edit(func(m sgObj) {
			m["personalizations"] = []sgObj{sgPersonalization("a@example.com", map[string]string{"-t-": strings.Repeat("x", 9997)}, nil)}
		}),
		edit(func(m sgObj) { m["custom_args"] = sgObj{"k": strings.Repeat("x", 9998)} }),
		edit(func(m sgObj) { m["send_at"] = time.Now().Add(71 * time.Hour).Unix() }),
		edit(func(m sgObj) { m["categories"] = []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"} }),
		// Every personalization has a subject: none needed at the top.
		edit(func(m sgObj) {
			delete(m, "subject")
			m["personalizations"] = []sgObj{{"to": []sgObj{{"email": "a@example.com"}}, "subject": "x"}}
		}),
		// A template needs neither content nor subject.
		edit(func(m sgObj) { delete(m, "subject"); delete(m, "content"); m["template_id"] = "d-1" }),
	}
	for i, m := range ok {
		if a := sgPost(t, srv, sgTestKey, m); a.status != http.StatusAccepted {
			t.Errorf("request %d at the limit: %d %s", i, a.status, a.raw)
		}
	}
}

func TestSendGridTooLarge(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	// Built by hand: encoding 30 MB with encoding/json is slow under the race detector.
	raw := `{"from":{"email":"shop@example.com"},"subject":"x","personalizations":[{"to":[{"email":"a@example.com"}]}],` +
		`"content":[{"type":"text/plain","value":"` + strings.Repeat("x", 30<<20) + `"}]}`
	a := sgPost(t, srv, sgTestKey, []byte(raw))
	if a.status != http.StatusRequestEntityTooLarge || len(a.errors) != 1 || a.errors[0].Message != "content too large" {
		t.Errorf("status %d body %.200s, want 413 content too large", a.status, a.raw)
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("recorded %d messages", n)
	}
}

func TestSendGridGzip(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	raw, _ := json.Marshal(sgMail(sgPersonalization("a@example.com", nil, nil)))
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	a := sgPost(t, srv, sgTestKey, buf.Bytes(), "Content-Encoding", "gzip")
	if a.status != http.StatusAccepted {
		t.Fatalf("status %d %s", a.status, a.raw)
	}
	if msgs := s.Messages(); len(msgs) != 1 || msgs[0].Body != "Merhaba" {
		t.Errorf("recorded %+v", msgs)
	}
}

func TestSendGridSandboxModeAndForbiddenSender(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	m := sgMail(sgPersonalization("a@example.com", nil, nil))
	m["mail_settings"] = sgObj{"sandbox_mode": sgObj{"enable": true}}
	if a := sgPost(t, srv, sgTestKey, m); a.status != http.StatusOK || a.raw != "" {
		t.Errorf("sandbox mode: %d %q, want 200 and no body", a.status, a.raw)
	}
	m = sgMail(sgPersonalization("a@example.com", nil, nil))
	m["from"] = sgObj{"email": "unverified+shop@example.com"}
	a := sgPost(t, srv, sgTestKey, m)
	if a.status != http.StatusForbidden || len(a.errors) != 1 || a.errors[0].Field == nil || *a.errors[0].Field != "from" ||
		!strings.Contains(a.errors[0].Message, "verified Sender Identity") {
		t.Errorf("unverified sender: %d %s", a.status, a.raw)
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("recorded %d messages", n)
	}
}

func TestSendGridMethodNotAllowed(t *testing.T) {
	_, srv := newSendGridSandbox(t, sandbox.Options{})
	resp, err := http.Get(srv.URL + "/v3/mail/send")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func TestSendGridRateLimit(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridRate: 2})
	var ok, limited int
	for range 10 {
		a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("a@example.com", nil, nil)))
		switch a.status {
		case http.StatusAccepted:
			ok++
		case http.StatusTooManyRequests:
			limited++
			reset, err := strconv.ParseInt(a.header.Get("X-RateLimit-Reset"), 10, 64)
			now := time.Now().Unix()
			if err != nil || reset < now || reset > now+2 ||
				a.header.Get("X-RateLimit-Limit") != "2" || a.header.Get("X-RateLimit-Remaining") != "0" ||
				a.raw != `{"errors":[{"message":"too many requests","field":null,"help":null}]}`+"\n" {
				t.Errorf("429: headers %v body %s", a.header, a.raw)
			}
		default:
			t.Errorf("status %d %s", a.status, a.raw)
		}
	}
	if ok == 0 || limited == 0 || ok+limited != 10 {
		t.Errorf("%d accepted, %d limited; want both", ok, limited)
	}
	// Another key has its own bucket.
	s2 := sandbox.New(sandbox.Options{SendGridRate: 1})
	srv2 := httptest.NewServer(s2)
	defer srv2.Close()
	for _, key := range []string{"SG.one", "SG.two"} {
		if a := sgPost(t, srv2, key, sgMail(sgPersonalization("a@example.com", nil, nil))); a.status != http.StatusAccepted {
			t.Errorf("first request of %s: %d", key, a.status)
		}
	}
	if st := s.Stats(); st.ByStatus[429] != limited || st.Accepted != ok {
		t.Errorf("stats %+v", st)
	}
}

func TestSendGridFaults(t *testing.T) {
	tests := []struct {
		name   string
		faults sandbox.Faults
		status int
		body   string
	}{
		{"429", sandbox.Faults{Rate429: 1}, 429, `{"errors":[{"message":"too many requests","field":null,"help":null}]}` + "\n"},
		{"500", sandbox.Faults{Rate500: 1}, 500, `{"errors":[{"message":"internal server error","field":null,"help":null}]}` + "\n"},
		{"503", sandbox.Faults{Rate503: 1}, 503, `{"errors":[{"message":"service unavailable","field":null,"help":null}]}` + "\n"},
		{"raw 503", sandbox.Faults{RateRaw503: 1}, 503, "<html>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, srv := newSendGridSandbox(t, sandbox.Options{Faults: tt.faults})
			a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("a@example.com", nil, nil)))
			if a.status != tt.status || !strings.HasPrefix(a.raw, tt.body) {
				t.Errorf("got %d %q, want %d %q", a.status, a.raw, tt.status, tt.body)
			}
			if tt.status == 429 && a.header.Get("X-RateLimit-Reset") == "" {
				t.Errorf("429 without X-RateLimit-Reset")
			}
			if len(s.Messages()) != 0 {
				t.Errorf("recorded a refused message")
			}
		})
	}
	// Faults come after authentication: a bad key still gets its 401.
	_, srv := newSendGridSandbox(t, sandbox.Options{Faults: sandbox.Faults{Rate500: 1}})
	if a := sgPost(t, srv, "SG.bad", sgMail(sgPersonalization("a@example.com", nil, nil))); a.status != http.StatusUnauthorized {
		t.Errorf("bad key under faults: %d", a.status)
	}
}

func TestSendGridTimeoutAndResetFaults(t *testing.T) {
	s, srv := newSendGridSandbox(t, sandbox.Options{Faults: sandbox.Faults{RateTimeout: 1}})
	c := srv.Client()
	c.Timeout = 200 * time.Millisecond
	raw, _ := json.Marshal(sgMail(sgPersonalization("a@example.com", nil, nil)))
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v3/mail/send", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+sgTestKey)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("timeout fault answered %d", resp.StatusCode)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || !msgs[0].Hung || msgs[0].To != "a@example.com" {
		t.Errorf("recorded %+v, want the one hung message", msgs)
	}

	s, srv = newSendGridSandbox(t, sandbox.Options{Faults: sandbox.Faults{RateReset: 1}})
	req, _ = http.NewRequest(http.MethodPost, srv.URL+"/v3/mail/send", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+sgTestKey)
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("reset fault answered %d", resp.StatusCode)
	}
	if st := s.Stats(); st.Resets != 1 || st.Accepted != 0 {
		t.Errorf("stats %+v, want one reset and nothing accepted", st)
	}
}

// The request log masks recipients and never shows the API key or the content.
func TestSendGridLogs(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, srv := newSendGridSandbox(t, sandbox.Options{Logger: logger})
	sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("ayse.yilmaz@example.com", nil, nil)))
	sgPost(t, srv, "SG.wrong.key", sgMail(sgPersonalization("ayse.yilmaz@example.com", nil, nil)))
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if !strings.Contains(out, "a***@example.com") {
		t.Errorf("log has no masked recipient:\n%s", out)
	}
	for _, secret := range []string{"ayse.yilmaz", sgTestKey, "SG.wrong.key", "Merhaba"} {
		if strings.Contains(out, secret) {
			t.Errorf("log shows %q:\n%s", secret, out)
		}
	}
}

// A message's headers are the request's with its personalization's over them, as SendGrid's are; with
// none for the request, the personalization's alone; with neither, none.
func TestSendGridHeadersOfAPersonalizationWin(t *testing.T) {
	t.Parallel()
	s, srv := newSendGridSandbox(t, sandbox.Options{})
	both := sgPersonalization("both@example.com", nil, nil)
	both["headers"] = map[string]string{"X-Kind": "own"}
	top := sgMail(both, sgPersonalization("top@example.com", nil, nil))
	top["headers"] = sgObj{"X-Kind": "request", "X-List": "kampanya"}
	own := sgPersonalization("own@example.com", nil, nil)
	own["headers"] = map[string]string{"List-Unsubscribe": "<https://example.com/u/1>"}
	for _, m := range []sgObj{top, sgMail(own, sgPersonalization("none@example.com", nil, nil))} {
		if a := sgPost(t, srv, sgTestKey, m); a.status != http.StatusAccepted {
			t.Fatalf("send: %d %s", a.status, a.raw)
		}
	}
	got := map[string]map[string]string{}
	for _, m := range s.Messages() {
		got[m.To] = m.Headers
	}
	want := map[string]map[string]string{
		"both@example.com": {"X-Kind": "own", "X-List": "kampanya"},
		"top@example.com":  {"X-Kind": "request", "X-List": "kampanya"},
		"own@example.com":  {"List-Unsubscribe": "<https://example.com/u/1>"},
		"none@example.com": nil,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("headers by recipient (-want +got):\n%s", diff)
	}
}

// BenchmarkSendGridHandler measures the sandbox's own work for one accepted request of 1000
// personalizations shaped as the SendGrid adapter writes a campaign's (the shared text and HTML once, each
// recipient's subject, four substitutions, the unsubscribe headers and the custom_args naming the
// recipient), without the network: what the stand-in spends on an e-mail besides reading HTTP.
func BenchmarkSendGridHandler(b *testing.B) {
	s := sandbox.New(sandbox.Options{SendGridAPIKey: sgTestKey})
	tmpl, err := http.NewRequest(http.MethodPost, "http://sandbox/v3/mail/send", nil)
	if err != nil {
		b.Fatal(err)
	}
	tmpl.Header.Set("Content-Type", "application/json")
	tmpl.Header.Set("Authorization", "Bearer "+sgTestKey)
	names := []string{"Ayşe", "Mehmet", "Zeynep", "Mustafa", "Elif", "Ahmet", "Şükrü", "Gülşen", "İbrahim", "Çağrı"}
	body := func(round int) []byte {
		ps := make([]sgObj, 1000)
		for i := range ps {
			name, code := names[i%len(names)], fmt.Sprintf("KMP%07d", 7919*i%10000000)
			ps[i] = sgObj{
				"to":      []sgObj{{"email": fmt.Sprintf("musteri%d.%d@example.com", i, round)}},
				"subject": name + ", size özel bir kod",
				"headers": map[string]string{"List-Unsubscribe": fmt.Sprintf("<https://hooks.example.com/u/NDIxNzpjMDAxMDAwMDA.%022d>", i),
					"List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
				"substitutions": map[string]string{"-campaignctl_v0-": name, "-campaignctl_v1-": code, "-campaignctl_v2-": name, "-campaignctl_v3-": code},
				"custom_args":   map[string]string{"campaign_id": "4217", "user_id": fmt.Sprintf("c%08d", 100000+i)},
			}
		}
		raw, err := json.Marshal(sgObj{
			"personalizations": ps,
			"from":             sgObj{"email": "kampanya@example.com"},
			"content": []sgObj{{"type": "text/plain", "value": "Merhaba -campaignctl_v0-, kodunuz -campaignctl_v1-"},
				{"type": "text/html", "value": "<p>Merhaba -campaignctl_v2-,</p><p>Kodunuz: <b>-campaignctl_v3-</b></p>"}},
		})
		if err != nil {
			b.Fatal(err)
		}
		return raw
	}
	// A few distinct bodies, so that the log's duplicates stay as few as a campaign's.
	bodies := make([][]byte, 8)
	for i := range bodies {
		bodies[i] = body(i)
	}
	w := &discardWriter{header: http.Header{}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		raw := bodies[i%len(bodies)]
		w.serve(b, s, tmpl, bytes.NewReader(raw), len(raw), http.StatusAccepted)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/e-mail")
}
