// Package webhook delivers campaign messages to an in-house HTTP endpoint: one signed JSON POST per
// message, with an Idempotency-Key the receiver can deduplicate on. It turns every failure into a
// *providers.Error whose Class tells the engine whether to retry, give up, or hold the recipient as
// unknown. Receivers check requests with Verify.
//
// The request is
//
//	POST {URL}
//	Content-Type: application/json
//	Idempotency-Key: <campaign_id>:<user_id>
//	X-Campaignctl-Timestamp: <unix seconds>
//	X-Campaignctl-Signature: v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>
//
//	{"campaign_id":7,"user_id":"u1","to":"...","subject":"...","body":"...","data":{"k":"v"}}
//
// The signature covers the timestamp, so that a captured request cannot be replayed outside the
// receiver's tolerance, and the exact body bytes, so that the receiver must verify before parsing.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// Header names of a webhook request.
const (
	HeaderTimestamp      = "X-Campaignctl-Timestamp"
	HeaderSignature      = "X-Campaignctl-Signature"
	HeaderIdempotencyKey = "Idempotency-Key"
)

// DefaultTimeout bounds one request when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultTolerance is the replay window Verify uses when given a tolerance of zero or less.
const DefaultTolerance = 5 * time.Minute

// signatureVersion prefixes the hex HMAC in HeaderSignature; a new scheme would get a new version.
const signatureVersion = "v1="

const (
	maxAnswer  = 1 << 20
	maxMessage = 200
)

// Config configures a Provider. The zero value of Timeout means the default; URL and Secret are required.
type Config struct {
	// URL is the receiver's endpoint, http(s). A query string is allowed; it never appears in errors.
	URL string
	// Secret is the HMAC-SHA256 key shared with the receiver. It never appears in an error or a log.
	Secret string
	// Timeout bounds each HTTP request, from dialling to reading the body. Zero means DefaultTimeout.
	Timeout time.Duration
	// Conns is the most requests the process has in flight to the provider at once, for the size of the
	// connection pool (wire.NewTransport); zero means wire.MaxIdleConns.
	Conns int
}

// Provider posts messages to a webhook. It is safe for concurrent use.
type Provider struct {
	url     string
	secret  []byte
	client  *http.Client
	timeout time.Duration
	now     func() time.Time
	// hidden are the parts of url that may hold a receiver's credential (password, query); they never
	// appear in an error.
	hidden []string
}

