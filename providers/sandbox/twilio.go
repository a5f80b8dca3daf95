package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/campaignctl/campaignctl/internal/jsonstr"
	"github.com/campaignctl/campaignctl/providers"
)

// Twilio error codes the sandbox answers with. The permanent recipient errors are also reachable through
// the magic numbers (see the package doc).
const (
	codeAuthenticate     = 20003
	codeNotFound         = 20404
	codeMethodNotAllowed = 20004
	codeTooManyRequests  = 20429
	codeInternal         = 20500
	codeUnavailable      = 20503
	codeInvalidTo        = 21211
	codeRegionDisabled   = 21408
	codeBodyRequired     = 21602
	codeFromRequired     = 21603
	codeToRequired       = 21604
	codeFromInvalid      = 21606
	codeUnverified       = 21608
	codeOptedOut         = 21610
	codeNotMobile        = 21614
	codeBodyTooLong      = 21617
	codeLandline         = 21635
)

// twilioMaxBody is the longest Body Twilio accepts, in characters.
const twilioMaxBody = 1600

// magicPrefix starts the recipients that draw a permanent error: magicPrefix + the five-digit code.
const magicPrefix = "+9055500"

// magicErrors are the codes a magic recipient can ask for, with Twilio's message for each ("%s" is the
// recipient, which Twilio's own messages name too).
var magicErrors = map[string]struct {
	code int
	msg  string
}{
	"21211": {codeInvalidTo, "Invalid 'To' Phone Number: %s"},
	"21408": {codeRegionDisabled, "Permission to send an SMS has not been enabled for the region indicated by the 'To' number: %s."},
	"21606": {codeFromInvalid, "The 'From' phone number provided is not a valid message-capable Twilio phone number for this destination (%s)."},
	"21608": {codeUnverified, "The number %s is unverified. Trial accounts cannot send messages to unverified numbers."},
	"21610": {codeOptedOut, "Attempt to send to unsubscribed recipient %s"},
	"21614": {codeNotMobile, "'To' number %s is not a valid mobile number"},
	"21635": {codeLandline, "The 'To' number %s is a landline and cannot receive SMS."},
}

func (s *Server) twilioRoutes() {
	s.mux.HandleFunc("/2010-04-01/Accounts/{AccountSid}/Messages.json", s.twilioCreateMessage)
	s.mux.HandleFunc("/2010-04-01/", func(w http.ResponseWriter, r *http.Request) {
		w, done, ok := s.arrive(w, r, apiTwilio, false)
		defer done()
		if !ok {
			return
		}
		s.twilioError(w, r, http.StatusNotFound, codeNotFound, "The requested resource "+r.URL.Path+" was not found")
	})
	s.twilioInboundRoutes()
}

