package sandbox_test

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const fcmProject = "campaignctl-demo"

// fcmEnv is a sandbox with a service account written for it.
type fcmEnv struct {
	s     *sandbox.Server
	srv   *httptest.Server
	email string
	key   *rsa.PrivateKey
}

func newFCMSandbox(t *testing.T, opts sandbox.Options) *fcmEnv {
	t.Helper()
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "sa.json")
	if err := sandbox.WriteServiceAccount(path, srv.URL, fcmProject); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("service account file mode %v, want 0600", fi.Mode())
	}
	var sa map[string]string
	if err := json.Unmarshal(data, &sa); err != nil {
		t.Fatal(err)
	}
	if sa["type"] != "service_account" || sa["project_id"] != fcmProject || sa["token_uri"] != srv.URL+"/token" || sa["private_key_id"] == "" {
		t.Errorf("service account %v", sa)
	}
	block, _ := pem.Decode([]byte(sa["private_key"]))
	if block == nil {
		t.Fatal("private_key is not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return &fcmEnv{s: s, srv: srv, email: sa["client_email"], key: k.(*rsa.PrivateKey)}
}

func b64(v any) string {
	data, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(data)
}

// assertion builds an RS256 JWT as golang.org/x/oauth2/jwt does.
func assertion(key *rsa.PrivateKey, header, claims map[string]any) string {
	signing := b64(header) + "." + b64(claims)
	h := sha256.Sum256([]byte(signing))
	sig, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, h[:])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func (e *fcmEnv) claims() map[string]any {
	now := time.Now().Add(-10 * time.Second).Unix()
	return map[string]any{
		"iss": e.email, "scope": "https://www.googleapis.com/auth/firebase.messaging",
		"aud": e.srv.URL + "/token", "iat": now, "exp": now + 3600,
	}
}

var rs256 = map[string]any{"alg": "RS256", "typ": "JWT"}

type tokenAnswer struct {
	status int
	body   map[string]any
}

func (e *fcmEnv) postToken(t *testing.T, form url.Values) tokenAnswer {
	t.Helper()
	resp, err := http.PostForm(e.srv.URL+"/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("token answer is not JSON: %v", err)
	}
	return tokenAnswer{resp.StatusCode, body}
}

func grant(a string) url.Values {
	return url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:jwt-bearer"}, "assertion": {a}}
}

// token gets an access token for e's service account.
func (e *fcmEnv) token(t *testing.T) string {
	t.Helper()
	a := e.postToken(t, grant(assertion(e.key, rs256, e.claims())))
	tok, _ := a.body["access_token"].(string)
	if a.status != http.StatusOK || tok == "" {
		t.Fatalf("token: %d %v", a.status, a.body)
	}
	return tok
}

type fcmAnswer struct {
	status     int
	retryAfter string
	name       string
	code       int
	google     string
	errorCode  string
	message    string
}

func (e *fcmEnv) send(t *testing.T, path, token, body string) fcmAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Name  string `json:"name"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
			Details []struct {
				Type      string `json:"@type"`
				ErrorCode string `json:"errorCode"`
			} `json:"details"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("answer %d is not JSON: %v", resp.StatusCode, err)
	}
	a := fcmAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), name: v.Name,
		code: v.Error.Code, google: v.Error.Status, message: v.Error.Message}
	for _, d := range v.Error.Details {
		if d.Type == "type.googleapis.com/google.firebase.fcm.v1.FcmError" {
			a.errorCode = d.ErrorCode
		}
	}
	return a
}

const sendPath = "/v1/projects/" + fcmProject + "/messages:send"

