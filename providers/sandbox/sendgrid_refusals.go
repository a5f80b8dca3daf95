package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// SendGrid refusal events
//
// A recipient who unsubscribes, leaves an unsubscribe group or reports a message as spam makes SendGrid
// post an unsubscribe, group_unsubscribe or spamreport event. The sandbox has no mailboxes, so the
// refusal is made up through the control API:
//
//	POST /_sandbox/sendgrid/events  {"event":"unsubscribe","email":"a@example.com","campaign_id":"1","user_id":"u1"}
//
// posts, once and at once, a one-event batch to Options.SendGridEventURL, signed with the fake's event
// key and headers like its other events. As SendGrid does, the event carries the custom args, the
// categories and the sg_message_id of the last message the fake accepted to that address (the last
// sendgridMaxRemembered recipients are remembered, and only while events are posted at all); the
// request's campaign_id and user_id, when given, take the place of those args. A group_unsubscribe
// names asm_group_id (1 unless given). "sg_event_id" and "timestamp" repeat an event already posted, as
// SendGrid repeats events. The answer is a SendGridEventResult (see control_post.go for the status
// codes); without an event URL the request is answered 409.

// sendgridMaxRemembered bounds the recipients whose last message the fake remembers for their refusal
// events: a load run sends millions, and what a refusal needs of them is small but not nothing.
const sendgridMaxRemembered = 100_000

// sendgridRefusalEvents are the events POST /_sandbox/sendgrid/events makes.
var sendgridRefusalEvents = map[string]bool{"unsubscribe": true, "group_unsubscribe": true, "spamreport": true}

// SendGridRecipientEvent is a recipient's refusal to make up: what POST /_sandbox/sendgrid/events takes.
type SendGridRecipientEvent struct {
	// Event is "unsubscribe", "group_unsubscribe" or "spamreport".
	Event string `json:"event"`
	// Email is the recipient's address.
	Email string `json:"email"`
	// CampaignID and UserID are the custom args campaign_id and user_id of the event; empty means those of
	// the last message to Email, if the fake sent one.
	CampaignID string `json:"campaign_id,omitempty"`
	UserID     string `json:"user_id,omitempty"`
	// ASMGroupID is the unsubscribe group; 0 means 1 for a group_unsubscribe and none for the others.
	ASMGroupID int64 `json:"asm_group_id,omitempty"`
	// SGEventID and Timestamp (Unix seconds) repeat an event already posted; empty and 0 mean a new ID and
	// now.
	SGEventID string `json:"sg_event_id,omitempty"`
	Timestamp int64  `json:"timestamp,omitempty"`
}

// SendGridEventResult is what the sandbox posted for a refusal event and what the receiver answered.
type SendGridEventResult struct {
	// Event is the event posted (the batch was [Event]).
	Event map[string]any `json:"event"`
	// URL is where it was posted (Options.SendGridEventURL).
	URL string `json:"url"`
	// Status is the receiver's HTTP status; 0 when it did not answer.
	Status int `json:"status"`
	// Error says why no answer came, or that the answer was not a 2xx; "" when it was one.
	Error string `json:"error,omitempty"`
}

// sendgridSentMail is what a refusal event takes from the last message to a recipient.
type sendgridSentMail struct {
	sgMessageID string
	args        map[string]string // shared by the recipients of a personalization; never changed
	categories  []string
	seq         uint64
}

// sendgridSent remembers the last message to each of the last sendgridMaxRemembered recipients, keyed
// by the lower-case address. ring holds the keys in the order remembered; a key remembered again has a
// newer seq, so that its older slot does not evict it.
type sendgridSent struct {
	mu   sync.Mutex
	last map[string]sendgridSentMail
	ring []sendgridRingSlot
	next int
	seq  uint64
}

type sendgridRingSlot struct {
	key string
	seq uint64
}

func newSendgridSent() *sendgridSent {
	return &sendgridSent{last: make(map[string]sendgridSentMail)}
}

// sendgridRemember is one recipient of an accepted request, to remember.
type sendgridRemember struct {
	email string
	mail  sendgridSentMail
}

// remember notes the messages of one request.
func (m *sendgridSent) remember(rs []sendgridRemember) {
	if len(rs) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rs {
		m.seq++
		key := strings.ToLower(r.email)
		r.mail.seq = m.seq
		slot := sendgridRingSlot{key: key, seq: m.seq}
		if len(m.ring) < sendgridMaxRemembered {
			m.ring = append(m.ring, slot)
		} else {
			if old := m.ring[m.next]; m.last[old.key].seq == old.seq {
				delete(m.last, old.key)
			}
			m.ring[m.next] = slot
			m.next = (m.next + 1) % sendgridMaxRemembered
		}
		m.last[key] = r.mail
	}
}

// lookup returns the last message to email.
func (m *sendgridSent) lookup(email string) (sendgridSentMail, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mail, ok := m.last[strings.ToLower(email)]
	return mail, ok
}

