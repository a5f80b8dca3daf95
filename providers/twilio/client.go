package twilio

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"time"

	"github.com/twilio/twilio-go/client"

	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// The recorder is also the client twilio-go sends through (client.BaseClient, the SDK's place for a
// client of one's own): the SDK still builds the request's URL and form and decodes the answer, and the
// recorder sends it. What it leaves out of twilio-go's own client.Client is work a Send repeated for
// nothing: checking the credentials with a regular expression (New checked them once), encoding the Basic
// credentials twice, parsing the URL three times, and net/http's Client around a transport that already
// bounds the request.

// userAgent is the User-Agent twilio-go's own client sends, spelled the same way.
var userAgent = fmt.Sprintf("twilio-go/%s (%s %s) go/%s", client.LibraryVersion, runtime.GOOS, runtime.GOARCH, runtime.Version())

// basicAuth is the Authorization header of an account SID and auth token.
func basicAuth(sid, token string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(sid+":"+token))
}

// messagesURL returns rawURL, the SDK's URL of the Messages resource, parsed and pointed at the
// configured host. The SDK builds the same URL for every message of an account: it is parsed once.
func (p *Provider) messagesURL(rawURL string) (*url.URL, error) {
	if c := p.lastURL.Load(); c != nil && c.raw == rawURL {
		u := c.u
		return &u, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if t := p.target; t != nil {
		u.Scheme, u.Host = t.Scheme, t.Host
	}
	p.lastURL.Store(&parsedURL{raw: rawURL, u: *u})
	return u, nil
}

// parsedURL is a URL as the SDK built it and as it is sent.
type parsedURL struct {
	raw string
	u   url.URL
}

// AccountSid is the account the SDK puts in the request path.
func (r *recorder) AccountSid() string { return r.p.accountSID }

// SetTimeout does nothing: Config.Timeout bounds each request (see do).
func (r *recorder) SetTimeout(time.Duration) {}

// SetOauth does nothing: the Messages API is called with the account's Basic credentials.
func (r *recorder) SetOauth(client.OAuth) {}

// OAuth returns nil: no OAuth.
func (r *recorder) OAuth() client.OAuth { return nil }

// SendRequest sends what the SDK built, a form POST, to the configured host with the account's
// credentials, and gives the SDK what its own client would: the answer of a 2xx or 3xx status, and the
// *client.TwilioRestError of any other (or the error that kept it from being decoded).
func (r *recorder) SendRequest(method, rawURL string, data url.Values, headers map[string]any, body ...byte) (*http.Response, error) {
	if method != http.MethodPost || len(body) > 0 {
		// CreateMessage posts a form; nothing else goes through this client.
		return nil, fmt.Errorf("twilio: this adapter sends only the form POST of a message, not %s with a body of %d bytes", method, len(body))
	}
	u, err := r.p.messagesURL(rawURL)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(r.WithTrace(wire.Until(context.Background(), time.Now().Add(r.p.timeout))), method, "", bytes.NewReader(wire.AppendForm(nil, data)))
	if err != nil {
		return nil, err
	}
	req.URL, req.Host = u, u.Host
	req.Header["Authorization"] = []string{r.p.auth}
	req.Header["User-Agent"] = []string{userAgent}
	for k, v := range headers {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		req.Header.Add(k, s)
	}
	resp, err := r.do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 400 {
		return resp, nil
	}
	defer resp.Body.Close()
	te := &client.TwilioRestError{}
	if err := json.NewDecoder(resp.Body).Decode(te); err != nil {
		return nil, fmt.Errorf("error decoding the response for an HTTP error code: %d: %w", resp.StatusCode, err)
	}
	return nil, te
}
