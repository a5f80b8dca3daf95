// Package jsonstr writes strings as JSON strings, byte for byte as encoding/json writes them by default
// (json.Marshal: HTML-safe), for the bodies that are written directly instead of through reflection (the
// SendGrid adapter's requests, the sandbox's answers).
package jsonstr

import "unicode/utf8"

// Append appends s as a quoted JSON string.
func Append(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = AppendChars(dst, s)
	return append(dst, '"')
}

// safe marks the ASCII bytes encoding/json writes as they are in a string: not the control characters,
// '"', '\\', '<', '>' and '&'.
var safe = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// AppendChars appends s escaped for a JSON string, without the quotes: '"' and '\\' escaped with a
// backslash, \b \f \n \r \t by name, other control characters and '<', '>', '&' as \u00XX, U+2028 and
// U+2029 as \u2028 and \u2029, and every byte that is not part of valid UTF-8 as \ufffd. Pieces escaped one
// after the other come out as their concatenation would, unless a piece starts with UTF-8 continuation
// bytes.
func AppendChars(dst []byte, s string) []byte {
	start := 0 // s[start:i] is yet to be copied as it is
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...)
}
