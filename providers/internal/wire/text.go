package wire

import "github.com/campaignctl/campaignctl/internal/pgtext"

// Redacted returns an error whose text is msg (err's text with credentials and addresses taken out) while
// errors.Is and errors.As still see err.
func Redacted(msg string, err error) error { return &redactedError{msg: msg, err: err} }

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Truncate cuts s to at most n bytes, on a rune boundary, and marks the cut with an ellipsis.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return pgtext.Cut(s, n) + "…"
}

// Join joins two parts of an error message with ": ", leaving out an empty one.
func Join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + ": " + b
}
