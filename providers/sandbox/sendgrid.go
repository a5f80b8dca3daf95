package sandbox

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/mail"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// SendGrid's Mail Send limits, as the fake enforces them.
const (
	// sendgridMaxBody is the largest request body (and gzip-decompressed body) accepted: 30 MB.
	sendgridMaxBody = 30 << 20
	// sendgridMaxPersonalizations bounds both the personalizations and the recipients of one request.
	sendgridMaxPersonalizations = 1000
	sendgridMaxCategories       = 10
	sendgridMaxCategoryLen      = 255
	// sendgridMaxCustomArgs: custom_args must stay under this many bytes (keys and values).
	sendgridMaxCustomArgs = 10000
	// sendgridMaxSubstitutions: the substitutions of one personalization may weigh this many bytes.
	sendgridMaxSubstitutions = 10000
	sendgridMaxSendAhead     = 72 * time.Hour
)

// The sandbox's magic e-mail addresses. A recipient whose local part starts with one of these prefixes
// (any domain) is accepted like any other, and its Event Webhook events end in bounce, dropped or
// deferred instead of delivered. A from address starting with sendgridUnverifiedPrefix gets the 403 of a
// sender that is not a verified Sender Identity.
const (
	sendgridBouncePrefix     = "bounce+"
	sendgridDropPrefix       = "drop+"
	sendgridUnsubDropPrefix  = "unsubscribed+"
	sendgridDeferPrefix      = "defer+"
	sendgridUnverifiedPrefix = "unverified+"
)

// sendgridState is the SendGrid fake's state: the rate buckets per API key, the Event Webhook signing key
// and the emitter, and the last message to each recipient, for its refusal events.
type sendgridState struct {
	limiter   *rateLimiter
	publicKey string // base64 PKIX DER of the signing key's public half
	events    *sendgridEmitter
	sent      *sendgridSent
}

// sendgridRoutes registers the SendGrid v3 Mail Send fake:
//
//	POST /v3/mail/send                                 Mail Send (research §5.1)
//	GET  /v3/user/webhooks/event/settings/signed[/id]  {"public_key": base64 PKIX DER} of the event signing key
//	GET  /_sandbox/sendgrid/events/stats               SendGridEventStats as JSON
//	POST /_sandbox/sendgrid/events                     post a recipient's unsubscribe, group_unsubscribe or
//	                                                   spamreport event now (sendgrid_refusals.go)
//
// Mail Send checks a request in SendGrid's order: the Bearer API key (Options.SendGridAPIKey; empty means
// any), the key's rate (Options.SendGridRate, a real 429 with X-RateLimit-* headers), the body size (413
// over 30 MB, gzip accepted), then the injected Faults, then validation (400 with errors[].field), then
// the sender (403 for a from address starting "unverified+"). A valid request in sandbox_mode gets 200
// and is not recorded; any other gets 202, an empty body and X-Message-Id, and each personalization is
// recorded as a Message with its substitutions applied: SID is the sg_message_id of its events, Status
// "processed". For a dynamic template Body is {"template_id","dynamic_template_data"} as JSON. The
// timeout fault records the messages (Hung) and their events before it hangs: SendGrid took them.
//
// When Options.SendGridEventURL is set, and only if it names a loopback host, each accepted recipient's
// events (processed, then delivered) are posted there ReceiptDelay after acceptance, in signed batches;
// a recipient whose local part starts with "bounce+", "drop+" or "defer+" gets bounce, dropped or
// deferred instead of delivered, and one starting with "unsubscribed+" is dropped as on SendGrid's
// unsubscribe list (reason "Unsubscribed Address"). See sendgridEmitter.
func (s *Server) sendgridRoutes() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic("sandbox: generate the SendGrid event signing key: " + err.Error())
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		panic("sandbox: encode the SendGrid event public key: " + err.Error())
	}
	s.sendgrid = &sendgridState{
		limiter:   newRateLimiter(s.opts.SendGridRate),
		publicKey: base64.StdEncoding.EncodeToString(der),
		events:    newSendgridEmitter(s.opts.SendGridEventURL, s.opts.ReceiptDelay, key, s.logger),
		sent:      newSendgridSent(),
	}
	s.mux.HandleFunc("/v3/mail/send", s.sendgridMailSend)
	s.mux.HandleFunc("GET /v3/user/webhooks/event/settings/signed", s.sendgridSigningKey)
	s.mux.HandleFunc("GET /v3/user/webhooks/event/settings/signed/{id}", s.sendgridSigningKey)
	s.mux.HandleFunc("GET /_sandbox/sendgrid/events/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.SendGridEventStats())
	})
	s.sendgridRefusalRoute()
}

