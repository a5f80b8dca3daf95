package sandbox

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Event Webhook emitter's bounds.
const (
	// sendgridMaxQueued bounds the events waiting to be posted; the events of a request that does not
	// fit are dropped (and counted), so that a stalled receiver never holds up or grows the send path.
	sendgridMaxQueued = 100_000
	// sendgridMaxPerPost bounds the events of one post, as SendGrid batches them.
	sendgridMaxPerPost = 1000
	// sendgridRetryFor is how long SendGrid keeps posting a batch its receiver did not take (2xx) before
	// it drops its events: 24 hours.
	sendgridRetryFor = 24 * time.Hour
	// sendgridRetryMax bounds the wait between two attempts of a batch; the first retry comes after
	// max(ReceiptDelay, sendgridRetryMin), each next one twice as late.
	sendgridRetryMin = 100 * time.Millisecond
	sendgridRetryMax = time.Minute
)

// The Event Webhook signature headers (sendgrid-go's eventwebhook.VerificationHTTPHeader and
// TimestampHTTPHeader).
const (
	sendgridSignatureHeader = "X-Twilio-Email-Event-Webhook-Signature"
	sendgridTimestampHeader = "X-Twilio-Email-Event-Webhook-Timestamp"
)

// SendGridEventStats counts what the SendGrid fake's Event Webhook emitter did since the Server started.
type SendGridEventStats struct {
	// Posted is the number of posts the receiver answered with a 2xx.
	Posted int `json:"posted"`
	// Failed is the number of post attempts that failed: an error status, a transport error or a timeout.
	// As SendGrid does, a failed post is tried again, later each time (from max(ReceiptDelay, 100 ms),
	// doubling, at most a minute apart), for 24 hours; newer events are posted meanwhile.
	Failed int `json:"failed"`
	// Events is the number of events in the posts answered with a 2xx.
	Events int `json:"events"`
	// Dropped is the number of events given up: the queue was full, or no attempt to post them succeeded
	// in 24 hours.
	Dropped int `json:"dropped"`
	// Queued is the number of events waiting for their time, for the post before them, or to be tried
	// again.
	Queued int `json:"queued"`
	// Disabled says why no events are sent although Options.SendGridEventURL is set ("" when they are).
	Disabled string `json:"disabled,omitempty"`
}

// sendgridEmitter posts the SendGrid fake's events, signed, to Options.SendGridEventURL. Each event is
// due ReceiptDelay after its message was accepted; one goroutine, started when events are queued and
// gone when the queue is empty, posts everything due in batches of up to 1000, so a busy send path makes
// few, large posts. The send path only appends to the queue.
type sendgridEmitter struct {
	url    string // "" when no events are sent
	delay  time.Duration
	key    *ecdsa.PrivateKey
	client *http.Client
	logger *slog.Logger

	mu      sync.Mutex
	queue   []sendgridPending
	again   []*sendgridRetry // batches whose post failed, to be tried again
	running bool
	stats   SendGridEventStats
}

// sendgridRetry is a batch whose post failed: tried again at due, given up sendgridRetryFor after first.
type sendgridRetry struct {
	batch    []map[string]any
	due      time.Time
	first    time.Time
	attempts int
}

// retryWait is how long after its attempt-th failure a batch is tried again.
func (e *sendgridEmitter) retryWait(attempt int) time.Duration {
	w := max(e.delay, sendgridRetryMin)
	for i := 1; i < attempt && w < sendgridRetryMax; i++ {
		w *= 2
	}
	return min(w, sendgridRetryMax)
}

type sendgridPending struct {
	due   time.Time
	event map[string]any
}

func newSendgridEmitter(rawURL string, delay time.Duration, key *ecdsa.PrivateKey, logger *slog.Logger) *sendgridEmitter {
	e := &sendgridEmitter{delay: delay, key: key, logger: logger}
	if rawURL == "" {
		return e
	}
	// Only "localhost" or a loopback IP; the client's dialer checks the address again after resolution.
	if _, err := parseLoopbackURL("the SendGrid event URL", rawURL); err != nil {
		e.stats.Disabled = err.Error()
		logger.Error("sandbox sendgrid events disabled", "err", err)
		return e
	}
	e.url = rawURL
	e.client = loopbackClient()
	return e
}

// sendgridEvents returns a recipient's events, processed then the outcome its address asks for, each
// with the request's custom_args at the top level.
func sendgridEvents(email, sgMessageID string, at time.Time, args map[string]string, categories []string) []map[string]any {
	outcome := map[string]any{"event": "delivered", "response": "250 2.0.0 OK sandbox"}
	local := strings.ToLower(email)
	switch {
	case strings.HasPrefix(local, sendgridBouncePrefix):
		outcome = map[string]any{
			"event": "bounce", "type": "bounce", "status": "5.1.1",
			"reason":                "550 5.1.1 The email account that you tried to reach does not exist.",
			"bounce_classification": "Invalid Address",
		}
	case strings.HasPrefix(local, sendgridDropPrefix):
		outcome = map[string]any{"event": "dropped", "reason": "Bounced Address"}
	case strings.HasPrefix(local, sendgridUnsubDropPrefix):
		outcome = map[string]any{"event": "dropped", "reason": "Unsubscribed Address"}
	case strings.HasPrefix(local, sendgridDeferPrefix):
		outcome = map[string]any{"event": "deferred", "response": "421 4.7.0 Try again later", "attempt": "1"}
	}
	smtpID := "<" + sgMessageID + "@sandbox.sendgrid.test>"
	out := make([]map[string]any, 0, 2)
	for _, ev := range []map[string]any{{"event": "processed"}, outcome} {
		for k, v := range args {
			ev[k] = v
		}
		if len(categories) > 0 {
			ev["category"] = categories
		}
		// The standard fields win over a custom arg of the same name.
		ev["email"] = email
		ev["timestamp"] = at.Unix()
		ev["sg_event_id"] = newSendgridEventID()
		ev["sg_message_id"] = sgMessageID
		ev["smtp-id"] = smtpID
		out = append(out, ev)
	}
	return out
}

