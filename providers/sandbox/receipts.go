package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// Twilio status callbacks
//
// A message accepted with a StatusCallback URL gets Twilio's status callbacks: ReceiptDelay after it
// was accepted a form-encoded POST with MessageStatus "sent", and ReceiptDelay later one with the final
// status, "delivered" unless the recipient is a magic receipt number:
//
//	+905550030001  failed       ErrorCode 30001 (queue overflow; no "sent" before it)
//	+905550030003  undelivered  ErrorCode 30003 (unreachable destination handset)
//	+905550030005  undelivered  ErrorCode 30005 (unknown destination handset)
//	+905550030006  undelivered  ErrorCode 30006 (landline or unreachable carrier)
//	+905550030007  undelivered  ErrorCode 30007 (message filtered by the carrier)
//
// These share the +9055500NNNNN form of the send-time magic numbers (NNNNN is the code); the 300xx
// codes are asynchronous ones Twilio never answers a send with, so the send is accepted (201).
//
// Each POST carries MessageSid and SmsSid, MessageStatus and SmsStatus, AccountSid, From (or
// MessagingServiceSid), To, ApiVersion, and ErrorCode on failure, and is signed as Twilio signs:
// X-Twilio-Signature = base64(HMAC-SHA1(auth token, URL + the POST keys sorted, each followed by its
// value)), with the auth token the message was sent with. A message accepted and then left hanging by
// the timeout fault gets its callbacks too, as the real one would be delivered.
//
// Callbacks go only to loopback hosts (localhost or a loopback IP, checked again when dialling, and no
// redirects are followed); any other URL is refused silently and counted. Each callback is tried as
// Twilio tries it: once more if the connection failed, and as the URL's connection overrides say, a
// fragment that is not sent (#rc=3&rp=5xx,ct: rc retries, 0 to 5, of the failures rp names: 4xx, 5xx, ct
// a connection that failed, rt an answer that did not come, all), a retry connectionRetryWait after the
// failure. The signature covers the URL without its fragment, the one the receiver sees. At most
// maxPendingReceipts messages wait for theirs, and a message beyond that gets none (counted as dropped),
// so the send path never waits. GET /_sandbox/receipts/stats
// returns ReceiptStats; Reset does not clear them.
//
// The message log keeps, per message, the last status its receiver answered with a 2xx and when the
// first such answer came (Message.Receipt, Message.ReceiptAt): from that instant the receiver held proof
// that the provider had accepted the message. GET /_sandbox/receipts returns the ReceiptSettings and
// POST /_sandbox/receipts changes them while the sandbox runs (the delay, or no callbacks at all), for the
// messages accepted from then on.

// maxPendingReceipts bounds the messages whose callbacks are scheduled or in flight.
const maxPendingReceipts = 4096

// magicReceipts are the recipients (magicPrefix + code) whose message is not delivered, with the final
// status their callback reports.
var magicReceipts = map[string]string{
	"30001": "failed",
	"30003": "undelivered",
	"30005": "undelivered",
	"30006": "undelivered",
	"30007": "undelivered",
}

// ReceiptStats counts the delivery receipts the sandbox sent, since it started.
type ReceiptStats struct {
	// Scheduled is the number of messages whose callbacks were scheduled.
	Scheduled int64 `json:"scheduled"`
	// Sent is the number of callbacks POSTed and answered with a 2xx.
	Sent int64 `json:"sent"`
	// Failed is the number of callbacks that got no answer or a non-2xx one, at their last attempt.
	Failed int64 `json:"failed"`
	// Retried is the number of attempts that failed and were tried again (connection overrides).
	Retried int64 `json:"retried"`
	// Refused is the number of messages whose StatusCallback was not a loopback http(s) URL.
	Refused int64 `json:"refused"`
	// Dropped is the number of messages that got no callbacks because maxPendingReceipts were pending.
	Dropped int64 `json:"dropped"`
	// Pending is the number of messages whose callbacks are not all sent yet.
	Pending int64 `json:"pending"`
	// Disabled is the number of messages that got no callbacks because ReceiptSettings.Off was set.
	Disabled int64 `json:"disabled"`
}

// ReceiptSettings are what can change about the Twilio status callbacks while the sandbox runs. A change
// applies to the messages accepted after it; callbacks already scheduled keep their times.
type ReceiptSettings struct {
	// DelayMS is how long after acceptance the first callback is posted, and how long after it the final
	// one, in milliseconds (Options.ReceiptDelay at the start).
	DelayMS int64 `json:"delay_ms"`
	// Off sends no callbacks at all: the messages accepted meanwhile never get theirs.
	Off bool `json:"off"`
}

