package providers

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaskAddress hides most of a phone number or e-mail address for logs: "+905321234567" becomes
// "+9053*****4567" and "ayse.yilmaz@example.com" becomes "a***@example.com".
func MaskAddress(s string) string {
	if at := strings.LastIndexByte(s, '@'); at >= 0 {
		if at == 0 {
			return "***" + s[at:]
		}
		_, first := utf8.DecodeRuneInString(s)
		return s[:first] + "***" + s[at:]
	}
	// By characters, not bytes: an address of Turkish letters must stay valid UTF-8 (a report's CSV).
	r := []rune(s)
	if len(r) <= 6 {
		return strings.Repeat("*", len(r))
	}
	keep := 4
	head := 4
	if len(r) < head+keep+2 {
		head = 1
	}
	return string(r[:head]) + strings.Repeat("*", len(r)-head-keep) + string(r[len(r)-keep:])
}

// AsksToSlowDown reports whether the provider refused because of the sender's rate (a 429, Twilio's
// 20429, or an adapter's own rate-limit code: Throttled), rather than for a fault of its own.
func (e *Error) AsksToSlowDown() bool {
	return e.Status == 429 || e.Code == 20429 || e.Throttled
}

// AccountLevel reports whether the error is about the sending account or its configuration (bad
// credentials, a sender the account may not use) rather than about the recipient: failing the recipient
// would be wrong, and every other recipient would fail the same way, so the work must wait for an operator.
func (e *Error) AccountLevel() bool {
	if e.BadAddress || e.RecipientLimited {
		return false // the address is at fault (an unregistered push token answers 404), or waits alone
	}
	if e.Account {
		return true
	}
	switch {
	case e.Status == 401, e.Status == 403, e.Status == 404, e.Status >= 300 && e.Status < 400:
		// bad credentials, a wrong account or base URL, a proxy in the way
		return true
	}
	switch e.Code {
	case 20003, 20404, 21222, 21224, // credentials, account
		21212, 21603, 21606, 21659, 21660: // the sender (From) is missing, invalid or not the account's
		return true
	}
	return false
}

// phoneLike matches what could be a phone number in a provider's own text (an error description that
// quotes the recipient, perhaps reformatted: "0532 123 45 67", "+90 (532) 123-45-67").
var phoneLike = regexp.MustCompile(`\+?\d[\d ()-]{6,}\d`)

// MaskPhoneLike replaces anything shaped like a phone number in s, a text that came from a provider, with
// "[number]". Not for transport error texts: their URLs and account IDs carry digits it would mangle.
// Digits inside a word are not a number: a Twilio message SID ("SM" and 32 hex digits) often holds a run
// of eight digits or more, and is what an operator looks the message up by.
func MaskPhoneLike(s string) string {
	spans := phoneLike.FindAllStringIndex(s, -1)
	if spans == nil {
		return s
	}
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		if inWord(s, sp[0], sp[1]) {
			continue
		}
		b.WriteString(s[last:sp[0]])
		b.WriteString("[number]")
		last = sp[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// inWord says whether s[i:j] has a letter right before or right after it.
func inWord(s string, i, j int) bool {
	before, _ := utf8.DecodeLastRuneInString(s[:i])
	after, _ := utf8.DecodeRuneInString(s[j:])
	return i > 0 && unicode.IsLetter(before) || j < len(s) && unicode.IsLetter(after)
}

// MaskDigits replaces in s every spelling of the number digits (a recipient's national number, say) with
// "[to]": its digits in order with up to three other characters between any two ("0532.123.45.67",
// "532/123 4567"), which a general pattern for phone numbers cannot take without eating dates and IP
// addresses too. A number of fewer than 6 digits is left alone.
func MaskDigits(s, digits string) string {
	var ds []string
	for _, r := range digits {
		if r >= '0' && r <= '9' {
			ds = append(ds, string(r))
		}
	}
	if len(ds) < 6 || !strings.Contains(s, ds[0]) {
		return s
	}
	return regexp.MustCompile(strings.Join(ds, `[^0-9]{0,3}`)).ReplaceAllString(s, "[to]")
}

// credentialLike matches the credentials of an Authorization header quoted in a text (a provider that
// echoes the request, a proxy's error page): "Basic" or "Bearer" and a token of at least 16 characters.
var credentialLike = regexp.MustCompile(`(?i)\b(basic|bearer)(\s+|%20|\+)[A-Za-z0-9._~+/-]{16,}=*`)

// emailLike matches an e-mail address, also with its "@" percent-encoded (a form or a URL quoted).
// Letters of any script count: a CRM holds "şule@example.com" as readily as "sule@example.com".
var emailLike = regexp.MustCompile(`[\p{L}\p{N}._%+-]+(@|%40|%2540)[\p{L}\p{N}-]+(\.[\p{L}\p{N}-]+)*\.\p{L}{2,}`)

// ScrubSecrets masks, in a text about a request, what no log or stored reason may show whatever the text
// is: the credentials of an Authorization header ("Basic [secret]") and e-mail addresses (MaskAddress).
// It spares other digits: a transport error's URL carries account IDs and ports.
func ScrubSecrets(s string) string {
	if s == "" {
		return s
	}
	s = credentialLike.ReplaceAllString(s, "$1 [secret]")
	return emailLike.ReplaceAllStringFunc(s, func(m string) string {
		for _, at := range []string{"%2540", "%40"} {
			m = strings.Replace(m, at, "@", 1)
		}
		return MaskAddress(m)
	})
}

// ScrubText is ScrubSecrets for a text that came from a provider or a registry (an error's description,
// a bounce reason), which may quote any recipient of the request, its own or another's: phone numbers
// are masked too (MaskPhoneLike).
func ScrubText(s string) string {
	if s == "" {
		return s
	}
	return MaskPhoneLike(ScrubSecrets(s))
}

// MaskUserID is a user ID as logs and errors show it: as it is, unless it is an e-mail address or a phone
// number (an audience keyed by either), which is masked as MaskAddress masks an address. A phone number is
// taken in the shapes a CRM keeps it: "+905321234567", "0532 123 45 67", "(0532) 123-45-67",
// "tel:+905321234567": 8 digits or more, with nothing but separators around them.
func MaskUserID(id string) string {
	if m := emailLike.FindString(id); m == id && m != "" {
		return MaskAddress(id)
	}
	if phoneShaped(id) {
		return MaskAddress(id)
	}
	return id
}

// phoneShaped says whether id is a phone number in one of the shapes MaskUserID names.
func phoneShaped(id string) bool {
	rest := id
	if len(rest) > 4 && strings.EqualFold(rest[:4], "tel:") {
		rest = rest[4:]
	}
	digits := 0
	for _, r := range rest {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case strings.ContainsRune("+()-. /", r), unicode.IsSpace(r):
		default:
			return false
		}
	}
	return digits >= 8
}