// SendGridEventPublicKey returns the public key that verifies the sandbox's Event Webhook signatures, as
// SendGrid publishes it: base64 of the PKIX DER encoding of a P-256 key. sendgrid-go's
// eventwebhook.ConvertPublicKeyBase64ToECDSA reads it.
func (s *Server) SendGridEventPublicKey() string { return s.sendgrid.publicKey }

// SendGridEventStats returns the Event Webhook emitter's counters.
func (s *Server) SendGridEventStats() SendGridEventStats { return s.sendgrid.events.snapshot() }

// sendgridAddress, sendgridContent, sendgridPersonalization and sendgridMail are the parts of a Mail Send
// body the fake reads.
type sendgridAddress struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

type sendgridContent struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type sendgridPersonalization struct {
	To                  []sendgridAddress `json:"to"`
	CC                  []sendgridAddress `json:"cc"`
	BCC                 []sendgridAddress `json:"bcc"`
	Subject             string            `json:"subject"`
	Substitutions       map[string]string `json:"substitutions"`
	CustomArgs          map[string]string `json:"custom_args"`
	Headers             map[string]string `json:"headers"`
	DynamicTemplateData map[string]any    `json:"dynamic_template_data"`
	SendAt              int64             `json:"send_at"`
}

type sendgridMail struct {
	Personalizations []sendgridPersonalization `json:"personalizations"`
	From             *sendgridAddress          `json:"from"`
	Subject          string                    `json:"subject"`
	Content          []sendgridContent         `json:"content"`
	TemplateID       string                    `json:"template_id"`
	Categories       []string                  `json:"categories"`
	CustomArgs       map[string]string         `json:"custom_args"`
	Headers          map[string]string         `json:"headers"`
	SendAt           int64                     `json:"send_at"`
	MailSettings     struct {
		SandboxMode struct {
			Enable bool `json:"enable"`
		} `json:"sandbox_mode"`
	} `json:"mail_settings"`
}

