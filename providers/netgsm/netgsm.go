// Package netgsm sends SMS through Netgsm's REST API (v2), the Turkish operator used as the second SMS
// provider: the engine fails over to it when the first is down (see worker.Config.Fallback). It turns
// every failure into a *providers.Error whose Class tells the engine whether to retry, give up, or hold
// the recipient as unknown.
//
// The request is
//
//	POST {BaseURL}/sms/rest/v2/send
//	Authorization: Basic <usercode:password>
//	Content-Type: application/json
//
//	{"msgheader":"KAMPANYA","encoding":"TR","iysfilter":"11","messages":[{"msg":"...","no":"5321234567"}]}
//
// and the answer {"code":"00","description":"...","jobid":"..."}: code 00 is accepted (the job ID is the
// message ID), any other code a refusal. iysfilter makes Netgsm check İYS as well: 11 for commercial
// messages to individuals, 12 to merchants (TACIR), 0 for transactional messages.
package netgsm

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// DefaultBaseURL is Netgsm's API.
const DefaultBaseURL = "https://api.netgsm.com.tr"

// DefaultTimeout bounds one request when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// SendPath is the path of the send endpoint under the base URL.
const SendPath = "/sms/rest/v2/send"

// İYS filters of a send.
const (
	IYSIndividual    = "11" // commercial, to individuals (BIREYSEL): Netgsm checks İYS
	IYSMerchant      = "12" // commercial, to merchants (TACIR): Netgsm checks İYS
	IYSTransactional = "0"  // not commercial: no İYS check
)

const (
	maxAnswer  = 1 << 20
	maxMessage = 200
)

// Config configures a Provider.
type Config struct {
	// UserCode and Password are the API user's credentials (Basic auth). The password never appears in an
	// error or a log.
	UserCode, Password string
	// Header is the approved sender name (msgheader): up to 11 letters, digits, spaces, dots or dashes,
	// without Turkish letters.
	Header string
	// BaseURL, when set, is where requests go instead of DefaultBaseURL (the sandbox).
	BaseURL string
	// IYSFilter, when set, is sent with every message instead of the one the message asks for
	// (IYSIndividual for a commercial message to BIREYSEL, IYSMerchant to TACIR, IYSTransactional for one
	// that is not commercial).
	IYSFilter string
	// Timeout bounds each HTTP request. Zero means DefaultTimeout.
	Timeout time.Duration
	// Conns is the most requests the process has in flight to the provider at once, for the size of the
	// connection pool (wire.NewTransport); zero means wire.MaxIdleConns.
	Conns int
}

// Provider sends SMS through Netgsm. It is safe for concurrent use.
type Provider struct {
	endpoint   string
	sendURL    *url.URL // endpoint, parsed (Warm)
	reportURL  string
	user, pass string
	secrets    []string // the password as an answer could quote it (secretForms)
	header     string
	filter     string
	client     *http.Client
	timeout    time.Duration
}

// New validates cfg and returns a Provider. Its errors name the environment variable to fix and never
// contain the password.
func New(cfg Config) (*Provider, error) { return build(cfg, true) }

// NewReporter is New for a Provider that only asks for reports (Report): it needs no sender header.
func NewReporter(cfg Config) (*Provider, error) { return build(cfg, false) }

