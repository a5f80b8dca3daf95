package twilio

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/nyaruka/phonenumbers"
	"github.com/twilio/twilio-go/client"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// Codes twilio-go raises itself, before any request, when a credential is not alphanumeric. New rejects
// such credentials, so these show up only if that check and the SDK's ever disagree.
const (
	codeBadUsername = 21222
	codeBadPassword = 21224
	codeTooMany     = 20429
	// codeQueueFull: the sender's queue holds more than 10 hours of messages; slow down and retry.
	codeQueueFull = 21611
	// codeOptedOut: the recipient replied STOP to the sender; Twilio sends them nothing more.
	codeOptedOut = 21610
)

// classify turns a failed CreateMessage into a *providers.Error, reading what the SDK does not keep (the
// HTTP status, Retry-After, whether the request was written) from the call's recorder.
func (p *Provider) classify(rec *recorder, err error, to string) error {
	status, retryAfter := rec.answer()
	e := &providers.Error{Provider: "twilio", Status: status}
	var te *client.TwilioRestError
	switch {
	case errors.As(err, &te) && status == 0 && !rec.Connected() &&
		(te.Code == codeBadUsername || te.Code == codeBadPassword):
		e.Code, e.Message, e.Class = te.Code, te.Message, providers.Permanent
		return e
	case errors.As(err, &te):
		// Twilio's JSON error body. The SDK takes Status from the body; the status line is the truth.
		if e.Status == 0 {
			e.Status = te.Status
		}
		e.Code = te.Code
		e.Message = p.redact(te.Message, to, true)
		e.Class = classOfStatus(e.Status, e.Code)
		e.OptedOut = e.Code == codeOptedOut && e.Class == providers.Permanent
	case status != 0:
		// An answer the SDK could not decode: an HTML 5xx from a proxy, or a body cut short.
		e.Message = "undecodable response"
		e.Err = p.redactErr(err, to)
		e.Class = classOfStatus(status, 0)
		switch {
		case status >= 200 && status <= 299:
			// Twilio created the message but we could not read which one.
			e.Message = "created, but the response could not be read"
			e.Class = providers.Ambiguous
		case status >= 300 && status <= 399:
			e.Message = "unexpected redirect: check TWILIO_BASE_URL"
		}
	default:
		// No answer at all: what matters is whether the request left.
		e.Err = p.redactErr(err, to)
		e.Message, e.Class = "request not sent", providers.Transient
		if rec.Written() {
			e.Message, e.Class = "request sent, no answer", providers.Ambiguous
		}
	}
	if e.Class == providers.Transient {
		e.RetryAfter = wire.ParseRetryAfter(retryAfter, time.Now())
	}
	return e
}

// classOfStatus classifies an error answer: rate limits and server errors may be retried, any other
// answer is Twilio refusing this message (or this configuration) for good.
func classOfStatus(status, code int) providers.Class {
	switch {
	case status == http.StatusTooManyRequests || code == codeTooMany || code == codeQueueFull:
		return providers.Transient
	case status >= 500:
		return providers.Transient
	default:
		return providers.Permanent
	}
}

// redact removes the recipient (and, in Twilio's own messages, anything shaped like a phone number) and
// the auth token from a text that came from the SDK or from Twilio. Transport error texts are spared the
// pattern: their URLs carry the account SID, whose digits it would mangle.
func (p *Provider) redact(s, to string, fromTwilio bool) string {
	if p.token != "" {
		s = strings.ReplaceAll(s, p.token, "[token]")
	}
	if to != "" {
		s = strings.ReplaceAll(s, to, "[to]")
		if bare := strings.TrimPrefix(to, "+"); len(bare) >= 6 {
			s = strings.ReplaceAll(s, bare, "[to]")
		}
	}
	if fromTwilio {
		s = providers.MaskPhoneLike(s)
		if n, err := phonenumbers.Parse(to, ""); err == nil && to != "" {
			s = providers.MaskDigits(s, phonenumbers.GetNationalSignificantNumber(n)) // "0532.123.45.67"
		}
	}
	// The Basic credentials as the request carried them (base64), echoed back, and any e-mail address.
	return providers.ScrubSecrets(s)
}

// redactErr wraps err so that its text is redacted; errors.Is and errors.As still see err.
func (p *Provider) redactErr(err error, to string) error {
	return wire.Redacted(p.redact(err.Error(), to, false), err)
}