// sendgridMailSend imitates POST /v3/mail/send.
func (s *Server) sendgridMailSend(w http.ResponseWriter, r *http.Request) {
	w, done, ok := s.arrive(w, r, apiSendGrid, true)
	defer done()
	if !ok {
		return
	}

	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.sendgridError(w, nil, http.StatusMethodNotAllowed, "", "method not allowed")
		return
	}
	key, ok := s.sendgridAuthorized(r)
	if !ok {
		s.sendgridError(w, nil, http.StatusUnauthorized, "", "authorization required")
		return
	}
	if !s.sendgrid.limiter.allow(key) {
		mark(w, outRate)
		s.sendgridTooManyRequests(w, time.Duration(float64(time.Second)/s.opts.SendGridRate))
		return
	}
	if s.overRate(w, r) {
		return
	}
	raw, tooLarge, err := readSendgridBody(r)
	switch {
	case tooLarge:
		s.sendgridError(w, nil, http.StatusRequestEntityTooLarge, "", "content too large")
		return
	case err != nil:
		s.sendgridError(w, nil, http.StatusBadRequest, "", "Bad Request")
		return
	}

	hangAfterAccept := false
	f := s.faults.Load().pick("sendgrid")
	if f != noFault && f != faultTimeout {
		mark(w, faultOutcome(f))
	}
	switch f {
	case fault429:
		s.sendgridTooManyRequests(w, time.Second)
		return
	case fault500:
		s.sendgridError(w, nil, http.StatusInternalServerError, "", "internal server error")
		return
	case fault503:
		s.sendgridError(w, nil, http.StatusServiceUnavailable, "", "service unavailable")
		return
	case faultRaw503:
		s.log.rejected(http.StatusServiceUnavailable, 0)
		s.sendgridLogRequest(nil, http.StatusServiceUnavailable)
		writeRaw503(w)
		return
	case faultReset:
		s.log.connReset()
		s.sendgridLogRequest(nil, 0)
		resetConn(w)
		return
	case faultTimeout:
		hangAfterAccept = true
	}

	var m sendgridMail
	if err := json.Unmarshal(raw, &m); err != nil {
		s.sendgridError(w, nil, http.StatusBadRequest, "", "Bad Request")
		return
	}
	now := time.Now()
	if field, msg := validateSendgridMail(&m, now); msg != "" {
		s.sendgridError(w, &m, http.StatusBadRequest, field, msg)
		return
	}
	if strings.HasPrefix(strings.ToLower(m.From.Email), sendgridUnverifiedPrefix) {
		s.sendgridError(w, &m, http.StatusForbidden, "from",
			"The from address does not match a verified Sender Identity. Mail cannot be sent until this error is resolved. "+
				"Visit https://sendgrid.com/docs/for-developers/sending-email/sender-identity/ to see the Sender Identity requirements")
		return
	}
	if m.MailSettings.SandboxMode.Enable {
		// SendGrid's own sandbox mode: valid, not delivered, not recorded.
		if hangAfterAccept {
			mark(w, outHung)
			hang(r)
			return
		}
		s.sendgridLogRequest(&m, http.StatusOK)
		w.WriteHeader(http.StatusOK)
		return
	}

	id := newSendgridID()
	recorded(w, s.sendgridAccept(&m, id, now.UTC(), hangAfterAccept), 0)
	if hangAfterAccept {
		mark(w, outHung)
		s.sendgridLogRequest(&m, 0)
		hang(r)
		return
	}
	s.sendgridLogRequest(&m, http.StatusAccepted)
	w.Header().Set("X-Message-Id", id)
	w.WriteHeader(http.StatusAccepted)
}

// sendgridAuthorized checks Authorization: Bearer <key> and returns the key.
func (s *Server) sendgridAuthorized(r *http.Request) (string, bool) {
	scheme, key, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" {
		return "", false
	}
	if s.opts.SendGridAPIKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.opts.SendGridAPIKey)) != 1 {
		return "", false
	}
	return key, true
}

// readSendgridBody reads the body, gunzipping it when Content-Encoding says gzip. tooLarge reports a
// body over 30 MB; the rest of it is drained (up to a bound) so that the client reads the 413 instead of
// a reset while it is still writing.
func readSendgridBody(r *http.Request) (body []byte, tooLarge bool, err error) {
	drain := func() { _, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 4*sendgridMaxBody)) }
	if r.ContentLength > sendgridMaxBody {
		drain()
		return nil, true, nil
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// ReadFrom wants MinRead bytes free before each read, the one that finds the end too: with less,
		// it doubled the buffer of every request (a megabyte more for a thousand e-mails).
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, sendgridMaxBody+1)); err != nil {
		return nil, false, err
	}
	raw := buf.Bytes()
	if len(raw) > sendgridMaxBody {
		drain()
		return nil, true, nil
	}
	if !strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		return raw, false, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, false, err
	}
	raw, err = io.ReadAll(io.LimitReader(zr, sendgridMaxBody+1))
	if err != nil {
		return nil, false, err
	}
	return raw, len(raw) > sendgridMaxBody, nil
}

