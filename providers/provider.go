// Package providers defines the one interface every delivery provider (Twilio, SendGrid, push, webhook)
// implements, and the typed error that tells the engine whether a failed call may be retried, must not be,
// or left the message in an unknown state.
//
// Providers never import the campaign or worker packages: they take a Message and return a Result.
package providers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Message is one message to one recipient.
type Message struct {
	// To is the canonical address: E.164 phone for SMS, lower-case e-mail, push token.
	To string
	// Subject is the e-mail subject; other channels ignore it.
	Subject string
	// Body is the rendered message text (for e-mail, the plain-text part).
	Body string
	// HTML is the rendered HTML part of an e-mail ("" for none).
	HTML string
	// TemplateID names a template kept at the provider (a SendGrid dynamic template "d-..."); Data is then
	// its data. Push uses Data as the message's data payload.
	TemplateID string
	Data       map[string]string
	// Shared, when set, is content the message shares with the other messages of its campaign (the same
	// pointer for all of them), with a tag where each recipient's value goes, and Values are this
	// message's values for its Tags, in order. A provider that sends many messages in one request may send
	// Shared once and each recipient's values (SendGrid's substitutions) instead of every rendered text.
	// Body and HTML are then left empty (a thousand copies of a newsletter are not kept for a request that
	// carries one): Parts puts Values in for Tags, which gives the rendered text and HTML byte for byte.
	Shared *Shared
	Values []string
	// CampaignID and UserID travel to the provider as metadata where it supports that (never PII), and so
	// does CampaignNonce, which tells the campaign from another of the same ID (a database re-created,
	// another engine on the same provider account): its receipts name it back.
	CampaignID    int64
	UserID        string
	CampaignNonce string
	// Commercial says the message needs İYS consent (a providers' own İYS check, as Netgsm's, is asked
	// for); RecipientType is the İYS recipient type of the campaign, BIREYSEL or TACIR.
	Commercial    bool
	RecipientType string
	// ListUnsubscribe is the List-Unsubscribe header of a commercial e-mail ("<https://…/u/TOKEN>", and a
	// "<mailto:…>" where one is configured): an e-mail provider sends it with List-Unsubscribe-Post:
	// List-Unsubscribe=One-Click (RFC 8058). "" for none.
	ListUnsubscribe string
}

// Parts returns m's text and HTML: Body and HTML, or, when m has Shared content, that content with m's
// Values put in.
func (m *Message) Parts() (text, html string) {
	if m.Shared == nil {
		return m.Body, m.HTML
	}
	return m.Shared.Parts(m.Values)
}

// OneClickPost is the List-Unsubscribe-Post header that makes a List-Unsubscribe link one-click (RFC 8058).
const OneClickPost = "List-Unsubscribe=One-Click"

// Shared is a message's text and HTML content with substitution tags, written once for many recipients.
// Every tag starts with SharedTagPrefix and ends with "-"; no other text of the content holds the prefix.
type Shared struct {
	Text, HTML string
	Tags       []string
}

