package iys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrMalformedResponse is returned, wrapped, when İYS answers with a body the client cannot read in full:
// JSON that does not parse, or that lacks or garbles a field the answer needs. Nothing of such an answer
// is returned.
var ErrMalformedResponse = errors.New("malformed İYS response")

// APIError is an error answer of the İYS API. İYS sends {"errors":[{"code","message","location","value",
// "index"}]} (research §2.12); its token endpoint sends OAuth's {"error","error_description"} instead,
// which lands in Code and Message. Read it with errors.As, or classify it with IsRateLimited, IsAuth,
// IsValidation, IsAccount and IsRetryable.
type APIError struct {
	// Op is the operation: "token", "status", "multi_status", "changes", "add", "add_batch" or
	// "add_results" (an item a batch add refused; Status is then 0).
	Op string
	// Status is the HTTP status.
	Status int
	// Code is İYS's error code ("H124", "H351"), or the OAuth error ("invalid_request") for Op "token";
	// empty when the body had none.
	Code string
	// Message is İYS's text, in Turkish; HTTP's status text when the body had none.
	Message string
	// Field is the location of a validation error joined with dots ("recipient", "recipients.3"); may be
	// empty.
	Field string
	// Value is the offending value as İYS echoed it. It may be a recipient: Error masks it.
	Value string
	// Index is the position in a list request that the error is about, when İYS gave one.
	Index *int
	// Details holds every entry of the errors list, the first one (also in Code, Message, Field and Value)
	// included.
	Details []ErrorDetail
	// RetryAfter is how long to wait before asking again: the Retry-After header, or an hour for İYS's
	// hourly limits (H084, H086, H089) when the header is absent.
	RetryAfter time.Duration

	notFound bool // a status query for a key İYS has no record of: unwraps to ErrNoConsent
}

// ErrorDetail is one entry of İYS's errors list.
type ErrorDetail struct {
	Code    string
	Message string
	Field   string
	Value   string
	Index   *int
}

// Error returns the operation, the HTTP status, the code and the message, with the value masked.
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "iys %s:", e.Op)
	if e.Status != 0 {
		fmt.Fprintf(&b, " HTTP %d", e.Status)
	}
	if e.Index != nil && e.Status == 0 {
		fmt.Fprintf(&b, " item %d", *e.Index)
	}
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Field != "" {
		b.WriteString(" (field " + e.Field)
		if e.Value != "" {
			b.WriteString(", value " + maskRecipient(e.Value))
		}
		b.WriteString(")")
	} else if e.Value != "" {
		b.WriteString(" (value " + maskRecipient(e.Value) + ")")
	}
	if n := len(e.Details); n > 1 {
		fmt.Fprintf(&b, " and %d more", n-1)
	}
	return b.String()
}

// Unwrap returns ErrNoConsent for a status query about a key İYS has no record of.
func (e *APIError) Unwrap() error {
	if e.notFound {
		return ErrNoConsent
	}
	return nil
}

// hourly reports whether the code is one of İYS's per-hour limits, which an early retry only prolongs.
func (e *APIError) hourly() bool {
	switch e.Code {
	case "H084", "H086", "H089":
		return true
	}
	return false
}

// IsRateLimited reports whether err is İYS refusing a request for its rate: HTTP 429, with H124 or H083
// for the per-second limit, H084 (token), H086 (single status) or H089 (history) for the hourly ones.
// APIError.RetryAfter says how long to wait.
func IsRateLimited(err error) bool {
	var e *APIError
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case "H124", "H083", "H084", "H086", "H089":
		return true
	}
	return e.Status == http.StatusTooManyRequests
}

// IsAuth reports whether err is an authentication failure: the token endpoint refusing the credentials
// (400 invalid_request or invalid_grant), or a 401 H351 that survived a fresh token. Retrying does not
// help; the configured username and password need fixing.
func IsAuth(err error) bool {
	var e *APIError
	if !errors.As(err, &e) {
		return false
	}
	if e.Op == opToken && (e.Status == http.StatusBadRequest || e.Status == http.StatusUnauthorized) {
		return true
	}
	return e.Status == http.StatusUnauthorized || e.Code == "H351"
}