// validateSendgridMail applies SendGrid's rules for a Mail Send body, in the order SendGrid reports
// them, and returns the first violation: the field it names ("" for null) and SendGrid's message.
func validateSendgridMail(m *sendgridMail, now time.Time) (field, msg string) {
	switch n := len(m.Personalizations); {
	case n == 0:
		return "personalizations", "The personalizations field is required and must have at least one personalization."
	case n > sendgridMaxPersonalizations:
		return "personalizations", "You may not have more than 1000 personalizations per API request. You may need to make multiple requests."
	}
	if m.From == nil || m.From.Email == "" {
		return "from.email", "The from object must be provided for every email send. It is an object that requires the email parameter, but may also contain a name parameter."
	}
	if !sendgridASCII(m.From.Email) || !isSendgridAddress(m.From.Email) {
		return "from.email", "The from email does not contain a valid address."
	}
	if m.TemplateID == "" {
		if len(m.Content) == 0 {
			return "content", "Unless a valid template_id is provided, the content parameter is required. There must be at least one defined content block. " +
				"We typically suggest both text/plain and text/html blocks are included, but only one block is required."
		}
		for i, c := range m.Content {
			switch {
			case c.Type == "":
				return fmt.Sprintf("content.%d.type", i), "The content type must be provided."
			case c.Value == "":
				return fmt.Sprintf("content.%d.value", i), "The content value must be a string at least one character in length."
			case c.Type == "text/plain" && i != 0:
				return fmt.Sprintf("content.%d.type", i), "If present, text/plain content must be first, followed by text/html, followed by any other content."
			}
		}
		if m.Subject == "" {
			for _, p := range m.Personalizations {
				if p.Subject == "" {
					return "subject", "The subject is required. You can get around this requirement if you use a template with a subject defined or if every personalization has a subject defined."
				}
			}
		}
	}
	recipients := 0
	seen := make(map[string]bool, len(m.Personalizations))
	for i, p := range m.Personalizations {
		if len(p.To) == 0 {
			return fmt.Sprintf("personalizations.%d.to", i), "The to array is required for all personalization objects, and must have at least one email object with a valid email address."
		}
		for _, list := range []struct {
			name  string
			addrs []sendgridAddress
		}{{"to", p.To}, {"cc", p.CC}, {"bcc", p.BCC}} {
			for j, a := range list.addrs {
				if !isSendgridAddress(a.Email) {
					return fmt.Sprintf("personalizations.%d.%s.%d.email", i, list.name, j), "Does not contain a valid address."
				}
				if strings.ContainsAny(a.Name, ";,") {
					return fmt.Sprintf("personalizations.%d.%s.%d.name", i, list.name, j), "The name cannot contain semicolons or commas."
				}
				key := strings.ToLower(a.Email)
				if seen[key] {
					return fmt.Sprintf("personalizations.%d.%s", i, list.name),
						fmt.Sprintf("Each email address in the personalization block should be unique between to, cc, and bcc. "+
							"We found the first duplicate instance of [%s] in the personalizations.%d.%s field.", a.Email, i, list.name)
				}
				seen[key] = true
				recipients++
			}
		}
		if sendgridSubstitutionBytes(p.Substitutions) > sendgridMaxSubstitutions {
			return fmt.Sprintf("personalizations.%d.substitutions", i), "The substitutions for a personalization may not exceed 10,000 bytes."
		}
		if sendgridCustomArgBytes(m.CustomArgs, p.CustomArgs) >= sendgridMaxCustomArgs {
			return fmt.Sprintf("personalizations.%d.custom_args", i), "The custom arguments may not exceed 10,000 bytes."
		}
		if p.SendAt != 0 && time.Unix(p.SendAt, 0).After(now.Add(sendgridMaxSendAhead)) {
			return fmt.Sprintf("personalizations.%d.send_at", i), "The send_at parameter may not be more than 72 hours in the future."
		}
	}
	if recipients > sendgridMaxPersonalizations {
		return "personalizations", "The total number of recipients (to, cc and bcc) may not be more than 1000 per request."
	}
	if len(m.Categories) > sendgridMaxCategories {
		return "categories", "You may not have more than 10 categories per request."
	}
	for i, c := range m.Categories {
		if len(c) > sendgridMaxCategoryLen {
			return fmt.Sprintf("categories.%d", i), "A category may not be longer than 255 characters."
		}
	}
	if sendgridCustomArgBytes(m.CustomArgs, nil) >= sendgridMaxCustomArgs {
		return "custom_args", "The custom arguments may not exceed 10,000 bytes."
	}
	if m.SendAt != 0 && time.Unix(m.SendAt, 0).After(now.Add(sendgridMaxSendAhead)) {
		return "send_at", "The send_at parameter may not be more than 72 hours in the future."
	}
	return "", ""
}

