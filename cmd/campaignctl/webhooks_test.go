package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/providers/receipts"

	"github.com/campaignctl/campaignctl/internal/testlog"
)

const hooksToken = "tw-T0ken-s3cret"

var hooksURLRe = regexp.MustCompile(`listening on http://(\S+?);`)

// hooksKey is SendGrid's side of the signed Event Webhook.
type hooksKey struct {
	key    *ecdsa.PrivateKey
	public string
}

func newHooksKey(t *testing.T) hooksKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return hooksKey{key: key, public: base64.StdEncoding.EncodeToString(der)}
}

// headers are the signature headers of body, signed now.
func (k hooksKey) headers(t *testing.T, body []byte) map[string]string {
	t.Helper()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	h := sha256.Sum256(append([]byte(ts), body...))
	sig, err := ecdsa.SignASN1(rand.Reader, k.key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"X-Twilio-Email-Event-Webhook-Signature": base64.StdEncoding.EncodeToString(sig),
		"X-Twilio-Email-Event-Webhook-Timestamp": ts,
		"Content-Type":                           "application/json",
	}
}

// twilioSig is X-Twilio-Signature for a POST of form to fullURL.
func twilioSig(token, fullURL string, form url.Values) string {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range form {
			if !yield(k) {
				return
			}
		}
	})
	s := fullURL
	for _, k := range keys {
		s += k + form.Get(k)
	}
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(s))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func hooksCallback(sid string) url.Values {
	return url.Values{"MessageSid": {sid}, "MessageStatus": {"delivered"}, "AccountSid": {"ACtest"}, "To": {"+905551234567"}, "ApiVersion": {"2010-04-01"}}
}

// hooksPost sends one request and returns its status.
func hooksPost(t *testing.T, target string, body io.Reader, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", target, err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp.StatusCode
}

// hooksEnv is a fresh database and both providers' keys.
func hooksEnv(t *testing.T) (map[string]string, hooksKey, func() int64) {
	t.Helper()
	db, dbURL := testdb.New(t)
	key := newHooksKey(t)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "SENDGRID_WEBHOOK_PUBLIC_KEY": key.public}
	return env, key, func() int64 { return countRows(t, db, `SELECT count(*) FROM receipt_events`) }
}

