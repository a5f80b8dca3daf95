// Package sendgrid sends e-mail through SendGrid's v3 Mail Send API with the official sendgrid-go SDK and
// turns every failure into a *providers.Error whose Class tells the engine whether to retry, give up, or
// hold the recipients as unknown.
//
// One request carries up to 1000 messages, one personalization each. sendgrid-go's Client writes the body
// into the shared struct on every send and so is not safe for concurrent use, and its default HTTP
// client has no timeout; this package therefore builds a fresh rest.Request per call with
// sendgrid.GetRequest and sends it through one shared rest.Client whose http.Client has a timeout and a
// RoundTripper that bounds the answer. Each request carries in its context (rest.Client sends it with the
// context it is given) its own wire.Tracker, which follows it with net/http/httptrace to know whether it
// was written before a transport error. The request's body is the one sendgrid-go's helpers and
// mail.GetRequestBody make, written directly (body.go) without the helpers' maps and encoding/json's
// reflection.
package sendgrid

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/mail"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/sendgrid/rest"
	sg "github.com/sendgrid/sendgrid-go"
	sgmail "github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// DefaultBaseURL is SendGrid's global API host.
const DefaultBaseURL = "https://api.sendgrid.com"

// DefaultTimeout bounds one HTTP request when Config.Timeout is zero. A request of 1000 personalizations
// is a few megabytes, and SendGrid answers it in well under a second.
const DefaultTimeout = 30 * time.Second

// maxBatch is SendGrid's limit of personalizations (and of recipients) per request.
const maxBatch = 1000

// MaxSubstitutionBytes is SendGrid's limit on the substitutions of one personalization, counted as the
// bytes of every key and value. A multi-message request carries each recipient's rendered text there.
const MaxSubstitutionBytes = 10000

// The substitution tags that stand for each recipient's own rendered text in a multi-message request.
const (
	textTag = "-campaignctl_text-"
	htmlTag = "-campaignctl_html-"
)

const sendPath = "/v3/mail/send"

// Config configures a Provider. The zero value of FromName, BaseURL and Timeout means the default; APIKey
// and From are required. cmd fills it from SENDGRID_API_KEY, SENDGRID_FROM and SENDGRID_BASE_URL.
type Config struct {
	// APIKey is the API key with the Mail Send permission (Authorization: Bearer). It never appears in an
	// error or a log.
	APIKey string
	// From is the sender's address, a Verified Sender or an address of an authenticated domain.
	From string
	// FromName is the sender's display name; empty means none.
	FromName string
	// BaseURL is the scheme://host[:port] of the API: DefaultBaseURL when empty,
	// https://api.eu.sendgrid.com for EU subusers, the sandbox in tests.
	BaseURL string
	// Timeout bounds each HTTP request, from dialling to reading the body. Zero means DefaultTimeout.
	Timeout time.Duration
	// Conns is the most requests the process has in flight to the provider at once, for the size of the
	// connection pool (wire.NewTransport); zero means wire.MaxIdleConns.
	Conns int
}

// Provider sends e-mail through SendGrid. It implements providers.Batcher and is safe for concurrent use.
type Provider struct {
	key     string
	from    *sgmail.Email
	baseURL string
	sendURL *url.URL     // baseURL and the Mail Send path, parsed (Warm)
	client  *rest.Client // shared: it holds only the *http.Client
	// bodies holds request body buffers (*[]byte) for the next requests: a request of 1000
	// personalizations is half a megabyte, which would be allocated, zeroed and collected each time. A
	// buffer comes back only once net/http has read the whole body from it (wire.Tracker.Settled).
	bodies sync.Pool
}

// maxPooledBody is the largest body buffer kept for another request: requests of a thousand copies of a
// newsletter are rare, and their buffers are left to the collector.
const maxPooledBody = 4 << 20

var _ providers.Batcher = (*Provider)(nil)

