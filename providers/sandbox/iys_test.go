package sandbox_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const (
	iysUser     = "api-user@brand.example"
	iysPassword = "s3cret-İYS-pass"
	iysCode     = 700001
	iysBrand    = 700002
)

var (
	iysBase  = fmt.Sprintf("/sps/%d/brands/%d/consents", iysCode, iysBrand)
	trt      = time.FixedZone("TRT", 3*60*60)
	cursorRE = regexp.MustCompile(`^\d{13}_[0-9a-f]{64}$`)
)

// iysClock is a settable clock shared by the fake and the test.
type iysClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *iysClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *iysClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type iysEnv struct {
	s     *sandbox.Server
	srv   *httptest.Server
	clock *iysClock
}

// newIYSSandbox starts a sandbox with the test credentials and codes and a clock of its own.
func newIYSSandbox(t *testing.T, opts sandbox.Options) *iysEnv {
	t.Helper()
	clock := &iysClock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, trt)}
	opts.IYSUsername, opts.IYSPassword = iysUser, iysPassword
	opts.IYSCode, opts.IYSBrandCode = iysCode, iysBrand
	if opts.IYSNow == nil {
		opts.IYSNow = clock.Now
	}
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &iysEnv{s: s, srv: srv, clock: clock}
}

type iysAnswer struct {
	status int
	header http.Header
	body   string
}

// errs decodes İYS's error list.
func (a iysAnswer) errs(t *testing.T) []map[string]any {
	t.Helper()
	var b struct {
		Errors []map[string]any `json:"errors"`
	}
	if err := json.Unmarshal([]byte(a.body), &b); err != nil || len(b.Errors) == 0 {
		t.Fatalf("not an İYS error body (%d): %s", a.status, a.body)
	}
	return b.Errors
}

func (e *iysEnv) do(t *testing.T, method, path, token, contentType, body string) iysAnswer {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return iysAnswer{status: resp.StatusCode, header: resp.Header, body: string(data)}
}

func (e *iysEnv) postToken(t *testing.T, form url.Values) iysAnswer {
	t.Helper()
	return e.do(t, "POST", "/oauth2/token", "", "application/x-www-form-urlencoded", form.Encode())
}

type iysTokens struct {
	Access  string `json:"access_token"`
	Refresh string `json:"refresh_token"`
	Expires int    `json:"expires_in"`
	RExp    int    `json:"refresh_expires_in"`
	Type    string `json:"token_type"`
}

