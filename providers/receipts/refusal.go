package receipts

import (
	"context"
	"strings"
	"time"
	"unicode"

	"github.com/campaignctl/campaignctl/internal/pgtext"
)

// Refusal kinds, the values of Refusal.Kind. Which provider event gives which is in the package doc.
const (
	// RefusalUnsubscribe: the recipient used the unsubscribe link of an e-mail (SendGrid "unsubscribe").
	RefusalUnsubscribe = "unsubscribe"
	// RefusalGroupUnsubscribe: the recipient left one unsubscribe group (SendGrid "group_unsubscribe").
	RefusalGroupUnsubscribe = "group_unsubscribe"
	// RefusalSpamReport: the recipient marked an e-mail as spam (SendGrid "spamreport").
	RefusalSpamReport = "spamreport"
	// RefusalInbound: the recipient answered an SMS with a refusal keyword (RET, IPTAL, STOP, ...).
	RefusalInbound = "inbound"
	// RefusalOptedOut: the provider refused a message because the recipient had opted out with it (a Twilio
	// status callback with error 21610: the recipient replied STOP, and Twilio sends them nothing more).
	RefusalOptedOut = "opted_out"
)

// Channels, the values of Refusal.Channel.
const (
	// ChannelEmail: the refusal came back through an e-mail (SendGrid).
	ChannelEmail = "email"
	// ChannelSMS: the refusal came back through an SMS (Twilio).
	ChannelSMS = "sms"
)

// DefaultRefusalKeywords are the words that make an incoming SMS a refusal when TwilioInboundHandler is
// given none: RET and IPTAL, the Turkish answers İYS rules name for withdrawing consent, and STOP, which
// Twilio itself honours.
//
// Twilio's own opt-out words are among them: Twilio stops messages to whoever sends one (STOP, STOPALL,
// UNSUBSCRIBE, CANCEL, END, QUIT, and with Advanced Opt-Out OPTOUT and REVOKE), so such a person has
// refused, whatever the brand's keywords.
var DefaultRefusalKeywords = []string{"RET", "IPTAL", "STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "OPTOUT", "REVOKE"}

// Refusal is a recipient's refusal of further messages that came back through a provider: an
// unsubscribe or a spam report, or an SMS answered with a refusal keyword.
type Refusal struct {
	// Provider is "sendgrid" or "twilio".
	Provider string
	// Channel is ChannelEmail or ChannelSMS.
	Channel string
	// Address is who refuses: the e-mail address, lower case, or the sender's phone number as Twilio
	// gives it (E.164, "+905321234567"). Log it only through providers.MaskAddress.
	Address string
	// CampaignID and UserID are the SendGrid custom args campaign_id and user_id of the message refused,
	// when the event carries them; 0 and "" otherwise (always, for an SMS).
	CampaignID int64
	UserID     string
	// Kind is one of the Refusal constants.
	Kind string
	// Keyword is, for RefusalInbound, the keyword matched, upper case and with İ and ı folded to I
	// ("RET", "IPTAL", "STOP"); "" for the other kinds.
	Keyword string
	// EventID identifies the refusal, stable across the provider's repeats of it: SendGrid's sg_event_id,
	// or sg_message_id:event:timestamp when it has none; the MessageSid of an incoming SMS.
	EventID string
	// At is when the refusal happened: SendGrid's event timestamp, or the arrival time of an incoming SMS
	// (Twilio's webhook carries none).
	At time.Time
	// Evidence is a short text for the audit trail saying what the provider reported, never the address:
	// `sendgrid spamreport sg_event_id=...`, `twilio inbound SM... "Ret"` (the word as written).
	Evidence string
	// Suppressed says the provider reported no refusal event but dropped a message because the address is
	// on its list of those who refused (SendGrid's "Unsubscribed Address", "Spam Reporting Address"): the
	// refusal behind it may be one recorded already, or one whose post was lost.
	Suppressed bool
}

// RefusalSink records refusals. Refuse is called once per provider request with every refusal in it,
// and may be called concurrently. An error makes the handler answer 500, so the provider delivers the
// request again: a RefusalSink must tolerate refusals it has already recorded (dedupe on EventID).
type RefusalSink interface {
	Refuse(ctx context.Context, rs []Refusal) error
}

// RefusalSinkFunc adapts a function to a RefusalSink.
type RefusalSinkFunc func(ctx context.Context, rs []Refusal) error

// Refuse calls f(ctx, rs).
func (f RefusalSinkFunc) Refuse(ctx context.Context, rs []Refusal) error { return f(ctx, rs) }

// maxAddressLen bounds Refusal.Address: an e-mail address is at most 254 characters.
const maxAddressLen = 320

// maxEvidenceLen bounds Refusal.Evidence.
const maxEvidenceLen = 200

// cleanEvidence bounds an evidence text, cutting on a character boundary.
func cleanEvidence(s string) string { return pgtext.Cut(s, maxEvidenceLen) }

// foldKeyword folds a word for comparison: upper case, with the Turkish İ and ı and the Latin i all
// folded to I, and combining marks dropped (a decomposed İ is I and U+0307). "iptal", "İptal", "İPTAL"
// and "IPTAL" all fold to "IPTAL". Folding dotted and dotless together errs on the side of a refusal,
// which is the side to err on.
func foldKeyword(w string) string {
	var b strings.Builder
	b.Grow(len(w))
	for _, r := range w {
		switch {
		case r == 'i' || r == 'ı' || r == 'İ':
			b.WriteByte('I')
		case unicode.Is(unicode.Mn, r):
		default:
			b.WriteRune(unicode.ToUpper(r))
		}
	}
	return b.String()
}

// isWordRune tells whether r belongs to a word: a letter, a digit or a combining mark.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)
}

// firstWord is the first word of body as written: what comes after any leading spaces and punctuation,
// up to the next character that is neither a letter, a digit nor a combining mark ("  Ret." gives
// "Ret", "İPTAL lütfen" "İPTAL", "RET,teşekkürler" "RET").
func firstWord(body string) string {
	start := strings.IndexFunc(body, isWordRune)
	if start < 0 {
		return ""
	}
	rest := body[start:]
	if end := strings.IndexFunc(rest, func(r rune) bool { return !isWordRune(r) }); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

// keywordSet is the folded keywords a handler matches; nil or empty keywords mean
// DefaultRefusalKeywords. A keyword that is not one word could never match; it is returned in bad.
func keywordSet(keywords []string) (set map[string]bool, bad []string) {
	if len(keywords) == 0 {
		keywords = DefaultRefusalKeywords
	}
	set = make(map[string]bool, len(keywords))
	for _, k := range keywords {
		k = strings.TrimSpace(k)
		if k == "" || firstWord(k) != k {
			bad = append(bad, k)
			continue
		}
		set[foldKeyword(k)] = true
	}
	return set, bad
}