// twilioCreateMessage imitates POST /2010-04-01/Accounts/{AccountSid}/Messages.json. The order of checks
// follows Twilio's: an outage and the concurrency limit at the door, authentication, then the account's
// rate and the hidden rate limit, then the request itself; injected faults come after the rate checks,
// so only authenticated traffic sees them, and the segment limit after validation, so only messages
// Twilio would take count.
func (s *Server) twilioCreateMessage(w http.ResponseWriter, r *http.Request) {
	w, done, ok := s.arrive(w, r, apiTwilio, true)
	defer done()
	if !ok {
		return
	}

	if r.Method != http.MethodPost {
		s.twilioError(w, r, http.StatusMethodNotAllowed, codeMethodNotAllowed, "Method not allowed")
		return
	}
	account := r.PathValue("AccountSid")
	if !s.twilioAuthorized(r, account) {
		w.Header().Set("WWW-Authenticate", `Basic realm="Twilio API"`)
		s.twilioError(w, r, http.StatusUnauthorized, codeAuthenticate, "Authenticate")
		return
	}
	if !s.twilio.allow(account) {
		mark(w, outRate)
		s.twilioError(w, r, http.StatusTooManyRequests, codeTooManyRequests, "Too Many Requests")
		return
	}
	if s.overRate(w, r) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	form, err := readTwilioForm(r)
	if x := exchangeOf(w); x != nil {
		x.recipient = form.to
	}
	if err != nil {
		s.twilioError(w, r, http.StatusBadRequest, codeToRequired, "A 'To' phone number is required.")
		return
	}

	hangAfterAccept := false
	f := s.faults.Load().pick("twilio")
	if f != noFault && f != faultTimeout {
		mark(w, faultOutcome(f))
	}
	switch f {
	case fault429:
		s.twilioError(w, r, http.StatusTooManyRequests, codeTooManyRequests, "Too Many Requests")
		return
	case fault500:
		s.twilioError(w, r, http.StatusInternalServerError, codeInternal, "Internal Server Error")
		return
	case fault503:
		s.twilioError(w, r, http.StatusServiceUnavailable, codeUnavailable, "Service Unavailable")
		return
	case faultRaw503:
		s.log.rejected(http.StatusServiceUnavailable, 0)
		s.logRequest(w, r, http.StatusServiceUnavailable, 0)
		writeRaw503(w)
		return
	case faultReset:
		s.log.connReset()
		s.logRequest(w, r, 0, 0)
		resetConn(w)
		return
	case faultTimeout:
		hangAfterAccept = true
	}

	to, from, msid, body := form.to, form.from, form.msid, form.body
	switch {
	case to == "":
		s.twilioError(w, r, http.StatusBadRequest, codeToRequired, "A 'To' phone number is required.")
		return
	case !isE164(to):
		s.twilioError(w, r, http.StatusBadRequest, codeInvalidTo, fmt.Sprintf("The 'To' number %s is not a valid phone number.", to))
		return
	case from == "" && msid == "":
		s.twilioError(w, r, http.StatusBadRequest, codeFromRequired, "A 'From' or 'MessagingServiceSid' parameter is required to send a message")
		return
	case body == "" && form.mediaURL == "" && form.contentSID == "":
		s.twilioError(w, r, http.StatusBadRequest, codeBodyRequired, "A text message body or media urls must be specified.")
		return
	case utf8.RuneCountInString(body) > twilioMaxBody:
		s.twilioError(w, r, http.StatusBadRequest, codeBodyTooLong, "The concatenated message body exceeds the 1600 character limit.")
		return
	}
	if e, ok := magicErrors[strings.TrimPrefix(to, magicPrefix)]; ok && strings.HasPrefix(to, magicPrefix) {
		s.twilioError(w, r, http.StatusBadRequest, e.code, fmt.Sprintf(e.msg, to))
		return
	}
	_, segments := providers.SMSSegments(body)
	if s.overSegments(w, r, segments) {
		return
	}

	m := Message{
		Provider:   "twilio",
		SID:        newSID("SM"),
		AccountSID: account,
		To:         to,
		From:       from,
		Body:       body,
		Status:     "queued",
		At:         time.Now().UTC(),
		Hung:       hangAfterAccept,
	}
	m.NumSegments = segments
	if from == "" {
		// A Messaging Service picks the sender later, so Twilio answers "accepted" and, not knowing the
		// sender's encoding yet, "0" segments.
		m.From, m.Status, m.NumSegments = msid, "accepted", 0
	}
	entry := s.log.accept(m)
	recorded(w, 1, segments)
	s.scheduleTwilioReceipts(r, &form, m, entry)
	if hangAfterAccept {
		mark(w, outHung)
		s.logRequest(w, r, 0, 0)
		hang(r)
		return
	}
	s.logRequest(w, r, http.StatusCreated, 0)
	buf := bufs.Get().(*[]byte)
	*buf = appendTwilioMessage((*buf)[:0], &m, from, msid)
	writeJSONBytes(w, http.StatusCreated, *buf)
	bufs.Put(buf)
}

