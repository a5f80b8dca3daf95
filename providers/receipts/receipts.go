// Package receipts receives the providers' delivery receipts (Twilio status callbacks, the SendGrid
// Event Webhook), verifies that the provider sent them, and hands them to a Sink as Receipts. The
// recipients' refusals that come back the same way (SendGrid unsubscribes and spam reports, an SMS
// answered with RET or IPTAL) go to a RefusalSink as Refusals.
//
// Each kind of request has its own http.Handler (TwilioHandler, TwilioInboundHandler, SendGridHandler).
// A request is verified before anything in it is believed: an unsigned or wrongly signed request (or,
// for SendGrid, one whose signed timestamp lies outside the replay window) is answered 403, a request
// that cannot be parsed 400 (413 when too large, 408 when its body came too slowly), and a request whose
// receipts or refusals a sink could not record 500, so that the provider delivers it again; refusals the
// sink could not take within the store wait go to the handler's Spool, if it has one, and do not make the
// request fail (see Spool). A request
// that was recorded, or held nothing but events that are neither (opens, clicks, Twilio's interim
// statuses), is answered 204; an incoming SMS is answered 200 with an empty TwiML document, so that
// Twilio sends no reply.
//
// What an unauthenticated client can make a handler do is bounded: the signature headers are checked
// before any of the body is read; a Content-Length over the limit (MaxTwilioBody, MaxSendGridBody) is
// answered 413 unread, and a body without one is read through http.MaxBytesReader; the bodies being read
// at once are bounded in bytes per handler (a request beyond that waits a moment, then is answered 503
// with Retry-After, its body unread); a body must arrive at a minimum pace or is cut off (408). The
// signature is checked on the bounded bytes before anything is decoded: for SendGrid on the raw body
// before any JSON, for Twilio on the form, which is all it signs.
//
// Delivery is at least once: providers repeat a request they saw fail, and SendGrid may repeat events
// anyway. Sinks dedupe on Receipt.EventID and Refusal.EventID. When one request holds both receipts and
// refusals and only the second sink fails, the repeat brings the receipts again.
//
// Status mapping (the raw provider event on the left):
//
//	Twilio MessageStatus          Receipt.Status
//	sent                          sent
//	delivered                     delivered
//	undelivered                   undelivered   Error "twilio 30003: unreachable destination handset"
//	failed                        failed        Error "twilio 30001: queue overflow"
//	canceled                      failed        Error "canceled"
//	accepted, scheduled, queued,  (ignored, counted in Stats.Ignored)
//	sending, read, receiving,
//	received, partially_delivered
//
//	SendGrid event                Receipt.Status
//	processed                     processed
//	delivered                     delivered
//	deferred                      deferred      Error is the receiving server's response
//	bounce (incl. type=blocked)   bounced       Error is the bounce reason ("blocked: ..." when blocked)
//	dropped                       dropped       Error is the drop reason ("Bounced Address", ...)
//	open, click,                  (ignored, counted in Stats.Ignored)
//	group_resubscribe
//
//	SendGrid event                Refusal.Kind (when the Sink is also a RefusalSink; else ignored)
//	unsubscribe                   unsubscribe        Address: the e-mail, lower case
//	group_unsubscribe             group_unsubscribe  Evidence names the asm_group_id
//	spamreport                    spamreport
//	dropped, reason "Unsubscribed unsubscribe        besides the dropped Receipt; Suppressed is set: the
//	Address" / "Spam Reporting    / spamreport       refusal is recorded only when none of the address
//	Address"                                         is (its own post may have been lost)
//
//	Twilio incoming SMS           Refusal.Kind
//	Body's first word a keyword   inbound            Address: From; Keyword: RET, IPTAL, STOP, ...
//	(RET, IPTAL, STOP by default)
//	any other Body                (ignored, counted in Stats.Ignored["inbound_other"])
//
// Secrets (auth tokens, signatures) are never logged; addresses are logged only through
// providers.MaskAddress, and a recipient's e-mail address quoted in a bounce reason is masked in
// Receipt.Error too.
package receipts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/campaignctl/campaignctl/internal/pgtext"
	"github.com/campaignctl/campaignctl/providers"
)