// New validates cfg and returns a Provider. Its errors name the environment variable to fix and never
// contain the API key.
func New(cfg Config) (*Provider, error) {
	switch {
	case cfg.APIKey == "":
		return nil, errors.New("sendgrid: API key is empty: set SENDGRID_API_KEY")
	case !isHeaderToken(cfg.APIKey):
		return nil, errors.New("sendgrid: API key contains spaces or control characters: check SENDGRID_API_KEY")
	case cfg.From == "":
		return nil, errors.New("sendgrid: sender is empty: set SENDGRID_FROM to the verified sender's e-mail address")
	case !isAddress(cfg.From):
		return nil, fmt.Errorf("sendgrid: sender %q is not a plain ASCII e-mail address: check SENDGRID_FROM", cfg.From)
	case strings.ContainsFunc(cfg.FromName, unicode.IsControl):
		return nil, errors.New("sendgrid: the sender's name holds a line break or another control character, which would write a header of its own: check SENDGRID_FROM_NAME")
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("sendgrid: timeout %v is negative", cfg.Timeout)
	}
	base := DefaultBaseURL
	if cfg.BaseURL != "" {
		u, err := parseBaseURL(cfg.BaseURL)
		if err != nil {
			return nil, err
		}
		base = u
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	hc := &http.Client{
		Transport: &boundingTransport{next: wire.NewTransport(cfg.Conns)},
		Timeout:   timeout,
		// SendGrid does not redirect API calls; following one would resend the mail elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	sendURL, err := url.Parse(base + sendPath)
	if err != nil {
		return nil, errors.New("sendgrid: base URL is not a valid URL: check SENDGRID_BASE_URL")
	}
	return &Provider{
		key:     cfg.APIKey,
		from:    sgmail.NewEmail(cfg.FromName, cfg.From),
		baseURL: base,
		sendURL: sendURL,
		client:  &rest.Client{HTTPClient: hc},
	}, nil
}

// Warm opens up to n connections to the API's host, so that the requests about to take their rate's
// tokens (a request's worth of recipients each) do not spend them on a TCP and TLS handshake
// (providers.Warmer).
func (p *Provider) Warm(ctx context.Context, n int) error {
	if bt, ok := p.client.HTTPClient.Transport.(*boundingTransport); ok {
		return wire.Warm(ctx, bt.next, p.sendURL, n)
	}
	return nil
}

// Name returns "sendgrid".
func (p *Provider) Name() string { return "sendgrid" }

// ReceiptsNameRecipient is true: every personalization carries the custom_args campaign_id and user_id,
// which come back at the top level of each Event Webhook event about it.
func (p *Provider) ReceiptsNameRecipient() bool { return true }

// MaxBatch returns 1000, SendGrid's limit of personalizations per request.
func (p *Provider) MaxBatch() int { return maxBatch }

// Send sends one message: SendBatch with a batch of one.
func (p *Provider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	res, err := p.SendBatch(ctx, []providers.Message{m})
	if err != nil {
		return providers.Result{}, err
	}
	return res[0], nil
}

// SendBatch sends ms in one Mail Send request, one personalization per message: its To, its Subject and
// custom_args campaign_id and user_id (which come back at the top level of every Event Webhook event).
// With a TemplateID, which every message of the batch must share, each personalization carries the
// message's Data as dynamic_template_data. Without one, every recipient gets exactly their own Body (and
// HTML): a single message carries them as the content, and a batch carries them as substitutions of
// shared placeholder content.
//
// On success every result holds the request's X-Message-Id, which prefixes the sg_message_id of the
// events. Every error is a *providers.Error, except when ctx is already done on entry: then nothing was
// sent and the error wraps ctx.Err(). The class is:
//   - Permanent, without sending, for a batch SendGrid would refuse: over 1000 messages, two messages to
//     one address, mixed template IDs, or a message whose text and HTML come to more than 10,000 bytes in
//     a batch of several (alone it is sent as the content, which has no such limit). Status is then 0.
//   - Permanent for 400 (Message has SendGrid's reasons and fields), 401 and 403 (AccountLevel), 404 and
//     any other 4xx but 429, 413 (too large: split the batch) and an unexpected redirect.
//   - Transient for 429 (RetryAfter from X-RateLimit-Reset, at least a second), any 5xx, and a transport
//     error before the request was written (connection refused, DNS, TLS).
//   - Ambiguous when the request was written but no answer came back (timeout, connection reset, EOF):
//     SendGrid may have accepted the mail.
//
// Error texts never contain the API key or a recipient's address.
func (p *Provider) SendBatch(ctx context.Context, ms []providers.Message) ([]providers.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sendgrid send: %w", err)
	}
	if len(ms) == 0 {
		return nil, nil
	}
	l, err := plan(ms)
	if err != nil {
		return nil, err
	}
	req := sg.GetRequest(p.key, sendPath, p.baseURL)
	req.Method = rest.Post
	buf, _ := p.bodies.Get().(*[]byte)
	if size := bodySize(ms, l); buf == nil || cap(*buf) < size {
		b := make([]byte, 0, size)
		buf = &b
	}
	req.Body = appendBody((*buf)[:0], p.from, ms, l)

	var tr wire.Tracker
	defer func() {
		if cap(req.Body) <= maxPooledBody && tr.Settled() {
			*buf = req.Body[:0]
			p.bodies.Put(buf)
		}
	}()
	resp, err := p.client.SendWithContext(tr.WithTrace(ctx), req)
	if resp == nil || resp.StatusCode == 0 {
		if err == nil {
			err = errors.New("no response")
		}
		return nil, p.transportError(&tr, err, ms)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, p.statusError(resp, err, ms, time.Now())
	}
	// A 2xx whose (empty) body could not be read is still an acceptance: the status and the id came first.
	id := http.Header(resp.Headers).Get("X-Message-Id")
	out := make([]providers.Result, len(ms))
	for i := range out {
		out[i].MessageID = id
	}
	return out, nil
}

// sharedOf returns the content every message of ms shares (providers.Message.Shared) when the request can
// carry it once with each recipient's values as substitutions, or nil: then each recipient's rendered
// text and HTML are the substitutions. It can when every message has the same Shared with a value for each
// tag, no value holds the tags' prefix (a value is never mistaken for a tag), and each recipient's values
// fit SendGrid's limit.
func sharedOf(ms []providers.Message) *providers.Shared {
	shared := ms[0].Shared
	if shared == nil || shared.Text == "" {
		return nil
	}
	for i := range ms {
		m := &ms[i]
		// SendGrid substitutes in the subject too: a subject that holds the prefix goes without tags.
		if m.Shared != shared || len(m.Values) != len(shared.Tags) || strings.Contains(m.Subject, providers.SharedTagPrefix) {
			return nil
		}
		n := 0
		for i, v := range m.Values {
			if strings.Contains(v, providers.SharedTagPrefix) {
				return nil
			}
			n += len(shared.Tags[i]) + len(v)
		}
		if n > MaxSubstitutionBytes {
			return nil
		}
	}
	return shared
}

// substitutionSize is what the substitutions of a message of text and HTML weigh against
// MaxSubstitutionBytes.
func substitutionSize(text, html string, withHTML bool) int {
	n := len(textTag) + len(text)
	if withHTML {
		n += len(htmlTag) + len(htmlOf(text, html))
	}
	return n
}

// htmlOf is the HTML part of a message of text and HTML in a request where other messages have one.
// Content is shared by the whole request, so a message without HTML still gets an HTML part; an empty one
// would show a blank mail in clients that prefer HTML, so it gets its text, escaped, with its line breaks
// kept.
func htmlOf(text, htmlPart string) string {
	if htmlPart != "" || text == "" {
		return htmlPart
	}
	return `<div style="white-space: pre-wrap">` + html.EscapeString(text) + `</div>`
}

// refuse is the Permanent error for a request SendGrid would refuse as a whole; nothing was sent.
func refuse(msg string) *providers.Error {
	return &providers.Error{Provider: "sendgrid", Class: providers.Permanent, Message: msg}
}

func parseBaseURL(raw string) (string, error) {
	u, err := providers.ParseBaseURL("sendgrid", "SENDGRID_BASE_URL", raw, false)
	if err != nil {
		return "", err
	}
	return u.Scheme + "://" + u.Host, nil
}

// isHeaderToken reports whether s can travel in the Authorization header as it is: printable ASCII
// without spaces.
func isHeaderToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// isAddress reports whether s is a bare ASCII e-mail address (SendGrid refuses Unicode in from).
func isAddress(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	a, err := mail.ParseAddress(s)
	return err == nil && a.Address == s && a.Name == ""
}