func (e *iysEnv) login(t *testing.T) iysTokens {
	t.Helper()
	a := e.postToken(t, url.Values{"grant_type": {"password"}, "username": {iysUser}, "password": {iysPassword}})
	if a.status != 200 {
		t.Fatalf("login: %d %s", a.status, a.body)
	}
	var tk iysTokens
	if err := json.Unmarshal([]byte(a.body), &tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

func (e *iysEnv) add(t *testing.T, cs ...sandbox.IYSConsent) []sandbox.IYSConsent {
	t.Helper()
	out, err := e.s.AddIYSConsents(cs...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// at formats a time the way İYS does.
func at(tm time.Time) string { return tm.In(trt).Format("2006-01-02 15:04:05") }

func TestIYSTokenEndpoint(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tk := e.login(t)
	if tk.Access == "" || tk.Refresh == "" || tk.Expires != 7200 || tk.RExp != 14400 || tk.Type != "bearer" {
		t.Errorf("token answer %+v", tk)
	}
	if parts := strings.Split(tk.Access, "."); len(parts) != 3 || !strings.HasPrefix(tk.Access, "eyJ") {
		t.Errorf("access token is not JWT-shaped: %q", tk.Access)
	}
	// JSON bodies work too.
	a := e.do(t, "POST", "/oauth2/token", "", "application/json",
		fmt.Sprintf(`{"username":%q,"password":%q,"grant_type":"password"}`, iysUser, iysPassword))
	if a.status != 200 || a.header.Get("Cache-Control") != "no-store" {
		t.Errorf("JSON login: %d %s", a.status, a.body)
	}

	refusals := []struct {
		name string
		form url.Values
		want string
	}{
		{"wrong password", url.Values{"grant_type": {"password"}, "username": {iysUser}, "password": {"nope"}},
			`{"error":"invalid_request","error_description":"Kullanıcı kimlik bilgileri geçersiz."}`},
		{"wrong user", url.Values{"grant_type": {"password"}, "username": {"x@y.example"}, "password": {iysPassword}},
			`{"error":"invalid_request","error_description":"Kullanıcı kimlik bilgileri geçersiz."}`},
		{"no grant", url.Values{"username": {iysUser}}, `{"error":"invalid_request","error_description":"Giriş yöntemi belirtilmemiş."}`},
		{"empty grant", url.Values{"grant_type": {""}}, `{"error":"invalid_grant","error_description":"Giriş yöntemi boş olamaz."}`},
		{"unknown grant", url.Values{"grant_type": {"client_credentials"}}, `{"error":"invalid_request","error_description":"Bilinmeyen giriş yöntemi."}`},
		{"no username", url.Values{"grant_type": {"password"}, "password": {"p"}}, `{"error":"invalid_request","error_description":"Kullanıcı adı verilmemiş."}`},
		{"no password", url.Values{"grant_type": {"password"}, "username": {iysUser}}, `{"error":"invalid_request","error_description":"Şifre verilmemiş."}`},
		{"empty password", url.Values{"grant_type": {"password"}, "username": {iysUser}, "password": {""}}, `{"error":"invalid_grant","error_description":"Şifre boş bırakılamaz."}`},
		{"no refresh token", url.Values{"grant_type": {"refresh_token"}}, `{"error":"invalid_request","error_description":"Yenileme jetonu verilmemiş."}`},
		{"unknown refresh token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {"eyJx.y.z"}}, `{"error":"invalid_grant","error_description":"Yenileme jetonu geçersiz veya süresi dolmuş."}`},
	}
	for _, tt := range refusals {
		a := e.postToken(t, tt.form)
		if a.status != 400 || strings.TrimSpace(a.body) != tt.want {
			t.Errorf("%s: %d %s, want 400 %s", tt.name, a.status, a.body, tt.want)
		}
		if strings.Contains(a.body, iysPassword) {
			t.Errorf("%s: the answer shows the password", tt.name)
		}
	}

	// A refresh rotates the refresh token: the new one works once, the old one never again.
	a = e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk.Refresh}})
	if a.status != 200 {
		t.Fatalf("refresh: %d %s", a.status, a.body)
	}
	var tk2 iysTokens
	_ = json.Unmarshal([]byte(a.body), &tk2)
	if tk2.Refresh == tk.Refresh || tk2.Access == tk.Access {
		t.Errorf("refresh did not rotate the tokens")
	}
	if a := e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk.Refresh}}); a.status != 400 || !strings.Contains(a.body, "invalid_grant") {
		t.Errorf("reused refresh token: %d %s", a.status, a.body)
	}
	// Both access tokens work.
	for _, tok := range []string{tk.Access, tk2.Access} {
		if a := e.do(t, "GET", iysBase+"/changes", tok, "", ""); a.status != 204 {
			t.Errorf("pull with a fresh token: %d %s", a.status, a.body)
		}
	}
	st := e.s.IYSStats()
	if st.TokenRequests != 2+len(refusals)+2 || st.PasswordGrants != 2 || st.RefreshGrants != 1 || st.TokensRefused != len(refusals)+1 {
		t.Errorf("stats %+v", st)
	}
}

func TestIYSTokenExpiry(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{IYSTokenTTL: 10 * time.Minute, IYSRefreshTTL: 30 * time.Minute})
	tk := e.login(t)
	if tk.Expires != 600 || tk.RExp != 1800 {
		t.Errorf("lifetimes %d/%d, want 600/1800", tk.Expires, tk.RExp)
	}
	pull := func(tok string) iysAnswer { return e.do(t, "GET", iysBase+"/changes", tok, "", "") }
	if a := pull(tk.Access); a.status != 204 {
		t.Fatalf("fresh token: %d %s", a.status, a.body)
	}
	e.clock.Advance(10 * time.Minute)
	want401 := `{"errors":[{"code":"H351","message":"Eksik veya geçersiz jeton!"}]}`
	if a := pull(tk.Access); a.status != 401 || strings.TrimSpace(a.body) != want401 {
		t.Errorf("expired token: %d %s", a.status, a.body)
	}
	a := e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk.Refresh}})
	if a.status != 200 {
		t.Fatalf("refresh within its life: %d %s", a.status, a.body)
	}
	var tk2 iysTokens
	_ = json.Unmarshal([]byte(a.body), &tk2)
	if a := pull(tk2.Access); a.status != 204 {
		t.Errorf("refreshed token: %d", a.status)
	}
	e.clock.Advance(30 * time.Minute)
	if a := e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk2.Refresh}}); a.status != 400 {
		t.Errorf("expired refresh token: %d %s", a.status, a.body)
	}

	// The control API expires access tokens (refresh tokens live on) or revokes everything.
	tk3 := e.login(t)
	if code := postJSON(t, e.srv.URL+"/_sandbox/iys/tokens/expire", ""); code != http.StatusNoContent {
		t.Fatalf("expire: %d", code)
	}
	if a := pull(tk3.Access); a.status != 401 {
		t.Errorf("after expire: %d", a.status)
	}
	a = e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk3.Refresh}})
	if a.status != 200 {
		t.Fatalf("refresh after expire: %d %s", a.status, a.body)
	}
	var tk4 iysTokens
	_ = json.Unmarshal([]byte(a.body), &tk4)
	if code := postJSON(t, e.srv.URL+"/_sandbox/iys/tokens/revoke", ""); code != http.StatusNoContent {
		t.Fatalf("revoke: %d", code)
	}
	if a := pull(tk4.Access); a.status != 401 {
		t.Errorf("after revoke: %d", a.status)
	}
	if a := e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk4.Refresh}}); a.status != 400 {
		t.Errorf("refresh after revoke: %d", a.status)
	}
	if st := e.s.IYSStats(); st.Unauthenticated != 3 || st.ByCode["H351"] != 3 {
		t.Errorf("stats %+v", st)
	}
}

