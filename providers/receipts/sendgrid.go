package receipts

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sendgrid/sendgrid-go/helpers/eventwebhook"

	"github.com/campaignctl/campaignctl/providers"
)

// ReplayWindow is how far a SendGrid request's signed timestamp may lie from the local clock, either
// way. SendGrid documents no tolerance; five minutes covers clock skew and its queueing while keeping a
// captured request from being replayed for long.
const ReplayWindow = 5 * time.Minute

// sendgridStatuses maps SendGrid's delivery events to Receipt statuses.
var sendgridStatuses = map[string]string{
	"processed": StatusProcessed,
	"delivered": StatusDelivered,
	"deferred":  StatusDeferred,
	"bounce":    StatusBounced,
	"dropped":   StatusDropped,
}

// sendgridEngagement are SendGrid's engagement events, which are counted and not recorded (the refusals
// among them are recorded when the handler has a RefusalSink).
var sendgridEngagement = map[string]bool{
	"open": true, "click": true, "spamreport": true, "unsubscribe": true,
	"group_unsubscribe": true, "group_resubscribe": true,
}

// sendgridRefusals maps SendGrid's refusal events to Refusal kinds.
var sendgridRefusals = map[string]string{
	"unsubscribe":       RefusalUnsubscribe,
	"group_unsubscribe": RefusalGroupUnsubscribe,
	"spamreport":        RefusalSpamReport,
}

// sendgridSuppressions maps the reasons of a "dropped" event that say the address is on a list of those
// who refused to the Refusal kind behind it. SendGrid drops every later message to such an address: when
// the unsubscribe or spam report itself never reached the webhooks (the endpoint down longer than
// SendGrid's retries), the drop is the only word of it that comes.
var sendgridSuppressions = map[string]string{
	"unsubscribed address":   RefusalUnsubscribe,
	"spam reporting address": RefusalSpamReport,
}

// sendgridEvent is the part of an Event Webhook event that makes a Receipt. custom_args arrive as
// top-level keys.
type sendgridEvent struct {
	Event       string      `json:"event"`
	Email       string      `json:"email"`
	Timestamp   json.Number `json:"timestamp"`
	SGEventID   string      `json:"sg_event_id"`
	SGMessageID string      `json:"sg_message_id"`
	Reason      string      `json:"reason"`
	Response    string      `json:"response"`
	Type        string      `json:"type"`
	CampaignID  flexString  `json:"campaign_id"`
	UserID      flexString  `json:"user_id"`
	Nonce       flexString  `json:"campaign_nonce"`
	ASMGroupID  flexString  `json:"asm_group_id"`
}

// flexString takes a JSON string, number or null: custom args are strings, but a sender that once put a
// number there should not lose its receipts.
type flexString string

func (f *flexString) UnmarshalJSON(b []byte) error {
	switch {
	case bytes.Equal(b, []byte("null")):
		*f = ""
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = flexString(s)
	default:
		var n json.Number
		if err := json.Unmarshal(b, &n); err != nil {
			// An object, array or boolean: not a usable custom arg, but no reason to drop the event (an
			// unsubscribe in it must still be recorded); it is treated as absent.
			*f = ""
			return nil
		}
		*f = flexString(n)
	}
	return nil
}

