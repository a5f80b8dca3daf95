package sandbox

import (
	"maps"
	"sync"
	"time"
)

// Message is one message the sandbox accepted: answered with 201, or accepted and then left hanging by
// the timeout fault.
type Message struct {
	// Provider is the API that accepted it: "twilio", "netgsm", "sendgrid", "fcm" or "webhook".
	Provider   string `json:"provider"`
	SID        string `json:"sid"`
	AccountSID string `json:"account_sid"`
	To         string `json:"to"`
	// From is the sender, or the MessagingServiceSid when the request named no From.
	From    string `json:"from"`
	Subject string `json:"subject,omitempty"`
	Body    string `json:"body"`
	HTML    string `json:"html,omitempty"`
	// Headers are the e-mail headers a SendGrid request set for this message (its own personalization's
	// over the request's): List-Unsubscribe, List-Unsubscribe-Post, ...
	Headers     map[string]string `json:"headers,omitempty"`
	NumSegments int               `json:"num_segments"`
	Status      string            `json:"status"`
	At          time.Time         `json:"at"`
	// IYSFilter is the İYS filter a Netgsm request asked for (11 individuals, 12 merchants, 0 none).
	IYSFilter string `json:"iys_filter,omitempty"`
	// Hung is true when the sandbox accepted the message but never answered (the timeout fault).
	Hung bool `json:"hung,omitempty"`
	// Receipt is the last delivery receipt (Twilio status callback: "sent", "delivered", ...) that the
	// receiver answered with a 2xx; "" when none was.
	Receipt string `json:"receipt,omitempty"`
	// ReceiptAt is when the receiver first answered a receipt of this message with a 2xx: from then on it
	// held proof that the provider accepted the message. Zero when it never did.
	ReceiptAt time.Time `json:"receipt_at,omitzero"`
}

// Stats counts what the sandbox saw since it started or was last reset.
type Stats struct {
	// Requests is every request to a provider API route (the control API is not counted).
	Requests int `json:"requests"`
	// Accepted is the number of messages recorded, Hung included.
	Accepted int `json:"accepted"`
	// Rejected is the number of requests answered with an error status.
	Rejected int `json:"rejected"`
	// ByStatus counts the error answers by HTTP status.
	ByStatus map[int]int `json:"by_status"`
	// ByCode counts the error answers by provider error code (raw 503s have none).
	ByCode map[int]int `json:"by_code"`
	// Hung is the number of messages accepted and then never answered.
	Hung int `json:"hung"`
	// Resets is the number of connections closed without an answer.
	Resets int `json:"resets"`
	// Connections is the number of connections clients opened to the sandbox.
	Connections int64 `json:"connections"`
	// Recipients is the number of distinct To with at least one accepted message.
	Recipients int `json:"recipients"`
	// Duplicates is the number of To with more than one accepted message.
	Duplicates int `json:"duplicates"`
	// FirstAcceptedAt and LastAcceptedAt bound the acceptances (zero before the first): the span a
	// throughput is measured over.
	FirstAcceptedAt time.Time `json:"first_accepted_at"`
	LastAcceptedAt  time.Time `json:"last_accepted_at"`
	// Outages are the outage windows, scheduled, active and over, with what each refused; absent when
	// there were none. A Reset keeps them.
	Outages []OutageWindow `json:"outages,omitempty"`
}

// internLimit bounds the table of shared account SIDs and senders: campaigns use a handful, and a
// flood of distinct values must not grow it without end.
const internLimit = 1024

// logBlock is how many messages one block of the log holds (about 640 KB of entries). The log grows a
// block at a time and never moves a message once stored: a single slice, copied whole at each doubling,
// made the copying (and the page faults of each new, larger array) the costliest part of an acceptance
// in a long run.
const logBlock = 4096

// logEntry is a Message as the log keeps it. The fields that SMS leave empty (e-mail subjects, HTML and
// headers, Netgsm's İYS filter) and those set only later (the receipt) live in extra, so that a logged
// SMS is 160 bytes instead of a whole Message's 256: the log is most of the sandbox's memory in a long
// run, and the garbage collector scans all of it.
type logEntry struct {
	provider, sid, accountSID, to, from, body, status string
	at                                                time.Time
	numSegments                                       int
	hung                                              bool
	extra                                             *logExtra
}

// logExtra holds the Message fields an entry keeps only when they are set.
type logExtra struct {
	subject, html, iysFilter, receipt string
	headers                           map[string]string
	receiptAt                         time.Time
}

func newLogEntry(m Message) logEntry {
	e := logEntry{
		provider: m.Provider, sid: m.SID, accountSID: m.AccountSID, to: m.To, from: m.From, body: m.Body,
		status: m.Status, at: m.At, numSegments: m.NumSegments, hung: m.Hung,
	}
	if m.Subject != "" || m.HTML != "" || m.IYSFilter != "" || m.Receipt != "" || m.Headers != nil || !m.ReceiptAt.IsZero() {
		e.extra = &logExtra{
			subject: m.Subject, html: m.HTML, iysFilter: m.IYSFilter, receipt: m.Receipt,
			headers: m.Headers, receiptAt: m.ReceiptAt,
		}
	}
	return e
}