// Receipt statuses. Which provider event maps to which is in the package doc.
const (
	// StatusProcessed: SendGrid accepted the message for delivery (SendGrid "processed").
	StatusProcessed = "processed"
	// StatusSent: Twilio handed the message to the carrier (Twilio "sent").
	StatusSent = "sent"
	// StatusDelivered: the handset or the receiving mail server confirmed delivery (both providers).
	StatusDelivered = "delivered"
	// StatusUndelivered: the carrier could not deliver the SMS (Twilio "undelivered", ErrorCode 300xx).
	StatusUndelivered = "undelivered"
	// StatusFailed: Twilio could not send the SMS at all (Twilio "failed", and "canceled").
	StatusFailed = "failed"
	// StatusBounced: the receiving mail server refused the message (SendGrid "bounce", also "blocked").
	StatusBounced = "bounced"
	// StatusDropped: SendGrid did not send the message (suppressed address, invalid, ...).
	StatusDropped = "dropped"
	// StatusDeferred: the receiving mail server asked SendGrid to try again later; not final.
	StatusDeferred = "deferred"
)

// Receipt is one delivery event for one message.
type Receipt struct {
	// Provider is "twilio" or "sendgrid".
	Provider string
	// MessageID is the provider's message identifier as the send returned it: the Twilio MessageSid, or
	// the SendGrid X-Message-Id (sg_message_id up to its first '.'). It may be empty for SendGrid
	// events that lack sg_message_id (some asynchronous bounces).
	MessageID string
	// CampaignID and UserID are what the send attached: the SendGrid custom args campaign_id and
	// user_id, or the query parameters campaign_id and user_id of the Twilio StatusCallback URL. 0 and
	// "" when absent.
	CampaignID int64
	UserID     string
	// CampaignNonce is the campaign's nonce the send attached (SendGrid's custom arg campaign_nonce, the
	// callback URL's query parameter), which tells the campaign from another of the same ID; "" when
	// absent (a send of an earlier version).
	CampaignNonce string
	// Address is the recipient the provider says the message was for: Twilio's To, SendGrid's email
	// (lower-cased); "" when the receipt names none. A receipt that names its recipient by campaign and
	// user is only applied to a recipient with this address.
	Address string
	// Status is one of the Status constants.
	Status string
	// Error says why a message was not delivered ("" when it was, or when the provider gave no reason).
	// It never contains the recipient's address.
	Error string
	// EventID identifies the event, stable across the provider's repeats of it: SendGrid's sg_event_id;
	// for Twilio, which has none, MessageSid + ":" + the raw MessageStatus.
	EventID string
	// At is when the event happened: SendGrid's event timestamp, or the arrival time of a Twilio callback
	// (which carries none).
	At time.Time
}

// Sink records receipts. Record is called once per provider request with every receipt in it, and may
// be called concurrently. An error makes the handler answer 500, so the provider delivers the request
// again: a Sink must tolerate receipts it has already recorded.
type Sink interface {
	Record(ctx context.Context, rs []Receipt) error
}

// MatchingSink is a Sink that also says which receipts named nothing it knows (a stray callback: a
// message it never sent, a campaign or user that is not its own), and which it keeps until the send they
// name is recorded. The Handler counts both apart (Stats.Unmatched, Stats.Early) and logs the first.
type MatchingSink interface {
	Sink
	// RecordMatched records rs like Record and returns the positions in rs of the receipts that matched
	// nothing, whether the provider delivered them for the first time or again, and of those kept to be
	// applied once their send is recorded (a receipt that overtook the worker's outcome).
	RecordMatched(ctx context.Context, rs []Receipt) (Matched, error)
}