// SendGridHandler receives SendGrid's signed Event Webhook (a JSON array of events) and records the
// delivery events in sink.
//
// publicKeyBase64 is the webhook's verification key as SendGrid shows it (base64 of the PKIX DER of a
// P-256 key); an error says it is not one. Each request must carry the
// X-Twilio-Email-Event-Webhook-Signature and -Timestamp headers, and the signature must be well formed,
// before the body is read; the signature is checked with sendgrid-go's eventwebhook.VerifySignature
// over the timestamp and the raw body, before any JSON is decoded, then the timestamp must lie within
// ReplayWindow of the local clock. Bodies over MaxSendGridBody are refused with 413 (see the package doc
// for the other limits).
//
// processed, delivered, deferred, bounce and dropped events become Receipts (see the package doc);
// engagement events (open, click, ...) and unusable events are counted in Stats.Ignored. The custom
// args campaign_id and user_id give CampaignID and UserID (a campaign_id that is not an integer gives
// 0), sg_message_id up to its first '.' gives MessageID, sg_event_id EventID (sg_message_id:event:timestamp
// when absent), the reason (bounce, dropped) or response (deferred) Error.
//
// When sink is also a RefusalSink, unsubscribe, group_unsubscribe and spamreport events become Refusals
// (see Refusal for their fields), recorded with Refuse in the same request, after the receipts and
// before the answer: a RefusalSink error answers 500 like a Sink error, and SendGrid posts the whole
// batch again. An event of these without an e-mail address is counted as "invalid". Otherwise they
// are counted in Stats.Ignored under their event names. A nil log discards; a nil sink panics.
func SendGridHandler(publicKeyBase64 string, sink Sink, log *slog.Logger) (*Handler, error) {
	if sink == nil {
		panic("receipts: nil Sink")
	}
	key, err := sendgridKey(publicKeyBase64)
	if err != nil {
		return nil, err
	}
	refusals, _ := sink.(RefusalSink)
	h := newHandler("sendgrid", sink, refusals, log, newLimits(MaxSendGridBody, sendgridInFlight))
	h.signatureHint = "SENDGRID_WEBHOOK_PUBLIC_KEY here is not the verification key of this Event Webhook (SendGrid's Mail Settings, Signed Event Webhook)"
	h.headers = func(r *http.Request) *rejection {
		sig, ts := r.Header.Get(eventwebhook.VerificationHTTPHeader), r.Header.Get(eventwebhook.TimestampHTTPHeader)
		if sig == "" || ts == "" {
			return reject(http.StatusForbidden, ReasonUnsigned, "signature or timestamp header missing")
		}
		if !wellFormedSignature(sig) {
			return reject(http.StatusForbidden, ReasonBadSignature, "signature header is not a base64 ECDSA signature")
		}
		return nil
	}
	h.parse = func(h *Handler, r *http.Request) (batch, *rejection) {
		sig, ts := r.Header.Get(eventwebhook.VerificationHTTPHeader), r.Header.Get(eventwebhook.TimestampHTTPHeader)
		body, done, err := readBody(r, h.limits.max)
		defer done() // the receipts hold copies of what they take from the body
		if err != nil {
			return batch{}, bodyRejection(err, h.limits.max)
		}
		// The signature is checked on the raw bytes, before any JSON is decoded.
		if ok, err := eventwebhook.VerifySignature(key, body, sig, ts); err != nil || !ok {
			return batch{}, reject(http.StatusForbidden, ReasonBadSignature, "signature does not match the body")
		}
		// The timestamp is checked after the signature, so that "stale" counts only requests SendGrid
		// really signed: replays, or a clock that drifted.
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return batch{}, reject(http.StatusForbidden, ReasonStale, "timestamp %q is not Unix seconds", ts)
		}
		if d := h.now().Sub(time.Unix(sec, 0)); d > ReplayWindow || d < -ReplayWindow {
			return batch{}, reject(http.StatusForbidden, ReasonStale, "timestamp %s off the local clock", d.Round(time.Second))
		}
		return h.sendgridBatch(body)
	}
	return h, nil
}

// maxSignatureLen bounds the signature header: a P-256 signature is at most 72 bytes of DER, 96 of base64.
const maxSignatureLen = 128

// wellFormedSignature tells whether sig can be a signature at all (base64 of an ASN.1 pair of positive
// integers, nothing after it), so that a request whose signature could never verify is refused before
// its body is read.
func wellFormedSignature(sig string) bool {
	if len(sig) > maxSignatureLen {
		return false
	}
	der, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return false
	}
	var rs struct{ R, S *big.Int }
	rest, err := asn1.Unmarshal(der, &rs)
	return err == nil && len(rest) == 0 && rs.R.Sign() > 0 && rs.S.Sign() > 0
}

// readBody reads r's body, which r.Body bounds to max bytes, into one buffer (see bodyBuffer) of its
// Content-Length, or of max when it has none: a buffer grown as the body comes would be copied, and
// several copies would be alive at once, beyond the room the handler reserved. done gives the buffer
// back.
func readBody(r *http.Request, max int64) (body []byte, done func(), err error) {
	size := r.ContentLength
	if size < 0 {
		size = max
	}
	body, done = bodyBuffer(size)
	n, err := io.ReadFull(r.Body, body)
	switch {
	case r.ContentLength >= 0:
		return body, done, err
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return body[:n], done, nil
	case err != nil:
		return nil, done, err
	}
	// max bytes without a Content-Length: the body must end here (r.Body says so if it does not).
	if _, err := io.ReadFull(r.Body, make([]byte, 1)); err != io.EOF {
		if err == nil {
			err = &http.MaxBytesError{Limit: max}
		}
		return nil, done, err
	}
	return body, done, nil
}

