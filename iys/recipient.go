package iys

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nyaruka/phonenumbers"

	"github.com/campaignctl/campaignctl/providers"
)

// Consent types (İYS "type"), recipient types and statuses, spelled exactly as İYS spells them.
const (
	TypeMessage = "MESAJ"  // TypeMessage is SMS and other short messages.
	TypeEmail   = "EPOSTA" // TypeEmail is e-mail.
	TypeCall    = "ARAMA"  // TypeCall is voice calls.

	RecipientIndividual = "BIREYSEL" // RecipientIndividual is a consumer.
	RecipientMerchant   = "TACIR"    // RecipientMerchant is a merchant or tradesperson.

	StatusApproved = "ONAY" // StatusApproved means commercial messages may be sent.
	StatusRejected = "RET"  // StatusRejected means they must not be.
)

// ErrInvalidPhone is returned, wrapped, by CanonicalPhone for a string that is not a valid phone number.
var ErrInvalidPhone = errors.New("invalid phone number")

// ErrInvalidEmail is returned, wrapped, by CanonicalEmail for a string that is not a plausible e-mail address.
var ErrInvalidEmail = errors.New("invalid e-mail address")

// ErrInvalidType is returned, wrapped, by CanonicalRecipient for a consent type other than MESAJ, EPOSTA
// and ARAMA.
var ErrInvalidType = errors.New("invalid consent type")

// maxRawPhoneDigits bounds the digits (with an international prefix) that are worth handing to the parser;
// E.164 allows 15 after the country code's "+", and "00" adds two.
const maxRawPhoneDigits = 17

// CanonicalRecipient returns raw in the canonical form for consents of type typ: CanonicalPhone for MESAJ
// and ARAMA, CanonicalEmail for EPOSTA.
func CanonicalRecipient(typ, raw string) (string, error) {
	switch typ {
	case TypeMessage, TypeCall:
		return CanonicalPhone(raw)
	case TypeEmail:
		return CanonicalEmail(raw)
	default:
		return "", invalid(ErrInvalidType, typ, "must be MESAJ, EPOSTA or ARAMA")
	}
}

// CanonicalPhone returns raw as an E.164 phone number ("+905321234567"). Numbers without a country code are
// read as Turkish: "05321234567", "5321234567", "905321234567", "0532 123 45 67", "+90 (532) 123-45-67" and
// "0090 532 123 45 67" all give "+905321234567"; "+14155552671" stays American. Spaces, tabs, no-break
// spaces and the separators - . ( ) / are ignored; anything else (letters, "tel:", extensions) is rejected.
// The number must be valid by libphonenumber's metadata, and a trunk "0" after an international prefix
// ("+9005321234567", which İYS rejects) is rejected rather than silently dropped. Errors wrap
// ErrInvalidPhone.
//
// Turkish mobile numbers in ranges where every number is valid take a fast path (40–80 ns, no allocation
// when raw is already canonical) that gives the same answer as the full parse (about 25 µs); everything else
// goes through libphonenumber.
func CanonicalPhone(raw string) (string, error) {
	var buf [maxRawPhoneDigits]byte
	d := buf[:0]
	plus := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c >= '0' && c <= '9':
			if len(d) == len(buf) {
				return "", invalid(ErrInvalidPhone, raw, "too many digits")
			}
			d = append(d, c)
		case c == '+' && len(d) == 0 && !plus:
			plus = true
		case c == ' ' || c == '\t' || c == '-' || c == '.' || c == '(' || c == ')' || c == '/':
		case c == 0xC2 && i+1 < len(raw) && raw[i+1] == 0xA0: // U+00A0, the no-break space spreadsheets insert
			i++
		default:
			return "", invalid(ErrInvalidPhone, raw, "unexpected character %q", rune(c))
		}
	}
	if len(d) == 0 {
		return "", invalid(ErrInvalidPhone, raw, "no digits")
	}

	if nat := turkishMobile(d, plus); nat != nil && fastPrefixes()[prefixIndex(nat)] {
		if len(raw) == 13 && plus && raw[0] == '+' && raw[1] == '9' && raw[2] == '0' && raw[3:] == string(nat) {
			return raw, nil // already canonical: no allocation
		}
		var out [13]byte
		copy(out[:], "+90")
		copy(out[3:], nat)
		return string(out[:]), nil
	}
	return slowCanonicalPhone(raw, d, plus)
}

// turkishMobile returns the 10-digit national number (5XXXXXXXXX) if digits, with or without a leading "+",
// spell a Turkish mobile in one of the unambiguous shapes +90 5.., 0090 5.., 90 5.., 0 5.. or 5..; else nil.
func turkishMobile(d []byte, plus bool) []byte {
	var nat []byte
	switch {
	case plus:
		if len(d) == 12 && d[0] == '9' && d[1] == '0' {
			nat = d[2:]
		}
	case len(d) == 14 && d[0] == '0' && d[1] == '0' && d[2] == '9' && d[3] == '0':
		nat = d[4:]
	case len(d) == 12 && d[0] == '9' && d[1] == '0':
		nat = d[2:]
	case len(d) == 11 && d[0] == '0':
		nat = d[1:]
	case len(d) == 10:
		nat = d
	}
	if nat == nil || nat[0] != '5' {
		return nil
	}
	return nat
}

// prefixIndex maps the national number 5AB... to AB (0–99).
func prefixIndex(nat []byte) int { return int(nat[1]-'0')*10 + int(nat[2]-'0') }