// New validates cfg and returns a Provider. Its errors name the environment variable to fix (WEBHOOK_URL,
// WEBHOOK_SECRET) and never contain the secret.
func New(cfg Config) (*Provider, error) {
	switch {
	case cfg.URL == "":
		return nil, errors.New("webhook: URL is empty: set WEBHOOK_URL")
	case cfg.Secret == "":
		return nil, errors.New("webhook: secret is empty: set WEBHOOK_SECRET (the receiver verifies every request with it)")
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("webhook: timeout %v is negative", cfg.Timeout)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, errors.New("webhook: URL is not a valid URL: check WEBHOOK_URL")
	}
	safe := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Fragment != "" {
		return nil, fmt.Errorf("webhook: URL %q must be http(s)://host[:port]/path: check WEBHOOK_URL", safe.String())
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	var hidden []string
	if pw, ok := u.User.Password(); ok && pw != "" {
		hidden = append(hidden, pw)
	}
	if u.RawQuery != "" {
		hidden = append(hidden, u.RawQuery)
	}
	return &Provider{
		url:     cfg.URL,
		hidden:  hidden,
		secret:  []byte(cfg.Secret),
		timeout: timeout,
		client: &http.Client{
			// No Timeout here: Send bounds the request with a deadline on its context (see Send).
			Transport: wire.NewTransport(cfg.Conns),
			// A redirect would resend the message, signature and all, to an address nobody configured.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		now: time.Now,
	}, nil
}

// Name returns "webhook".
func (p *Provider) Name() string { return "webhook" }

// payload is the JSON body of a webhook request.
type payload struct {
	CampaignID int64             `json:"campaign_id"`
	UserID     string            `json:"user_id"`
	To         string            `json:"to"`
	Subject    string            `json:"subject"`
	Body       string            `json:"body"`
	Data       map[string]string `json:"data"`
}

// Send posts m to the webhook. On a 2xx the MessageID is the "id" of a JSON answer when there is one,
// else the Idempotency-Key.
//
// Every error is a *providers.Error, except when ctx is already done on entry: then nothing was sent and
// the error wraps ctx.Err(). The class is:
//   - Transient for 408, 429 and any 5xx (RetryAfter from Retry-After), and for a transport error before
//     the request was written;
//   - Permanent for any other 4xx and for a redirect (401, 403 and 404 are account-level: a wrong secret
//     or URL), and for a message without a UserID, which could not get a distinct Idempotency-Key;
//   - Ambiguous when the request was written but no answer came back (timeout, reset): the receiver may
//     have taken it. Its Idempotency-Key lets a receiver that keeps them drop a resend.
//
// The transport (wire.NewTransport) never resends a request by itself, not even on a reused keep-alive
// connection that turns out to be dead: such a request fails as Ambiguous when any of it may have left,
// and as Transient when none did. Only through a proxy, where net/http sends it, may the request be
// resent once because of that header; a receiver that deduplicates on the key absorbs that too.
//
// Like the other providers, Send does not cancel a request in flight when ctx is done; Config.Timeout
// bounds it.
func (p *Provider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	if err := ctx.Err(); err != nil {
		return providers.Result{}, fmt.Errorf("webhook send: %w", err)
	}
	if m.UserID == "" {
		return providers.Result{}, &providers.Error{Provider: "webhook", Class: providers.Permanent,
			Message: "message has no user ID: the Idempotency-Key needs one"}
	}
	key := strconv.FormatInt(m.CampaignID, 10) + ":" + m.UserID
	fields := m.Data
	if fields == nil {
		fields = map[string]string{} // an object, never null, so that receivers can index it
	}
	body, err := json.Marshal(payload{CampaignID: m.CampaignID, UserID: m.UserID, To: m.To, Subject: m.Subject, Body: m.Body, Data: fields})
	if err != nil {
		return providers.Result{}, &providers.Error{Provider: "webhook", Class: providers.Permanent, Message: "cannot encode the message", Err: err}
	}
	ts := strconv.FormatInt(p.now().Unix(), 10)

	var tr wire.Tracker
	// The timeout is a deadline on the request's context rather than http.Client.Timeout: for a
	// RoundTripper that is not net/http's own (wire's), the client enforces Timeout with a goroutine, a
	// timer and a channel per request. Nothing cancels the request before it (wire.Until: no timer either),
	// and the answer is read below, within it.
	reqCtx := wire.Until(tr.WithTrace(ctx), time.Now().Add(p.timeout))
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return providers.Result{}, &providers.Error{Provider: "webhook", Class: providers.Permanent,
			Message: "cannot build the request: check WEBHOOK_URL"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderIdempotencyKey, key)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, sign(p.secret, ts, body))

	resp, err := p.client.Do(req)
	if err != nil {
		e := &providers.Error{Provider: "webhook", Err: p.redactErr(err, m.To), Message: "request not sent", Class: providers.Transient}
		if tr.Written() {
			e.Message, e.Class = "request sent, no answer", providers.Ambiguous
		}
		return providers.Result{}, e
	}
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	resp.Body.Close()

	st := resp.StatusCode
	if st >= 200 && st <= 299 {
		// The status says the receiver took it; a body cut short changes nothing about that.
		var ok struct {
			ID json.RawMessage `json:"id"`
		}
		if readErr == nil && json.Unmarshal(data, &ok) == nil {
			if id := rawID(ok.ID); id != "" {
				return providers.Result{MessageID: id}, nil
			}
		}
		return providers.Result{MessageID: key}, nil
	}
	e := &providers.Error{Provider: "webhook", Status: st, Message: p.answerText(data, m.To)}
	switch {
	case st == http.StatusRequestTimeout, st == http.StatusTooManyRequests, st >= 500:
		e.Class = providers.Transient
		e.RetryAfter = wire.ParseRetryAfter(resp.Header.Get("Retry-After"), p.now())
	case st >= 300 && st <= 399:
		e.Class, e.Message = providers.Permanent, "unexpected redirect: check WEBHOOK_URL"
	default:
		e.Class = providers.Permanent
		if st == http.StatusUnauthorized || st == http.StatusForbidden {
			e.Message = wire.Join(e.Message, "check WEBHOOK_SECRET")
		}
	}
	if readErr != nil {
		e.Err = p.redactErr(readErr, m.To)
	}
	return providers.Result{}, e
}

// rawID returns a JSON string's value, or a number's text; "" for anything else.
func rawID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// answerText picks the receiver's explanation from an error answer ("error" or "message" of a JSON
// body), without the recipient's address or the secret, and bounded; "" when there is none.
func (p *Provider) answerText(data []byte, to string) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	text := v.Message
	var s string
	if json.Unmarshal(v.Error, &s) == nil && s != "" {
		text = s
	}
	return wire.Truncate(providers.ScrubText(p.redact(text, to)), maxMessage)
}

