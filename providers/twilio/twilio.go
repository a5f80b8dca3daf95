// Package twilio sends SMS through Twilio's Messages API with the official twilio-go SDK and turns every
// failure into a *providers.Error whose Class tells the engine whether to retry, give up, or hold the
// recipient as unknown.
//
// twilio-go v1.31.0 hard-codes https://api.twilio.com, takes no context and hides the HTTP status and
// headers of an error answer. This package therefore gives the SDK, for each Send, a client of its own
// (client.BaseClient: client.go) that points the request at Config.BaseURL (the sandbox in tests), records
// the status and Retry-After of the answer, and follows the request with net/http/httptrace to know
// whether it was written before a transport error. That per-call state is what makes the classification exact under
// concurrency; the connection pool behind it is shared by all calls.
package twilio

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twilio/twilio-go/client"
	openapi "github.com/twilio/twilio-go/rest/api/v2010"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// DefaultBaseURL is Twilio's REST API.
const DefaultBaseURL = "https://api.twilio.com"

// DefaultTimeout bounds one HTTP request when Config.Timeout is zero; it is twilio-go's own default.
const DefaultTimeout = 10 * time.Second

// Config configures a Provider. The zero value of BaseURL and Timeout means the default; the other fields
// are required. cmd fills it from TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, TWILIO_FROM and TWILIO_BASE_URL.
type Config struct {
	// AccountSID is the account (AC...) the messages are sent from; it is the Basic-auth username and part
	// of the request path. Letters and digits only.
	AccountSID string
	// AuthToken is the account's auth token, the Basic-auth password. Letters and digits only; it never
	// appears in an error or a log.
	AuthToken string
	// From is the sender: an E.164 number (+14155550100) or an alphanumeric sender ID (up to 11 letters,
	// digits or spaces, at least one letter).
	From string
	// BaseURL, when set, is the scheme://host[:port] every request is sent to instead of Twilio's (the
	// sandbox). Empty means DefaultBaseURL, with twilio-go's TWILIO_EDGE and TWILIO_REGION honoured.
	BaseURL string
	// Timeout bounds each HTTP request, from dialling to reading the body. Zero means DefaultTimeout.
	Timeout time.Duration
	// Conns is the most requests the process has in flight to the provider at once, for the size of the
	// connection pool (wire.NewTransport); zero means wire.MaxIdleConns.
	Conns int
	// RootCAs, when set, are the certificate authorities trusted for the provider's TLS certificate
	// instead of the system's: a sandbox or a gateway served over https with a certificate of its own.
	RootCAs *x509.CertPool
	// StatusCallback, when set, is the URL Twilio posts delivery receipts to (`campaignctl webhooks`);
	// each message's callback carries its campaign and user as query parameters.
	StatusCallback string
}

// Provider sends SMS through Twilio. It is safe for concurrent use.
type Provider struct {
	accountSID string
	token      string
	from       string
	// callback is the status callback URL ready for a message's campaign and user (callbackPrefix); ""
	// when none is configured.
	callback string
	// callbackEnd is the status callback URL's fragment with its "#" (Twilio's connection overrides, such
	// as #rc=3&rp=5xx,ct: retries of the callbacks), after the message's parameters; "" when it has none.
	callbackEnd string
	auth        string   // the Basic Authorization header of AccountSID and AuthToken
	target      *url.URL // nil: leave the SDK's URL alone
	edge        string
	region      string
	timeout     time.Duration
	transport   http.RoundTripper
	lastURL     atomic.Pointer[parsedURL] // the last Messages URL the SDK gave, parsed
	warmURL     *url.URL                  // the Messages URL as the SDK builds it and as it is sent, for Warm
}