func countRows(t *testing.T, db *pgxpool.Pool, sql string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Flags and settings that could echo a credential are refused (exit 2) without it, naming the problem
// and the fix, before anything is served or connected to.
func TestWebhooksFlagsAreValidatedWithoutEchoingCredentials(t *testing.T) {
	t.Parallel()
	const secret, dbSecret = "pU8l1c-S3cret", "db-Pa55w0rd"
	dir := t.TempDir()
	worldReadable := filepath.Join(dir, "auth")
	if err := os.WriteFile(worldReadable, []byte("ops:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(worldReadable, 0o644); err != nil {
		t.Fatal(err)
	}
	// Postgres is not reachable: a refusal must come before the connection (a missed one exits 1).
	base := map[string]string{"DATABASE_URL": "postgres://app:" + dbSecret + "@127.0.0.1:1/campaignctl?sslmode=disable", "TWILIO_AUTH_TOKEN": hooksToken}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		says []string
	}{
		{"public URL with user and password", base, []string{"--public-url", "https://ops:" + secret + "@hooks.example.com"}, []string{"--public-url", "user name or password", "https://hooks.example.com", "ops:xxxxx@hooks.example.com"}},
		{"public URL with a token as user", base, []string{"--public-url", "https://" + secret + "@hooks.example.com"}, []string{"--public-url", "user name or password", "xxxxx@hooks.example.com"}},
		{"public URL that does not parse", base, []string{"--public-url", "https://ops:" + secret + "@hooks.example.com:port/"}, []string{"--public-url", "not a valid URL", "https://hooks.example.com"}},
		{"public URL, bad escape", base, []string{"--public-url", "https://ops:" + secret + "%zz@hooks.example.com"}, []string{"--public-url", "not a valid URL"}},
		{"public URL of another scheme", base, []string{"--public-url", "ftp://ops:" + secret + "@hooks.example.com"}, []string{"--public-url", "scheme://host"}},
		{"public URL without a host", base, []string{"--public-url", "https://ops:" + secret + "@"}, []string{"--public-url", "scheme://host"}},
		{"public URL without a scheme", base, []string{"--public-url", "ops:" + secret + "@hooks.example.com"}, []string{"--public-url", "scheme://host"}},
		{"public URL with a query", base, []string{"--public-url", "https://hooks.example.com/?token=" + secret}, []string{"--public-url", "query", "/twilio/status"}},
		{"address given as a URL", base, []string{"--addr", "https://ops:" + secret + "@0.0.0.0:8090"}, []string{"--addr", "host:port", "0.0.0.0:8090"}},
		{"address with credentials", base, []string{"--addr", "ops:" + secret + "@0.0.0.0:8090"}, []string{"--addr", "host:port"}},
		{"address without a port", base, []string{"--addr", "127.0.0.1"}, []string{"--addr", "host:port"}},
		{"malformed UI credentials", with(uiAuthEnv, secret), nil, []string{uiAuthEnv, "user:password"}},
		{"world-readable credentials file", base, []string{"--basic-auth-file", worldReadable}, []string{"other users", "chmod 600 " + worldReadable}},
		{"no provider key", map[string]string{"DATABASE_URL": base["DATABASE_URL"]}, nil, []string{"TWILIO_AUTH_TOKEN", "SENDGRID_WEBHOOK_PUBLIC_KEY"}},
		{"SendGrid key not a key", with("SENDGRID_WEBHOOK_PUBLIC_KEY", "not-a-key"), nil, []string{"SENDGRID_WEBHOOK_PUBLIC_KEY", "base64"}},
		{"database URL that does not parse", with("DATABASE_URL", "postgres://app:"+dbSecret+"@127.0.0.1:port/x"), nil, []string{"DATABASE_URL", "postgres://"}},
		{"database URL flag that does not parse", base, []string{"--database-url", "postgres://app:" + dbSecret + "@127.0.0.1:port/x"}, []string{"--database-url", "postgres://"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := cli(t, tt.env, append([]string{"webhooks"}, tt.args...)...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			for _, s := range tt.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr)
				}
			}
			for _, s := range []string{secret, dbSecret, hooksToken} {
				if strings.Contains(stdout+stderr, s) {
					t.Errorf("the output holds a credential (%s):\n%s", s, stderr)
				}
			}
		})
	}

	// Valid flags, Postgres down: exit 1 naming the address, never the password.
	_, stderr, code := cli(t, base, "webhooks", "--addr", "127.0.0.1:0", "--public-url", "https://hooks.example.com/campaignctl/")
	if code != 1 || !strings.Contains(stderr, "Postgres is not reachable at 127.0.0.1:1") || strings.Contains(stderr, dbSecret) {
		t.Errorf("Postgres down: exit %d, stderr %q; want 1 naming the address and no password", code, stderr)
	}

	// --help: the limits and /stats access, and no credential from the environment.
	stdout, stderr, code := cli(t, with(uiAuthEnv, "ops:"+secret), "webhooks", "--help")
	for _, s := range []string{"--public-url", "--basic-auth-file", uiAuthEnv, "/stats", "/healthz", "413", byteSize(receipts.MaxSendGridBody), byteSize(receipts.MaxTwilioBody)} {
		if !strings.Contains(stdout, s) {
			t.Errorf("webhooks --help does not mention %q:\n%s", s, stdout)
		}
	}
	if code != 0 || strings.Contains(stdout+stderr, secret) || strings.Contains(stdout+stderr, hooksToken) || strings.Contains(stdout+stderr, dbSecret) {
		t.Errorf("webhooks --help: exit %d, or it shows a credential:\n%s", code, stdout)
	}
}