// fastPrefixes reports, for each 3-digit Turkish mobile prefix 5AB, whether libphonenumber considers every
// number 5AB XXX XX XX valid, so that the fast path may skip the parser. It is derived from the library's
// own metadata at first use rather than hard-coded, so that a metadata update that adds or narrows a range
// moves it to the slow path; a prefix whose validity depends on later digits (561, 592 today) fails at
// least one of the probes below and never takes the fast path. TestFastPathMatchesLibphonenumber checks
// the equivalence on random numbers.
var fastPrefixes = sync.OnceValue(func() *[100]bool {
	probes := []uint64{0, 1, 1234567, 2345678, 3456789, 4567890, 5555555, 6789012, 7654321, 8000000, 9000000, 9999999}
	var fast [100]bool
	for p := range fast {
		fast[p] = true
		for _, s := range probes {
			n := &phonenumbers.PhoneNumber{}
			cc := int32(90)
			nn := uint64(500+p)*10_000_000 + s
			n.CountryCode = &cc
			n.NationalNumber = &nn
			if !phonenumbers.IsValidNumber(n) {
				fast[p] = false
				break
			}
		}
	}
	return &fast
})

// slowCanonicalPhone parses with libphonenumber and then insists that the digits the caller wrote are the
// number's own digits, so that the parser's leniency (dropping a trunk "0" after "+90") cannot turn a
// number İYS rejects into one we accept.
func slowCanonicalPhone(raw string, d []byte, plus bool) (string, error) {
	s := string(d)
	if plus {
		s = "+" + s
	}
	n, err := phonenumbers.Parse(s, "TR")
	if err != nil {
		return "", invalid(ErrInvalidPhone, raw, "%v", err)
	}
	if !phonenumbers.IsValidNumber(n) {
		return "", invalid(ErrInvalidPhone, raw, "not a valid number")
	}
	e164 := phonenumbers.Format(n, phonenumbers.E164)
	digits := string(d)
	var ok bool
	switch {
	case plus:
		ok = digits == e164[1:]
	case strings.HasPrefix(digits, "00"):
		ok = digits[2:] == e164[1:]
	default:
		nsn := phonenumbers.GetNationalSignificantNumber(n)
		ok = n.GetCountryCode() == 90 && (digits == nsn || digits == "0"+nsn || digits == "90"+nsn)
	}
	if !ok || len(e164) > 16 || n.GetExtension() != "" {
		// Masked as the value itself is wherever it is shown: the detail goes into logs and reasons.
		return "", invalid(ErrInvalidPhone, raw, "not a form İYS accepts; did you mean %s?", providers.MaskAddress(e164))
	}
	return e164, nil
}

// maxEmailLen is the longest recipient İYS accepts for EPOSTA.
const maxEmailLen = 265

// CanonicalEmail returns raw trimmed and in lower case after a basic shape check: ASCII only, one "@", a
// local part of at most 64 characters without leading, trailing or doubled dots, and a domain of at least
// two dot-separated labels of letters, digits and hyphens whose last label is not all digits. Errors wrap
// ErrInvalidEmail.
func CanonicalEmail(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return "", invalid(ErrInvalidEmail, raw, "empty")
	}
	if len(s) > maxEmailLen {
		return "", invalid(ErrInvalidEmail, raw, "longer than %d characters", maxEmailLen)
	}
	at := strings.IndexByte(s, '@')
	if at <= 0 || at != strings.LastIndexByte(s, '@') || at == len(s)-1 {
		return "", invalid(ErrInvalidEmail, raw, "must be name@domain")
	}
	upper := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return "", invalid(ErrInvalidEmail, raw, "only ASCII letters are allowed")
		}
		if c >= 'A' && c <= 'Z' {
			upper = true
		}
	}
	if upper {
		s = strings.ToLower(s)
	}
	local, domain := s[:at], s[at+1:]
	if len(local) > 64 || local[0] == '.' || local[len(local)-1] == '.' || strings.Contains(local, "..") {
		return "", invalid(ErrInvalidEmail, raw, "bad local part")
	}
	for i := 0; i < len(local); i++ {
		if !localChar(local[i]) {
			return "", invalid(ErrInvalidEmail, raw, "character %q not allowed", rune(local[i]))
		}
	}
	if len(domain) > 253 {
		return "", invalid(ErrInvalidEmail, raw, "domain too long")
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return "", invalid(ErrInvalidEmail, raw, "domain needs a dot")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", invalid(ErrInvalidEmail, raw, "bad domain")
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", invalid(ErrInvalidEmail, raw, "character %q not allowed in domain", rune(c))
			}
		}
	}
	if tld := labels[len(labels)-1]; len(tld) < 2 || strings.Trim(tld, "0123456789") == "" {
		return "", invalid(ErrInvalidEmail, raw, "bad top-level domain")
	}
	return s, nil
}

func localChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte(".!#$%&'*+/=?^_`{|}~-", c) >= 0
}

// invalidError is a rejected recipient: it unwraps to its sentinel and keeps the reason apart, so that the
// importer can put the reason into its own sentence.
type invalidError struct {
	sentinel error
	raw      string
	detail   string
}

func invalid(sentinel error, raw, format string, args ...any) error {
	return &invalidError{sentinel: sentinel, raw: raw, detail: fmt.Sprintf(format, args...)}
}

func (e *invalidError) Error() string { return fmt.Sprintf("%v %q: %s", e.sentinel, e.raw, e.detail) }
func (e *invalidError) Unwrap() error { return e.sentinel }