// maxReceiptDelayMS bounds ReceiptSettings.DelayMS (10 minutes).
const maxReceiptDelayMS = 10 * 60 * 1000

func (rs ReceiptSettings) validate() error {
	if rs.DelayMS < 0 || rs.DelayMS > maxReceiptDelayMS {
		return fmt.Errorf("delay_ms must be between 0 and %d, got %d", maxReceiptDelayMS, rs.DelayMS)
	}
	return nil
}

// receiptState holds what the receipt emitters need (Twilio status callbacks).
type receiptState struct {
	client    *http.Client
	slots     chan struct{} // one per pending message; never waited on
	settings  atomic.Pointer[ReceiptSettings]
	callbacks callbackCheck

	scheduled, sent, failed, retried, refused, dropped, disabled atomic.Int64
}

// receiptRoutes sets up the delivery receipt emitters.
func (s *Server) receiptRoutes() {
	s.receipts = &receiptState{
		client: loopbackClient(),
		slots:  make(chan struct{}, maxPendingReceipts),
	}
	s.receipts.settings.Store(&ReceiptSettings{DelayMS: max(s.opts.ReceiptDelay, 0).Milliseconds()})
	s.mux.HandleFunc("GET /_sandbox/receipts/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.ReceiptStats())
	})
	s.mux.HandleFunc("GET /_sandbox/receipts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Receipts())
	})
	s.mux.HandleFunc("POST /_sandbox/receipts", func(w http.ResponseWriter, r *http.Request) {
		var rs ReceiptSettings
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rs); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode receipt settings: " + err.Error()})
			return
		}
		if err := s.SetReceipts(rs); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s.logger.Info("sandbox receipt settings set", "delay_ms", rs.DelayMS, "off", rs.Off)
		writeJSON(w, http.StatusOK, rs)
	})
}

// Receipts returns the current status callback settings.
func (s *Server) Receipts() ReceiptSettings { return *s.receipts.settings.Load() }

// SetReceipts replaces the status callback settings, for the messages accepted from now on.
func (s *Server) SetReceipts(rs ReceiptSettings) error {
	if err := rs.validate(); err != nil {
		return err
	}
	s.receipts.settings.Store(&rs)
	return nil
}

// ReceiptStats returns the delivery receipt counters.
func (s *Server) ReceiptStats() ReceiptStats {
	rs := s.receipts
	return ReceiptStats{
		Scheduled: rs.scheduled.Load(),
		Sent:      rs.sent.Load(),
		Failed:    rs.failed.Load(),
		Retried:   rs.retried.Load(),
		Refused:   rs.refused.Load(),
		Dropped:   rs.dropped.Load(),
		Pending:   int64(len(rs.slots)),
		Disabled:  rs.disabled.Load(),
	}
}

// connectionRetryWait is how long after a failed attempt a status callback is tried again.
const connectionRetryWait = 250 * time.Millisecond

// connectionOverrides splits a webhook URL into the URL requested and its connection overrides' retries:
// how many (rc) and of which failures (rp). Without any, Twilio retries a failed connection once.
func connectionOverrides(raw string) (target string, retries int, policy []string) {
	target, frag, _ := strings.Cut(raw, "#")
	retries, policy = 1, []string{"ct"}
	q, err := url.ParseQuery(frag)
	if err != nil {
		return target, retries, policy
	}
	if rc := q.Get("rc"); rc != "" {
		if n, err := strconv.Atoi(rc); err == nil && n >= 0 && n <= 5 {
			retries = n
		}
	}
	if rp := q.Get("rp"); rp != "" {
		policy = strings.Split(rp, ",")
	}
	return target, retries, policy
}

// retried says whether a callback that failed with err is tried again under policy.
func retried(err error, policy []string) bool {
	var code answeredError
	var ne net.Error
	kind := "ct"
	switch {
	case errors.As(err, &code) && code >= 500:
		kind = "5xx"
	case errors.As(err, &code):
		kind = "4xx"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		kind = "rt"
	}
	return slices.Contains(policy, kind) || slices.Contains(policy, "all")
}

// twilioCallback is one scheduled status callback chain.
type twilioCallback struct {
	url     string // without the fragment
	retries int    // of a failure the policy names
	policy  []string
	token   string
	form    url.Values // the fields every callback of the message carries
	final   string     // "delivered", "undelivered" or "failed"
	code    string     // ErrorCode of the final callback, "" when delivered
	entry   int        // the message's place in the log, for its receipt fields
}