// Matched is what a MatchingSink says of the receipts it recorded: positions in the list given.
type Matched struct {
	Unmatched []int
	Early     []int
}

// SinkFunc adapts a function to a Sink.
type SinkFunc func(ctx context.Context, rs []Receipt) error

// Record calls f(ctx, rs).
func (f SinkFunc) Record(ctx context.Context, rs []Receipt) error { return f(ctx, rs) }

// Reasons a request is refused, the keys of Stats.Rejected.
const (
	// ReasonUnsigned: the signature header (or SendGrid's timestamp header) is missing.
	ReasonUnsigned = "unsigned"
	// ReasonBadSignature: the signature does not match the request.
	ReasonBadSignature = "bad_signature"
	// ReasonStale: the signed SendGrid timestamp is outside the replay window (±5 minutes).
	ReasonStale = "stale"
	// ReasonMalformed: not a POST, too large, too slow, or not parseable, or lacking a required field.
	ReasonMalformed = "malformed"
)

// ignoredInvalid is the Stats.Ignored key of a signed event that could not be used (undecodable, no
// event name or message); ignoredOther that of an event name this package does not know.
const (
	ignoredInvalid = "invalid"
	ignoredOther   = "other"
)

// Stats counts what a Handler did since it was made.
type Stats struct {
	// Accepted is the number of requests answered 204 (200 for incoming SMS).
	Accepted int64 `json:"accepted"`
	// Receipts is the number of receipts the sink recorded.
	Receipts int64 `json:"receipts"`
	// Unmatched is the number of verified receipts that named no message, campaign or user of this
	// engine's (a MatchingSink said so): answered like the others, so the provider stops posting them, and
	// recorded nowhere.
	Unmatched int64 `json:"unmatched"`
	// Early is the number of receipts, not counted in Receipts, that named a message whose send was not
	// recorded yet (the provider's receipt overtook the worker's outcome, or a callback set on the account
	// names the message ID alone): kept, and applied once the send is recorded; strays among them are
	// dropped after a while, and the log says how many.
	Early int64 `json:"early"`
	// Refusals is the number of refusals the RefusalSink recorded.
	Refusals int64 `json:"refusals"`
	// Ignored counts the verified events that are neither receipts nor refusals, by provider event name
	// (open, click, queued, ...; "other" for names this package does not know, "invalid" for unusable
	// events, "inbound_other" for incoming SMS that are not refusals).
	Ignored map[string]int64 `json:"ignored"`
	// Rejected counts the refused requests by reason (the Reason constants).
	Rejected map[string]int64 `json:"rejected"`
	// Spooled is the number of refusals and receipts the sinks could not take within the store wait and
	// that were held in the Spool instead, to be recorded when they take them again (the spool logs each
	// request it records).
	Spooled int64 `json:"spooled"`
	// SinkErrors is the number of requests answered 500 because the Sink or the RefusalSink failed.
	SinkErrors int64 `json:"sink_errors"`
}

// counter is a Handler's Stats behind a mutex; it is touched a few times per request.
type counter struct {
	mu sync.Mutex
	s  Stats
}

func (c *counter) update(f func(*Stats)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.s)
}

func (c *counter) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.s
	out.Ignored = maps.Clone(c.s.Ignored)
	out.Rejected = maps.Clone(c.s.Rejected)
	return out
}

// rejection is why a request was refused; detail goes to the log only and holds no secret or address.
type rejection struct {
	status int
	reason string
	detail string
}

func (r *rejection) Error() string { return r.reason + ": " + r.detail }

func reject(status int, reason, format string, args ...any) *rejection {
	return &rejection{status: status, reason: reason, detail: fmt.Sprintf(format, args...)}
}

