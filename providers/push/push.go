// Package push sends push notifications through Firebase Cloud Messaging's HTTP v1 API and turns every
// failure into a *providers.Error whose Class tells the engine whether to retry, give up, or hold the
// recipient as unknown, and whose BadAddress marks a device token that will never work again.
//
// It speaks the REST API directly with net/http: the Firebase Admin SDK and golang.org/x/oauth2/google
// would pull in many modules and retry behind the engine's back. The OAuth2 access token comes from the
// service account's JWT-bearer grant (golang.org/x/oauth2/jwt) and is cached until shortly before it
// expires, so a campaign fetches one token an hour, not one per message.
package push

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// DefaultBaseURL is the FCM API.
const DefaultBaseURL = "https://fcm.googleapis.com"

// DefaultTimeout bounds one HTTP request (the send, or the token request) when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Scope is the OAuth2 scope the access token is requested for.
const Scope = "https://www.googleapis.com/auth/firebase.messaging"

// maxAnswer bounds the answer body read into memory: a message name or an error is well under 1 KiB.
const maxAnswer = 1 << 20

// tokenEarlyExpiry is how long before its expiry a cached access token is replaced, so that a token is
// never sent that expires on the way (the request can take Timeout, and clocks drift).
const tokenEarlyExpiry = time.Minute

// Config configures a Provider. The zero value of BaseURL and Timeout means the default; cmd fills it from
// FCM_PROJECT_ID, GOOGLE_APPLICATION_CREDENTIALS and FCM_BASE_URL.
type Config struct {
	// ProjectID is the Firebase project the messages are sent from. Empty means the project_id of the
	// service-account file.
	ProjectID string
	// CredentialsFile is the path of a Google service-account JSON key (client_email, private_key,
	// token_uri). Its private key never appears in an error or a log.
	CredentialsFile string
	// BaseURL, when set, is the scheme://host[:port] requests are sent to instead of FCM (the sandbox).
	BaseURL string
	// Timeout bounds each HTTP request, from dialling to reading the body. Zero means DefaultTimeout.
	Timeout time.Duration
	// Conns is the most requests the process has in flight to the provider at once, for the size of the
	// connection pool (wire.NewTransport); zero means wire.MaxIdleConns.
	Conns int
}

// Provider sends push notifications through FCM HTTP v1. It is safe for concurrent use.
type Provider struct {
	sendURL string
	client  *http.Client
	jwt     *jwt.Config
	// tokenCtx carries the HTTP client the token source uses; it is never cancelled, because the
	// cached source is shared by every Send and one caller going away must not fail the others.
	tokenCtx context.Context
	// tokens is the cached access-token source. It is replaced, not refreshed, when FCM refuses a token
	// before its expiry (revoked), so that the next Send fetches a new one.
	tokens atomic.Pointer[oauth2.TokenSource]

	// refused keeps the token endpoint's last refusal for a while (tokenRefusal): oauth2's cache keeps
	// tokens, not errors, and every Send asked the endpoint again (40 requests a second from two workers
	// against an invalid_grant, enough for Google to lock the service account out).
	refusedMu sync.Mutex
	refused   tokenRefusal
}

// tokenRefusal is a refusal of the token endpoint, given again to every Send until until, without asking.
// wait doubles with each refusal in a row, from a second up to maxTokenWait; a token got clears it.
type tokenRefusal struct {
	err   error
	until time.Time
	wait  time.Duration
}

// maxTokenWait is the longest the token endpoint is left alone after refusals in a row.
const maxTokenWait = time.Minute

// New reads the service-account file, validates cfg and returns a Provider. It does not fetch a token:
// the first Send does. Its errors name the environment variable to fix and never contain the key.
func New(cfg Config) (*Provider, error) {
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("fcm: timeout %v is negative", cfg.Timeout)
	}
	sa, err := readServiceAccount(cfg.CredentialsFile)
	if err != nil {
		return nil, err
	}
	project := cfg.ProjectID
	if project == "" {
		project = sa.ProjectID
	}
	switch {
	case project == "":
		return nil, errors.New("fcm: project ID is empty: set FCM_PROJECT_ID")
	case !isProjectID(project):
		return nil, fmt.Errorf("fcm: project ID %q may contain only letters, digits, '-', '.', ':' and '_': check FCM_PROJECT_ID", project)
	}
	base := DefaultBaseURL
	if cfg.BaseURL != "" {
		base, err = parseBaseURL(cfg.BaseURL)
		if err != nil {
			return nil, err
		}
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	client := &http.Client{
		Transport: wire.NewTransport(cfg.Conns),
		Timeout:   timeout,
		// FCM does not redirect API calls; following one would resend the message (or the assertion)
		// elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	p := &Provider{
		sendURL: base + "/v1/projects/" + project + "/messages:send",
		client:  client,
		jwt: &jwt.Config{
			Email:        sa.ClientEmail,
			PrivateKey:   []byte(sa.PrivateKey),
			PrivateKeyID: sa.PrivateKeyID,
			Scopes:       []string{Scope},
			TokenURL:     sa.TokenURI,
		},
		tokenCtx: context.WithValue(context.Background(), oauth2.HTTPClient, client),
	}
	p.tokens.Store(p.newTokenSource())
	return p, nil
}