// IsValidation reports whether err is İYS refusing the request's content: 422 (H110–H121, H164, H193,
// H464, H506, H507...) or 400 outside the token endpoint (H014, H097, H174, H175, H178...). Such a
// request must not be sent again unchanged: İYS counts client errors against the provider.
func IsValidation(err error) bool {
	var e *APIError
	if !errors.As(err, &e) || e.Op == opToken {
		return false
	}
	return e.Status == http.StatusUnprocessableEntity || e.Status == http.StatusBadRequest
}

// IsAccount reports whether err is an account-level refusal, 403: the İYS or brand code is not linked to
// the user (H353), or the subscription is paused, expired, closed, missing or without API access (H520,
// H521, H524, H586). Nothing works until an operator fixes the account or the configuration.
func IsAccount(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusForbidden
}

// IsRetryable reports whether the same request may succeed later: İYS's per-second limit, a server
// error (5xx) or a network failure. The client already retried such errors a few times before
// returning one.
func IsRetryable(err error) bool {
	var e *APIError
	if errors.As(err, &e) {
		return e.retryable()
	}
	var ne net.Error
	return errors.As(err, &ne)
}

func (e *APIError) retryable() bool {
	if e.Status == http.StatusTooManyRequests {
		return !e.hourly()
	}
	return e.Status >= 500
}

// parseAPIError reads an error answer. It never fails: a body it cannot read leaves a generic message
// that names the content type and size, never the content, which may hold a recipient.
func parseAPIError(op string, status int, h http.Header, body []byte) *APIError {
	e := &APIError{Op: op, Status: status, RetryAfter: parseRetryAfter(h.Get("Retry-After"), time.Now())}
	var b struct {
		Errors []struct {
			Code     string          `json:"code"`
			CodeTypo string          `json:"code:"` // some documented 403 answers spell the key so
			Message  string          `json:"message"`
			Location []any           `json:"location"`
			Value    json.RawMessage `json:"value"`
			Index    *int            `json:"index"`
		} `json:"errors"`
		Error            string `json:"error"`
		ErrorDescription string `json:"error_description"`
	}
	switch {
	case len(bytes.TrimSpace(body)) == 0:
	case json.Unmarshal(body, &b) != nil:
		ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
		e.Message = fmt.Sprintf("unreadable error body (%d bytes of %s)", len(body), cmpOrString(ct, "unknown type"))
	case len(b.Errors) > 0:
		for _, d := range b.Errors {
			e.Details = append(e.Details, ErrorDetail{
				Code:    cmpOrString(d.Code, d.CodeTypo),
				Message: d.Message,
				Field:   joinLocation(d.Location),
				Value:   rawText(d.Value),
				Index:   d.Index,
			})
		}
		first := e.Details[0]
		e.Code, e.Message, e.Field, e.Value, e.Index = first.Code, first.Message, first.Field, first.Value, first.Index
	case b.Error != "":
		e.Code, e.Message = b.Error, b.ErrorDescription
	}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	if e.RetryAfter == 0 && e.hourly() {
		e.RetryAfter = time.Hour
	}
	return e
}

// parseRetryAfter reads Retry-After in seconds or as an HTTP date; 0 when absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		return time.Duration(max(0, n)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func joinLocation(loc []any) string {
	parts := make([]string, 0, len(loc))
	for _, p := range loc {
		switch v := p.(type) {
		case string:
			parts = append(parts, v)
		case float64:
			parts = append(parts, strconv.FormatFloat(v, 'f', -1, 64))
		default:
			parts = append(parts, fmt.Sprint(v))
		}
	}
	return strings.Join(parts, ".")
}

// rawText is a JSON value as text: a string unquoted, anything else compact.
func rawText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) == nil {
		return buf.String()
	}
	return string(raw)
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// maskRecipient hides most of a phone number or e-mail address, for errors and logs: "+905*****4567",
// "a***@example.com".
func maskRecipient(s string) string {
	if at := strings.LastIndexByte(s, '@'); at >= 0 {
		if at == 0 {
			return "***" + s[at:]
		}
		return s[:1] + "***" + s[at:]
	}
	if len(s) <= 6 {
		return strings.Repeat("*", len(s))
	}
	head, keep := 4, 4
	if len(s) < head+keep+2 {
		head = 1
	}
	return s[:head] + strings.Repeat("*", len(s)-head-keep) + s[len(s)-keep:]
}
