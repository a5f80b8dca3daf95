package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The sandbox posts delivery receipts (Twilio status callbacks, receipts.go) and events (SendGrid's
// Event Webhook, sendgrid_events.go) only to this machine: the URL must name "localhost" or a loopback
// IP, the dialer checks the address again after resolution, and no proxy or redirect is followed.

// loopbackTimeout bounds one receipt or event POST, from the dial to the end of the answer.
const loopbackTimeout = 5 * time.Second

// parseLoopbackURL parses raw and accepts it only if it is an http(s) URL whose host is "localhost" or a
// loopback IP. what names the URL in the error ("the SendGrid event URL").
func parseLoopbackURL(what, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New(what + " is not a valid URL")
	}
	if !httpScheme(u) {
		return nil, fmt.Errorf("%s %q is not http(s)", what, u.Redacted())
	}
	if !loopbackHost(u) {
		return nil, fmt.Errorf("%s %q is not on a loopback host: the sandbox posts events only to this machine", what, u.Redacted())
	}
	return u, nil
}

// CheckLoopbackURL says why raw cannot be where the sandbox posts (not http(s), or not on this machine),
// nil when it can; flag names the setting in the error. The sandbox itself only disables what such a URL
// would get (and says so in its stats); a command line refuses it.
func CheckLoopbackURL(flag, raw string) error {
	_, err := parseLoopbackURL(flag, raw)
	return err
}

func httpScheme(u *url.URL) bool { return u.Scheme == "http" || u.Scheme == "https" }

func loopbackHost(u *url.URL) bool {
	host := u.Hostname()
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback() || strings.EqualFold(host, "localhost")
}

// loopbackURL reports whether raw is an http(s) URL whose host is localhost or a loopback IP, with no
// credentials in it. It is asked of every message's status callback, so it builds no error.
func loopbackURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.User == nil && httpScheme(u) && loopbackHost(u)
}

// callbackCheck remembers whether the last status callback URL asked about, up to its query, is one the
// sandbox posts to: a sender names the same endpoint in every request, each with a query of its own (the
// message's campaign and recipient), and the check is then a string comparison, not a parse a message.
type callbackCheck struct {
	last atomic.Pointer[callbackVerdict]
}

type callbackVerdict struct {
	endpoint string
	ok       bool
}

// ok reports loopbackURL(raw), from the last verdict when raw names the same endpoint.
func (c *callbackCheck) ok(raw string) bool {
	// The scheme, any credentials, the host and the path all come before the query or the fragment.
	endpoint := raw
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		endpoint = raw[:i]
	}
	if v := c.last.Load(); v != nil && v.endpoint == endpoint {
		return v.ok
	}
	ok := loopbackURL(endpoint)
	c.last.Store(&callbackVerdict{endpoint: endpoint, ok: ok})
	return ok
}

// loopbackOnly is the dialer's Control: it refuses any address that is not loopback, whatever the host
// name resolved to.
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return errors.New("sandbox: refusing to dial non-loopback " + host)
	}
	return nil
}

// loopbackClient is the HTTP client of receipts and events: it dials loopback addresses only (so a
// "localhost" that resolves elsewhere is refused too) and follows no redirect.
func loopbackClient() *http.Client {
	dialer := &net.Dialer{Timeout: loopbackTimeout, Control: loopbackOnly}
	return &http.Client{
		Timeout: loopbackTimeout,
		Transport: &http.Transport{
			Proxy:               nil, // a proxy would take the posts off this machine
			DialContext:         dialer.DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// postLoopback POSTs body to target through client (a loopbackClient) with the given headers, within
// loopbackTimeout. It reads a bounded part of the answer, so that the connection can be reused, and
// fails unless the answer is a 2xx.
func postLoopback(client *http.Client, target string, header http.Header, body io.Reader) error {
	ctx, cancel := context.WithTimeout(context.Background(), loopbackTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, body)
	if err != nil {
		return err
	}
	req.Header = header
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return answeredError(resp.StatusCode)
	}
	return nil
}

// answeredError is a receiver's answer outside 2xx, its status code.
type answeredError int

func (e answeredError) Error() string { return fmt.Sprintf("receiver answered %d", int(e)) }