// Name returns "fcm".
func (p *Provider) Name() string { return "fcm" }

// fcmRequest is the body of messages:send.
type fcmRequest struct {
	Message fcmMessage `json:"message"`
}

type fcmMessage struct {
	Token        string            `json:"token"`
	Notification *fcmNotification  `json:"notification,omitempty"`
	Data         map[string]string `json:"data,omitempty"`
}

type fcmNotification struct {
	Title string `json:"title,omitempty"`
	Body  string `json:"body,omitempty"`
}

// Send sends a notification with title m.Subject and body m.Body, and m.Data as its data payload, to the
// device token m.To. It returns the FCM message name ("projects/p/messages/...") as the MessageID.
//
// Every error is a *providers.Error, except when ctx is done before the request was written (on entry,
// or while waiting for an access token): then nothing was sent and the error wraps ctx.Err(). The class
// is, from FCM's errorCode (error.details[] of type FcmError) and otherwise from the HTTP status:
//   - Permanent with BadAddress for UNREGISTERED (404) and SENDER_ID_MISMATCH (403): the token is dead
//     or belongs to another project;
//   - Permanent for INVALID_ARGUMENT (400) and any other 4xx or redirect; THIRD_PARTY_AUTH_ERROR and
//     other 401/403/404 answers are account-level (see providers.Error.AccountLevel);
//   - Transient for QUOTA_EXCEEDED (429), UNAVAILABLE (503), INTERNAL (500), any 5xx, with RetryAfter
//     from Retry-After, and for a transport error before the request was written;
//   - Ambiguous when the request was written but no usable answer came back (timeout, reset, a 200 whose
//     body cannot be read): FCM may have accepted the message.
//
// When the token endpoint fails, nothing was sent: a 5xx, 408 or 429 from it, or a transport error, is
// Transient; any other refusal (invalid_grant, a revoked key, a wrong token_uri) is Permanent with
// Status 401, so that it counts as account-level. A 401 UNAUTHENTICATED from FCM itself (a token revoked
// before its expiry) makes Send fetch a new token and send once more: FCM accepted nothing.
//
// Like the Twilio provider, Send does not cancel a request in flight when ctx is done: that would only
// turn a known outcome into an ambiguous one. Config.Timeout bounds each request.
//
// m.CampaignID and m.UserID are not sent: FCM has no metadata field for them.
func (p *Provider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	if err := ctx.Err(); err != nil {
		return providers.Result{}, fmt.Errorf("fcm send: %w", err)
	}
	if m.To == "" {
		return providers.Result{}, &providers.Error{Provider: "fcm", Class: providers.Permanent, Message: "empty device token"}
	}
	req := fcmRequest{Message: fcmMessage{Token: m.To, Data: m.Data}}
	if m.Subject != "" || m.Body != "" {
		req.Message.Notification = &fcmNotification{Title: m.Subject, Body: m.Body}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return providers.Result{}, &providers.Error{Provider: "fcm", Class: providers.Permanent, Message: "cannot encode the message", Err: err}
	}

	for attempt := 0; ; attempt++ {
		src := p.tokens.Load()
		tok, err := p.token(ctx, *src)
		if err != nil {
			return providers.Result{}, err
		}
		res, retry, err := p.post(ctx, body, tok, m.To)
		if retry && attempt == 0 {
			// FCM refused a token the cache still holds valid. Replace the source (once, whichever Send
			// sees it first) and try again with a fresh token.
			p.tokens.CompareAndSwap(src, p.newTokenSource())
			continue
		}
		return res, err
	}
}

