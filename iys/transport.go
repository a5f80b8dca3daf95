package iys

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5/pgxpool"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// Operation names, in errors and logs.
const (
	opToken       = "token"
	opStatus      = "status"
	opMultiStatus = "multi_status"
	opChanges     = "changes"
	opAdd         = "add"
	opAddBatch    = "add_batch"
	opAddResults  = "add_results"
)

// maxResponse bounds a response body: a full page of changes is about 300 kB.
const maxResponse = 32 << 20

// retryBase is the first back-off after a 5xx or a network error; it doubles per attempt.
const retryBase = 500 * time.Millisecond

// call is one logical request to İYS.
type call struct {
	op     string
	method string
	path   string
	query  url.Values
	body   []byte // JSON, or the form for the token endpoint
	form   bool
	noAuth bool
}

// do sends c, paced, with a bearer token unless noAuth, and returns the status and body of a 2xx
// answer. It retries a 429 of the per-second limit after Retry-After (1 s when absent), and 5xx answers
// and network errors after a doubling back-off, up to MaxRetries times, and never waits longer than
// MaxRetryWait. A 401 makes it drop the token and try once more with a new one. Every request İYS is
// asked here is read-only, a token grant or a V2 add, which İYS deduplicates (an identical add returns
// the first answer's transactionId and records nothing again), so a retry cannot duplicate a change.
func (c *Client) do(ctx context.Context, cl call) (int, []byte, error) {
	reauthed := false
	for attempt := 0; ; attempt++ {
		tok := ""
		if !cl.noAuth {
			var err error
			if tok, err = c.tokens.get(ctx); err != nil {
				return 0, nil, err
			}
		}
		if err := c.pace.wait(ctx); err != nil {
			return 0, nil, fmt.Errorf("iys %s: %w", cl.op, err)
		}
		start := time.Now()
		status, h, data, err := c.send(ctx, cl, tok)
		c.log.Debug("iys request", "op", cl.op, "status", status, "attempt", attempt, "duration", time.Since(start))
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil, fmt.Errorf("iys %s: %w", cl.op, ctx.Err())
			}
			if attempt < c.cfg.MaxRetries {
				if err := c.backoff(ctx, cl.op, attempt, 0, 0, "", err); err != nil {
					return 0, nil, err
				}
				continue
			}
			return 0, nil, fmt.Errorf("iys %s: %w", cl.op, err)
		}
		if status >= 200 && status < 300 {
			return status, data, nil
		}
		ae := parseAPIError(cl.op, status, h, data)
		c.scrub(ae, tok)
		if status == http.StatusUnauthorized && !cl.noAuth && !reauthed {
			reauthed = true
			c.tokens.invalidate(tok)
			c.log.Info("iys token refused; getting a new one", "op", cl.op, "status", status, "error_code", ae.Code)
			attempt-- // a new token is not a retry of the same request
			continue
		}
		if ae.retryable() && attempt < c.cfg.MaxRetries {
			if err := c.backoff(ctx, cl.op, attempt, status, ae.RetryAfter, ae.Code, nil); err != nil {
				if errors.Is(err, errWaitTooLong) {
					return 0, nil, ae
				}
				return 0, nil, err
			}
			continue
		}
		if cl.op == opStatus && status == http.StatusNotFound {
			ae.notFound = true
		}
		return 0, nil, ae
	}
}

var errWaitTooLong = errors.New("retry wait over MaxRetryWait")

// backoff sleeps before a retry: retryAfter when the answer gave one (a 429 without it waits 1 s, İYS's
// window), else retryBase doubled per attempt with jitter.
func (c *Client) backoff(ctx context.Context, op string, attempt, status int, retryAfter time.Duration, code string, netErr error) error {
	wait := retryAfter
	switch {
	case wait > 0:
	case status == http.StatusTooManyRequests:
		wait = time.Second
	default:
		d := retryBase << min(attempt, 10)
		wait = d + rand.N(d/2)
	}
	if wait > c.cfg.MaxRetryWait {
		if retryAfter > 0 {
			return errWaitTooLong
		}
		wait = c.cfg.MaxRetryWait
	}
	args := []any{"op", op, "attempt", attempt + 1, "wait", wait.String()}
	if netErr != nil {
		args = append(args, "err", netErr.Error())
	} else {
		args = append(args, "status", status, "error_code", code)
	}
	c.log.Info("iys retry", args...)
	if err := c.sleep(ctx, wait); err != nil {
		return fmt.Errorf("iys %s: %w", op, err)
	}
	return nil
}

