package providers

import "unicode/utf8"

// SMS encodings reported by SMSSegments.
const (
	// EncodingGSM7 is the GSM 03.38 7-bit default alphabet with its extension table.
	EncodingGSM7 = "GSM-7"
	// EncodingUCS2 is 16-bit UCS-2 (UTF-16 in practice): one unit per BMP character, two per character
	// outside it (most emoji).
	EncodingUCS2 = "UCS-2"
)

// Segment sizes. A message that fits one segment uses the full size; a longer one is split into parts that
// each lose room to the concatenation header (UDH).
const (
	gsm7Single = 160 // septets
	gsm7Part   = 153
	ucs2Single = 70 // UTF-16 code units
	ucs2Part   = 67
)

// SMSSegments returns the encoding an SMS with this body is sent in and the number of segments it is
// billed and rate-limited as, following the rules Twilio documents:
//
//   - GSM-7 when every character is in the GSM 03.38 basic table or its extension table; extension
//     characters (form feed and [ ] { } | ~ ^ \ €) take two septets. 160 septets fit one segment, longer
//     bodies are sent in parts of 153.
//   - UCS-2 otherwise, for the whole body: 70 UTF-16 code units in one segment, parts of 67. A character
//     outside the Basic Multilingual Plane (most emoji) takes two units.
//
// A two-septet escape sequence or a surrogate pair is never split across parts, so a part may hold one
// unit less than its size. Turkish ç ğ Ğ ı İ ş Ş are not in GSM-7 and force UCS-2; Ç Ö Ü ö ü are in it.
// An empty body is GSM-7 with 0 segments: there is nothing to send, and callers that budget segments
// must not charge for it.
func SMSSegments(body string) (encoding string, segments int) {
	if body == "" {
		return EncodingGSM7, 0
	}
	if septets, ok := gsm7Length(body); ok {
		return EncodingGSM7, countParts(body, septets, gsm7Single, gsm7Part, gsm7Width)
	}
	return EncodingUCS2, countParts(body, ucs2Length(body), ucs2Single, ucs2Part, ucs2Width)
}

// countParts returns the number of segments for a body of total units. Beyond one segment it fills parts
// character by character, so that a character wider than the room left in a part starts the next one.
func countParts(body string, total, single, part int, width func(rune) int) int {
	if total <= single {
		return 1
	}
	parts, used := 1, 0
	for _, r := range body {
		w := width(r)
		if used+w > part {
			parts++
			used = 0
		}
		used += w
	}
	return parts
}

// gsm7Length returns the body's length in septets, and false when a character is not in GSM-7.
func gsm7Length(body string) (int, bool) {
	n := 0
	for _, r := range body {
		w := gsm7Width(r)
		if w == 0 {
			return 0, false
		}
		n += w
	}
	return n, true
}

// ucs2Length returns the body's length in UTF-16 code units.
func ucs2Length(body string) int {
	n := 0
	for _, r := range body {
		n += ucs2Width(r)
	}
	return n
}

func ucs2Width(r rune) int {
	if r > 0xFFFF {
		return 2
	}
	return 1
}

// gsm7ASCII holds the width in septets of each ASCII character: 1 in the basic table, 2 in the extension
// table, 0 when it has no GSM-7 form (the grave accent, tab and most control characters).
var gsm7ASCII = func() [utf8.RuneSelf]uint8 {
	var t [utf8.RuneSelf]uint8
	for c := ' '; c <= '~'; c++ {
		t[c] = 1
	}
	t['\n'], t['\r'] = 1, 1
	t['`'] = 0
	for _, c := range "\f[]{}|~^\\" {
		t[c] = 2
	}
	return t
}()

// gsm7Width returns the number of septets r takes in GSM-7, 0 when it has none.
func gsm7Width(r rune) int {
	if r < utf8.RuneSelf {
		return int(gsm7ASCII[r])
	}
	switch r {
	case '€':
		return 2
	case '£', '¥', 'è', 'é', 'ù', 'ì', 'ò', 'Ç', 'Ø', 'ø', 'Å', 'å',
		'Δ', 'Φ', 'Γ', 'Λ', 'Ω', 'Π', 'Ψ', 'Σ', 'Θ', 'Ξ',
		'Æ', 'æ', 'ß', 'É', '¤', '¡', 'Ä', 'Ö', 'Ñ', 'Ü', '§', '¿', 'ä', 'ö', 'ñ', 'ü', 'à':
		return 1
	}
	return 0
}