// scheduleTwilioReceipts schedules the status callbacks of m, just accepted by r (whose form is f) and
// logged at entry, if r named a StatusCallback. It never blocks.
func (s *Server) scheduleTwilioReceipts(r *http.Request, f *twilioForm, m Message, entry int) {
	cbURL := f.statusCallback
	if cbURL == "" {
		return
	}
	rs := s.receipts
	settings := rs.settings.Load()
	if settings.Off {
		rs.disabled.Add(1)
		return
	}
	delay := time.Duration(settings.DelayMS) * time.Millisecond
	if !rs.callbacks.ok(cbURL) {
		rs.refused.Add(1)
		s.logger.Debug("sandbox status callback refused: not a loopback URL", "message_sid", m.SID)
		return
	}
	select {
	case rs.slots <- struct{}{}:
	default:
		rs.dropped.Add(1)
		s.logger.Debug("sandbox status callback dropped: too many pending", "message_sid", m.SID)
		return
	}
	rs.scheduled.Add(1)
	_, token, _ := r.BasicAuth()
	target, retries, policy := connectionOverrides(cbURL)
	cb := &twilioCallback{
		url:     target,
		retries: retries,
		policy:  policy,
		token:   token,
		form: url.Values{
			"MessageSid": {m.SID}, "SmsSid": {m.SID},
			"AccountSid": {m.AccountSID},
			"To":         {m.To},
			"ApiVersion": {"2010-04-01"},
		},
		final: "delivered",
		entry: entry,
	}
	if f.msid != "" {
		cb.form.Set("MessagingServiceSid", f.msid)
	}
	if f.from != "" {
		cb.form.Set("From", f.from)
	}
	if status, ok := magicReceipts[strings.TrimPrefix(m.To, magicPrefix)]; ok && strings.HasPrefix(m.To, magicPrefix) {
		cb.final, cb.code = status, strings.TrimPrefix(m.To, magicPrefix)
	}
	if cb.final == "failed" {
		time.AfterFunc(delay, func() { s.postFinal(cb) })
		return
	}
	time.AfterFunc(delay, func() {
		s.postTwilioCallback(cb, "sent", "")
		time.AfterFunc(delay, func() { s.postFinal(cb) })
	})
}

func (s *Server) postFinal(cb *twilioCallback) {
	defer func() { <-s.receipts.slots }()
	s.postTwilioCallback(cb, cb.final, cb.code)
}

// postTwilioCallback POSTs one signed status callback and counts the outcome.
func (s *Server) postTwilioCallback(cb *twilioCallback, status, code string) {
	form := make(url.Values, len(cb.form)+3)
	for k, v := range cb.form {
		form[k] = v
	}
	form.Set("MessageStatus", status)
	form.Set("SmsStatus", status)
	if code != "" {
		form.Set("ErrorCode", code)
	}
	sig := twilioSignature(cb.token, cb.url, form)
	err := s.receipts.post(cb.url, form, sig)
	for try := 0; err != nil && try < cb.retries && retried(err, cb.policy); try++ {
		s.receipts.retried.Add(1)
		time.Sleep(connectionRetryWait)
		err = s.receipts.post(cb.url, form, sig)
	}
	if err != nil {
		s.receipts.failed.Add(1)
		s.logger.Debug("sandbox status callback failed", "message_sid", form.Get("MessageSid"),
			"to", providers.MaskAddress(form.Get("To")), "status", status, "err", err)
		return
	}
	s.receipts.sent.Add(1)
	s.log.receipted(cb.entry, form.Get("MessageSid"), status, time.Now().UTC())
	s.logger.Debug("sandbox status callback sent", "message_sid", form.Get("MessageSid"),
		"to", providers.MaskAddress(form.Get("To")), "status", status)
}

func (rs *receiptState) post(target string, form url.Values, sig string) error {
	header := http.Header{
		"Content-Type":       {"application/x-www-form-urlencoded"},
		"User-Agent":         {"TwilioProxy/1.1"},
		"X-Twilio-Signature": {sig},
	}
	return postLoopback(rs.client, target, header, strings.NewReader(form.Encode()))
}

// twilioSignature is X-Twilio-Signature for a form POST to rawURL: base64(HMAC-SHA1(token, rawURL +
// each key, sorted, followed by its value)).
func twilioSignature(token, rawURL string, form url.Values) string {
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(rawURL))
	for _, k := range keys {
		for _, v := range form[k] {
			mac.Write([]byte(k))
			mac.Write([]byte(v))
		}
	}
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