func build(cfg Config, sends bool) (*Provider, error) {
	switch {
	case cfg.UserCode == "":
		return nil, errors.New("netgsm: user code is empty: set NETGSM_USERCODE")
	case cfg.Password == "":
		return nil, errors.New("netgsm: password is empty: set NETGSM_PASSWORD")
	case sends && !validHeader(cfg.Header):
		return nil, fmt.Errorf("netgsm: sender header %q must be 1 to 11 letters (no Turkish letters), digits, spaces, dots or dashes, as approved by BTK: check NETGSM_HEADER", cfg.Header)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("netgsm: timeout %v is negative", cfg.Timeout)
	}
	filter := cfg.IYSFilter
	switch filter {
	case "", IYSIndividual, IYSMerchant, IYSTransactional:
	default:
		return nil, fmt.Errorf("netgsm: İYS filter %q: give 11 (individuals), 12 (merchants) or 0 (transactional)", filter)
	}
	base := cfg.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return nil, errors.New("netgsm: base URL must be http(s)://host[:port]: check NETGSM_BASE_URL")
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	endpoint := strings.TrimSuffix(u.String(), "/") + SendPath
	sendURL, err := url.Parse(endpoint)
	if err != nil {
		return nil, errors.New("netgsm: base URL must be http(s)://host[:port]: check NETGSM_BASE_URL")
	}
	return &Provider{
		endpoint: endpoint, sendURL: sendURL, reportURL: strings.TrimSuffix(u.String(), "/") + ReportPath,
		user: cfg.UserCode, pass: cfg.Password, header: cfg.Header, filter: filter, secrets: secretForms(cfg.UserCode, cfg.Password),
		timeout: timeout,
		client: &http.Client{
			// No Timeout here: Send bounds the request with a deadline on its context (see Send).
			Transport: wire.NewTransport(cfg.Conns),
			// A redirect would send the message (and the credentials) somewhere nobody configured.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

func validHeader(h string) bool {
	if len(h) == 0 || len(h) > 11 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == ' ' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Name returns "netgsm".
func (p *Provider) Name() string { return "netgsm" }

// Warm opens up to n connections to the send endpoint's host, so that the requests about to take their
// rate's tokens do not spend them on a TCP and TLS handshake (providers.Warmer).
func (p *Provider) Warm(ctx context.Context, n int) error {
	return wire.Warm(ctx, p.client.Transport, p.sendURL, n)
}

type message struct {
	Msg string `json:"msg"`
	No  string `json:"no"`
}

type request struct {
	Header    string    `json:"msgheader"`
	Encoding  string    `json:"encoding"`
	IYSFilter string    `json:"iysfilter"`
	Messages  []message `json:"messages"`
}

type answer struct {
	Code        string `json:"code"`
	Description string `json:"description"`
	JobID       string `json:"jobid"`
}

// Takes implements providers.AddressTaker: Netgsm takes Turkish mobile numbers only (Number).
func (p *Provider) Takes(address string) bool {
	_, ok := Number(address)
	return ok
}

// Number turns an E.164 Turkish mobile number (+905321234567) into Netgsm's form (5321234567). It
// reports false for anything else: Netgsm sends to Turkish numbers only.
func Number(e164 string) (string, bool) {
	n, ok := strings.CutPrefix(e164, "+90")
	if !ok || len(n) != 10 || n[0] != '5' {
		return "", false
	}
	for i := 0; i < len(n); i++ {
		if n[i] < '0' || n[i] > '9' {
			return "", false
		}
	}
	return n, true
}

// Send sends m.Body to m.To (E.164). Every error is a *providers.Error, except when ctx is already done on
// entry. The class is:
//   - Transient for 429 and 5xx answers, for codes 80 and 85 (rate limits) and 100, 101 (system error),
//     and for a transport error before the request was written;
//   - Permanent for other refusals: codes 30 (credentials or IP), 40 (unknown header) and 51 (no İYS brand)
//     are about the account; 50 (İYS refuses the recipient), 20 (text) and 70 (parameters) about the
//     message; a number Netgsm cannot take fails before any request;
//   - Ambiguous when the request was written but no answer came back, or an answer said 2xx without a
//     readable code: Netgsm may have taken it.
func (p *Provider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	if err := ctx.Err(); err != nil {
		return providers.Result{}, fmt.Errorf("netgsm send: %w", err)
	}
	no, ok := Number(m.To)
	if !ok {
		return providers.Result{}, &providers.Error{Provider: "netgsm", Class: providers.Permanent,
			Message: "not a Turkish mobile number (+905XXXXXXXXX)"}
	}
	filter := p.filter
	if filter == "" {
		switch {
		case !m.Commercial:
			filter = IYSTransactional
		case m.RecipientType == "TACIR":
			filter = IYSMerchant
		default:
			filter = IYSIndividual
		}
	}
	body, err := json.Marshal(request{Header: p.header, Encoding: "TR", IYSFilter: filter, Messages: []message{{Msg: m.Body, No: no}}})
	if err != nil {
		return providers.Result{}, &providers.Error{Provider: "netgsm", Class: providers.Permanent, Message: "cannot encode the message", Err: err}
	}
	var tr wire.Tracker
	// The timeout is a deadline on the request's context rather than http.Client.Timeout: for a
	// RoundTripper that is not net/http's own (wire's), the client enforces Timeout with a goroutine, a
	// timer and a channel per request. Nothing cancels the request before it (wire.Until: no timer either),
	// and the answer is read below, within it.
	reqCtx := wire.Until(tr.WithTrace(ctx), time.Now().Add(p.timeout))
	resp, data, readErr, err := p.post(reqCtx, p.endpoint, body)
	if errors.Is(err, errBuild) {
		return providers.Result{}, &providers.Error{Provider: "netgsm", Class: providers.Permanent, Message: "cannot build the request: check NETGSM_BASE_URL"}
	}
	if err != nil {
		e := &providers.Error{Provider: "netgsm", Err: p.redactErr(err, m.To), Message: "request not sent", Class: providers.Transient}
		if tr.Written() {
			e.Message, e.Class = "request sent, no answer", providers.Ambiguous
		}
		return providers.Result{}, e
	}
	st := resp.StatusCode
	var a answer
	decoded := readErr == nil && json.Unmarshal(data, &a) == nil && a.Code != ""
	e := &providers.Error{Provider: "netgsm", Status: st}
	if decoded {
		e.Code, _ = strconv.Atoi(a.Code)
		e.Message = p.quote(a.Description, m.To)
	}
	switch {
	case st >= 200 && st <= 299 && decoded && (a.Code == "00" || a.Code == "0"):
		if a.JobID == "" {
			return providers.Result{}, &providers.Error{Provider: "netgsm", Status: st, Class: providers.Ambiguous, Message: "accepted without a job ID"}
		}
		// Netgsm does not say; the count is the engine's own (its "TR" encoding may fit more in a part).
		_, segments := providers.SMSSegments(m.Body)
		return providers.Result{MessageID: a.JobID, Segments: segments}, nil
	case st == http.StatusTooManyRequests || st >= 500:
		e.Class = providers.Transient
		e.RetryAfter = wire.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	case st >= 200 && st <= 299 && !decoded:
		e.Class, e.Message = providers.Ambiguous, "answer without a readable code"
	case st >= 300 && st <= 399:
		e.Class, e.Message = providers.Permanent, "unexpected redirect: check NETGSM_BASE_URL"
	case !decoded:
		e.Class = providers.Permanent
	default:
		switch e.Code {
		case 80:
			e.Class, e.Throttled = providers.Transient, true
		case 85:
			// More than 20 messages to the number within a minute: that number waits out the minute; the
			// account's pace is not at fault.
			e.Class, e.RecipientLimited = providers.Transient, true
			e.RetryAfter = max(e.RetryAfter, time.Minute)
		case 100, 101:
			e.Class = providers.Transient
		case 50:
			// İYS-controlled sending not allowed: Netgsm asked İYS, which holds no consent for the number.
			e.Class, e.NoConsent = providers.Permanent, true
		case 30, 40, 51:
			e.Class, e.Account = providers.Permanent, true
			e.Message = wire.Join(e.Message, map[int]string{30: "check NETGSM_USERCODE, NETGSM_PASSWORD and the API IP allow-list",
				40: "check NETGSM_HEADER (the sender header must be approved)", 51: "register the brand with İYS on Netgsm"}[e.Code])
		default:
			e.Class = providers.Permanent
		}
	}
	if readErr != nil {
		e.Err = p.redactErr(readErr, m.To)
	}
	return providers.Result{}, e
}

// secretForms are the spellings of the password an answer could quote: as it is, upper and lower case,
// URL- and HTML-escaped, and inside the Basic credentials (base64 of user:password), the longest first.
func secretForms(user, pass string) []string {
	forms := []string{pass, strings.ToUpper(pass), strings.ToLower(pass), url.QueryEscape(pass), url.PathEscape(pass),
		html.EscapeString(pass), base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))}
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(forms)
}

// errBuild is post's error for a request it could not build (the endpoint is not a URL).
var errBuild = errors.New("cannot build the request")

// post sends body as JSON to url with the account's Basic auth, within ctx, and returns the answer (its
// body closed), up to maxAnswer bytes of its body, and readErr when the body could not all be read; err
// when no answer came (errBuild when there was no request to send).
func (p *Provider) post(ctx context.Context, url string, body []byte) (resp *http.Response, data []byte, readErr, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, nil, errBuild
	}
	req.SetBasicAuth(p.user, p.pass)
	req.Header.Set("Content-Type", "application/json")
	if resp, err = p.client.Do(req); err != nil {
		return nil, nil, nil, err
	}
	data, readErr = io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	resp.Body.Close()
	return resp, data, readErr, nil
}

// quote is Netgsm's description of an answer as an error may carry it: no secret, no phone number (the
// recipient to in any spelling), and short.
func (p *Provider) quote(description, to string) string {
	return wire.Truncate(providers.ScrubText(p.redact(description, to)), maxMessage)
}

func (p *Provider) redact(s, to string) string {
	for _, f := range p.secrets {
		if f != "" {
			s = strings.ReplaceAll(s, f, "[secret]")
		}
	}
	// Any case at all, as a last resort (Unicode case folding, not only ASCII).
	for i := indexFold(s, p.pass); p.pass != "" && i >= 0; i = indexFold(s, p.pass) {
		s = s[:i] + "[secret]" + s[i+len(p.pass):]
	}
	if to != "" {
		s = strings.ReplaceAll(s, to, "[to]")
		if no, ok := Number(to); ok {
			s = providers.MaskDigits(s, no)
		}
	}
	return s
}

// indexFold is the index of sub in s under Unicode case folding, -1 when it is not there; the match has
// sub's length in bytes (a fold that changes the length is not looked for).
func indexFold(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

func (p *Provider) redactErr(err error, to string) error {
	return wire.Redacted(providers.ScrubSecrets(p.redact(err.Error(), to)), err)
}