// New validates cfg and returns a Provider. Its errors name the environment variable to fix and never
// contain the auth token.
func New(cfg Config) (*Provider, error) {
	switch {
	case cfg.AccountSID == "":
		return nil, errors.New("twilio: account SID is empty: set TWILIO_ACCOUNT_SID")
	case !isAlnum(cfg.AccountSID):
		return nil, errors.New("twilio: account SID must contain only letters and digits: check TWILIO_ACCOUNT_SID")
	case cfg.AuthToken == "":
		return nil, errors.New("twilio: auth token is empty: set TWILIO_AUTH_TOKEN")
	case !isAlnum(cfg.AuthToken):
		// twilio-go refuses such a token locally (code 21224) before every request.
		return nil, errors.New("twilio: auth token must contain only letters and digits: check TWILIO_AUTH_TOKEN")
	case cfg.From == "":
		return nil, errors.New("twilio: sender is empty: set TWILIO_FROM to an E.164 number or an alphanumeric sender ID")
	case !isE164(cfg.From) && !isSenderID(cfg.From):
		return nil, fmt.Errorf("twilio: sender %q is neither an E.164 number nor an alphanumeric sender ID of up to 11 letters, digits or spaces: check TWILIO_FROM", cfg.From)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("twilio: timeout %v is negative", cfg.Timeout)
	}
	callback, callbackEnd, err := callbackPrefix(cfg.StatusCallback)
	if err != nil {
		return nil, err
	}
	p := &Provider{
		accountSID:  cfg.AccountSID,
		token:       cfg.AuthToken,
		from:        cfg.From,
		callback:    callback,
		callbackEnd: callbackEnd,
		auth:        basicAuth(cfg.AccountSID, cfg.AuthToken),
		timeout:     cfg.Timeout,
		transport:   wire.NewTransport(cfg.Conns),
	}
	if cfg.RootCAs != nil {
		p.transport.(*wire.Transport).TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs}
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	if cfg.BaseURL != "" {
		u, err := parseBaseURL(cfg.BaseURL)
		if err != nil {
			return nil, err
		}
		p.target = u
	} else {
		p.edge, p.region = os.Getenv("TWILIO_EDGE"), os.Getenv("TWILIO_REGION")
	}
	raw, err := (&client.RequestHandler{Edge: p.edge, Region: p.region}).BuildUrl(DefaultBaseURL + "/2010-04-01/Accounts/" + p.accountSID + "/Messages.json")
	if err == nil {
		p.warmURL, err = p.messagesURL(raw)
	}
	if err != nil {
		return nil, errors.New("twilio: the Messages URL cannot be built: check TWILIO_EDGE and TWILIO_REGION")
	}
	return p, nil
}

// PacesSegments says that Twilio's throughput (messages per second of an account or a sender) counts
// segments: a three-segment message takes three of them.
func (p *Provider) PacesSegments() bool { return true }

// ReceiptsNameRecipient says whether the status callbacks of this provider's messages name their
// campaign and user: they do when Config.StatusCallback is set (the worker sets it on each message, with
// campaign_id and user_id in its query). Without one, the only receipts are those of a callback set on
// the account or a Messaging Service, which name the message SID alone.
func (p *Provider) ReceiptsNameRecipient() bool { return p.callback != "" }

// Name returns "twilio".
func (p *Provider) Name() string { return "twilio" }

// Send sends m.Body to m.To from Config.From. It returns the message SID and Twilio's segment count.
//
// Every error is a *providers.Error, except when ctx is already done on entry: then nothing was sent
// and the error wraps ctx.Err(). The class is:
//   - Transient for 429 (code 20429, with RetryAfter from Retry-After), any 5xx (JSON or not), and a
//     transport error before the request was written (connection refused, DNS, TLS);
//   - Permanent for any other 4xx (21211, 21408, 21606, 21608, 21610, 21614, 21635, 20003 ...), for an
//     unexpected redirect, and for credentials twilio-go rejects locally (21222, 21224);
//   - Ambiguous when the request was written but no usable answer came back (timeout, connection reset,
//     a 2xx whose body could not be read): Twilio may have accepted the message.
//
// twilio-go cannot cancel a request in flight, and Send does not try to: cancelling after the write would
// only turn a known outcome into an ambiguous one. Config.Timeout bounds how long Send can take (plus at
// most a second, in the rare case that net/http is still reporting a write when the timeout fires).
//
// m.CampaignID and m.UserID are not sent: the Messages API has no metadata field.
func (p *Provider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	if err := ctx.Err(); err != nil {
		return providers.Result{}, fmt.Errorf("twilio send: %w", err)
	}
	rt := &recorder{p: p}
	api := openapi.NewApiService(&client.RequestHandler{Client: rt, Edge: p.edge, Region: p.region})

	params := &openapi.CreateMessageParams{}
	params.SetTo(m.To)
	params.SetFrom(p.from)
	params.SetBody(m.Body)
	if p.callback != "" {
		params.SetStatusCallback(p.callbackURL(m))
	}
	msg, err := api.CreateMessage(params)
	if err != nil {
		return providers.Result{}, p.classify(rt, err, m.To)
	}
	status, _ := rt.answer()
	if status < 200 || status > 299 {
		return providers.Result{}, &providers.Error{
			Provider: "twilio", Status: status, Class: providers.Permanent,
			Message: "unexpected status " + strconv.Itoa(status) + ": check TWILIO_BASE_URL",
		}
	}
	if msg.Sid == nil || *msg.Sid == "" {
		// The message was created but we cannot name it; sending again could deliver it twice.
		return providers.Result{}, &providers.Error{
			Provider: "twilio", Status: status, Class: providers.Ambiguous,
			Message: "response has no message sid",
		}
	}
	res := providers.Result{MessageID: *msg.Sid}
	if msg.NumSegments != nil {
		// A Messaging Service answers "0" until it picks a sender; 0 means unknown to the caller too.
		res.Segments, _ = strconv.Atoi(*msg.NumSegments)
	}
	return res, nil
}