// Over-large bodies are refused (413), unsigned and forged ones too (403), and none is recorded; a
// SendGrid batch of a real size is taken.
func TestWebhooksBodyLimits(t *testing.T) {
	t.Parallel()
	env, key, recorded := hooksEnv(t)
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	events, twilio := hooks.base+sendgridReceiptPath, hooks.base+twilioReceiptPath

	// Bounded: 3 MiB is more than a SendGrid batch ever is, 20 KiB more than a Twilio callback.
	overLimit := bytes.Repeat([]byte(" "), 3<<20)
	bigForm := hooksCallback("SM0big")
	bigForm.Set("Body", strings.Repeat("x", 20<<10))
	forged := newHooksKey(t)
	junk := []byte(`[{"event":"delivered","sg_event_id":"forged","sg_message_id":"m.x"}]`)
	form := hooksCallback("SM0forged")
	for _, tt := range []struct {
		name   string
		target string
		body   io.Reader
		hdr    map[string]string
		want   int
	}{
		{"SendGrid Content-Length over the limit", events, bytes.NewReader(overLimit), key.headers(t, overLimit), http.StatusRequestEntityTooLarge},
		{"SendGrid chunked over the limit", events, io.MultiReader(bytes.NewReader(overLimit), strings.NewReader("]")), key.headers(t, overLimit), http.StatusRequestEntityTooLarge},
		{"Twilio form over the limit", twilio, strings.NewReader(bigForm.Encode()),
			map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig(hooksToken, twilio, bigForm)}, http.StatusRequestEntityTooLarge},
		{"SendGrid unsigned", events, bytes.NewReader(junk), map[string]string{"Content-Type": "application/json"}, http.StatusForbidden},
		{"SendGrid signed with another key", events, bytes.NewReader(junk), forged.headers(t, junk), http.StatusForbidden},
		{"Twilio unsigned", twilio, strings.NewReader(form.Encode()), map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusForbidden},
		{"Twilio signed with another token", twilio, strings.NewReader(form.Encode()),
			map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig("other-token", twilio, form)}, http.StatusForbidden},
	} {
		if code := hooksPost(t, tt.target, tt.body, tt.hdr); code != tt.want {
			t.Errorf("%s: status %d, want %d", tt.name, code, tt.want)
		}
	}
	if n := recorded(); n != 0 {
		t.Fatalf("%d receipts recorded from refused requests", n)
	}

	// A batch as large as SendGrid posts (it flushes at about 768 KB), and then some: taken whole.
	var batch bytes.Buffer
	batch.WriteByte('[')
	n := 0
	for ; batch.Len() < 1<<20; n++ {
		if n > 0 {
			batch.WriteByte(',')
		}
		fmt.Fprintf(&batch, `{"email":"user%d@example.com","timestamp":%d,"smtp-id":"<m%d@ismtpd0001p1lon1.sendgrid.net>","event":"delivered","category":["campaign"],"sg_event_id":"ZGVsaXZlcmVkLTAtMjcwNTk0NjctbHUzVnRpd0xRUVN5bGJmbkJZa3pWUS0w-%d","sg_message_id":"lu3VtiwLQQSylbfnBYkzVQ-%d.filterdrecv-5645d9c87f-zrgts-1-650A1F6C-4A.0","response":"250 2.0.0 OK  1695162222 k8-20020a05600c0b4800b00401c1b1b7b3si2931263wmr.321 - gsmtp","ip":"149.72.123.24","tls":1,"campaign_id":"1","user_id":"u%d"}`,
			n, time.Now().Unix(), n, n, n, n)
	}
	batch.WriteByte(']')
	if code := hooksPost(t, events, bytes.NewReader(batch.Bytes()), key.headers(t, batch.Bytes())); code != http.StatusNoContent {
		t.Fatalf("a signed batch of %d events (%d bytes): status %d, want 204", n, batch.Len(), code)
	}
	// None names a planned recipient (no campaign here): each is taken and matched, and counted as
	// naming nobody.
	resp, err := http.Get(hooks.base + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var stats map[string]receipts.Stats
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	if got := stats["sendgrid"].Receipts + stats["sendgrid"].Unmatched; got != int64(n) {
		t.Errorf("%d receipts taken from a batch of %d (stats %+v)", got, n, stats["sendgrid"])
	}
}

// rawConn is a client that writes a request by hand.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// trickle writes s one byte every gap until it is written or stop is closed.
func trickle(c net.Conn, s string, gap time.Duration, stop <-chan struct{}) {
	for i := range len(s) {
		select {
		case <-stop:
			return
		case <-time.After(gap):
		}
		if _, err := c.Write([]byte{s[i]}); err != nil {
			return
		}
	}
}

// cutOff waits up to limit for the server to answer or close c, and returns how long that took from
// start, with the answer's status (0: closed without one).
func cutOff(t *testing.T, c net.Conn, start time.Time, limit time.Duration) (time.Duration, int) {
	t.Helper()
	c.SetReadDeadline(start.Add(limit)) //nolint:errcheck
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	took := time.Since(start)
	if err == nil {
		resp.Body.Close()
		return took, resp.StatusCode
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection was still open after %s", limit)
	}
	return took, 0
}