// Parts returns s's text and HTML with values put in for its tags: each tag replaced by the value of the
// same index, in one pass (a value is never searched for tags).
func (s *Shared) Parts(values []string) (text, html string) {
	pairs := make([]string, 0, 2*len(s.Tags))
	for i, tag := range s.Tags[:min(len(s.Tags), len(values))] {
		pairs = append(pairs, tag, values[i])
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace(s.Text), r.Replace(s.HTML)
}

// SharedTagPrefix starts every tag of a Shared content.
const SharedTagPrefix = "-campaignctl_v"

// Result is what a provider answered for an accepted message.
type Result struct {
	// MessageID is the provider's identifier (Twilio SID, SendGrid X-Message-Id).
	MessageID string
	// Segments is the number of SMS segments the provider counted (0 when unknown or not SMS).
	Segments int
}

// KeyedReceipts is implemented by a provider that knows whether its delivery receipts name the campaign
// and the user a message was sent for (Message.CampaignID, Message.UserID): a Twilio status callback URL
// the adapter sets for each message, SendGrid's custom_args.
type KeyedReceipts interface {
	ReceiptsNameRecipient() bool
}

// ReceiptsNameRecipient reports whether p's receipts name the recipient they are about, so that nobody
// needs to find a message by its ID alone; false when p cannot say.
func ReceiptsNameRecipient(p Provider) bool {
	k, ok := p.(KeyedReceipts)
	return ok && k.ReceiptsNameRecipient()
}

// Provider sends messages. Implementations are safe for concurrent use.
type Provider interface {
	// Name is a short stable name ("twilio", "sendgrid") used in keys, logs and metrics.
	Name() string
	// Send delivers one message. A non-nil error is a *Error unless the context was cancelled before the
	// request was written.
	Send(ctx context.Context, m Message) (Result, error)
}

// Warmer is a Provider that can open its connections before they are needed. The engine warms n
// connections before it takes a rate limit's tokens for n requests: a connection's set-up (TCP and TLS
// handshakes, a few round trips: hundreds of milliseconds to a distant provider, on every connection of a
// campaign's first second) is then not spent holding tokens. Requests held that long would reach the
// provider together with those sent meanwhile on open connections, and one second could carry more than
// the cap.
type Warmer interface {
	// Warm makes sure n connections are open and idle, opening the missing ones at once, and returns when
	// they are open or ctx ends. An error only means that the sends will open their connections themselves.
	Warm(ctx context.Context, n int) error
}

// Batcher is a Provider that sends many messages in one request (SendGrid: up to 1000
// personalizations). The request succeeds or fails as a whole.
type Batcher interface {
	Provider
	// MaxBatch is the most messages one SendBatch call takes.
	MaxBatch() int
	// SendBatch sends ms in one request. On success every message was accepted and results[i] is ms[i]'s.
	// A non-nil error is a *Error that holds for every message of the request (a 400 for one bad address
	// fails the whole request: the caller splits it to find the culprit).
	SendBatch(ctx context.Context, ms []Message) ([]Result, error)
}

// Class says what a failed provider call means for the recipient.
type Class int

const (
	// Transient means the provider definitely did not accept the message (429, 5xx, connection refused
	// before the request was written): it is safe to send again later.
	Transient Class = iota
	// Permanent means the provider refused this message for good (invalid number, opted out, bad
	// credentials): it must not be retried.
	Permanent
	// Ambiguous means the request was written but no answer arrived (timeout, connection reset): the
	// provider may or may not have accepted it, so a resend risks a double send.
	Ambiguous
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	case Ambiguous:
		return "ambiguous"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// Error is a failed provider call. Read it with errors.As.
type Error struct {
	Provider string
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Code is the provider's own error code (Twilio 21211, 20429), 0 when none.
	Code int
	// Message is the provider's error text, free of credentials and of the recipient's address.
	Message string
	// RetryAfter is the provider's retry hint (Retry-After, X-RateLimit-Reset), 0 when none.
	RetryAfter time.Duration
	Class      Class
	// Throttled marks a refusal that asks the sender to slow down (a 429, or the provider's own rate-limit
	// code in a 200, as Netgsm's 80).
	Throttled bool
	// RecipientLimited marks a transient refusal for this recipient alone: the provider caps the messages
	// one address takes in a while (Netgsm's 85: more than 20 to a number within a minute), and RetryAfter
	// says when it takes one again. The provider answered at its usual pace: nobody else waits.
	RecipientLimited bool
	// Account marks an error about the sending account or its configuration, when the adapter knows it
	// from the provider's own code (see AccountLevel).
	Account bool
	// BadAddress marks a permanent error that condemns the address itself for future campaigns (an
	// unregistered push token), not only this message.
	BadAddress bool
	// NoConsent marks a permanent refusal because the provider checked İYS and found no consent for the
	// recipient (Netgsm's 50). The engine turns the consent RET here only (campaign.Store.ProviderNoConsent).
	NoConsent bool
	// OptedOut marks a permanent refusal because the recipient opted out with the provider (Twilio's 21610:
	// they replied STOP to the brand's sender). That is the person's refusal through the brand's channel:
	// the engine records it as such, for İYS too (campaign.Store.ProviderOptOut).
	OptedOut bool
	// Err is the underlying transport error, if any.
	Err error
}

func (e *Error) Error() string {
	s := e.Provider
	if e.Status != 0 {
		s += fmt.Sprintf(": http %d", e.Status)
	}
	if e.Code != 0 {
		s += fmt.Sprintf(" code %d", e.Code)
	}
	if e.Message != "" {
		s += ": " + ScrubText(e.Message)
	}
	if e.Err != nil {
		s += ": " + ScrubSecrets(e.Err.Error())
	}
	return s + " (" + e.Class.String() + ")"
}

func (e *Error) Unwrap() error { return e.Err }

// Reason is the short text stored with a failed or unknown recipient, e.g. "twilio 21211: invalid To".
//
// Error and Reason scrub what they show (ScrubText, ScrubSecrets), whatever the adapter already took out
// of Message and Err: a provider that echoes the request can quote the Authorization header, a bearer
// token, and every recipient and audience column of the request.
func (e *Error) Reason() string {
	msg := ScrubText(e.Message)
	if e.Code != 0 {
		return fmt.Sprintf("%s %d: %s", e.Provider, e.Code, msg)
	}
	if e.Status != 0 {
		return fmt.Sprintf("%s http %d: %s", e.Provider, e.Status, msg)
	}
	if e.Err != nil {
		return fmt.Sprintf("%s: %s", e.Provider, ScrubSecrets(e.Err.Error()))
	}
	return e.Provider + ": " + msg
}

// ClassOf returns the class of err: the Class of a *Error, Transient for anything else (a context
// cancelled before the request was written sent nothing).
func ClassOf(err error) Class {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class
	}
	return Transient
}

// AddressTaker is implemented by a provider that can take only some addresses of its channel (Netgsm:
// Turkish mobile numbers). The engine sends the others through the channel's other provider, and does not
// fail over to it with an address it cannot take: an outage of one provider must not fail for good a
// recipient the other would send once back.
type AddressTaker interface {
	Takes(address string) bool
}

// Takes reports whether p can take address; true when p does not say.
func Takes(p Provider, address string) bool {
	at, ok := p.(AddressTaker)
	return !ok || at.Takes(address)
}

// SegmentPaced is implemented by a provider whose rate limit counts SMS segments, not messages (Twilio's
// messages-per-second count segments): the engine takes a token a segment for it.
type SegmentPaced interface {
	PacesSegments() bool
}