// send makes one HTTP attempt and reads the whole answer.
func (c *Client) send(ctx context.Context, cl call, tok string) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	u := c.base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, body)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "campaignctl-iys")
	switch {
	case cl.form:
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	case cl.body != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("read answer: %w", err)
	}
	if len(data) > maxResponse {
		return 0, nil, nil, fmt.Errorf("answer over %d bytes", maxResponse)
	}
	return resp.StatusCode, resp.Header, data, nil
}

// scrub removes the password and the token from an error İYS might have echoed them in, as sent and as a
// form or a URL encodes them, and masks the recipients its text quotes (providers.ScrubText: a request
// echoed back holds every recipient of a batch or a status query).
func (c *Client) scrub(e *APIError, tok string) {
	pw := c.cfg.Password
	for _, secret := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw), tok} {
		if secret == "" {
			continue
		}
		e.Message = strings.ReplaceAll(e.Message, secret, "***")
		e.Value = strings.ReplaceAll(e.Value, secret, "***")
		for i := range e.Details {
			e.Details[i].Message = strings.ReplaceAll(e.Details[i].Message, secret, "***")
			e.Details[i].Value = strings.ReplaceAll(e.Details[i].Value, secret, "***")
		}
	}
	e.Message = scrubText(e.Message)
	for i := range e.Details {
		e.Details[i].Message = scrubText(e.Details[i].Message)
	}
}

// formSecret matches a credential of the token endpoint's form quoted in a text, in any encoding.
var formSecret = regexp.MustCompile(`(?i)\b(password|refresh_token|access_token|client_secret)=[^&\s"',}]*`)

// scrubText masks in a text İYS sent the credentials of a token request it may have echoed (formSecret),
// and the recipients and credentials any text may quote (providers.ScrubText).
func scrubText(s string) string {
	return providers.ScrubText(formSecret.ReplaceAllString(s, "$1=***"))
}

// tokenSource gets and caches the OAuth2 token (research §2.2). İYS's access token lives 2 h and its
// refresh token 4 h, and the token endpoint allows only 10 requests an hour per IP, so the token is
// renewed a little before it expires (5 min, or a fifth of its life if shorter), with the refresh grant
// while the refresh token lives (each refresh rotates it) and the password grant otherwise. One caller
// at a time renews; the others wait for its result. After a 429 H084 no token is asked for until the hour
// is up, since İYS restarts its hour on every early request.
type tokenSource struct {
	c   *Client
	sem chan struct{} // held while renewing

	mu           sync.Mutex
	access       string
	renewAt      time.Time // renew from here on
	expires      time.Time // İYS refuses it from here on
	refresh      string
	refreshUntil time.Time
	haltUntil    time.Time
	haltErr      error

	// keep, when set, keeps the token between runs (KeepTokensIn); loaded says it was read.
	keep   *pgxpool.Pool
	loaded bool
}

// get returns a token valid now, renewing it if needed.
func (t *tokenSource) get(ctx context.Context) (string, error) {
	if tok, ok := t.cached(); ok {
		return tok, nil
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("iys token: %w", ctx.Err())
	}
	defer func() { <-t.sem }()
	t.loadKept(ctx)
	if tok, ok := t.cached(); ok {
		return tok, nil // renewed by the caller we waited for, or kept by an earlier run
	}
	now := t.c.now()
	t.mu.Lock()
	if now.Before(t.haltUntil) {
		err, until := t.haltErr, t.haltUntil
		t.mu.Unlock()
		return "", fmt.Errorf("%w; no token is asked for before %s, since an early request restarts İYS's hour",
			err, until.In(istanbul).Format(DateLayout))
	}
	refresh := ""
	if t.refresh != "" && now.Before(t.refreshUntil) {
		refresh = t.refresh
	}
	old, oldExpires := t.access, t.expires
	t.mu.Unlock()

	if refresh != "" {
		tok, err := t.fetch(ctx, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}})
		if err == nil {
			return tok, nil
		}
		if !IsAuth(err) {
			return t.fallback(old, oldExpires, err)
		}
		t.c.log.Info("iys refresh token refused; logging in again", "op", opToken, "err", err.Error())
		t.mu.Lock()
		t.refresh = ""
		t.mu.Unlock()
	}
	tok, err := t.fetch(ctx, url.Values{"grant_type": {"password"}, "username": {t.c.cfg.Username}, "password": {t.c.cfg.Password}})
	if err != nil {
		return t.fallback(old, oldExpires, err)
	}
	return tok, nil
}