func TestFCMTokenEndpoint(t *testing.T) {
	e := newFCMSandbox(t, sandbox.Options{})
	a := e.postToken(t, grant(assertion(e.key, rs256, e.claims())))
	if a.status != http.StatusOK || a.body["token_type"] != "Bearer" || a.body["expires_in"] != float64(3600) || a.body["access_token"] == "" {
		t.Errorf("token answer %d %v", a.status, a.body)
	}

	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	with := func(edit func(map[string]any)) map[string]any {
		c := e.claims()
		edit(c)
		return c
	}
	valid := assertion(e.key, rs256, e.claims())
	parts := strings.Split(valid, ".")
	refusals := []struct {
		name  string
		form  url.Values
		error string
	}{
		{"wrong grant type", url.Values{"grant_type": {"client_credentials"}, "assertion": {valid}}, "unsupported_grant_type"},
		{"no assertion", grant(""), "invalid_grant"},
		{"two parts", grant(parts[0] + "." + parts[1]), "invalid_grant"},
		{"header not base64", grant("!!." + parts[1] + "." + parts[2]), "invalid_grant"},
		{"claims not json", grant(parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte("nope")) + "." + parts[2]), "invalid_grant"},
		{"HS256", grant(assertion(e.key, map[string]any{"alg": "HS256", "typ": "JWT"}, e.claims())), "invalid_grant"},
		{"no signature", grant(parts[0] + "." + parts[1] + "."), "invalid_grant"},
		{"signed with another key", grant(assertion(other, rs256, e.claims())), "invalid_grant"},
		{"claims changed after signing", grant(parts[0] + "." + b64(with(func(c map[string]any) { c["scope"] = "x" })) + "." + parts[2]), "invalid_grant"},
		{"no iss", grant(assertion(e.key, rs256, with(func(c map[string]any) { delete(c, "iss") }))), "invalid_grant"},
		{"wrong aud", grant(assertion(e.key, rs256, with(func(c map[string]any) { c["aud"] = e.srv.URL + "/elsewhere" }))), "invalid_grant"},
		{"expired", grant(assertion(e.key, rs256, with(func(c map[string]any) {
			c["iat"], c["exp"] = time.Now().Add(-2*time.Hour).Unix(), time.Now().Add(-time.Hour).Unix()
		}))), "invalid_grant"},
		{"longer than an hour", grant(assertion(e.key, rs256, with(func(c map[string]any) { c["exp"] = c["iat"].(int64) + 7200 }))), "invalid_grant"},
		{"issued in the future", grant(assertion(e.key, rs256, with(func(c map[string]any) {
			c["iat"], c["exp"] = time.Now().Add(time.Hour).Unix(), time.Now().Add(2*time.Hour).Unix()
		}))), "invalid_grant"},
		{"no scope", grant(assertion(e.key, rs256, with(func(c map[string]any) { delete(c, "scope") }))), "invalid_scope"},
		{"other scope", grant(assertion(e.key, rs256, with(func(c map[string]any) { c["scope"] = "https://www.googleapis.com/auth/drive" }))), "invalid_scope"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			a := e.postToken(t, tt.form)
			if a.status != http.StatusBadRequest || a.body["error"] != tt.error || a.body["access_token"] != nil {
				t.Errorf("answer %d %v, want 400 %s", a.status, a.body, tt.error)
			}
		})
	}

	// The sandbox does not know the key of an issuer it did not write: it checks the shape only.
	unknown := e.claims()
	unknown["iss"] = "someone@elsewhere.iam.gserviceaccount.com"
	if a := e.postToken(t, grant(assertion(other, rs256, unknown))); a.status != http.StatusOK {
		t.Errorf("unknown issuer: %d %v, want a token", a.status, a.body)
	}

	want := sandbox.FCMStats{TokenRequests: 2 + len(refusals), TokensIssued: 2, TokensRefused: len(refusals)}
	if diff := cmp.Diff(want, e.s.FCMStats()); diff != "" {
		t.Errorf("FCM stats (-want +got):\n%s", diff)
	}
}

func TestFCMSendAuthentication(t *testing.T) {
	e := newFCMSandbox(t, sandbox.Options{})
	body := `{"message":{"token":"device-1","notification":{"title":"t","body":"b"}}}`
	for name, tok := range map[string]string{"no token": "", "made-up token": "ya29.made-up"} {
		a := e.send(t, sendPath, tok, body)
		if a.status != 401 || a.google != "UNAUTHENTICATED" || a.code != 401 || a.errorCode != "" {
			t.Errorf("%s: %+v, want 401 UNAUTHENTICATED without an FcmError", name, a)
		}
	}
	tok := e.token(t)
	a := e.send(t, sendPath, tok, body)
	if a.status != 200 || !strings.HasPrefix(a.name, "projects/"+fcmProject+"/messages/0:") {
		t.Fatalf("send: %+v", a)
	}
	e.s.RevokeFCMTokens()
	if a := e.send(t, sendPath, tok, body); a.status != 401 {
		t.Errorf("revoked token: %+v", a)
	}
	if st := e.s.FCMStats(); st.Unauthenticated != 3 {
		t.Errorf("%d unauthenticated, want 3", st.Unauthenticated)
	}
	msgs := e.s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("recorded %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if a.name != "projects/"+fcmProject+"/messages/"+m.SID || m.Provider != "fcm" || m.To != "device-1" || m.Subject != "t" || m.Body != "b" || m.AccountSID != fcmProject {
		t.Errorf("recorded %+v", m)
	}
}