// Slow clients are cut off within seconds: headers trickled, a body trickled, a connection that says
// nothing; over-large headers are refused.
func TestWebhooksCutOffSlowClients(t *testing.T) {
	t.Parallel()
	env, _, recorded := hooksEnv(t)
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	addr := strings.TrimPrefix(hooks.base, "http://")
	form := hooksCallback("SM0slow").Encode()

	var mu sync.Mutex
	report := map[string]time.Duration{}
	t.Run("cases", func(t *testing.T) {
		t.Run("headers trickled", func(t *testing.T) {
			t.Parallel()
			c := rawConn(t, addr)
			start := time.Now()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\n", twilioReceiptPath, addr)
			stop := make(chan struct{})
			defer close(stop)
			go trickle(c, "X-Twilio-Signature: "+strings.Repeat("a", 200)+"\r\n", 200*time.Millisecond, stop)
			took, _ := cutOff(t, c, start, 8*time.Second)
			if took > webhooksReadHeaderTimeout+2*time.Second {
				t.Errorf("cut off after %s, want within the %s header timeout", took, webhooksReadHeaderTimeout)
			}
			mu.Lock()
			report["headers trickled"] = took
			mu.Unlock()
		})
		t.Run("silent connection", func(t *testing.T) {
			t.Parallel()
			c := rawConn(t, addr)
			took, _ := cutOff(t, c, time.Now(), 8*time.Second)
			if took > webhooksReadHeaderTimeout+2*time.Second {
				t.Errorf("closed after %s, want within the %s header timeout", took, webhooksReadHeaderTimeout)
			}
			mu.Lock()
			report["silent connection"] = took
			mu.Unlock()
		})
		t.Run("body trickled", func(t *testing.T) {
			t.Parallel()
			c := rawConn(t, addr)
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nX-Twilio-Signature: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n",
				twilioReceiptPath, addr, twilioSig(hooksToken, hooks.base+twilioReceiptPath, hooksCallback("SM0slow")), len(form))
			start := time.Now()
			stop := make(chan struct{})
			defer close(stop)
			go trickle(c, form, 200*time.Millisecond, stop)
			took, code := cutOff(t, c, start, 8*time.Second)
			if code != http.StatusRequestTimeout || took > 4*time.Second {
				t.Errorf("answered %d after %s, want 408 within about 2s", code, took)
			}
			mu.Lock()
			report["body trickled"] = took
			mu.Unlock()
		})
		t.Run("refused body trickled", func(t *testing.T) {
			t.Parallel()
			c := rawConn(t, addr) // unsigned: refused before the body is read, and not waited for
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n", twilioReceiptPath, addr, len(form))
			start := time.Now()
			stop := make(chan struct{})
			defer close(stop)
			go trickle(c, form, 200*time.Millisecond, stop)
			took, code := cutOff(t, c, start, 14*time.Second)
			if code != http.StatusForbidden || took > 2*time.Second {
				t.Errorf("answered %d after %s, want 403 at once", code, took)
			}
			mu.Lock()
			report["refused body trickled"] = took
			mu.Unlock()
		})
		t.Run("body trickled elsewhere", func(t *testing.T) {
			t.Parallel()
			c := rawConn(t, addr) // a route that reads no body does not wait for one
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", addr, len(form))
			start := time.Now()
			stop := make(chan struct{})
			defer close(stop)
			go trickle(c, form, 200*time.Millisecond, stop)
			took, code := cutOff(t, c, start, 14*time.Second)
			if code != http.StatusOK || took > 2*time.Second {
				t.Errorf("answered %d after %s, want 200 at once", code, took)
			}
			mu.Lock()
			report["body trickled elsewhere"] = took
			mu.Unlock()
		})
		t.Run("headers too large", func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(http.MethodGet, hooks.base+"/healthz", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Padding", strings.Repeat("p", 64<<10))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("64 KiB of headers: status %d, want 431", resp.StatusCode)
			}
		})
	})
	t.Logf("cut off after: %v", report)
	if n := recorded(); n != 0 {
		t.Errorf("%d receipts recorded from slow clients", n)
	}

	// What no test waits for: the write and idle timeouts are set, and bounded.
	srv := webhooksServer(http.NotFoundHandler())
	if srv.WriteTimeout <= 0 || srv.WriteTimeout > time.Minute || srv.IdleTimeout <= 0 || srv.IdleTimeout > time.Minute || srv.ReadTimeout <= 0 || srv.ReadTimeout > 15*time.Second {
		t.Errorf("server timeouts read %s, write %s, idle %s; want each set and under a minute", srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
}

// GET /stats answers on loopback, or with the UI's credentials; elsewhere 403 (401 when there are
// credentials to give). Whether a request is from loopback is the connection's address, not what the
// request says.
func TestWebhooksStatsOnlyOnLoopbackOrWithCredentials(t *testing.T) {
	t.Parallel()
	const user, secret = "ops", "st4ts-Pa55"
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	sink := receipts.SinkFunc(func(context.Context, []receipts.Receipt) error { return nil })
	handlers := map[string]*receipts.Handler{"twilio": receipts.TwilioHandler(hooksToken, "", sink, log)}
	creds, why := parseBasicAuth(user + ":" + secret)
	if why != "" {
		t.Fatal(why)
	}
	open, locked := webhooksMux(handlers, nil, log, nil, nil), webhooksMux(handlers, creds, log, nil, nil)
	get := func(h http.Handler, path, remote, host string, hdr map[string]string, auth ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.RemoteAddr, r.Host = remote, host
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		if len(auth) == 2 {
			r.SetBasicAuth(auth[0], auth[1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, tt := range []struct {
		name         string
		h            http.Handler
		remote, host string
		hdr          map[string]string
		auth         []string
		want         int
	}{
		{"loopback IPv4", open, "127.0.0.1:40000", "127.0.0.1:8090", nil, nil, 200},
		{"loopback IPv6, localhost", open, "[::1]:40000", "localhost:8090", nil, nil, 200},
		{"loopback, credentials set but not given", locked, "127.0.0.1:40000", "127.0.0.1:8090", nil, nil, 200},
		{"elsewhere, no credentials set", open, "192.0.2.7:40000", "hooks.example.com", nil, nil, 403},
		{"elsewhere, credentials given but none set", open, "192.0.2.7:40000", "hooks.example.com", nil, []string{user, secret}, 403},
		{"elsewhere, credentials set, none given", locked, "192.0.2.7:40000", "hooks.example.com", nil, nil, 401},
		{"elsewhere, wrong password", locked, "192.0.2.7:40000", "hooks.example.com", nil, []string{user, "wrong"}, 401},
		{"elsewhere, wrong user", locked, "192.0.2.7:40000", "hooks.example.com", nil, []string{"admin", secret}, 401},
		{"elsewhere, credentials", locked, "192.0.2.7:40000", "hooks.example.com", nil, []string{user, secret}, 200},
		{"elsewhere, claiming loopback in Host", open, "192.0.2.7:40000", "127.0.0.1:8090", nil, nil, 403},
		{"through a proxy on this machine", open, "127.0.0.1:40000", "127.0.0.1:8090", map[string]string{"X-Forwarded-For": "203.0.113.9"}, nil, 403},
		{"through a proxy saying Forwarded", open, "127.0.0.1:40000", "127.0.0.1:8090", map[string]string{"Forwarded": "for=203.0.113.9"}, nil, 403},
		{"loopback under another name (DNS rebinding)", open, "127.0.0.1:40000", "rebind.example.com:8090", nil, nil, 403},
		{"IPv4-mapped IPv6 from elsewhere", open, "[::ffff:192.0.2.7]:40000", "127.0.0.1:8090", nil, nil, 403},
		{"no remote address", open, "", "127.0.0.1:8090", nil, nil, 403},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := get(tt.h, "/stats", tt.remote, tt.host, tt.hdr, tt.auth...)
			if w.Code != tt.want {
				t.Fatalf("GET /stats: %d %s, want %d", w.Code, w.Body, tt.want)
			}
			switch tt.want {
			case 200:
				var st map[string]receipts.Stats
				if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || len(st) != 1 {
					t.Errorf("GET /stats: %v %s, want the stats of twilio", err, w.Body)
				}
			case 401:
				if !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), `Basic realm="`+webhooksRealm+`"`) {
					t.Errorf("WWW-Authenticate %q, want a Basic challenge", w.Header().Get("WWW-Authenticate"))
				}
			case 403:
				if !strings.Contains(w.Body.String(), "--basic-auth-file") || !strings.Contains(w.Body.String(), uiAuthEnv) {
					t.Errorf("403 does not say how to read /stats: %s", w.Body)
				}
			}
			if strings.Contains(w.Body.String(), "accepted") != (tt.want == 200) {
				t.Errorf("stats shown with %d: %s", tt.want, w.Body)
			}
		})
	}
	// /healthz and the receipts themselves answer anyone.
	if w := get(open, "/healthz", "192.0.2.7:40000", "hooks.example.com", nil); w.Code != 200 || strings.Contains(w.Body.String(), "accepted") {
		t.Errorf("GET /healthz from elsewhere: %d %s, want 200 without stats", w.Code, w.Body)
	}
	r := httptest.NewRequest(http.MethodPost, twilioReceiptPath, strings.NewReader("x=1"))
	r.RemoteAddr = "192.0.2.7:40000"
	w := httptest.NewRecorder()
	open.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || handlers["twilio"].Stats().Rejected[receipts.ReasonUnsigned] != 1 {
		t.Errorf("unsigned callback from elsewhere: %d, want the receipts handler's 403", w.Code)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the password is in the log:\n%s", logs.String())
	}
}

// The same over a real connection from a non-loopback address of this machine, when it has one: the
// server sees the connection's address.
func TestWebhooksStatsOverTheNetwork(t *testing.T) {
	t.Parallel()
	ip := nonLoopbackIP(t)
	const user, secret = "ops", "n3t-Pa55"
	env, _, _ := hooksEnv(t)
	authFile := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(authFile, []byte(user+":"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(ip, "0")
	plain := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", addr)
	locked := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", addr, "--basic-auth-file", authFile)
	if code, _, body := uiDo(t, "GET", plain.base+"/stats", nil); code != http.StatusForbidden {
		t.Errorf("GET /stats over %s without credentials set: %d %s, want 403", ip, code, body)
	}
	if code, _, body := uiDo(t, "GET", plain.base+"/stats", map[string]string{"Host": "127.0.0.1"}); code != http.StatusForbidden {
		t.Errorf("GET /stats over %s saying Host: 127.0.0.1: %d %s, want 403", ip, code, body)
	}
	if code, hdr, _ := uiDo(t, "GET", locked.base+"/stats", nil); code != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") == "" {
		t.Errorf("GET /stats over %s without credentials: %d, want 401 with a challenge", ip, code)
	}
	if code, _, _ := uiDo(t, "GET", locked.base+"/stats", nil, user, "wrong"); code != http.StatusUnauthorized {
		t.Errorf("GET /stats over %s with a wrong password: %d, want 401", ip, code)
	}
	if code, _, body := uiDo(t, "GET", locked.base+"/stats", nil, user, secret); code != 200 || !strings.Contains(body, "accepted") {
		t.Errorf("GET /stats over %s with credentials: %d %s, want 200 and the stats", ip, code, body)
	}
	if code, _, _ := uiDo(t, "GET", plain.base+"/healthz", nil); code != 200 {
		t.Errorf("GET /healthz over %s: %d, want 200", ip, code)
	}
	for _, s := range []*uiServer{plain, locked} {
		if err := s.stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if out := s.stderr.String(); strings.Contains(out, secret) || strings.Contains(out, hooksToken) {
			t.Errorf("a credential is in the output:\n%s", out)
		}
	}
	if !strings.Contains(locked.stderr.String(), `basic auth as "ops"`) {
		t.Errorf("stderr does not say who may read /stats: %s", locked.stderr)
	}
}

// nonLoopbackIP is an address of this machine other than loopback; the test is skipped without one
// (TestWebhooksStatsOnlyOnLoopbackOrWithCredentials covers the decision either way).
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address")
	return ""
}

// procKB reads a "Vm..." line of /proc/PID/status, in KiB.
func procKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// Concurrent junk posts of the largest sizes do not push the memory of a real `campaignctl webhooks`
// far up: over-large ones are refused unread or read no further than the limit, and the bodies read at
// once are bounded.
func TestWebhooksJunkPostsKeepMemoryBounded(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc to read the memory of a process from")
	}
	env, key, recorded := hooksEnv(t)
	addr := freeAddr(t)
	cmd := exec.Command(binary(t), "webhooks", "--addr", addr)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+env["DATABASE_URL"], "TWILIO_AUTH_TOKEN="+hooksToken, "SENDGRID_WEBHOOK_PUBLIC_KEY="+key.public, uiAuthEnv+"=")
	var logs testlog.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt) //nolint:errcheck
		cmd.Wait()                       //nolint:errcheck
	})
	base := "http://" + addr
	waitFor(t, 20*time.Second, func() bool {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	pid := cmd.Process.Pid
	before := procKB(t, pid, "VmRSS")

	const posts, junkSize = 200, 5 << 20 // with 60, two cores seldom have them all in flight at once
	junk := bytes.Repeat([]byte("x"), junkSize)
	fakeSig := map[string]string{ // well formed, so that only the body can show it is forged
		"X-Twilio-Email-Event-Webhook-Signature": base64.StdEncoding.EncodeToString([]byte{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01}),
		"X-Twilio-Email-Event-Webhook-Timestamp": strconv.FormatInt(time.Now().Unix(), 10),
	}
	twilioHdr := map[string]string{"X-Twilio-Signature": "Zm9yZ2Vk", "Content-Type": "application/x-www-form-urlencoded"}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxConnsPerHost: posts, MaxIdleConnsPerHost: posts}}
	rounds := []struct {
		name   string
		target string
		body   func() io.Reader
		hdr    map[string]string
	}{
		{"SendGrid, 5 MB Content-Length", base + sendgridReceiptPath, func() io.Reader { return bytes.NewReader(junk) }, fakeSig},
		{"SendGrid, 5 MB chunked", base + sendgridReceiptPath, func() io.Reader { return io.MultiReader(bytes.NewReader(junk)) }, fakeSig},
		{"SendGrid, the largest body taken", base + sendgridReceiptPath, func() io.Reader { return bytes.NewReader(junk[:receipts.MaxSendGridBody]) }, fakeSig},
		{"Twilio, 5 MB chunked", base + twilioReceiptPath, func() io.Reader { return io.MultiReader(bytes.NewReader(junk)) }, twilioHdr},
	}
	for _, rd := range rounds {
		var mu sync.Mutex
		outcomes := map[string]int{}
		var wg sync.WaitGroup
		for range posts {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodPost, rd.target, rd.body())
				if err != nil {
					t.Error(err)
					return
				}
				for k, v := range rd.hdr {
					req.Header.Set(k, v)
				}
				outcome := "closed before answering"
				if resp, err := client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body) //nolint:errcheck
					resp.Body.Close()
					outcome = strconv.Itoa(resp.StatusCode)
				}
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			})
		}
		wg.Wait()
		for o := range outcomes {
			if strings.HasPrefix(o, "2") {
				t.Errorf("%s: junk accepted (%v)", rd.name, outcomes)
			}
		}
		t.Logf("%d concurrent posts, %s: %v (peak RSS so far %d MiB)", posts, rd.name, outcomes, procKB(t, pid, "VmHWM")>>10)
	}
	peak := procKB(t, pid, "VmHWM")
	t.Logf("RSS %d MiB before, peak %d MiB after %d×%d concurrent junk posts", before>>10, peak>>10, len(rounds), posts)
	if grew := peak - before; grew > 64<<10 {
		t.Errorf("peak RSS grew by %d MiB (from %d MiB), want under 64 MiB", grew>>10, before>>10)
	}
	if n := recorded(); n != 0 {
		t.Errorf("%d receipts recorded from junk", n)
	}
}