// Handler receives one provider's receipts, or its incoming messages. It is an http.Handler and safe for
// concurrent use.
type Handler struct {
	provider string
	sink     Sink        // nil for incoming messages
	refusals RefusalSink // nil when refusals are not recorded
	log      *slog.Logger
	now      func() time.Time
	limits   limits
	// headers checks what can be checked from the headers alone (the signature's presence and form),
	// before any of the body is read; nil when they are fine.
	headers func(r *http.Request) *rejection
	// parse verifies r, whose body is bounded, and returns what it holds.
	parse func(h *Handler, r *http.Request) (batch, *rejection)
	// answer writes the answer to a request that was recorded: 204 unless the provider wants more.
	answer  func(w http.ResponseWriter)
	counter counter
	spool   *Spool // nil: none
	// signatureHint says what to check when every request fails its signature: the key or URL this
	// process checks against is not the provider's.
	signatureHint string
	// keyWarned: the error that the first requests all failed their signature is logged once.
	keyWarned atomic.Bool
}

// signatureAlarm is how many requests, none accepted, must fail their signature before the handler says
// that its key or URL is likely wrong (an error, once): one forged request is no reason to alarm.
const signatureAlarm = 10

// batch is what one verified request holds: its receipts, its refusals and the names of the events it
// ignored.
type batch struct {
	receipts []Receipt
	refusals []Refusal
	ignored  []string
}

// newHandler makes a handler that records receipts in sink and refusals in refusals; either may be nil,
// not both.
func newHandler(provider string, sink Sink, refusals RefusalSink, log *slog.Logger, lim limits) *Handler {
	if sink == nil && refusals == nil {
		panic("receipts: nil Sink")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{provider: provider, sink: sink, refusals: refusals, log: log.With("provider", provider), now: time.Now, limits: lim,
		answer: func(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }}
	h.counter.s = Stats{Ignored: make(map[string]int64), Rejected: make(map[string]int64)}
	return h
}

// Stats returns the counters since the handler was made.
func (h *Handler) Stats() Stats { return h.counter.snapshot() }

// ServeHTTP verifies and parses one provider request and records its receipts and refusals, all before
// it answers.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.refuse(w, r, unread(w, r, reject(http.StatusMethodNotAllowed, ReasonMalformed, "method %s", r.Method)))
		return
	}
	b, rej := h.read(w, r)
	if rej != nil {
		h.refuse(w, r, rej)
		return
	}
	// Refusals first: they are what keeps the next message from someone who said no, and a receipt the
	// sink cannot write must not hold them back (the post is answered 500 and comes again; refusals
	// already recorded are repeats then).
	// What was posted is recorded even when the provider hangs up meanwhile (its timeout passed, a
	// connection cut): the writes outlive the request, bounded by the wait and a margin. Before, a refusal
	// whose poster gave up during a Postgres restart was dropped with its cancelled context.
	wctx, cancel := StoreContext(r.Context(), h.limits.storeWait)
	defer cancel()
	spooled := 0
	if len(b.refusals) > 0 {
		var hold func() error
		if h.spool != nil {
			hold = func() error { return h.spool.Hold(b.refusals) }
		}
		// The workers skip them from now on: the write may wait behind an import for longer than a chunk.
		announced := h.spool.Announce(RefusalIDs(b.refusals))
		held, err := StoreOrHold(wctx, h.limits.storeWait, h.log, "refusals", func(ctx context.Context) error {
			return h.refusals.Refuse(ctx, b.refusals)
		}, hold)
		announced()
		if err != nil {
			h.sinkFailed(w, "record refusals", "refusals", len(b.refusals), err)
			return
		}
		msg := "refusal recorded"
		if held {
			msg, spooled = "refusal held in the spool", len(b.refusals)
		}
		for _, rf := range b.refusals {
			h.log.Info(msg, "kind", rf.Kind, "channel", rf.Channel, "address", providers.MaskAddress(rf.Address),
				"campaign_id", rf.CampaignID, "event_id", rf.EventID)
		}
	}
	var unmatched, early []int
	spooledReceipts := 0
	if len(b.receipts) > 0 {
		// Refusals of the same post just spooled: Postgres is away, and a second wait would take the
		// answer past the provider's timeout (Twilio's is 15 s).
		wait := h.limits.storeWait
		if spooled > 0 {
			wait = 0
		}
		// As refusals: a receipt can be what settles a recipient whose outcome is unknown (it was sent),
		// which keeps it from being sent again, and Twilio would not post it again.
		var hold func() error
		if h.spool.holdsReceipts() {
			hold = func() error { return h.spool.HoldRequest(receiptsKind, len(b.receipts), b.receipts) }
		}
		held, err := StoreOrHold(wctx, wait, h.log, "receipts", func(ctx context.Context) (err error) {
			if ms, ok := h.sink.(MatchingSink); ok {
				var m Matched
				m, err = ms.RecordMatched(ctx, b.receipts)
				unmatched, early = m.Unmatched, m.Early
				return err
			}
			return h.sink.Record(ctx, b.receipts)
		}, hold)
		if err != nil {
			h.sinkFailed(w, "record receipts", "receipts", len(b.receipts), err)
			return
		}
		if held {
			unmatched, early, spooledReceipts = nil, nil, len(b.receipts)
		}
		if len(unmatched) > 0 {
			// One line a request, with its first stray: a campaign's late receipts after its database was
			// re-created come by the thousand.
			rc := b.receipts[unmatched[0]]
			h.log.Warn("receipt names no message recorded by this engine: ignored", "receipts", len(unmatched),
				"message_id", rc.MessageID, "campaign_id", rc.CampaignID, "user_id", providers.MaskUserID(rc.UserID), "status", rc.Status)
		}
		if len(early) > 0 {
			// The usual order when the callback names only the message (set on the account): no warning.
			h.log.Debug("receipts kept until their sends are recorded", "receipts", len(early), "message_id", b.receipts[early[0]].MessageID)
		}
	}
	h.counter.update(func(s *Stats) {
		s.Accepted++
		s.Receipts += int64(len(b.receipts) - len(unmatched) - len(early) - spooledReceipts)
		s.Unmatched += int64(len(unmatched))
		s.Early += int64(len(early))
		s.Refusals += int64(len(b.refusals) - spooled)
		s.Spooled += int64(spooled + spooledReceipts)
		for _, name := range b.ignored {
			s.Ignored[name]++
		}
	})
	h.log.Debug("receipts recorded", "receipts", len(b.receipts), "refusals", len(b.refusals), "ignored", len(b.ignored))
	h.answer(w)
}

