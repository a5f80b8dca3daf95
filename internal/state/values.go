package state

import (
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// Kind is what a claim knows of its recipient, the first letter of its value.
type Kind byte

// Claim values (after the campaign's nonce and a slash):
//
//	c|<unix ms>|<owner>   InFlight: claimed by owner, the provider has not answered (yet)
//	s|<message id>|<seg>  Sent: the provider accepted the message
//	f|<reason>            Failed: the provider refused it for good
//	u|<reason>            Unknown: the answer never came (ambiguous)
//	k|<reason>            Skipped: not sent (consent revoked, cancelled, frequency cap)
const (
	InFlight Kind = 'c'
	Sent     Kind = 's'
	Failed   Kind = 'f'
	Unknown  Kind = 'u'
	Skipped  Kind = 'k'
	// Foreign is not a value's letter: a value that belongs to another campaign of the same ID.
	Foreign Kind = 0
)

const valueSeparator = "|"

// Value is a decoded claim value.
type Value struct {
	Kind      Kind
	At        time.Time // InFlight: when claimed
	Owner     string    // InFlight: who claimed (host:pid)
	MessageID string    // Sent
	Segments  int       // Sent
	// Provider is the provider that accepted a Sent message when it was not the channel's first (a
	// fallback, Netgsm for Twilio); "" for the first.
	Provider string
	Reason   string // Failed, Unknown, Skipped
}

// ParseValue decodes a claim value without its nonce ("" decodes as in flight, of no time).
func ParseValue(v string) Value {
	if v == "" {
		return Value{Kind: InFlight}
	}
	parts := strings.SplitN(v, valueSeparator, 3)
	st := Value{Kind: Kind(v[0])}
	if st.Kind == Sent {
		parts = strings.SplitN(v, valueSeparator, 4)
	}
	switch st.Kind {
	case InFlight:
		if len(parts) > 1 {
			if ms, err := strconv.ParseInt(parts[1], 10, 64); err == nil {
				st.At = time.UnixMilli(ms)
			}
		}
		if len(parts) > 2 {
			st.Owner = parts[2]
		}
	case Sent:
		st.Segments = 1
		if len(parts) > 1 {
			st.MessageID = decodeMessageID(parts[1])
		}
		if len(parts) > 2 {
			st.Segments, _ = strconv.Atoi(parts[2])
		}
		if len(parts) > 3 {
			st.Provider = parts[3]
		}
	default:
		if len(parts) > 1 {
			st.Reason = strings.Join(parts[1:], valueSeparator)
		}
	}
	return st
}

// ParseValueOf decodes a claim value as stored, nonce included; Kind Foreign means another campaign's.
func ParseValueOf(val, nonce string) Value {
	if len(val) <= len(nonce) || val[:len(nonce)+1] != nonce+"/" {
		return Value{Kind: Foreign}
	}
	return ParseValue(val[len(nonce)+1:])
}

// Nonce is c's nonce (campaign.Campaign.Nonce): every claim value starts with it and a slash. Campaign IDs
// start again at 1 when the engine database is re-created, but Redis may still hold the claims of the old
// campaign 1 for weeks; those must not pass for the new one's.
func Nonce(c *campaign.Campaign) string { return c.Nonce() }

// InFlightValue is the value of a claim owner takes at now, before its provider call.
func InFlightValue(now time.Time, owner string) string {
	return string(InFlight) + valueSeparator + strconv.FormatInt(now.UnixMilli(), 10) + valueSeparator + owner
}

// SentValue is the value of a claim whose message the provider accepted.
func SentValue(messageID string, segments int) string {
	v := string(Sent) + valueSeparator + encodeMessageID(messageID)
	if segments != 1 {
		v += valueSeparator + strconv.Itoa(segments)
	}
	return v
}

// SentValueVia is SentValue of a message a fallback provider accepted (provider, not the channel's
// first): the claim tells which, so that a run that records the send from the claim alone (its worker
// died) names the provider whose receipts and reports it takes.
func SentValueVia(messageID string, segments int, provider string) string {
	if provider == "" {
		return SentValue(messageID, segments)
	}
	return string(Sent) + valueSeparator + encodeMessageID(messageID) + valueSeparator + strconv.Itoa(segments) + valueSeparator + provider
}

// ReasonValue is the value of a claim of kind (Failed, Unknown, Skipped) with its reason.
func ReasonValue(kind Kind, reason string) string {
	return string(kind) + valueSeparator + reason
}

// encodeMessageID writes a Twilio-style ID (two capital letters and 32 lower-case hex digits, e.g. SM…)
// as "~", the letters and the 16 bytes in base64 (25 characters instead of 34), so that a sent claim stays
// a short string (Redis stores values up to 44 bytes inline with their object). Other IDs are kept as they
// are; none starts with "~".
func encodeMessageID(id string) string {
	if len(id) != 34 || id[0] < 'A' || id[0] > 'Z' || id[1] < 'A' || id[1] > 'Z' {
		return id
	}
	raw, err := hex.DecodeString(id[2:])
	if err != nil || hex.EncodeToString(raw) != id[2:] { // upper-case hex would not come back the same
		return id
	}
	return "~" + id[:2] + base64.RawURLEncoding.EncodeToString(raw)
}

func decodeMessageID(v string) string {
	if len(v) != 25 || v[0] != '~' {
		return v
	}
	raw, err := base64.RawURLEncoding.DecodeString(v[3:])
	if err != nil {
		return v
	}
	return v[1:3] + hex.EncodeToString(raw)
}