// Warm opens up to n connections to the host messages go to, so that the requests about to take their
// rate's tokens do not spend them on a TCP and TLS handshake (providers.Warmer). The URL is the one the
// SDK builds for a message of the account (its edge and region included), pointed at Config.BaseURL.
func (p *Provider) Warm(ctx context.Context, n int) error {
	return wire.Warm(ctx, p.transport, p.warmURL, n)
}

func parseBaseURL(raw string) (*url.URL, error) {
	u, err := providers.ParseBaseURL("twilio", "TWILIO_BASE_URL", raw, false)
	if err != nil {
		return nil, err
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, nil
}

// isE164 reports whether s is "+" and 2 to 15 digits, the first not 0.
func isE164(s string) bool {
	if len(s) < 3 || len(s) > 16 || s[0] != '+' || s[1] == '0' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// isSenderID reports whether s is an alphanumeric sender ID: 1 to 11 ASCII letters, digits and spaces,
// with at least one letter (an all-digit ID would be taken for a number).
func isSenderID(s string) bool {
	if len(s) == 0 || len(s) > 11 {
		return false
	}
	letter := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case isLetter(c):
			letter = true
		case isDigit(c), c == ' ':
		default:
			return false
		}
	}
	return letter
}

func isAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isLetter(s[i]) && !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool  { return '0' <= c && c <= '9' }

// callbackURL adds the message's campaign and user to the status callback URL, so a receipt names its
// recipient even before the message's SID is recorded. The URL's own part is parsed once (New).
func (p *Provider) callbackURL(m providers.Message) string {
	u := p.callback + "campaign_id=" + strconv.FormatInt(m.CampaignID, 10) + "&user_id=" + url.QueryEscape(m.UserID)
	if m.CampaignNonce != "" {
		u += "&campaign_nonce=" + url.QueryEscape(m.CampaignNonce)
	}
	return u + p.callbackEnd
}

// callbackPrefix is the status callback URL with its own query (less any campaign_id and user_id) and the
// separator the message's parameters follow, and its fragment with the "#" (Twilio's connection
// overrides: Twilio retries a callback only as they say, and does not send them); "" when base is empty.
func callbackPrefix(base string) (prefix, end string, err error) {
	if base == "" {
		return "", "", nil
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The parse error quotes the input, which could carry a secret in its query; say only what is wrong.
		return "", "", errors.New("twilio: status callback is not an http(s) URL: check TWILIO_STATUS_CALLBACK (the public address of `campaignctl webhooks`, e.g. https://hooks.example.com/twilio/status)")
	}
	q := u.Query()
	q.Del("campaign_id")
	q.Del("user_id")
	q.Del("campaign_nonce")
	if u.Fragment != "" {
		end = "#" + u.EscapedFragment()
	}
	u.RawQuery, u.Fragment, u.RawFragment = q.Encode(), "", ""
	if u.RawQuery == "" {
		return u.String() + "?", end, nil
	}
	return u.String() + "&", end, nil
}