// fallback keeps using a token renewed early when the renewal failed for a reason other than the
// credentials, as long as İYS still accepts it.
func (t *tokenSource) fallback(old string, expires time.Time, err error) (string, error) {
	if old != "" && !IsAuth(err) && t.c.now().Before(expires) {
		t.mu.Lock()
		still := t.access == old
		t.mu.Unlock()
		if still {
			t.c.log.Info("iys token renewal failed; using the current token until it expires", "op", opToken, "err", err.Error())
			return old, nil
		}
	}
	return "", err
}

func (t *tokenSource) cached() (string, bool) {
	now := t.c.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.access, t.access != "" && now.Before(t.renewAt)
}

// invalidate forgets tok after İYS refused it, unless it was replaced meanwhile.
func (t *tokenSource) invalidate(tok string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.access == tok {
		t.access = ""
		t.renewAt, t.expires = time.Time{}, time.Time{}
	}
}

// fetch asks the token endpoint for a grant and stores the answer.
func (t *tokenSource) fetch(ctx context.Context, form url.Values) (string, error) {
	c := t.c
	issued := c.now()
	_, data, err := c.do(ctx, call{op: opToken, method: http.MethodPost, path: "/oauth2/token",
		body: []byte(form.Encode()), form: true, noAuth: true})
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Code == "H084" {
			t.mu.Lock()
			t.haltUntil = issued.Add(max(ae.RetryAfter, time.Hour))
			t.haltErr = ae
			t.mu.Unlock()
			t.saveKept(ctx)
		}
		return "", err
	}
	var tr struct {
		AccessToken      string `json:"access_token"`
		RefreshToken     string `json:"refresh_token"`
		ExpiresIn        int64  `json:"expires_in"`
		RefreshExpiresIn int64  `json:"refresh_expires_in"`
		TokenType        string `json:"token_type"`
	}
	// The body holds the tokens: the error names neither the body nor the decoder's detail.
	if json.Unmarshal(data, &tr) != nil || tr.AccessToken == "" ||
		(tr.TokenType != "" && !strings.EqualFold(tr.TokenType, "bearer")) {
		return "", fmt.Errorf("iys token: %w: not a bearer token answer (%d bytes)", ErrMalformedResponse, len(data))
	}
	life := time.Duration(tr.ExpiresIn) * time.Second
	if life <= 0 {
		life = 2 * time.Hour // İYS's documented lifetime
	}
	rlife := time.Duration(tr.RefreshExpiresIn) * time.Second
	t.mu.Lock()
	t.access = tr.AccessToken
	t.expires = issued.Add(life)
	t.renewAt = issued.Add(life - renewMargin(life))
	t.refresh = tr.RefreshToken
	t.refreshUntil = time.Time{}
	if tr.RefreshToken != "" && rlife > 0 {
		t.refreshUntil = issued.Add(rlife - renewMargin(rlife))
	}
	c.log.Debug("iys token obtained", "op", opToken, "grant", form.Get("grant_type"), "expires_in", life)
	access := t.access
	t.mu.Unlock()
	t.saveKept(ctx)
	return access, nil
}

// renewMargin is how long before its expiry a token is renewed: 5 min, or a fifth of its life if
// that is shorter.
func renewMargin(life time.Duration) time.Duration {
	return min(5*time.Minute, life/5)
}