// sign returns the HeaderSignature value for body sent at timestamp ts.
func sign(secret []byte, ts string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return signatureVersion + hex.EncodeToString(mac.Sum(nil))
}

// Sign returns the X-Campaignctl-Signature value for body sent at t: "v1=" and the hex HMAC-SHA256 of
// the Unix timestamp, ".", and body. Receivers' tests can use it to build requests.
func Sign(secret string, t time.Time, body []byte) string {
	return sign([]byte(secret), strconv.FormatInt(t.Unix(), 10), body)
}

// Errors Verify returns.
var (
	// ErrNoSecret means Verify was given an empty secret; it never accepts a request then.
	ErrNoSecret = errors.New("webhook: no secret to verify with")
	// ErrMissingSignature means the timestamp or signature header is absent.
	ErrMissingSignature = errors.New("webhook: missing " + HeaderTimestamp + " or " + HeaderSignature)
	// ErrBadTimestamp means the timestamp is not a Unix time in seconds.
	ErrBadTimestamp = errors.New("webhook: malformed " + HeaderTimestamp)
	// ErrStale means the timestamp is outside the tolerance: an old request replayed, or a clock far off.
	ErrStale = errors.New("webhook: timestamp outside the tolerance")
	// ErrBadSignature means no signature matches the body and timestamp under the secret.
	ErrBadSignature = errors.New("webhook: signature mismatch")
)

// Verify checks a webhook request for a receiver: the timestamp in header must be within tolerance of now
// (either way; DefaultTolerance when tolerance <= 0) and one of the "v1=" signatures in header, which may
// hold several separated by commas (to rotate a secret), must be the HMAC of the timestamp and body under
// secret. body must be the raw bytes as received, before any parsing. Signatures are compared in constant
// time. It returns nil or one of the errors above.
//
// The timestamp window limits replays; a receiver that must never act twice also keeps the
// Idempotency-Key of what it processed.
func Verify(secret string, header http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	if secret == "" {
		return ErrNoSecret
	}
	ts, sigs := header.Get(HeaderTimestamp), header.Values(HeaderSignature)
	if ts == "" || len(sigs) == 0 {
		return ErrMissingSignature
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	want := []byte(sign([]byte(secret), ts, body))
	match := 0
	for _, v := range sigs {
		for _, sig := range strings.Split(v, ",") {
			// Every candidate is compared, so the time taken does not tell which one matched.
			match |= subtle.ConstantTimeCompare([]byte(strings.TrimSpace(sig)), want)
		}
	}
	if match == 0 {
		return ErrBadSignature
	}
	return nil
}

// redact removes the secret, the URL's password and query, and the recipient's address from a text.
func (p *Provider) redact(s, to string) string {
	for _, h := range p.hidden {
		s = strings.ReplaceAll(s, h, "[redacted]")
	}
	if len(p.secret) > 0 {
		s = strings.ReplaceAll(s, string(p.secret), "[secret]")
	}
	if to != "" {
		s = strings.ReplaceAll(s, to, "[to]")
	}
	return s
}

// redactErr wraps err so that its text is redacted; errors.Is and errors.As still see err.
func (p *Provider) redactErr(err error, to string) error {
	return wire.Redacted(providers.ScrubSecrets(p.redact(err.Error(), to)), err)
}