// A verified receipt that names nobody this engine sent to (a stray callback: another phone for a user of
// the campaign, a user it never planned) is answered like the others, so the provider stops posting it,
// but recorded nowhere and counted apart in /stats as unmatched, not as a receipt.
func TestWebhooksCountStrayReceiptsApart(t *testing.T) {
	t.Parallel()
	db, dbURL := testdb.New(t)
	if _, err := db.Exec(t.Context(), `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status, provider_message_id)
		VALUES (1, 'u1', '+905551234567', 0, 'sent', 'SM1')`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	post := func(user, sid, to string) {
		t.Helper()
		target := hooks.base + twilioReceiptPath + "?campaign_id=1&user_id=" + user
		form := hooksCallback(sid)
		form.Set("To", to)
		hdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig(hooksToken, target, form)}
		if code := hooksPost(t, target, strings.NewReader(form.Encode()), hdr); code != http.StatusNoContent {
			t.Fatalf("callback %s for %s: status %d, want 204", sid, user, code)
		}
	}
	post("u1", "SM1", "+905551234567")    // the recipient's own
	post("ghost", "SM2", "+905551234567") // a user the campaign never planned
	post("u1", "SM3", "+905559999999")    // the campaign's user, another phone
	post("u1", "SM3", "+905559999999")    // the same stray delivered again
	code, _, body := uiDo(t, "GET", hooks.base+"/stats", nil)
	var st map[string]receipts.Stats
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
		t.Fatalf("GET /stats: %d %v %s", code, err, body)
	}
	if tw := st["twilio"]; tw.Accepted != 4 || tw.Receipts != 1 || tw.Unmatched != 3 {
		t.Errorf("/stats twilio: accepted %d, receipts %d, unmatched %d; want 4 answered, 1 receipt recorded (the recipient's own), 3 unmatched",
			tw.Accepted, tw.Receipts, tw.Unmatched)
	}
	if n := countRows(t, db, `SELECT count(*) FROM campaign_recipients WHERE delivery = 'delivered'`); n != 1 {
		t.Errorf("%d recipients delivered, want the one whose receipt named them", n)
	}
}

