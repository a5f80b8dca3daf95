package campaign

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/campaignctl/campaignctl/iys"
)

// Channel is how messages travel: the name of one registration in the channel table (see ChannelSpec).
type Channel string

// Channels, as --channel names them and the campaigns table stores them.
const (
	ChannelSMS   Channel = "sms"
	ChannelEmail Channel = "email"
	ChannelPush  Channel = "push"
	// ChannelWebhook posts each message, signed, to an in-house system (WEBHOOK_URL); the recipient is
	// the user_id.
	ChannelWebhook Channel = "webhook"
)

// ChannelSpec is one channel's registration: everything the engine knows about the channel. The planner
// (address, consent, parts, batch size), the lease (consent), the worker (what a message carries) and the
// CLI (names, help) read it, so that a channel is added here, with its provider adapter, and nowhere else
// in this package. The CLI registers the channel's providers (which adapter, which settings, which cap).
type ChannelSpec struct {
	// Name is the channel as --channel takes it and the campaigns table stores it.
	Name Channel
	// Title names the channel in messages to the marketer ("SMS", "e-mail").
	Title string
	// AddressColumn is the audience column that carries the recipient's address; user_id for a channel
	// that addresses the user itself.
	AddressColumn string
	// Canonical returns an address as campaigns store it (and İYS records it), or an error for one that
	// cannot be sent to: its audience row is excluded as invalid_address.
	Canonical func(raw string) (string, error)
	// IYSType is the İYS consent type that governs the channel's commercial messages; "" for a channel
	// İYS has no type for, whose audience says who opted in (OptInColumn).
	IYSType string
	// OptInColumn is the audience column that must say true for a recipient of a channel without an İYS
	// type; "" for İYS channels.
	OptInColumn string
	// BatchSize is how many recipients one queued task carries unless the launch says otherwise.
	BatchSize int
	// Spread says a message goes in a request of its own (SMS, push, webhook): a small campaign's
	// recipients are spread over SpreadBatches batches rather than filling a few (Spec.batchSize).
	Spread bool
	// SubjectRequired says a message needs a subject unless a provider template (TemplateID) gives one.
	SubjectRequired bool
	// SubjectHeader says the subject travels in a header, where a line break would start a header of its
	// own: a recipient whose values would put one there is excluded at launch (invalid_value) and failed
	// at send time.
	SubjectHeader bool
	// HTML says the channel takes an HTML part (--html, html/template); TemplateID that it takes a
	// provider-side template (--template-id, SendGrid's d-...).
	HTML, TemplateID bool
	// Unsubscribe says the channel's commercial messages carry a signed one-click unsubscribe link per
	// recipient (List-Unsubscribe, RFC 8058), which their templates may show as {{.unsubscribe_url}}.
	Unsubscribe bool
	// Data says the provider gets the template's values themselves besides the rendered parts (a push's
	// data payload); a message through a provider template always gets them.
	Data bool
	// Segmented says the body travels as SMS: billed in segments, bounded by --max-segments and
	// MaxSMSChars at launch and at send time, counted by a dry run.
	Segmented bool
	// Linted says a commercial body must carry what law 6563 asks of it (Spec.Rules): the sender's
	// identity and how to refuse further messages.
	Linted bool
}

// registry holds one registration per channel, in the order help text lists them.
var registry = []ChannelSpec{
	{
		Name: ChannelSMS, Title: "SMS", AddressColumn: "phone", Canonical: iys.CanonicalPhone,
		IYSType: iys.TypeMessage, BatchSize: DefaultBatchSize, Spread: true, Segmented: true, Linted: true,
	},
	{
		Name: ChannelEmail, Title: "e-mail", AddressColumn: "email", Canonical: iys.CanonicalEmail,
		IYSType: iys.TypeEmail, BatchSize: DefaultEmailBatchSize,
		SubjectRequired: true, SubjectHeader: true, HTML: true, TemplateID: true, Unsubscribe: true,
	},
	{
		Name: ChannelPush, Title: "push", AddressColumn: "push_token", Canonical: canonicalPushToken,
		OptInColumn: "push_opt_in", BatchSize: DefaultBatchSize, Spread: true, Data: true,
	},
	{
		Name: ChannelWebhook, Title: "webhook", AddressColumn: "user_id", Canonical: canonicalUserID,
		OptInColumn: "webhook_opt_in", BatchSize: DefaultBatchSize, Spread: true,
	},
}