// twilioAuthorized checks HTTP Basic auth the way Twilio does for an account's resources: the username is
// the account SID in the path, and both parts are alphanumeric.
func (s *Server) twilioAuthorized(r *http.Request, account string) bool {
	user, pass, ok := r.BasicAuth()
	if !ok || user == "" || pass == "" || user != account || !isAlnum(user) || !isAlnum(pass) {
		return false
	}
	if s.opts.TwilioAccountSID != "" && user != s.opts.TwilioAccountSID {
		return false
	}
	if s.opts.TwilioAuthToken != "" && subtle.ConstantTimeCompare([]byte(pass), []byte(s.opts.TwilioAuthToken)) != 1 {
		return false
	}
	return true
}

// twilioForm is what the sandbox reads of a Messages.json POST: the first value of each field, as
// r.PostForm.Get gives it.
type twilioForm struct {
	to, from, msid, body, mediaURL, contentSID, statusCallback string
}

// field returns where f keeps the form field key, and a bit of its own; nil for a field not read.
func (f *twilioForm) field(key string) (*string, uint8) {
	switch key {
	case "To":
		return &f.to, 1 << 0
	case "From":
		return &f.from, 1 << 1
	case "MessagingServiceSid":
		return &f.msid, 1 << 2
	case "Body":
		return &f.body, 1 << 3
	case "MediaUrl":
		return &f.mediaURL, 1 << 4
	case "ContentSid":
		return &f.contentSID, 1 << 5
	case "StatusCallback":
		return &f.statusCallback, 1 << 6
	}
	return nil, 0
}

// maxFormFields is net/url's default bound on the fields of a query (urlmaxqueryparams).
const maxFormFields = 10000

// readTwilioForm reads the form of a Messages.json POST as r.ParseForm and r.PostForm.Get would, with
// the same error wherever ParseForm gives one. The usual request, a form body and no query, is parsed
// here field by field as url.ParseQuery does, without ParseForm's two maps of slices: they were half of
// the allocations of an accepted message. Any other request, or a GODEBUG that may change url's bound on
// the fields, goes through ParseForm itself.
func readTwilioForm(r *http.Request) (f twilioForm, err error) {
	if r.URL.RawQuery != "" || r.Header.Get("Content-Type") != "application/x-www-form-urlencoded" ||
		strings.Contains(os.Getenv("GODEBUG"), "urlmaxqueryparams") {
		err = r.ParseForm()
		f.to, f.from, f.msid, f.body = r.PostForm.Get("To"), r.PostForm.Get("From"), r.PostForm.Get("MessagingServiceSid"), r.PostForm.Get("Body")
		f.mediaURL, f.contentSID, f.statusCallback = r.PostForm.Get("MediaUrl"), r.PostForm.Get("ContentSid"), r.PostForm.Get("StatusCallback")
		return f, err
	}
	buf := bufs.Get().(*[]byte)
	*buf, err = readAll((*buf)[:0], r.Body)
	q := string(*buf)
	bufs.Put(buf)
	if err != nil {
		return f, err
	}
	if strings.Count(q, "&") >= maxFormFields {
		return f, errors.New("number of form fields exceeded limit")
	}
	var seen uint8 // the fields read: the first value of each is kept
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		if strings.Contains(pair, ";") {
			err = errors.New("invalid semicolon separator in form")
			continue
		}
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, kerr := url.QueryUnescape(k)
		value, verr := url.QueryUnescape(v)
		if kerr != nil || verr != nil {
			if err == nil {
				err = cmp.Or(kerr, verr)
			}
			continue
		}
		if p, bit := f.field(key); p != nil && seen&bit == 0 {
			seen |= bit
			*p = value
		}
	}
	return f, err
}