// The batcher writes the receipts of many requests in one statement; each request gets back the
// positions of its own stray receipts, not another's.
func TestDeliveryBatcherGivesEachRequestItsOwnStrays(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	if _, err := db.Exec(t.Context(), `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status)
		SELECT 1, 'u' || i, '+90555000000' || i, 0, 'sent' FROM generate_series(0, 5) i`); err != nil {
		t.Fatal(err)
	}
	b := newDeliveryBatcher(campaign.NewStore(db))
	rcpt := func(user string) campaign.Delivery {
		return campaign.Delivery{Provider: "twilio", CampaignID: 1, UserID: user, MessageID: "SM" + user, Status: campaign.DeliveryDelivered,
			EventID: "SM" + user + ":delivered", At: time.Now()}
	}
	// One that names only a message no recorded send carries yet is kept (early), not a stray.
	early := func(sid string) campaign.Delivery {
		return campaign.Delivery{Provider: "twilio", MessageID: sid, Status: campaign.DeliveryDelivered, EventID: sid + ":delivered", At: time.Now()}
	}
	requests := [][]campaign.Delivery{
		{rcpt("u0"), rcpt("x0"), rcpt("u1")},
		{rcpt("x1"), early("SMlater1"), rcpt("x2")},
		{early("SMlater2"), rcpt("u2"), rcpt("u3"), rcpt("u4"), rcpt("x3")},
	}
	want := [][]int{{1}, {0, 2}, {4}}
	wantEarly := [][]int{nil, {1}, {0}}
	got := make([]receipts.Matched, len(requests))
	errs := make([]error, len(requests))
	var wg sync.WaitGroup
	for i, ds := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = b.record(t.Context(), ds)
		}()
	}
	// All three wait in the queue before the batcher starts: one statement takes them together.
	waitFor(t, 5*time.Second, func() bool { return len(b.in) == len(requests) })
	go b.run(t.Context())
	wg.Wait()
	for i := range requests {
		if errs[i] != nil || !slices.Equal(got[i].Unmatched, want[i]) || !slices.Equal(got[i].Early, wantEarly[i]) {
			t.Errorf("request %d: unmatched %v, early %v (err %v), want %v and %v", i, got[i].Unmatched, got[i].Early, errs[i], want[i], wantEarly[i])
		}
	}
	if n := countRows(t, db, `SELECT count(*) FROM campaign_recipients WHERE delivery = 'delivered'`); n != 5 {
		t.Errorf("%d recipients delivered, want the 5 named", n)
	}
}