// Over IYSTokenPerHour the token endpoint answers 429 H084, and asking again early restarts the hour.
func TestIYSTokenHourlyLimit(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{IYSTokenPerHour: 2})
	login := func() iysAnswer {
		return e.postToken(t, url.Values{"grant_type": {"password"}, "username": {iysUser}, "password": {iysPassword}})
	}
	for i := range 2 {
		if a := login(); a.status != 200 {
			t.Fatalf("login %d: %d", i, a.status)
		}
	}
	want := `{"errors":[{"code":"H084","message":"Saatte kabul edilen kimlik doğrulama istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz."}]}`
	a := login()
	if a.status != 429 || strings.TrimSpace(a.body) != want || a.header.Get("Retry-After") != "3600" {
		t.Errorf("third login: %d %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	e.clock.Advance(59 * time.Minute)
	if a := login(); a.status != 429 {
		t.Errorf("59 min after a refusal: %d, want 429", a.status)
	}
	e.clock.Advance(59 * time.Minute) // 118 min after the first refusal, but only 59 after the last
	if a := login(); a.status != 429 {
		t.Errorf("an early retry must restart the hour: %d", a.status)
	}
	e.clock.Advance(61 * time.Minute)
	if a := login(); a.status != 200 {
		t.Errorf("an hour after the last refusal: %d %s", a.status, a.body)
	}
	if st := e.s.IYSStats(); st.ByCode["H084"] != 3 || st.RateLimited != 3 || st.PasswordGrants != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestIYSAuthorizationAndCodes(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	body := `{"recipient":"+905321234567","recipientType":"BIREYSEL","type":"MESAJ"}`
	for _, tt := range []struct {
		name, path, token string
		status            int
		want              string
	}{
		{"no token", iysBase + "/status", "", 401, `{"errors":[{"code":"H351","message":"Eksik veya geçersiz jeton!"}]}`},
		{"unknown token", iysBase + "/status", "eyJhbGciOi.x.y", 401, `{"errors":[{"code":"H351","message":"Eksik veya geçersiz jeton!"}]}`},
		{"other iysCode", fmt.Sprintf("/sps/1/brands/%d/consents/status", iysBrand), tok, 403,
			`{"errors":[{"code":"H353","message":"iysCode, kullanıcı izinleriyle eşleştirilemiyor"}]}`},
		{"other brandCode", fmt.Sprintf("/sps/%d/brands/2/consents/status", iysCode), tok, 403,
			`{"errors":[{"code":"H353","message":"brandCode, kullanıcı izinleriyle eşleştirilemiyor"}]}`},
		{"brandCode not a number", fmt.Sprintf("/sps/%d/brands/abc/consents/status", iysCode), tok, 403,
			`{"errors":[{"code":"H353","message":"brandCode, kullanıcı izinleriyle eşleştirilemiyor"}]}`},
	} {
		a := e.do(t, "POST", tt.path, tt.token, "application/json", body)
		if a.status != tt.status || strings.TrimSpace(a.body) != tt.want {
			t.Errorf("%s: %d %s, want %d %s", tt.name, a.status, a.body, tt.status, tt.want)
		}
	}
	// With no codes configured, any İYS number is accepted.
	open := sandbox.New(sandbox.Options{})
	srv := httptest.NewServer(open)
	defer srv.Close()
	o := &iysEnv{s: open, srv: srv}
	otk := o.postToken(t, url.Values{"grant_type": {"password"}, "username": {"anyone"}, "password": {"anything"}})
	var tk iysTokens
	_ = json.Unmarshal([]byte(otk.body), &tk)
	if a := o.do(t, "GET", "/sps/1/brands/2/consents/changes", tk.Access, "", ""); a.status != 204 {
		t.Errorf("open sandbox: %d %s", a.status, a.body)
	}
}

func TestIYSStatus(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	rec := e.add(t,
		sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", ConsentDate: "2026-03-09 10:00:00"},
		sandbox.IYSConsent{Recipient: "Ayse.Yilmaz@Example.com", Type: "EPOSTA", RecipientType: "TACIR", Status: "RET", Source: "IYS_MOBIL"},
	)
	if rec[1].Recipient != "ayse.yilmaz@example.com" || rec[1].ConsentDate != "" || rec[1].RecipientType != "TACIR" {
		t.Errorf("recorded %+v", rec[1])
	}
	status := func(body string) iysAnswer { return e.do(t, "POST", iysBase+"/status", tok, "application/json", body) }

	a := status(`{"recipient":"+905321234567","recipientType":"BIREYSEL","type":"MESAJ"}`)
	var got sandbox.IYSConsent
	if err := json.Unmarshal([]byte(a.body), &got); a.status != 200 || err != nil {
		t.Fatalf("status: %d %s", a.status, a.body)
	}
	if diff := cmp.Diff(rec[0], got); diff != "" {
		t.Errorf("status answer (-want +got):\n%s", diff)
	}
	if got.CreationDate != "2026-03-10 12:00:00" || len(got.TransactionID) != 64 {
		t.Errorf("server fields %+v", got)
	}
	// E-mails are compared in lower case, as İYS stores them.
	a = status(`{"recipient":"AYSE.YILMAZ@example.com","recipientType":"TACIR","type":"EPOSTA"}`)
	if a.status != 200 || !strings.Contains(a.body, `"status":"RET"`) || !strings.Contains(a.body, `"recipient":"ayse.yilmaz@example.com"`) {
		t.Errorf("e-mail status: %d %s", a.status, a.body)
	}
	// Same address, other recipient type or type: no record.
	for _, body := range []string{
		`{"recipient":"ayse.yilmaz@example.com","recipientType":"BIREYSEL","type":"EPOSTA"}`,
		`{"recipient":"+905321234567","recipientType":"BIREYSEL","type":"ARAMA"}`,
	} {
		if a := status(body); a.status != 404 || strings.TrimSpace(a.body) != `{"errors":[{"message":"İzin bulunamadı."}]}` {
			t.Errorf("%s: %d %s", body, a.status, a.body)
		}
	}

	for _, tt := range []struct {
		body   string
		status int
		code   string
		loc    string
		value  any
	}{
		{`{"recipient":`, 400, "H014", "", nil},
		{`[]`, 400, "H014", "", nil},
		{`{"recipient":"+905321234567","recipientType":"BIREYSEL","type":"MESAJ","brand":1}`, 422, "H118", "brand", nil},
		{`{"recipient":"+905321234567","recipientType":"BIREYSEL"}`, 422, "H111", "type", nil},
		{`{"recipient":"+905321234567","recipientType":"BIREYSEL","type":"ARAMAA"}`, 422, "H117", "type", "ARAMAA"},
		{`{"recipient":"+905321234567","type":"MESAJ"}`, 422, "H170", "recipientType", nil},
		{`{"recipient":"+905321234567","recipientType":"TACIRR","type":"MESAJ"}`, 422, "H116", "recipientType", "TACIRR"},
		{`{"recipientType":"BIREYSEL","type":"MESAJ"}`, 422, "H114", "recipient", nil},
		{`{"recipient":"+9005321234567","recipientType":"BIREYSEL","type":"MESAJ"}`, 422, "H121", "recipient", "+9005321234567"},
		{`{"recipient":"05321234567","recipientType":"BIREYSEL","type":"MESAJ"}`, 422, "H121", "recipient", "05321234567"},
		{`{"recipient":"+0554321323223333333333","recipientType":"BIREYSEL","type":"MESAJ"}`, 422, "H166", "recipient", "+0554321323223333333333"},
		{`{"recipient":"test@gmail.com","recipientType":"BIREYSEL","type":"MESAJ"}`, 422, "H464", "recipient", "test@gmail.com"},
		{`{"recipient":"+905312560714","recipientType":"BIREYSEL","type":"EPOSTA"}`, 422, "H464", "recipient", "+905312560714"},
		{`{"recipient":"ornekmail.com","recipientType":"BIREYSEL","type":"EPOSTA"}`, 422, "H120", "recipient", "ornekmail.com"},
		{`{"recipient":"ayşe@örnek.com","recipientType":"BIREYSEL","type":"EPOSTA"}`, 422, "H120", "recipient", "ayşe@örnek.com"},
	} {
		a := status(tt.body)
		if a.status != tt.status {
			t.Errorf("%s: %d %s, want %d %s", tt.body, a.status, a.body, tt.status, tt.code)
			continue
		}
		er := a.errs(t)[0]
		if er["code"] != tt.code || er["message"] == "" {
			t.Errorf("%s: %s, want %s", tt.body, a.body, tt.code)
		}
		if tt.loc != "" && fmt.Sprint(er["location"]) != "["+tt.loc+"]" {
			t.Errorf("%s: location %v, want [%s]", tt.body, er["location"], tt.loc)
		}
		if tt.value != nil && er["value"] != tt.value {
			t.Errorf("%s: value %v, want %v", tt.body, er["value"], tt.value)
		}
	}
	// İYS's exact text for a bad phone number.
	a = status(`{"recipient":"+05543213232","recipientType":"BIREYSEL","type":"MESAJ"}`)
	want := `{"errors":[{"code":"H121","message":"Alıcı (recipient) için E164 uluslararası([+][country code][area code][local phone number]) formata uygun bir telefon numarası girilmelidir. (örn. +905992000000)","location":["recipient"],"value":"+05543213232"}]}`
	if strings.TrimSpace(a.body) != want {
		t.Errorf("H121 body:\n got %s\nwant %s", a.body, want)
	}
	if st := e.s.IYSStats(); st.StatusQueries != 2 || st.Requests != 20 || st.ByCode["H464"] != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestIYSMultiStatus(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	e.add(t,
		sandbox.IYSConsent{Recipient: "+905054566789", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB"},
		sandbox.IYSConsent{Recipient: "+905055566790", Type: "MESAJ", Status: "ONAY", Source: "HS_MESAJ"},
		sandbox.IYSConsent{Recipient: "+905056566791", Type: "MESAJ", Status: "RET", Source: "IYS_KISAMESAJ"},
		sandbox.IYSConsent{Recipient: "+905057566792", Type: "MESAJ", RecipientType: "TACIR", Status: "ONAY", Source: "HS_WEB"},
		sandbox.IYSConsent{Recipient: "+905058566793", Type: "ARAMA", Status: "ONAY", Source: "HS_WEB"},
	)
	multi := func(rt, typ, body string) iysAnswer {
		return e.do(t, "POST", iysBase+"/"+rt+"/status/"+typ, tok, "application/json", body)
	}
	a := multi("BIREYSEL", "MESAJ", `{"recipients":["+905055566790","+905056566791","+905057566792","+905058566793","+905054566789","+905059999999"]}`)
	var got struct {
		RequestID string   `json:"requestId"`
		List      []string `json:"list"`
	}
	if err := json.Unmarshal([]byte(a.body), &got); a.status != 200 || err != nil {
		t.Fatalf("multi-status: %d %s", a.status, a.body)
	}
	if diff := cmp.Diff([]string{"+905055566790", "+905054566789"}, got.List); diff != "" {
		t.Errorf("approved (-want +got):\n%s", diff)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(got.RequestID) {
		t.Errorf("requestId %q", got.RequestID)
	}
	a = multi("TACIR", "MESAJ", `{"recipients":["+905057566792","+905054566789"]}`)
	if a.status != 200 || !strings.Contains(a.body, `"list":["+905057566792"]`) {
		t.Errorf("TACIR: %d %s", a.status, a.body)
	}
	if a := multi("BIREYSEL", "EPOSTA", `{"recipients":["nobody@example.com"]}`); a.status != 200 || !strings.Contains(a.body, `"list":[]`) {
		t.Errorf("none approved: %d %s", a.status, a.body)
	}

	many := make([]string, 1001)
	for i := range many {
		many[i] = fmt.Sprintf("+90532%07d", i)
	}
	manyJSON, _ := json.Marshal(map[string][]string{"recipients": many})
	for _, tt := range []struct {
		name, rt, typ, body string
		status              int
		want                string
	}{
		{"missing list", "BIREYSEL", "MESAJ", `{}`, 422, `{"errors":[{"code":"H168","message":"Alıcı listesi (recipients) bulunamadı.","location":["recipients"]}]}`},
		{"not a list", "BIREYSEL", "MESAJ", `{"recipients":{}}`, 422, `{"errors":[{"code":"H478","message":"Alıcı listesi (recipients) liste olmalıdır.","location":["recipients"]}]}`},
		{"empty list", "BIREYSEL", "MESAJ", `{"recipients":[]}`, 422, `{"errors":[{"code":"H164","message":"Alıcı listesi (recipients) kabul edilemedi. Liste boş olmamalıdır.","location":["recipients"],"value":[]}]}`},
		{"repeated", "BIREYSEL", "MESAJ", `{"recipients":["+905054566789","+905055566790","+905056566791","+905055566790"]}`, 422,
			`{"errors":[{"code":"H193","message":"Alıcı (recipient) değeri liste içinde tekrarlanamaz.","location":["recipients",3],"value":"+905055566790"}]}`},
		{"e-mail for MESAJ", "BIREYSEL", "MESAJ", `{"recipients":["+905054566789","test@gmail.com"]}`, 422,
			`{"errors":[{"code":"H464","message":"İzin tipi (type) MESAJ için, alıcı (recipient) telefon formatında olmalıdır.","location":["recipients",1],"value":"test@gmail.com"}]}`},
		{"bad recipient type", "BIREYSELL", "MESAJ", `{"recipients":["+905054566789"]}`, 422,
			`{"errors":[{"code":"H116","message":"Alıcı tipi (recipientType) için uygun değerler: BIREYSEL, TACIR","location":["recipientType"],"value":"BIREYSELL"}]}`},
		{"bad type", "BIREYSEL", "SMS", `{"recipients":["+905054566789"]}`, 422,
			`{"errors":[{"code":"H117","message":"İzin tipi (type) için uygun değerler: ARAMA, MESAJ, EPOSTA","location":["type"],"value":"SMS"}]}`},
		{"not JSON", "BIREYSEL", "MESAJ", `recipients=+905054566789`, 400, `{"errors":[{"code":"H014","message":"Gönderilen istek JSON formatına uygun olmalıdır."}]}`},
		{"over 1000", "BIREYSEL", "MESAJ", string(manyJSON), 422, `{"errors":[{"code":"H127","message":"Alıcı listesi (recipients) uzunluğu en fazla 1000 olmalıdır.","location":["recipients"]}]}`},
	} {
		a := multi(tt.rt, tt.typ, tt.body)
		if a.status != tt.status || strings.TrimSpace(a.body) != tt.want {
			t.Errorf("%s: %d %s\nwant %d %s", tt.name, a.status, a.body, tt.status, tt.want)
		}
	}
	st := e.s.IYSStats()
	if diff := cmp.Diff([]int{6, 2, 1, 0, 0, 0, 4, 2, 1, 1, 0, 1001}, st.MultiStatusBatches); diff != "" {
		t.Errorf("batches (-want +got):\n%s", diff)
	}
	if st.MultiStatusQueries != 3 {
		t.Errorf("stats %+v", st)
	}

	// IYSMultiStatusMax lowers the limit, e.g. to the error table's 100.
	small := newIYSSandbox(t, sandbox.Options{IYSMultiStatusMax: 100})
	stok := small.login(t).Access
	body, _ := json.Marshal(map[string][]string{"recipients": many[:101]})
	if a := small.do(t, "POST", iysBase+"/BIREYSEL/status/MESAJ", stok, "application/json", string(body)); a.status != 422 || a.errs(t)[0]["code"] != "H127" {
		t.Errorf("101 over a max of 100: %d %s", a.status, a.body)
	}
}

func TestIYSChanges(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	now := e.clock.Now()
	// Five citizen changes spread over the last days, one brand change, one too old, one too new.
	var citizen []sandbox.IYSConsent
	for i := range 5 {
		c := e.add(t, sandbox.IYSConsent{Recipient: fmt.Sprintf("+90532100000%d", i), Type: "MESAJ", Status: "RET",
			Source: "IYS_KISAMESAJ", CreationDate: at(now.Add(-time.Duration(50-i) * time.Hour))})
		citizen = append(citizen, c[0])
	}
	brand := e.add(t, sandbox.IYSConsent{Recipient: "musteri@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB",
		CreationDate: at(now.Add(-30 * time.Hour))})
	e.add(t, sandbox.IYSConsent{Recipient: "+905329999998", Type: "MESAJ", Status: "RET", Source: "IYS_WEB", CreationDate: at(now.Add(-8 * 24 * time.Hour))})
	e.add(t, sandbox.IYSConsent{Recipient: "+905329999999", Type: "MESAJ", Status: "RET", Source: "IYS_MOBIL", CreationDate: at(now.Add(-30 * time.Minute))})

	type page struct {
		After string               `json:"after"`
		List  []sandbox.IYSConsent `json:"list"`
	}
	pull := func(query string) (iysAnswer, page) {
		t.Helper()
		a := e.do(t, "GET", iysBase+"/changes"+query, tok, "", "")
		var p page
		if a.status == 200 {
			if err := json.Unmarshal([]byte(a.body), &p); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
		}
		return a, p
	}

	// Source defaults to IYS; paging by two.
	var got []sandbox.IYSConsent
	after := ""
	for n := 0; ; n++ {
		q := "?limit=2"
		if after != "" {
			q += "&after=" + url.QueryEscape(after)
		}
		a, p := pull(q)
		if a.status == 204 {
			if a.body != "" {
				t.Errorf("204 with a body: %q", a.body)
			}
			if n != 3 {
				t.Errorf("204 after %d pages, want 3", n)
			}
			break
		}
		if a.status != 200 || !cursorRE.MatchString(p.After) || len(p.List) == 0 || len(p.List) > 2 {
			t.Fatalf("page %d: %d %s", n, a.status, a.body)
		}
		got = append(got, p.List...)
		after = p.After
		if n > 5 {
			t.Fatal("no end of paging")
		}
	}
	if diff := cmp.Diff(citizen, got); diff != "" {
		t.Errorf("IYS changes (-want +got):\n%s", diff)
	}
	a, p := pull("?source=HS")
	if a.status != 200 || len(p.List) != 1 || p.List[0] != brand[0] {
		t.Errorf("HS changes: %d %s", a.status, a.body)
	}
	// The change made half an hour ago shows once it is an hour old; the 8-day-old one never does.
	e.clock.Advance(31 * time.Minute)
	a, p = pull("?source=IYS&after=" + url.QueryEscape(after))
	if a.status != 200 || len(p.List) != 1 || p.List[0].Recipient != "+905329999999" {
		t.Errorf("after the lag: %d %s", a.status, a.body)
	}

	for _, tt := range []struct {
		query  string
		status int
		want   string
	}{
		{"?source=SH", 422, `{"errors":[{"code":"H506","message":"İzin kaynağı (source) bulunamadı.","location":["source"],"value":"SH"}]}`},
		{"?limit=1500", 422, `{"errors":[{"code":"H507","message":"limit alanı için karakter üst sınırı 1000 olmalıdır.","location":["limit"],"value":"1500"}]}`},
		{"?limit=0", 422, `{"errors":[{"code":"H507","message":"limit alanı için karakter üst sınırı 1000 olmalıdır.","location":["limit"],"value":"0"}]}`},
		{"?after=garbage", 400, `{"errors":[{"code":"H097","message":"İzin sorgulama isteği geçerli olmalıdır."}]}`},
	} {
		if a, _ := pull(tt.query); a.status != tt.status || strings.TrimSpace(a.body) != tt.want {
			t.Errorf("%s: %d %s, want %d %s", tt.query, a.status, a.body, tt.status, tt.want)
		}
	}
	if st := e.s.IYSStats(); st.ChangesQueries != 6 || st.ChangesEmpty != 1 || st.Changes != 8 || st.Consents != 8 {
		t.Errorf("stats %+v", st)
	}
}

func TestIYSChangesPullLag(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{IYSPullLag: -1})
	tok := e.login(t).Access
	e.add(t, sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "RET", Source: "IYS_KISAMESAJ"})
	if a := e.do(t, "GET", iysBase+"/changes", tok, "", ""); a.status != 200 || !strings.Contains(a.body, "IYS_KISAMESAJ") {
		t.Errorf("no lag: %d %s", a.status, a.body)
	}
}

func TestIYSRateLimit(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{IYSRate: 2})
	tok := e.login(t).Access // one of the two tokens of this second
	if a := e.do(t, "GET", iysBase+"/changes", tok, "", ""); a.status != 204 {
		t.Fatalf("first: %d", a.status)
	}
	a := e.do(t, "GET", iysBase+"/changes", tok, "", "")
	want := `{"errors":[{"code":"H124","message":"Saniyede kabul edilen istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz."}]}`
	if a.status != 429 || strings.TrimSpace(a.body) != want || a.header.Get("Retry-After") != "1" {
		t.Errorf("over the rate: %d %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	// ResetIYS empties the buckets.
	if code := postJSON(t, e.srv.URL+"/_sandbox/iys/reset", ""); code != http.StatusNoContent {
		t.Fatal(code)
	}
	if a := e.do(t, "GET", iysBase+"/changes", tok, "", ""); a.status != 204 {
		t.Errorf("after reset: %d %s", a.status, a.body)
	}
}

func TestIYSFaults(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	e.add(t, sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: at(e.clock.Now().Add(-2 * time.Hour))})
	for _, bad := range []string{`{"malformed":-1}`, `{"nonsense":1}`} {
		resp, err := http.Post(e.srv.URL+"/_sandbox/iys/faults", "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("faults %s: %d", bad, resp.StatusCode)
		}
	}
	if code := postJSON(t, e.srv.URL+"/_sandbox/iys/faults", `{"rate_limited":1,"server_error":1,"unavailable":1,"malformed":2}`); code != 200 {
		t.Fatalf("set faults: %d", code)
	}
	var pending sandbox.IYSFaults
	getJSON(t, e.srv.URL+"/_sandbox/iys/faults", &pending)
	if pending != (sandbox.IYSFaults{RateLimited: 1, ServerError: 1, Unavailable: 1, Malformed: 2}) {
		t.Errorf("pending %+v", pending)
	}
	pull := func() iysAnswer { return e.do(t, "GET", iysBase+"/changes?source=HS", tok, "", "") }
	for _, w := range []struct {
		status int
		code   string
	}{{429, "H124"}, {500, "H103"}, {503, "H192"}} {
		a := pull()
		if a.status != w.status || a.errs(t)[0]["code"] != w.code {
			t.Errorf("want %d %s, got %d %s", w.status, w.code, a.status, a.body)
		}
	}
	a := pull()
	if a.status != 200 || json.Valid([]byte(a.body)) || !strings.HasPrefix(a.body, `{"after":"`) {
		t.Errorf("malformed page: %d %q", a.status, a.body)
	}
	// A malformed answer in place of a 204 is a broken page too.
	a = e.do(t, "GET", iysBase+"/changes?source=IYS", tok, "", "")
	if a.status != 200 || json.Valid([]byte(a.body)) {
		t.Errorf("malformed in place of 204: %d %q", a.status, a.body)
	}
	if a := pull(); a.status != 200 || !json.Valid([]byte(a.body)) {
		t.Errorf("faults used up: %d %s", a.status, a.body)
	}
	// The token endpoint is spared.
	e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	e.login(t)
	if a := pull(); json.Valid([]byte(a.body)) {
		t.Errorf("the fault went to the token endpoint")
	}
}

func TestIYSControlConsents(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	post := func(body string) (int, string) {
		resp, err := http.Post(e.srv.URL+"/_sandbox/iys/consents", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	code, body := post(`{"recipient":"05321234567","type":"MESAJ","status":"RET","source":"IYS_KISAMESAJ"}`)
	if code != 400 || !strings.Contains(body, "H121") {
		t.Errorf("İYS spelling enforced: %d %s", code, body)
	}
	code, body = post(`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_KISAMESAJ"}`)
	var got sandbox.IYSConsent
	if err := json.Unmarshal([]byte(body), &got); code != 201 || err != nil {
		t.Fatalf("post: %d %s", code, body)
	}
	want := sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET",
		Source: "IYS_KISAMESAJ", ConsentDate: "2026-03-10 12:00:00", CreationDate: "2026-03-10 12:00:00", TransactionID: got.TransactionID}
	if diff := cmp.Diff(want, got); diff != "" || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(got.TransactionID) {
		t.Errorf("recorded (-want +got):\n%s", diff)
	}
	for _, bad := range []string{
		`{"recipient":"+905321234567","type":"MESAJ","status":"RED","source":"IYS_KISAMESAJ"}`,
		`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"HS_UYDURMA"}`,
		`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"WEB"}`,
		`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_WEB","creationDate":"2026-03-11 00:00:00"}`,
		`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_WEB","creationDate":"10.03.2026"}`,
		`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_WEB","transactionId":"abc"}`,
		`{"recipient":"+905321234567","type":"SMS","status":"RET","source":"IYS_WEB"}`,
		`{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_WEB","extra":1}`,
		// All or nothing: the first is valid, the second is not.
		`[{"recipient":"+905321234568","type":"MESAJ","status":"ONAY","source":"HS_WEB"},{"recipient":"x","type":"EPOSTA","status":"ONAY","source":"HS_WEB"}]`,
	} {
		if code, body := post(bad); code != 400 || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s", bad, code, body)
		}
	}
	code, body = post(`[{"recipient":"+905321234568","type":"MESAJ","status":"ONAY","source":"HS_WEB","consentDate":"2026-03-09 09:00:00","creationDate":"2026-03-09 09:00:05"},
		{"recipient":"Bayi@Example.com","type":"EPOSTA","recipientType":"TACIR","status":"ONAY","source":"IYS_AHS_HAT_KAPATMA"}]`)
	var two []sandbox.IYSConsent
	if err := json.Unmarshal([]byte(body), &two); code != 201 || err != nil || len(two) != 2 {
		t.Fatalf("array: %d %s", code, body)
	}
	if two[0].ConsentDate != "2026-03-09 09:00:00" || two[0].CreationDate != "2026-03-09 09:00:05" || two[1].ConsentDate != "" || two[1].Recipient != "bayi@example.com" {
		t.Errorf("array recorded %+v", two)
	}
	var all []sandbox.IYSConsent
	getJSON(t, e.srv.URL+"/_sandbox/iys/consents", &all)
	if len(all) != 3 || all[0].Recipient != "+905321234567" || all[2].Recipient != "bayi@example.com" {
		t.Errorf("consents %+v", all)
	}
	// A later change replaces the current consent; a backdated one does not.
	e.add(t, sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: "2026-03-01 00:00:00"})
	if c := e.s.IYSConsents()[0]; c.Status != "RET" {
		t.Errorf("a backdated change replaced a later one: %+v", c)
	}
	var st sandbox.IYSStats
	getJSON(t, e.srv.URL+"/_sandbox/iys/stats", &st)
	if st.Consents != 3 || st.Changes != 4 || st.Requests != 0 {
		t.Errorf("stats %+v", st)
	}
	e.s.ResetIYS()
	if st := e.s.IYSStats(); st.Consents != 0 || st.Changes != 0 || len(e.s.IYSConsents()) != 0 {
		t.Errorf("after reset %+v", st)
	}
}

// The debug log masks recipients and never shows the password, a token or a cursor.
func TestIYSLogHidesSecrets(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newIYSSandbox(t, sandbox.Options{Logger: logger, IYSPullLag: -1})
	tk := e.login(t)
	e.postToken(t, url.Values{"grant_type": {"password"}, "username": {iysUser}, "password": {iysPassword + "x"}})
	e.postToken(t, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tk.Refresh}})
	rec := e.add(t, sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "RET", Source: "IYS_KISAMESAJ"},
		sandbox.IYSConsent{Recipient: "ayse@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB"})
	e.do(t, "POST", iysBase+"/status", tk.Access, "application/json", `{"recipient":"+905321234567","recipientType":"BIREYSEL","type":"MESAJ"}`)
	e.do(t, "POST", iysBase+"/status", tk.Access, "application/json", `{"recipient":"+9005321234567","recipientType":"BIREYSEL","type":"MESAJ"}`)
	a := e.do(t, "GET", iysBase+"/changes", tk.Access, "", "")
	var p struct {
		After string `json:"after"`
	}
	_ = json.Unmarshal([]byte(a.body), &p)
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, secret := range []string{iysPassword, tk.Access, tk.Refresh, "+905321234567", "+9005321234567", "ayse@example.com", rec[0].TransactionID, p.After} {
		if secret != "" && strings.Contains(out, secret) {
			t.Errorf("log shows %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "sandbox iys request") || !strings.Contains(out, "+905*****4567") || !strings.Contains(out, "a***@example.com") {
		t.Errorf("log lacks the masked records:\n%s", out)
	}
}