// appendTwilioMessage appends Twilio's Message resource for m as the 201 carries it, ended by a newline
// as encoding/json's Encoder ends it. num_segments, num_media and price are strings there, and twilio-go
// decodes them as such; from and messaging_service_sid are null when the request left them out.
func appendTwilioMessage(b []byte, m *Message, from, msid string) []byte {
	// The URIs are escaped piece by piece: none of the pieces after the first starts with a UTF-8
	// continuation byte (see jsonstr.AppendChars).
	uri := func(b []byte, suffix string) []byte {
		b = append(b, `"/2010-04-01/Accounts/`...)
		b = jsonstr.AppendChars(b, m.AccountSID)
		b = append(b, "/Messages/"...)
		b = jsonstr.AppendChars(b, m.SID)
		b = append(b, suffix...)
		return append(b, '"')
	}
	// An RFC 1123 date has nothing to escape.
	date := func(b []byte) []byte {
		b = append(b, '"')
		b = m.At.AppendFormat(b, time.RFC1123Z)
		return append(b, '"')
	}
	orNull := func(b []byte, s string) []byte {
		if s == "" {
			return append(b, "null"...)
		}
		return jsonstr.Append(b, s)
	}
	b = append(b, `{"account_sid":`...)
	b = jsonstr.Append(b, m.AccountSID)
	b = append(b, `,"api_version":"2010-04-01","body":`...)
	b = jsonstr.Append(b, m.Body)
	b = append(b, `,"date_created":`...)
	b = date(b)
	b = append(b, `,"date_sent":null,"date_updated":`...)
	b = date(b)
	b = append(b, `,"direction":"outbound-api","error_code":null,"error_message":null,"from":`...)
	b = orNull(b, from)
	b = append(b, `,"messaging_service_sid":`...)
	b = orNull(b, msid)
	b = append(b, `,"num_media":"0","num_segments":"`...)
	b = strconv.AppendInt(b, int64(m.NumSegments), 10)
	b = append(b, `","price":null,"price_unit":"USD","sid":`...)
	b = jsonstr.Append(b, m.SID)
	b = append(b, `,"status":`...)
	b = jsonstr.Append(b, m.Status)
	b = append(b, `,"subresource_uris":{"media":`...)
	b = uri(b, "/Media.json")
	b = append(b, `},"to":`...)
	b = jsonstr.Append(b, m.To)
	b = append(b, `,"uri":`...)
	b = uri(b, ".json")
	return append(b, "}\n"...)
}

// twilioErrorBody is Twilio's legacy error JSON. twilio-go reads status from the body, not the status
// line, so it is always present.
type twilioErrorBody struct {
	Code     int    `json:"code"`
	Message  string `json:"message"`
	MoreInfo string `json:"more_info"`
	Status   int    `json:"status"`
}

func (s *Server) twilioError(w http.ResponseWriter, r *http.Request, status, code int, msg string) {
	s.twilioReply(w, r, status, code, msg, status == http.StatusTooManyRequests)
}

// twilioReply answers with Twilio's error JSON, with Retry-After: 1 when retryAfter is set.
func (s *Server) twilioReply(w http.ResponseWriter, r *http.Request, status, code int, msg string, retryAfter bool) {
	s.log.rejected(status, code)
	s.logRequest(w, r, status, code)
	if retryAfter {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, twilioErrorBody{
		Code:     code,
		Message:  msg,
		MoreInfo: "https://www.twilio.com/docs/errors/" + strconv.Itoa(code),
		Status:   status,
	})
}

// logRequest writes one debug record per provider request answered through w; status 0 means no answer
// was sent. Only the masked recipient is logged, never the credentials or the body.
func (s *Server) logRequest(w http.ResponseWriter, r *http.Request, status, code int) {
	// Asked first (as Debug asks), so that a sandbox that does not log debug does not mask a number per
	// request for nothing.
	if !s.logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	s.logger.Debug("sandbox twilio request",
		"account_sid", r.PathValue("AccountSid"),
		"to", providers.MaskAddress(recipient(w)),
		"status", status,
		"code", code)
}

// newSID returns a Twilio-style resource SID: the two-letter prefix and 32 hex digits.
func newSID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// isE164 reports whether s is "+" and 2 to 15 digits, the first not 0.
func isE164(s string) bool {
	if len(s) < 3 || len(s) > 16 || s[0] != '+' || s[1] == '0' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