func (e *logEntry) message() Message {
	m := Message{
		Provider: e.provider, SID: e.sid, AccountSID: e.accountSID, To: e.to, From: e.from, Body: e.body,
		Status: e.status, At: e.at, NumSegments: e.numSegments, Hung: e.hung,
	}
	if x := e.extra; x != nil {
		m.Subject, m.HTML, m.IYSFilter, m.Receipt, m.Headers, m.ReceiptAt = x.subject, x.html, x.iysFilter, x.receipt, x.headers, x.receiptAt
	}
	return m
}

// messageLog is the record of everything the provider routes did. One mutex guards it; it is held only
// to append and count, never across a sleep or a network write.
type messageLog struct {
	mu sync.Mutex
	// blocks hold the messages in the order accepted, logBlock to a block; every block but the last is
	// full. n is the number of messages.
	blocks   [][]logEntry
	n        int
	perTo    map[string]int32
	interned map[string]string
	stats    Stats
}

func newMessageLog() *messageLog {
	l := &messageLog{}
	l.resetLocked()
	return l
}

func (l *messageLog) resetLocked() {
	l.blocks, l.n = nil, 0
	l.perTo = make(map[string]int32)
	l.interned = make(map[string]string)
	l.stats = Stats{ByStatus: make(map[int]int), ByCode: make(map[int]int)}
}

func (l *messageLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resetLocked()
}

func (l *messageLog) request() {
	l.mu.Lock()
	l.stats.Requests++
	l.mu.Unlock()
}

func (l *messageLog) rejected(status, code int) {
	l.mu.Lock()
	l.stats.Rejected++
	l.stats.ByStatus[status]++
	if code != 0 {
		l.stats.ByCode[code]++
	}
	l.mu.Unlock()
}

func (l *messageLog) connReset() {
	l.mu.Lock()
	l.stats.Resets++
	l.mu.Unlock()
}

// accept records m and returns its place in the log. Account SIDs and senders repeat on every message of
// a campaign, so they share one copy each, which keeps millions of records affordable.
func (l *messageLog) accept(m Message) int {
	e := newLogEntry(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	e.accountSID = l.intern(e.accountSID)
	e.from = l.intern(e.from)
	if l.n%logBlock == 0 {
		l.blocks = append(l.blocks, make([]logEntry, 0, logBlock))
	}
	last := &l.blocks[len(l.blocks)-1]
	*last = append(*last, e)
	l.n++
	l.stats.Accepted++
	if l.stats.FirstAcceptedAt.IsZero() || m.At.Before(l.stats.FirstAcceptedAt) {
		l.stats.FirstAcceptedAt = m.At
	}
	if m.At.After(l.stats.LastAcceptedAt) {
		l.stats.LastAcceptedAt = m.At
	}
	if m.Hung {
		l.stats.Hung++
	}
	n := l.perTo[m.To] + 1
	l.perTo[m.To] = n
	switch n {
	case 1:
		l.stats.Recipients++
	case 2:
		l.stats.Duplicates++
	}
	return l.n - 1
}

// at returns the logEntry at place i of the log, which must hold it.
func (l *messageLog) at(i int) *logEntry {
	return &l.blocks[i/logBlock][i%logBlock]
}

// receipted notes that a receipt with status for the message sid, logged at place i, was answered with a
// 2xx at at. A log reset since the message was accepted leaves nothing to note.
func (l *messageLog) receipted(i int, sid, status string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < 0 || i >= l.n || l.at(i).sid != sid {
		return
	}
	e := l.at(i)
	if e.extra == nil {
		e.extra = &logExtra{}
	}
	e.extra.receipt = status
	if e.extra.receiptAt.IsZero() {
		e.extra.receiptAt = at
	}
}

func (l *messageLog) intern(s string) string {
	if v, ok := l.interned[s]; ok {
		return v
	}
	if len(l.interned) < internLimit {
		l.interned[s] = s
	}
	return s
}

// list returns a copy of the accepted messages, only those to the given recipient when to is not empty.
func (l *messageLog) list(to string) []Message {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.n
	if to != "" {
		n = int(l.perTo[to])
	}
	out := make([]Message, 0, n)
	for _, b := range l.blocks {
		for i := range b {
			if to == "" || b[i].to == to {
				out = append(out, b[i].message())
			}
		}
	}
	return out
}

func (l *messageLog) snapshot() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.ByStatus = maps.Clone(l.stats.ByStatus)
	s.ByCode = maps.Clone(l.stats.ByCode)
	return s
}