func (m *sendgridSent) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.last, m.ring, m.next = make(map[string]sendgridSentMail), nil, 0
}

// sendgridRefusalRoute registers POST /_sandbox/sendgrid/events.
func (s *Server) sendgridRefusalRoute() {
	s.mux.HandleFunc("POST /_sandbox/sendgrid/events", func(w http.ResponseWriter, r *http.Request) {
		var e SendGridRecipientEvent
		if !decodeControl(w, r, &e, false) {
			return
		}
		res, err := s.PostSendGridEvent(r.Context(), e)
		writeControlPost(w, res, res.Status, err)
	})
}

// PostSendGridEvent posts the refusal event e to Options.SendGridEventURL, signed like the fake's other
// events, and returns what it posted and what the receiver answered. It fails, posting nothing, when e
// is not one of the refusal events or names no valid address, or when no event URL is configured; a
// receiver that fails or does not answer is reported in the result (and counted in
// SendGridEventStats), not as an error.
func (s *Server) PostSendGridEvent(ctx context.Context, e SendGridRecipientEvent) (SendGridEventResult, error) {
	em := s.sendgrid.events
	if !em.enabled() {
		if why := em.snapshot().Disabled; why != "" {
			return SendGridEventResult{}, fmt.Errorf("%w: %s", errNotConfigured, why)
		}
		return SendGridEventResult{}, fmt.Errorf("%w: no SendGrid event URL: start the sandbox with --sendgrid-event-url (Options.SendGridEventURL)", errNotConfigured)
	}
	switch {
	case !sendgridRefusalEvents[e.Event]:
		return SendGridEventResult{}, fmt.Errorf("%w: event %q: give unsubscribe, group_unsubscribe or spamreport", errInvalid, e.Event)
	case !isSendgridAddress(e.Email):
		return SendGridEventResult{}, fmt.Errorf("%w: email is not a valid address", errInvalid)
	case e.ASMGroupID < 0 || e.Timestamp < 0:
		return SendGridEventResult{}, fmt.Errorf("%w: asm_group_id and timestamp must not be negative", errInvalid)
	}
	ev := s.sendgridRefusalEvent(e)
	res := SendGridEventResult{Event: ev, URL: em.url}
	body, err := json.Marshal([]map[string]any{ev})
	if err != nil {
		return SendGridEventResult{}, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig, err := signSendgridEvents(em.key, ts, body)
	if err != nil {
		return SendGridEventResult{}, err
	}
	header := http.Header{
		"Content-Type":          {"application/json"},
		"User-Agent":            {"SendGrid Event API"},
		sendgridTimestampHeader: {ts},
		sendgridSignatureHeader: {sig},
	}
	status, _, err := postForAnswer(ctx, em.client, em.url, header, bytes.NewReader(body))
	res.Status = status
	switch {
	case err != nil:
		res.Error = err.Error()
	case status < 200 || status > 299:
		res.Error = fmt.Sprintf("receiver answered %d", status)
	}
	if res.Error == "" {
		em.count(func(st *SendGridEventStats) { st.Posted++; st.Events++ })
	} else {
		em.count(func(st *SendGridEventStats) { st.Failed++ })
	}
	s.logger.Info("sandbox sendgrid refusal event posted", "event", e.Event, "email", providers.MaskAddress(e.Email),
		"status", status, "err", res.Error)
	return res, nil
}

// sendgridRefusalEvent builds the event of e, with what the last message to its address carried.
func (s *Server) sendgridRefusalEvent(e SendGridRecipientEvent) map[string]any {
	ev := map[string]any{}
	if sent, ok := s.sendgrid.sent.lookup(e.Email); ok {
		for k, v := range sent.args {
			ev[k] = v
		}
		if len(sent.categories) > 0 {
			ev["category"] = sent.categories
		}
		ev["sg_message_id"] = sent.sgMessageID
		ev["smtp-id"] = "<" + sent.sgMessageID + "@sandbox.sendgrid.test>"
	}
	if e.CampaignID != "" {
		ev["campaign_id"] = e.CampaignID
	}
	if e.UserID != "" {
		ev["user_id"] = e.UserID
	}
	group := e.ASMGroupID
	if group == 0 && e.Event == "group_unsubscribe" {
		group = 1
	}
	if group != 0 {
		ev["asm_group_id"] = group
	}
	if e.Event == "group_unsubscribe" {
		// The unsubscribe page is a web page: SendGrid reports the browser that used it.
		ev["useragent"] = "Mozilla/5.0 (sandbox)"
		ev["ip"] = "127.0.0.1"
	}
	id, at := e.SGEventID, e.Timestamp
	if id == "" {
		id = newSendgridEventID()
	}
	if at == 0 {
		at = time.Now().Unix()
	}
	// The standard fields win over a custom arg of the same name, as in the other events.
	ev["event"] = e.Event
	ev["email"] = e.Email
	ev["timestamp"] = at
	ev["sg_event_id"] = id
	return ev
}