func TestFCMSendValidation(t *testing.T) {
	e := newFCMSandbox(t, sandbox.Options{})
	tok := e.token(t)
	big := strings.Repeat("x", 4000)
	refused := map[string]string{
		"not json":            `{"message":`,
		"unknown field":       `{"message":{"token":"d","colour":"red"}}`,
		"no message":          `{}`,
		"no target":           `{"message":{"notification":{"title":"t"}}}`,
		"token and topic":     `{"message":{"token":"d","topic":"news"}}`,
		"data number":         `{"message":{"token":"d","data":{"n":1}}}`,
		"reserved data key":   `{"message":{"token":"d","data":{"gcm.notification":"x"}}}`,
		"from data key":       `{"message":{"token":"d","data":{"from":"x"}}}`,
		"too big":             `{"message":{"token":"d","notification":{"body":"` + big + `"},"data":{"k":"` + big[:100] + `"}}}`,
		"topic too big":       `{"message":{"topic":"news","notification":{"body":"` + big[:2100] + `"}}}`,
		"bad topic":           `{"message":{"topic":"news and weather"}}`,
		"token with a space":  `{"message":{"token":"a b"}}`,
		"magic invalid token": `{"message":{"token":"invalid-1"}}`,
	}
	for name, body := range refused {
		t.Run(name, func(t *testing.T) {
			a := e.send(t, sendPath, tok, body)
			if a.status != 400 || a.google != "INVALID_ARGUMENT" || a.errorCode != "INVALID_ARGUMENT" || a.message == "" {
				t.Errorf("%+v, want 400 INVALID_ARGUMENT with the FcmError detail", a)
			}
		})
	}
	if n := len(e.s.Messages()); n != 0 {
		t.Errorf("recorded %d refused messages", n)
	}

	accepted := []struct {
		path, body, to string
	}{
		{sendPath, `{"message":{"topic":"news","data":{"k":"v"}}}`, "/topics/news"},
		{sendPath, `{"message":{"condition":"'a' in topics","notification":{"title":"t"}}}`, "'a' in topics"},
		{sendPath, `{"message":{"token":"d","notification":{"body":"` + big + `"}}}`, "d"},
		{"/projects/" + fcmProject + "/messages:send", `{"message":{"token":"no-v1"}}`, "no-v1"},
	}
	for _, tt := range accepted {
		if a := e.send(t, tt.path, tok, tt.body); a.status != 200 || a.name == "" {
			t.Errorf("%s %s: %+v", tt.path, tt.body, a)
		}
	}
	// validate_only is answered like a send and not recorded.
	if a := e.send(t, sendPath, tok, `{"validate_only":true,"message":{"token":"dry"}}`); a.status != 200 || !strings.HasSuffix(a.name, "/fake_message_id") {
		t.Errorf("validate_only: %+v", a)
	}
	var got []string
	for _, m := range e.s.Messages() {
		got = append(got, m.To)
	}
	if diff := cmp.Diff([]string{"/topics/news", "'a' in topics", "d", "no-v1"}, got); diff != "" {
		t.Errorf("recorded (-want +got):\n%s", diff)
	}
}