// post sends one messages:send request. retry reports a 401 UNAUTHENTICATED answer, which means the
// access token was refused and nothing was accepted.
func (p *Provider) post(ctx context.Context, body []byte, tok *oauth2.Token, to string) (res providers.Result, retry bool, err error) {
	var tr wire.Tracker
	reqCtx := tr.WithTrace(context.WithoutCancel(ctx))
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, p.sendURL, bytes.NewReader(body))
	if err != nil {
		return providers.Result{}, false, &providers.Error{Provider: "fcm", Class: providers.Permanent, Message: "cannot build the request", Err: err}
	}
	req.Header.Set("Content-Type", "application/json; charset=UTF-8")
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)

	resp, err := p.client.Do(req)
	if err != nil {
		e := &providers.Error{Provider: "fcm", Err: redactErr(err, tok.AccessToken, to), Message: "request not sent", Class: providers.Transient}
		if tr.Written() {
			e.Message, e.Class = "request sent, no answer", providers.Ambiguous
		}
		return providers.Result{}, false, e
	}
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	resp.Body.Close()

	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		var ok struct {
			Name string `json:"name"`
		}
		if readErr == nil && json.Unmarshal(data, &ok) == nil && ok.Name != "" {
			return providers.Result{MessageID: ok.Name}, false, nil
		}
		// FCM accepted the message but we cannot name it; sending again would deliver it twice.
		e := &providers.Error{Provider: "fcm", Status: resp.StatusCode, Class: providers.Ambiguous,
			Message: "accepted, but the response has no message name"}
		if readErr != nil {
			e.Err = redactErr(readErr, tok.AccessToken, to)
		}
		return providers.Result{}, false, e
	}
	e, code := classify(resp.StatusCode, resp.Header.Get("Retry-After"), data, to, time.Now())
	if readErr != nil {
		// The status line is enough to classify; keep the read error for the operator.
		e.Err = redactErr(readErr, tok.AccessToken, to)
	}
	retry = resp.StatusCode == http.StatusUnauthorized && code != codeThirdPartyAuth
	return providers.Result{}, retry, e
}

// newTokenSource returns a fresh caching token source: its first Token call signs an assertion and asks
// the token endpoint. oauth2's cache holds a mutex while it fetches, so concurrent Sends share one fetch.
func (p *Provider) newTokenSource() *oauth2.TokenSource {
	ts := oauth2.ReuseTokenSourceWithExpiry(nil, p.jwt.TokenSource(p.tokenCtx), tokenEarlyExpiry)
	return &ts
}

// token returns an access token from src, giving up when ctx is done (the fetch itself goes on, bounded
// by the timeout, and its token is cached for the next Send).
func (p *Provider) token(ctx context.Context, src oauth2.TokenSource) (*oauth2.Token, error) {
	type result struct {
		tok *oauth2.Token
		err error
	}
	p.refusedMu.Lock()
	if p.refused.err != nil && time.Now().Before(p.refused.until) {
		err := p.refused.err
		p.refusedMu.Unlock()
		return nil, err
	}
	p.refusedMu.Unlock()
	ch := make(chan result, 1)
	go func() {
		tok, err := src.Token()
		ch <- result{tok, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			err := tokenError(r.err, time.Now())
			p.refusedMu.Lock()
			p.refused.wait = min(max(time.Second, 2*p.refused.wait), maxTokenWait)
			p.refused.err, p.refused.until = err, time.Now().Add(p.refused.wait)
			p.refusedMu.Unlock()
			return nil, err
		}
		p.refusedMu.Lock()
		p.refused = tokenRefusal{}
		p.refusedMu.Unlock()
		if r.tok.AccessToken == "" {
			return nil, &providers.Error{Provider: "fcm", Status: http.StatusUnauthorized, Class: providers.Permanent,
				Message: "token endpoint answered without an access token: check token_uri in GOOGLE_APPLICATION_CREDENTIALS"}
		}
		return r.tok, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("fcm send: waiting for an access token: %w", ctx.Err())
	}
}

// parseBaseURL checks an FCM_BASE_URL and returns it without a trailing slash. A path is kept (a proxy
// may serve FCM under one); "/v1/projects/..." is appended to it.
func parseBaseURL(raw string) (string, error) {
	u, err := providers.ParseBaseURL("fcm", "FCM_BASE_URL", raw, true)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), nil
}

// isProjectID reports whether s can go into the request path as it is: Google project IDs are lower-case
// letters, digits and hyphens, with "domain:" in front for the oldest ones.
func isProjectID(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == ':' || c == '_') {
			return false
		}
	}
	return s != "" && s != "." && s != ".."
}