// sendgridKey parses the key the way eventwebhook does, after checking what that helper assumes (it
// panics on a key that is not ECDSA).
func sendgridKey(b64 string) (*ecdsa.PublicKey, error) {
	der, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return nil, errors.New("sendgrid webhook public key is not base64: copy it from the Event Webhook settings")
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("sendgrid webhook public key is not a PKIX public key: %w", err)
	}
	if k, ok := pub.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return nil, errors.New("sendgrid webhook public key is not an ECDSA P-256 key")
	}
	return eventwebhook.ConvertPublicKeyBase64ToECDSA(strings.TrimSpace(b64))
}

// sendgridBatch reads the verified events of body.
func (h *Handler) sendgridBatch(body []byte) (batch, *rejection) {
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return batch{}, reject(http.StatusBadRequest, ReasonMalformed, "body is not a JSON array of events: %v", err)
	}
	var b batch
	for _, m := range raw {
		var e sendgridEvent
		err := json.Unmarshal(m, &e)
		if err != nil {
			// One field of an unexpected type (a custom arg another sender of the account set, say) must
			// not lose the event: an unsubscribe in it is still a refusal of its address.
			e, err = lenientSendgridEvent(m)
		}
		if err != nil || e.Event == "" {
			b.ignored = append(b.ignored, ignoredInvalid)
			continue
		}
		status, ok := sendgridStatuses[e.Event]
		if kind, refusal := sendgridRefusals[e.Event]; refusal {
			if h.refusals != nil {
				rf, ok := h.sendgridRefusal(&e, kind)
				if !ok {
					b.ignored = append(b.ignored, ignoredInvalid)
					continue
				}
				b.refusals = append(b.refusals, rf)
			}
			// The person refused through the message (its unsubscribe link, its spam button): it reached
			// them. That is a receipt of its delivery too: a recipient recorded unknown (its answer lost)
			// becomes sent, and is not sent again by `resume --resend-unknown`.
			status, ok = StatusDelivered, true
		}
		if kind, ok := sendgridSuppressions[strings.ToLower(strings.TrimSpace(e.Reason))]; ok && e.Event == "dropped" && h.refusals != nil {
			// A refusal besides the drop's receipt (RecordRefusals records it only when no refusal of the
			// address is recorded already).
			if rf, ok := h.sendgridRefusal(&e, kind); ok {
				rf.Suppressed = true
				b.refusals = append(b.refusals, rf)
			}
		}
		if !ok {
			name := ignoredOther
			if sendgridEngagement[e.Event] {
				name = e.Event
			}
			b.ignored = append(b.ignored, name)
			continue
		}
		rc := Receipt{
			Provider:      "sendgrid",
			MessageID:     e.SGMessageID,
			UserID:        string(e.UserID),
			CampaignNonce: string(e.Nonce),
			Address:       strings.ToLower(strings.TrimSpace(e.Email)),
			Status:        status,
			EventID:       e.eventID(),
			At:            h.sendgridAt(&e),
		}
		if i := strings.IndexByte(rc.MessageID, '.'); i >= 0 {
			rc.MessageID = rc.MessageID[:i]
		}
		if rc.MessageID == "" && e.CampaignID == "" && e.UserID == "" {
			if _, refusal := sendgridRefusals[e.Event]; refusal {
				// Nothing to match a receipt to: the refusal is recorded (with a RefusalSink), or counted.
				if h.refusals == nil {
					b.ignored = append(b.ignored, e.Event)
				}
				continue
			}
			b.ignored = append(b.ignored, ignoredInvalid) // nothing to match it to a send
			continue
		}
		rc.CampaignID = e.campaignID()
		switch e.Event {
		case "bounce":
			rc.Error = cleanError(e.Reason, e.Email)
			if e.Type == "blocked" {
				rc.Error = "blocked: " + rc.Error
			}
		case "dropped":
			rc.Error = cleanError(e.Reason, e.Email)
		case "deferred":
			rc.Error = cleanError(e.Response, e.Email)
		}
		b.receipts = append(b.receipts, rc)
	}
	return b, nil
}