// SetSpool makes the handler hold in sp the refusals its RefusalSink could not take within the store
// wait (and the receipts its Sink could not, when sp records receipts: Spool.HandleReceipts), and answer
// their request as recorded; nil: answer it 500 (the provider may post it again).
func (h *Handler) SetSpool(sp *Spool) { h.spool = sp }

// storeMargin is how long a request's writes may go on past its store wait (one write under way when the
// wait ran out).
const storeMargin = 5 * time.Second

// SetStoreWait sets how long a request's receipts and refusals are tried again while the sink fails
// before the request is answered 500 (DefaultStoreWait; 0: not tried again).
func (h *Handler) SetStoreWait(d time.Duration) { h.limits.storeWait = d }

// store runs write (the sink's), and while it fails runs it again, up to the handler's storeWait: the
// request is held, not answered 500 at once. A refusal answered 500 is lost unless its provider posts it
// again, and Twilio does not by default (neither an incoming SMS nor a status callback): an "RET" sent
// while Postgres restarted would be lost, and the person who said no would get the next campaign. The
// sinks' writes are idempotent (event IDs, keyed refusals), so one that failed after its commit is
// written once.
func (h *Handler) store(ctx context.Context, what string, write func(context.Context) error) error {
	return Store(ctx, h.limits.storeWait, h.log, what, write)
}