// sendgridSubstitutionBytes is the weight of a personalization's substitutions: every key and value.
func sendgridSubstitutionBytes(subs map[string]string) int {
	n := 0
	for k, v := range subs {
		n += len(k) + len(v)
	}
	return n
}

// sendgridCustomArgBytes is the weight of the message-level custom_args with a personalization's on top.
func sendgridCustomArgBytes(global, own map[string]string) int {
	n := 0
	for k, v := range global {
		if _, over := own[k]; !over {
			n += len(k) + len(v)
		}
	}
	for k, v := range own {
		n += len(k) + len(v)
	}
	return n
}

func isSendgridAddress(s string) bool {
	a, err := mail.ParseAddress(s)
	return err == nil && a.Address == s
}

func sendgridASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// sendgridAccept records every recipient of m as a Message, with the substitutions of its
// personalization applied, and queues its events. It returns the number of messages recorded.
func (s *Server) sendgridAccept(m *sendgridMail, id string, at time.Time, hung bool) int {
	var text, html string
	for _, c := range m.Content {
		switch {
		case c.Type == "text/plain" && text == "":
			text = c.Value
		case c.Type == "text/html" && html == "":
			html = c.Value
		}
	}
	emit := s.sendgrid.events.enabled()
	var events []map[string]any
	var sent []sendgridRemember
	recorded := 0
	var tags []string // the personalization's substitution tags, longest first (one slice for the request)
	for i, p := range m.Personalizations {
		subject, body, htmlBody := p.Subject, text, html
		if subject == "" {
			subject = m.Subject
		}
		if m.TemplateID != "" {
			b, _ := json.Marshal(map[string]any{"template_id": m.TemplateID, "dynamic_template_data": p.DynamicTemplateData})
			body, htmlBody = string(b), ""
		} else if len(p.Substitutions) > 0 {
			// One pass, as SendGrid substitutes: a value is never searched for tags itself. The longest
			// tag is tried first, so that a tag that starts another cannot take its place.
			tags = slices.AppendSeq(tags[:0], maps.Keys(p.Substitutions))
			slices.SortFunc(tags, func(a, b string) int { return len(b) - len(a) })
			subject, body, htmlBody = substitute(subject, tags, p.Substitutions), substitute(body, tags, p.Substitutions),
				substitute(htmlBody, tags, p.Substitutions)
		}
		// The custom_args the events carry: only made when events are sent.
		var args map[string]string
		if emit {
			args = make(map[string]string, len(m.CustomArgs)+len(p.CustomArgs))
			maps.Copy(args, m.CustomArgs)
			maps.Copy(args, p.CustomArgs)
		}
		// A personalization's headers win, as SendGrid's do. Decoded for this request alone, they are
		// the message's as they are when the request sets none for all.
		headers := p.Headers
		if len(m.Headers) > 0 {
			headers = maps.Clone(m.Headers)
			maps.Copy(headers, p.Headers)
		} else if headers != nil && len(headers) == 0 {
			headers = nil
		}
		n := 0
		for _, list := range [][]sendgridAddress{p.To, p.CC, p.BCC} {
			for _, a := range list {
				sgID := id + ".sandbox-" + strconv.Itoa(i) + "-" + strconv.Itoa(n)
				n++
				s.log.accept(Message{
					Provider: "sendgrid",
					SID:      sgID,
					To:       a.Email,
					From:     m.From.Email,
					Subject:  subject,
					Body:     body,
					HTML:     htmlBody,
					Headers:  headers,
					Status:   "processed",
					At:       at,
					Hung:     hung,
				})
				recorded++
				if emit {
					events = append(events, sendgridEvents(a.Email, sgID, at, args, m.Categories)...)
					sent = append(sent, sendgridRemember{email: a.Email, mail: sendgridSentMail{sgMessageID: sgID, args: args, categories: m.Categories}})
				}
			}
		}
	}
	s.sendgrid.events.enqueue(events)
	s.sendgrid.sent.remember(sent)
	return recorded
}