func TestFCMMagicTokens(t *testing.T) {
	e := newFCMSandbox(t, sandbox.Options{})
	tok := e.token(t)
	tests := []struct {
		prefix     string
		status     int
		google     string
		errorCode  string
		retryAfter string
	}{
		{"unregistered-", 404, "NOT_FOUND", "UNREGISTERED", ""},
		{"invalid-", 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", ""},
		{"mismatch-", 403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", ""},
		{"thirdparty-", 401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", ""},
		{"quota-", 429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "1"},
		{"unavailable-", 503, "UNAVAILABLE", "UNAVAILABLE", "1"},
		{"internal-", 500, "INTERNAL", "INTERNAL", ""},
	}
	for _, tt := range tests {
		a := e.send(t, sendPath, tok, `{"message":{"token":"`+tt.prefix+`abc"}}`)
		want := fcmAnswer{status: tt.status, retryAfter: tt.retryAfter, code: tt.status, google: tt.google, errorCode: tt.errorCode}
		a.message = ""
		if diff := cmp.Diff(want, a, cmp.AllowUnexported(fcmAnswer{})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.prefix, diff)
		}
	}
	st := e.s.Stats()
	if st.Accepted != 0 || st.Rejected != len(tests) || st.Requests != len(tests) {
		t.Errorf("stats %+v", st)
	}
}

func TestFCMFaults(t *testing.T) {
	tests := []struct {
		faults    sandbox.Faults
		status    int
		errorCode string
		retry     string
	}{
		{sandbox.Faults{Rate429: 1}, 429, "QUOTA_EXCEEDED", "1"},
		{sandbox.Faults{Rate500: 1}, 500, "INTERNAL", ""},
		{sandbox.Faults{Rate503: 1}, 503, "UNAVAILABLE", "1"},
	}
	for _, tt := range tests {
		e := newFCMSandbox(t, sandbox.Options{Faults: tt.faults})
		// The token endpoint sees no faults.
		tok := e.token(t)
		a := e.send(t, sendPath, tok, `{"message":{"token":"d"}}`)
		if a.status != tt.status || a.errorCode != tt.errorCode || a.retryAfter != tt.retry {
			t.Errorf("%+v: %+v", tt.faults, a)
		}
	}
}

func TestFCMRateLimit(t *testing.T) {
	e := newFCMSandbox(t, sandbox.Options{FCMRate: 1})
	tok := e.token(t)
	body := `{"message":{"token":"d"}}`
	if a := e.send(t, sendPath, tok, body); a.status != 200 {
		t.Fatalf("first send: %+v", a)
	}
	a := e.send(t, sendPath, tok, body)
	if a.status != 429 || a.errorCode != "QUOTA_EXCEEDED" || a.retryAfter != "1" {
		t.Errorf("second send within the second: %+v", a)
	}
	// Each project has its own bucket.
	if a := e.send(t, "/v1/projects/other-project/messages:send", tok, body); a.status != 200 {
		t.Errorf("other project: %+v", a)
	}
	// ResetFCM empties the buckets.
	if code := postJSON(t, e.srv.URL+"/_sandbox/fcm/reset", ""); code != http.StatusNoContent {
		t.Fatalf("reset: %d", code)
	}
	if a := e.send(t, sendPath, tok, body); a.status != 200 {
		t.Errorf("after reset: %+v", a)
	}
}

func TestFCMControlRoutes(t *testing.T) {
	e := newFCMSandbox(t, sandbox.Options{})
	tok := e.token(t)
	var st sandbox.FCMStats
	getJSON(t, e.srv.URL+"/_sandbox/fcm/stats", &st)
	if diff := cmp.Diff(sandbox.FCMStats{TokenRequests: 1, TokensIssued: 1}, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if code := postJSON(t, e.srv.URL+"/_sandbox/fcm/revoke", ""); code != http.StatusNoContent {
		t.Fatalf("revoke: %d", code)
	}
	if a := e.send(t, sendPath, tok, `{"message":{"token":"d"}}`); a.status != 401 {
		t.Errorf("after revoke: %+v", a)
	}
	if code := postJSON(t, e.srv.URL+"/_sandbox/fcm/reset", ""); code != http.StatusNoContent {
		t.Fatalf("reset: %d", code)
	}
	getJSON(t, e.srv.URL+"/_sandbox/fcm/stats", &st)
	if st != (sandbox.FCMStats{}) {
		t.Errorf("stats after reset: %+v", st)
	}
}

// The debug log masks device tokens and never shows an access token or an assertion.
func TestFCMLogHidesSecrets(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newFCMSandbox(t, sandbox.Options{Logger: logger})
	a := assertion(e.key, rs256, e.claims())
	resp := e.postToken(t, grant(a))
	tok := resp.body["access_token"].(string)
	device := "dKx3s1Q9RZ2:APA91bHv7sandboxDeviceToken0000000001"
	for _, d := range []string{device, "unregistered-" + device} {
		e.send(t, sendPath, tok, fmt.Sprintf(`{"message":{"token":%q}}`, d))
	}
	e.postToken(t, grant(a[:len(a)-10]))
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, secret := range []string{device, tok, a, strings.Split(a, ".")[2]} {
		if strings.Contains(out, secret) {
			t.Errorf("log shows a secret:\n%s", out)
		}
	}
	if !strings.Contains(out, "sandbox fcm request") || !strings.Contains(out, "dKx3") {
		t.Errorf("log lacks the masked request records:\n%s", out)
	}
}