// Store runs write, and while it fails runs it again (after 0.1 s, doubling up to 1 s) for up to wait, or
// until ctx ends: what a request carries is held while Postgres restarts or fails over (see
// Handler.SetStoreWait). An error write marks Final is an answer, not a failure: it is returned at once.
// It returns write's last error.
func Store(ctx context.Context, wait time.Duration, log *slog.Logger, what string, write func(context.Context) error) error {
	deadline := time.Now().Add(wait)
	pause := 100 * time.Millisecond
	for {
		err := write(ctx)
		var f finalError
		if errors.As(err, &f) {
			return f.error
		}
		if err == nil || ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return err
		}
		log.Warn("record "+what+" failed; trying again", "err", err, "in", pause)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// StoreContext is the context of a request's writes (Store, StoreOrHold) from the request's own: not
// ended when the poster hangs up, bounded by the store wait and a margin (one write under way when the
// wait runs out).
func StoreContext(req context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(req), wait+storeMargin)
}

// StoreOrHold runs write once and, when it fails with an error not marked Final and hold is not nil,
// holds the request's writes in a Spool at once (hold), to be recorded when the sink takes them again (the
// spool tries every 0.25 to 0.5 s): held says they were, and the request may be answered as recorded,
// since a provider that does not post it again would lose it. That one attempt is bounded by holdAfter.
// Without hold it is Store: write is tried again for up to wait, and its last error returned.
//
// The request is not held in memory while Postgres is away when there is a spool: a process stopped or
// killed meanwhile lost what it held (the provider got no answer, and Twilio does not post again), while
// a file in the spool is recorded by the next process started on it.
func StoreOrHold(ctx context.Context, wait time.Duration, log *slog.Logger, what string, write func(context.Context) error, hold func() error) (held bool, err error) {
	if hold == nil {
		return false, Store(ctx, wait, log, what, write)
	}
	final := false
	actx, cancel := context.WithTimeout(ctx, holdAfter)
	err = Store(actx, 0, log, what, func(ctx context.Context) error {
		err := write(ctx)
		final = IsFinal(err)
		return err
	})
	cancel()
	if err == nil || final {
		return false, err
	}
	if herr := hold(); herr != nil {
		log.Error("the spool cannot hold the "+what+" either; tried again for up to the store wait", "err", herr)
		return false, Store(ctx, wait, log, what, write)
	}
	log.Warn(what+" not recorded: Postgres cannot take them; held in the spool, recorded when it is back", "err", err)
	return true, nil
}

// holdAfter bounds the one attempt StoreOrHold makes before it holds a request's writes in the spool: a
// Postgres that takes connections but answers nothing must not hold the request either.
const holdAfter = 3 * time.Second

// sinkFailed answers 500, so that the provider delivers the request again.
func (h *Handler) sinkFailed(w http.ResponseWriter, msg, what string, n int, err error) {
	h.counter.update(func(s *Stats) { s.SinkErrors++ })
	h.log.Error(msg, what, n, "err", err)
	http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
}

// read checks the headers, then reads the body within the handler's limits and parses it.
func (h *Handler) read(w http.ResponseWriter, r *http.Request) (batch, *rejection) {
	if rej := h.headers(r); rej != nil {
		return batch{}, unread(w, r, rej)
	}
	max := h.limits.max
	if r.ContentLength > max {
		return batch{}, unread(w, r, reject(http.StatusRequestEntityTooLarge, ReasonMalformed, "Content-Length %d over %d bytes", r.ContentLength, max))
	}
	n := r.ContentLength
	if n < 0 {
		n = max
	}
	_, n = bodyClass(n)
	if !h.limits.reserve(r.Context(), n) {
		return batch{}, unread(w, r, reject(http.StatusServiceUnavailable, ReasonBusy, "no room for a %d-byte body within %s", n, h.limits.busyWait))
	}
	defer h.limits.room.Release(n)
	// The deadline does not reach the sink: net/http clears it when it starts watching the connection
	// after the body's end, and nothing else is read while the sink records. A request without a body
	// is watched from the start, and a deadline would end the connection's context, that of the
	// requests after it too. Outside a real server (a ResponseRecorder) there are no deadlines to set,
	// hence the ignored errors.
	if r.ContentLength != 0 {
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.limits.bodyTime(n))) //nolint:errcheck
	}
	r.Body = http.MaxBytesReader(w, r.Body, max)
	return h.parse(h, r)
}