// lenientSendgridEvent reads an event whose fields json.Unmarshal refused by type: each field is taken
// as its string or number text, "" when it is anything else.
func lenientSendgridEvent(m json.RawMessage) (sendgridEvent, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(m, &fields); err != nil {
		return sendgridEvent{}, err
	}
	get := func(k string) string {
		var f flexString
		if raw, ok := fields[k]; !ok || json.Unmarshal(raw, &f) != nil {
			return ""
		}
		return string(f)
	}
	str := func(k string) string { // the event's name and address: strings only
		var v string
		if json.Unmarshal(fields[k], &v) != nil {
			return ""
		}
		return v
	}
	return sendgridEvent{Event: str("event"), Email: str("email"), Timestamp: json.Number(get("timestamp")),
		SGEventID: get("sg_event_id"), SGMessageID: get("sg_message_id"), Reason: get("reason"), Response: get("response"),
		Type: get("type"), CampaignID: flexString(get("campaign_id")), UserID: flexString(get("user_id")),
		Nonce: flexString(get("campaign_nonce")), ASMGroupID: flexString(get("asm_group_id"))}, nil
}

// sendgridRefusal is the Refusal of a refusal event; false when it names no address to refuse.
func (h *Handler) sendgridRefusal(e *sendgridEvent, kind string) (Refusal, bool) {
	addr := strings.ToLower(strings.TrimSpace(e.Email))
	if addr == "" || len(addr) > maxAddressLen {
		return Refusal{}, false
	}
	rf := Refusal{
		Provider:   "sendgrid",
		Channel:    ChannelEmail,
		Address:    addr,
		CampaignID: e.campaignID(),
		UserID:     string(e.UserID),
		Kind:       kind,
		EventID:    e.eventID(),
		At:         h.sendgridAt(e),
	}
	if rf.EventID == ":"+e.Event+":"+e.Timestamp.String() {
		// Neither sg_event_id nor sg_message_id: two addresses refusing in the same second would share
		// the ID, and a sink deduping on it would lose one. A digest of the address keeps them apart
		// without putting the address in the ID.
		sum := sha256.Sum256([]byte(addr))
		rf.EventID += ":" + hex.EncodeToString(sum[:8])
	}
	evidence := "sendgrid " + e.Event
	if e.Event == "dropped" {
		evidence += " reason=" + strconv.Quote(e.Reason)
	}
	if e.SGEventID != "" {
		evidence += " sg_event_id=" + e.SGEventID
	} else {
		evidence += " sg_message_id=" + e.SGMessageID + " timestamp=" + e.Timestamp.String()
	}
	if e.ASMGroupID != "" {
		evidence += " asm_group_id=" + string(e.ASMGroupID)
	}
	// The address may be quoted in any field a sender controls; the evidence must not carry it.
	rf.Evidence = cleanEvidence(replaceFold(evidence, addr, providers.MaskAddress(addr)))
	return rf, true
}

// eventID is sg_event_id, or sg_message_id:event:timestamp when SendGrid gave none.
func (e *sendgridEvent) eventID() string {
	if e.SGEventID != "" {
		return e.SGEventID
	}
	return e.SGMessageID + ":" + e.Event + ":" + e.Timestamp.String()
}

// campaignID is the custom arg campaign_id, 0 when absent or not an integer.
func (e *sendgridEvent) campaignID() int64 {
	id, err := strconv.ParseInt(string(e.CampaignID), 10, 64)
	if err != nil {
		return 0
	}
	return id
}

// sendgridAt is the event's timestamp, or now when it has none, or when it lies further ahead than a
// clock's error can explain (milliseconds sent for seconds, say). Such a time would be refused by Postgres
// with the post's other events, or would date a refusal after every consent given before that day.
func (h *Handler) sendgridAt(e *sendgridEvent) time.Time {
	now := h.now().UTC()
	if sec, err := e.Timestamp.Int64(); err == nil && sec > 0 && sec <= now.Add(ReplayWindow).Unix() {
		return time.Unix(sec, 0).UTC()
	}
	return now
}