// A Twilio status callback that names only its message SID (a callback set on the account) and comes
// before the worker has recorded the send is kept, and webhooks applies it by itself once the send is
// recorded: the recipient gets its delivery without the provider posting again.
func TestWebhooksApplyAReceiptThatCameBeforeItsSend(t *testing.T) {
	t.Parallel()
	db, dbURL := testdb.New(t)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0", "--spool-dir", "")
	const sid = "SMeeee0000000000000000000000000001"
	target := hooks.base + twilioReceiptPath
	form := hooksCallback(sid)
	if code := hooksPost(t, target, strings.NewReader(form.Encode()), map[string]string{"Content-Type": "application/x-www-form-urlencoded",
		"X-Twilio-Signature": twilioSig(hooksToken, target, form)}); code != http.StatusNoContent {
		t.Fatalf("the status callback: %d, want 204", code)
	}
	// Counted as kept, not as a stray, and no warning: with a callback set on the account, every receipt
	// may overtake its send's outcome (each one warned, by the thousand, before).
	code, _, body := uiDo(t, "GET", hooks.base+"/stats", nil)
	var st map[string]receipts.Stats
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
		t.Fatalf("GET /stats: %d %v %s", code, err, body)
	}
	if tw := st["twilio"]; tw.Early != 1 || tw.Unmatched != 0 || tw.Receipts != 0 {
		t.Errorf("/stats twilio: early %d, unmatched %d, receipts %d; want 1, 0, 0", tw.Early, tw.Unmatched, tw.Receipts)
	}
	if strings.Contains(hooks.stderr.String(), "names no message") {
		t.Errorf("a receipt kept until its send is recorded was warned of as a stray:\n%s", hooks.stderr.String())
	}
	// The worker records the send now: the recipient's row and its audit entry with the SID.
	ctx := t.Context()
	for _, sql := range []string{
		`INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status, provider_message_id) VALUES (1, 'u1', '+905551234567', 0, 'sent', '` + sid + `')`,
		`INSERT INTO send_log (campaign_id, user_id, status, provider_message_id) VALUES (1, 'u1', 'sent', '` + sid + `')`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, func() bool {
		var delivery *string
		if err := db.QueryRow(ctx, `SELECT delivery FROM campaign_recipients WHERE campaign_id = 1 AND user_id = 'u1'`).Scan(&delivery); err != nil {
			t.Fatal(err)
		}
		// The log line comes once the round is over, a moment after its write is seen.
		return delivery != nil && *delivery == "delivered" &&
			strings.Contains(hooks.stderr.String(), "receipts that came before their sends were recorded applied")
	})
}