// unread marks a request refused before its body was read: the body will not be read, so the
// connection's read deadline is now. The server would otherwise read what is left of a small body
// before answering, at whatever pace the client sends it; this way it answers at once and closes the
// connection (a provider opens another for its next post). A request without a body keeps its
// connection and its deadlines (see read).
func unread(w http.ResponseWriter, r *http.Request, rej *rejection) *rejection {
	if r.ContentLength != 0 {
		http.NewResponseController(w).SetReadDeadline(time.Now()) //nolint:errcheck // see read
	}
	return rej
}

func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, rej *rejection) {
	var alarm bool
	h.counter.update(func(s *Stats) {
		s.Rejected[rej.reason]++
		alarm = rej.reason == ReasonBadSignature && s.Accepted == 0 && s.Rejected[rej.reason] >= signatureAlarm
	})
	attrs := []any{"reason", rej.reason, "detail", rej.detail, "remote", r.RemoteAddr, "status", rej.status}
	if rej.reason == ReasonBadSignature && h.signatureHint != "" {
		attrs = append(attrs, "hint", "a forged or damaged request; if every one is refused, "+h.signatureHint)
	}
	h.log.Warn("receipt request refused", attrs...)
	if alarm && h.keyWarned.CompareAndSwap(false, true) {
		h.log.Error(fmt.Sprintf("the first %d requests all failed their signature check and none was accepted: what they carry (receipts, refusals) is lost unless the provider posts it again; %s",
			signatureAlarm, h.signatureHint))
	}
	switch rej.status {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", http.MethodPost)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, http.StatusText(rej.status), rej.status)
}

// maxErrorText bounds Receipt.Error: bounce texts can quote a whole SMTP conversation.
const maxErrorText = 500

// cleanError masks addr wherever the provider's text quotes it, and any other address, phone number or
// credential it quotes (providers.ScrubText), and bounds the length.
func cleanError(text, addr string) string {
	text = strings.TrimSpace(text)
	if addr != "" {
		text = replaceFold(text, addr, providers.MaskAddress(addr))
	}
	// Whatever else it quotes: the address percent-encoded or in another spelling, a phone number, another
	// recipient.
	return pgtext.Cut(providers.ScrubText(text), maxErrorText)
}

// replaceFold replaces every ASCII-case-insensitive occurrence of old in s (mail servers change the case
// of the address they quote).
func replaceFold(s, old, repl string) string {
	if old == "" || len(old) > len(s) {
		return s
	}
	// Byte by byte, ASCII letters compared without case: lower-casing the whole text would move the
	// offsets wherever a letter's other case has another length (the Turkish İ), and an address written in
	// another case than the event's would stay as it was.
	var b strings.Builder
	last := 0
	for i := 0; i+len(old) <= len(s); {
		if equalFoldASCII(s[i:i+len(old)], old) {
			b.WriteString(s[last:i])
			b.WriteString(repl)
			i += len(old)
			last = i
			continue
		}
		i++
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// equalFoldASCII reports whether a and b, of the same length, are equal with ASCII letters compared
// without case (any other byte must be the same).
func equalFoldASCII(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Final marks err, returned by Store's write, as one that trying again would not change.
func Final(err error) error { return finalError{err} }

type finalError struct{ error }

// IsFinal says whether err is, or wraps, an error marked Final.
func IsFinal(err error) bool { return errors.As(err, new(finalError)) }