// sendgridErrorItem and sendgridErrorBody are SendGrid's error answer.
type sendgridErrorItem struct {
	Message string  `json:"message"`
	Field   *string `json:"field"`
	Help    any     `json:"help"`
}

type sendgridErrorBody struct {
	Errors []sendgridErrorItem `json:"errors"`
}

// sendgridError answers status with SendGrid's error body; field "" is null. m is the request's body
// when it was decoded (the log record then describes it), nil before.
func (s *Server) sendgridError(w http.ResponseWriter, m *sendgridMail, status int, field, msg string) {
	s.log.rejected(status, 0)
	s.sendgridLogRequest(m, status)
	item := sendgridErrorItem{Message: msg}
	if field != "" {
		item.Field = &field
	}
	writeJSON(w, status, sendgridErrorBody{Errors: []sendgridErrorItem{item}})
}

// sendgridTooManyRequests answers 429 with SendGrid's rate-limit headers; the limit resets once wait has
// passed, rounded up to the next whole second.
func (s *Server) sendgridTooManyRequests(w http.ResponseWriter, wait time.Duration) {
	limit := max(1, int(s.opts.SendGridRate))
	reset := time.Now().Add(max(wait, time.Millisecond))
	resetSec := reset.Unix()
	if reset.Nanosecond() > 0 {
		resetSec++
	}
	w.Header().Set("X-RateLimit-Limit", strconv.Itoa(limit))
	w.Header().Set("X-RateLimit-Remaining", "0")
	w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(resetSec, 10))
	s.sendgridError(w, nil, http.StatusTooManyRequests, "", "too many requests")
}

// sendgridLogRequest writes one debug record per Mail Send request; status 0 means no answer was sent.
// Only the first recipient is logged, masked; never the API key or the content.
func (s *Server) sendgridLogRequest(m *sendgridMail, status int) {
	// Asked first (as Debug asks), so that a sandbox that does not log debug does not mask an address per
	// request for nothing.
	if !s.logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	to, n := "", 0
	if m != nil {
		n = len(m.Personalizations)
		if n > 0 && len(m.Personalizations[0].To) > 0 {
			to = providers.MaskAddress(m.Personalizations[0].To[0].Email)
		}
	}
	s.logger.Debug("sandbox sendgrid request", "to", to, "personalizations", n, "status", status)
}

// newSendgridID returns an X-Message-Id: 22 URL-safe base64 characters, like SendGrid's.
func newSendgridID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// sendgridSigningKey imitates GET /v3/user/webhooks/event/settings/signed[/{id}]: the public key of the
// Event Webhook signatures. Like SendGrid, it wants the API key.
func (s *Server) sendgridSigningKey(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.sendgridAuthorized(r); !ok {
		writeJSON(w, http.StatusUnauthorized, sendgridErrorBody{Errors: []sendgridErrorItem{{Message: "authorization required"}}})
		return
	}
	id := r.PathValue("id")
	if id == "" {
		id = "sandbox"
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "public_key": s.sendgrid.publicKey})
}

// substitute replaces every tag in s by its value in one pass, trying tags in the order given (longest
// first) at each position. It does what a strings.Replacer of the pairs does, without building one per
// personalization (a generic Replacer's trie cost more than the rest of a request's recipients).
func substitute(s string, tags []string, subs map[string]string) string {
	// When every tag starts with the same byte (a campaign's do), the text is searched for that byte
	// alone, not tried against each tag at every place.
	var first byte
	have, one := false, true
	for _, t := range tags {
		switch {
		case t == "":
		case !have:
			first, have = t[0], true
		case t[0] != first:
			one = false
		}
	}
	if !have {
		return s
	}
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); {
		if one {
			j := strings.IndexByte(s[i:], first)
			if j < 0 {
				break
			}
			i += j
		}
		tag := ""
		for _, t := range tags {
			if t != "" && strings.HasPrefix(s[i:], t) {
				tag = t
				break
			}
		}
		if tag == "" {
			i++
			continue
		}
		if last == 0 && b.Len() == 0 {
			b.Grow(len(s))
		}
		b.WriteString(s[last:i])
		b.WriteString(subs[tag])
		i += len(tag)
		last = i
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}