// newSendgridEventID returns a unique sg_event_id: 22 URL-safe base64 characters.
func newSendgridEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// enabled reports whether events are posted at all.
func (e *sendgridEmitter) enabled() bool { return e.url != "" }

// enqueue queues the events of messages just accepted, due ReceiptDelay from now. It never blocks on
// the network: when the queue has no room for all of them, they are dropped.
func (e *sendgridEmitter) enqueue(events []map[string]any) {
	if !e.enabled() || len(events) == 0 {
		return
	}
	due := time.Now().Add(e.delay)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue)+e.retrying()+len(events) > sendgridMaxQueued {
		e.stats.Dropped += len(events)
		e.logger.Warn("sandbox sendgrid event queue full", "dropped", len(events))
		return
	}
	for _, ev := range events {
		e.queue = append(e.queue, sendgridPending{due: due, event: ev})
	}
	if !e.running {
		e.running = true
		go e.run()
	}
}

// retrying is the number of events in the batches to be tried again (e.mu held).
func (e *sendgridEmitter) retrying() int {
	n := 0
	for _, r := range e.again {
		n += len(r.batch)
	}
	return n
}

// run posts the queued events as they fall due, and the batches to be tried again as their time comes,
// and returns when nothing waits.
func (e *sendgridEmitter) run() {
	for {
		e.mu.Lock()
		if len(e.queue) == 0 && len(e.again) == 0 {
			e.running = false
			e.queue = nil
			e.mu.Unlock()
			return
		}
		var next time.Time
		if len(e.queue) > 0 {
			next = e.queue[0].due
		}
		for _, r := range e.again {
			if next.IsZero() || r.due.Before(next) {
				next = r.due
			}
		}
		e.mu.Unlock()
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}

		e.mu.Lock()
		now := time.Now()
		n := 0
		for n < len(e.queue) && n < sendgridMaxPerPost && !e.queue[n].due.After(now) {
			n++
		}
		batch := make([]map[string]any, n)
		for i := range batch {
			batch[i] = e.queue[i].event
		}
		e.queue = append(e.queue[:0], e.queue[n:]...)
		var due []*sendgridRetry
		e.again = slices.DeleteFunc(e.again, func(r *sendgridRetry) bool {
			if r.due.After(now) {
				return false
			}
			due = append(due, r)
			return true
		})
		e.mu.Unlock()
		if n > 0 {
			e.post(&sendgridRetry{batch: batch, first: now})
		}
		for _, r := range due {
			e.post(r)
		}
	}
}

// post delivers one batch, signed; a batch that fails is tried again later (retryWait), until
// sendgridRetryFor after its first attempt.
func (e *sendgridEmitter) post(r *sendgridRetry) {
	body, err := json.Marshal(r.batch)
	if err != nil {
		e.count(func(st *SendGridEventStats) { st.Dropped += len(r.batch) })
		e.logger.Error("sandbox sendgrid events encode", "err", err)
		return
	}
	r.attempts++
	err = e.postOnce(body)
	if err == nil {
		e.count(func(st *SendGridEventStats) { st.Posted++; st.Events += len(r.batch) })
		e.logger.Debug("sandbox sendgrid events posted", "events", len(r.batch), "attempt", r.attempts)
		return
	}
	e.logger.Warn("sandbox sendgrid events post failed", "events", len(r.batch), "attempt", r.attempts, "err", err)
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stats.Failed++
	if now.Sub(r.first) >= sendgridRetryFor {
		e.stats.Dropped += len(r.batch)
		return
	}
	r.due = now.Add(e.retryWait(r.attempts))
	e.again = append(e.again, r)
}

func (e *sendgridEmitter) postOnce(body []byte) error {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig, err := signSendgridEvents(e.key, ts, body)
	if err != nil {
		return err
	}
	header := http.Header{
		"Content-Type":          {"application/json"},
		"User-Agent":            {"SendGrid Event API"},
		sendgridTimestampHeader: {ts},
		sendgridSignatureHeader: {sig},
	}
	return postLoopback(e.client, e.url, header, bytes.NewReader(body))
}

// signSendgridEvents signs as SendGrid does: base64 of the ASN.1 DER ECDSA signature of
// SHA-256(timestamp + body).
func signSendgridEvents(key *ecdsa.PrivateKey, ts string, body []byte) (string, error) {
	h := sha256.New()
	h.Write([]byte(ts))
	h.Write(body)
	sig, err := ecdsa.SignASN1(rand.Reader, key, h.Sum(nil))
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

func (e *sendgridEmitter) count(f func(*SendGridEventStats)) {
	e.mu.Lock()
	f(&e.stats)
	e.mu.Unlock()
}

func (e *sendgridEmitter) snapshot() SendGridEventStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stats
	st.Queued = len(e.queue) + e.retrying()
	return st
}