// E-mail sent from a configuration whose webhooks receive none of SendGrid's events loses its refusals
// (unsubscribes, spam reports) once SendGrid stops retrying: webhooks says so when it starts, naming the
// setting. Before, it served 404 at the events' path and said nothing.
func TestWebhooksWarnWhenSendGridEventsAreNotReceived(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.New(t)
	const warning = "SENDGRID_API_KEY is set but SENDGRID_WEBHOOK_PUBLIC_KEY is not"
	key := newHooksKey(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"sending e-mail, no event key", map[string]string{"SENDGRID_API_KEY": "SG.not-a-real-key"}, true},
		{"sending e-mail, the event key", map[string]string{"SENDGRID_API_KEY": "SG.not-a-real-key", "SENDGRID_WEBHOOK_PUBLIC_KEY": key.public}, false},
		{"no e-mail", map[string]string{}, false},
	} {
		env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken}
		maps.Copy(env, tc.env)
		hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0", "--spool-dir", "")
		if err := hooks.stop(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		out := hooks.stderr.String()
		if got := strings.Contains(out, warning); got != tc.want {
			t.Errorf("%s: warned %v, want %v:\n%s", tc.name, got, tc.want, out)
		}
		if strings.Contains(out, "SG.not-a-real-key") {
			t.Errorf("%s: the API key was printed:\n%s", tc.name, out)
		}
	}
}
