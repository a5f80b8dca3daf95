package sendgrid

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sendgrid/rest"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// maxReasons bounds how many of SendGrid's errors go into Error.Message.
const maxReasons = 5

// errorBody is SendGrid's error answer: {"errors":[{"message","field","help"}],"id"}.
type errorBody struct {
	Errors []struct {
		Message string  `json:"message"`
		Field   *string `json:"field"`
	} `json:"errors"`
}

// statusError classifies an answer with a non-2xx status. readErr is set when its body could not be read
// in full; the status alone then decides.
func (p *Provider) statusError(resp *rest.Response, readErr error, ms []providers.Message, now time.Time) error {
	status := resp.StatusCode
	e := &providers.Error{Provider: "sendgrid", Status: status, Class: classOfStatus(status)}
	// SendGrid's text may quote any recipient of the request, or its audience values: phone numbers too.
	e.Message = providers.MaskPhoneLike(p.redact(reasons(resp.Body), ms))
	if readErr != nil {
		e.Err = p.redactErr(readErr, ms)
	}
	h := http.Header(resp.Headers)
	switch {
	case status == http.StatusTooManyRequests:
		e.RetryAfter = rateLimitReset(h.Get("X-RateLimit-Reset"), now)
	case status >= 500:
		e.RetryAfter = retryAfter(h.Get("Retry-After"), now)
	case status >= 300 && status <= 399:
		e.Message = "unexpected redirect: check SENDGRID_BASE_URL"
	case status == http.StatusNotFound && e.Message == "":
		e.Message = "not found: check SENDGRID_BASE_URL"
	}
	if e.Message == "" {
		e.Message = strings.ToLower(http.StatusText(status))
	}
	return e
}

// transportError classifies a request that got no answer: what matters is whether it left.
func (p *Provider) transportError(tr *wire.Tracker, err error, ms []providers.Message) error {
	e := &providers.Error{Provider: "sendgrid", Err: p.redactErr(err, ms), Message: "request not sent", Class: providers.Transient}
	if tr.Written() {
		e.Message, e.Class = "request sent, no answer", providers.Ambiguous
	}
	return e
}

// classOfStatus classifies an error answer: rate limits and server errors may be retried, any other
// answer is SendGrid refusing this request (or this configuration) for good.
func classOfStatus(status int) providers.Class {
	if status == http.StatusTooManyRequests || status >= 500 {
		return providers.Transient
	}
	return providers.Permanent
}

// reasons joins SendGrid's error messages, each prefixed with its field when it names one:
// "personalizations.0.to.0.email: Does not contain a valid address.". "" when the body is not SendGrid's.
func reasons(body string) string {
	var eb errorBody
	if json.Unmarshal([]byte(body), &eb) != nil {
		return ""
	}
	var parts []string
	for i, e := range eb.Errors {
		if i == maxReasons {
			parts = append(parts, "and "+strconv.Itoa(len(eb.Errors)-maxReasons)+" more")
			break
		}
		s := strings.TrimSpace(e.Message)
		if e.Field != nil && *e.Field != "" {
			s = *e.Field + ": " + s
		}
		if s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ")
}

// rateLimitReset turns X-RateLimit-Reset (Unix seconds) into the wait from now until then, at least a
// second; 0 when the header is absent or invalid.
func rateLimitReset(v string, now time.Time) time.Duration {
	sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || sec <= 0 {
		return 0
	}
	d := time.Unix(sec, 0).Sub(now)
	if d < time.Second {
		return time.Second
	}
	return d
}

// retryAfter reads a Retry-After header, in seconds or as an HTTP date; 0 when absent or invalid.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		return time.Duration(max(s, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// addressLike matches anything shaped like an e-mail address; SendGrid's messages quote them ("We found
// the first duplicate instance of [a@b.example] in the personalizations.1.to field").
var addressLike = regexp.MustCompile(`[^\s@"'<>()\[\]{},;:]+@[^\s@"'<>()\[\]{},;:]+`)

// redact removes the API key and every address (the recipients' above all) from a text that came from
// SendGrid or from the transport.
func (p *Provider) redact(s string, ms []providers.Message) string {
	if s == "" {
		return s
	}
	s = strings.ReplaceAll(s, p.key, "[api key]")
	for _, m := range ms {
		if m.To != "" {
			s = strings.ReplaceAll(s, m.To, "[to]")
		}
	}
	return providers.ScrubSecrets(addressLike.ReplaceAllString(s, "[address]"))
}

// redactErr wraps err so that its text is redacted; errors.Is and errors.As still see err.
func (p *Provider) redactErr(err error, ms []providers.Message) error {
	return wire.Redacted(p.redact(err.Error(), ms), err)
}
