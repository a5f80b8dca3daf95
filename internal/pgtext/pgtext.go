// Package pgtext makes text from outside (a provider's answer, a webhook's fields) storable in a Postgres
// text column. Postgres refuses a NUL character and invalid UTF-8 in text, and it refuses the whole
// statement with them: one such field in a statement that records a hundred outcomes, or a post's
// receipts and refusals, would fail them all, on every retry.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Clean returns s with each NUL and each invalid UTF-8 sequence replaced by U+FFFD. Text Postgres
// accepts is returned as it is, without a copy.
func Clean(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// CleanAll cleans every element of ss in place and returns ss.
func CleanAll(ss []string) []string {
	for i, s := range ss {
		ss[i] = Clean(s)
	}
	return ss
}

// Cut returns s cut to at most n bytes where a character starts: cut inside one, the text would no longer
// be UTF-8 that Postgres accepts.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
