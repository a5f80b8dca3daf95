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

// messageLog is the record of everything the provider routes did. One mutex guards it; it is held only
// to append and count, never across a sleep or a network write.
type messageLog struct {
	mu       sync.Mutex
	messages []Message
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
	l.messages = nil
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
	l.mu.Lock()
	defer l.mu.Unlock()
	m.AccountSID = l.intern(m.AccountSID)
	m.From = l.intern(m.From)
	l.messages = append(l.messages, m)
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
	return len(l.messages) - 1
}

// receipted notes that a receipt with status for the message sid, logged at entry, was answered with a
// 2xx at at. A log reset since the message was accepted leaves nothing to note.
func (l *messageLog) receipted(entry int, sid, status string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if entry < 0 || entry >= len(l.messages) || l.messages[entry].SID != sid {
		return
	}
	m := &l.messages[entry]
	m.Receipt = status
	if m.ReceiptAt.IsZero() {
		m.ReceiptAt = at
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
	if to == "" {
		out := make([]Message, len(l.messages))
		copy(out, l.messages)
		return out
	}
	out := make([]Message, 0, l.perTo[to])
	for _, m := range l.messages {
		if m.To == to {
			out = append(out, m)
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
