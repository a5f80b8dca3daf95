package state

import (
	"strings"
	"testing"
)

// A sent claim keeps the provider's message ID and segment count, whatever the ID looks like, and a
// Twilio-style ID is stored short enough for Redis to keep the whole value inline.
func TestSentClaimValues(t *testing.T) {
	t.Parallel()
	nonce := "mbk2x8a1c9d" // as long as Nonce makes them today
	for _, tc := range []struct {
		id       string
		segments int
		short    bool
	}{
		{"SM0123456789abcdef0123456789abcdef", 1, true},
		{"MMfedcba9876543210fedcba9876543210", 3, true},
		{"SM0123456789ABCDEF0123456789abcdef", 1, false}, // upper-case hex: kept as it is
		{"SMdead", 1, false},
		{"14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0-0", 1, false}, // a SendGrid ID
		{"projects/p/messages/0:1500415314455276%31bd1c9631bd1c96", 0, false},
		{"", 1, false},
	} {
		v := SentValue(tc.id, tc.segments)
		st := ParseValue(v)
		if st.Kind != Sent || st.MessageID != tc.id || st.Segments != tc.segments {
			t.Errorf("SentValue(%q, %d) = %q, parsed back as %+v", tc.id, tc.segments, v, st)
		}
		if tc.short && len(nonce)+1+len(v) > 44 {
			t.Errorf("claim value %q is %d bytes with its nonce; Redis keeps at most 44 inline", v, len(nonce)+1+len(v))
		}
		if !tc.short && strings.HasPrefix(v, "s|~") {
			t.Errorf("%q was shortened to %q", tc.id, v)
		}
	}
	// Claims written before IDs were shortened still read back.
	if st := ParseValue("s|SM0123456789abcdef0123456789abcdef|2"); st.MessageID != "SM0123456789abcdef0123456789abcdef" || st.Segments != 2 {
		t.Errorf("old sent claim parsed as %+v", st)
	}
}

// A fallback's sent claim names its provider (Netgsm for Twilio), so that a send recorded from the claim
// alone (its worker died) is its provider's; the first provider's claims are as before.
func TestAFallbacksSentClaimNamesItsProvider(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id       string
		segments int
		provider string
	}{
		{"1234567890", 1, "netgsm"}, {"1234567890", 3, "netgsm"}, {"SM0123456789abcdef0123456789abcdef", 2, ""},
	} {
		v := SentValueVia(tc.id, tc.segments, tc.provider)
		if st := ParseValue(v); st.Kind != Sent || st.MessageID != tc.id || st.Segments != tc.segments || st.Provider != tc.provider {
			t.Errorf("SentValueVia(%q, %d, %q) = %q, parsed back as %+v", tc.id, tc.segments, tc.provider, v, st)
		}
	}
	if v := SentValueVia("SM0123456789abcdef0123456789abcdef", 2, ""); v != SentValue("SM0123456789abcdef0123456789abcdef", 2) {
		t.Errorf("the first provider's claim %q is not SentValue's", v)
	}
}