// DefaultBatchSize is how many recipients one queued task carries.
const DefaultBatchSize = 500

// DefaultEmailBatchSize is an e-mail batch: one SendGrid request of 1000 personalizations.
const DefaultEmailBatchSize = 1000

// SpreadBatches is how many batches a small campaign of a one-message channel (ChannelSpec.Spread) is
// spread over, at no fewer than MinSpreadBatch recipients a batch: each batch is a run of its own, so
// the batches are how many of its messages can be in flight at once. Four batches of 500 sent one message
// at a time a run (a cap under about 40 a second) went at 13 messages a second against a provider that
// answers in 300 ms, whatever the workers and the cap; 64 fill the slots of four default workers.
const SpreadBatches = 64

// MaxBatchSize is the most recipients a batch may carry (launch --batch-size).
const MaxBatchSize = 10000

// MinSpreadBatch is the fewest recipients a spread batch carries (SpreadBatches).
const MinSpreadBatch = 10

// Channels returns every channel's registration, in the order help text lists them.
func Channels() []ChannelSpec { return slices.Clone(registry) }

// Spec returns the channel's registration; the zero ChannelSpec for a name that has none (ParseChannel
// refuses those, so no campaign has one).
func (c Channel) Spec() ChannelSpec {
	for _, s := range registry {
		if s.Name == c {
			return s
		}
	}
	return ChannelSpec{}
}

// AddressColumn is the audience column that carries the channel's address.
func (c Channel) AddressColumn() string {
	// Not through Spec, which copies the whole registration: a message's data asks for it.
	for i := range registry {
		if registry[i].Name == c {
			return registry[i].AddressColumn
		}
	}
	return ""
}

// OptInColumn is the audience column that carries a recipient's own opt-in on a channel that has no İYS
// consent type (push_opt_in, webhook_opt_in); "" for İYS channels.
func (c Channel) OptInColumn() string { return c.Spec().OptInColumn }

// IYSType is the İYS consent type that governs the channel ("" for push and webhook, which have no İYS
// type).
func (c Channel) IYSType() string { return c.Spec().IYSType }

// ParseChannel validates a channel name.
func ParseChannel(s string) (Channel, error) {
	if c := Channel(s); c.Spec().Name == c && c != "" {
		return c, nil
	}
	return "", fmt.Errorf("%w: unknown channel %q; use --channel %s", ErrInvalid, s, ChannelChoices())
}

// ChannelChoices lists the channels for help text and messages: "sms, email, push or webhook".
func ChannelChoices() string {
	names := make([]string, len(registry))
	for i, s := range registry {
		names[i] = string(s.Name)
	}
	return listOr(names)
}

// titlesWhere lists, for a message, the titles of the channels whose registration satisfies ok.
func titlesWhere(ok func(ChannelSpec) bool) string {
	var titles []string
	for _, s := range registry {
		if ok(s) {
			titles = append(titles, s.Title)
		}
	}
	return listOr(titles)
}

// listOr joins items as a sentence does: "a", "a or b", "a, b or c".
func listOr(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// canonicalPushToken returns a push token as given, trimmed: FCM tokens are printable ASCII without
// spaces, and at most 4 KiB.
func canonicalPushToken(raw string) (string, error) {
	t := strings.TrimSpace(raw)
	if t == "" || len(t) > 4096 || strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return "", errors.New("invalid push token")
	}
	return t, nil
}

// canonicalUserID returns a user_id used as the address (webhook), trimmed; an empty one has no address.
func canonicalUserID(raw string) (string, error) {
	if t := strings.TrimSpace(raw); t != "" {
		return t, nil
	}
	return "", errors.New("empty user_id")
}
