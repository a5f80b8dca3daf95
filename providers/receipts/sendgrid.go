package receipts

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
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

// sendgridEngagement are SendGrid's engagement events, which are counted and not recorded.
var sendgridEngagement = map[string]bool{
	"open": true, "click": true, "spamreport": true, "unsubscribe": true,
	"group_unsubscribe": true, "group_resubscribe": true,
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
			return fmt.Errorf("custom arg is neither a string nor a number")
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
// when absent), the reason (bounce,
// dropped) or response (deferred) Error. A nil log discards; a nil sink panics.
func SendGridHandler(publicKeyBase64 string, sink Sink, log *slog.Logger) (*Handler, error) {
	key, err := sendgridKey(publicKeyBase64)
	if err != nil {
		return nil, err
	}
	h := newHandler("sendgrid", sink, log, newLimits(MaxSendGridBody, sendgridInFlight))
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
	h.parse = func(h *Handler, r *http.Request) ([]Receipt, []string, *rejection) {
		sig, ts := r.Header.Get(eventwebhook.VerificationHTTPHeader), r.Header.Get(eventwebhook.TimestampHTTPHeader)
		body, done, err := readBody(r, h.limits.max)
		defer done() // the receipts hold copies of what they take from the body
		if err != nil {
			return nil, nil, bodyRejection(err, h.limits.max)
		}
		// The signature is checked on the raw bytes, before any JSON is decoded.
		if ok, err := eventwebhook.VerifySignature(key, body, sig, ts); err != nil || !ok {
			return nil, nil, reject(http.StatusForbidden, ReasonBadSignature, "signature does not match the body")
		}
		// The timestamp is checked after the signature, so that "stale" counts only requests SendGrid
		// really signed: replays, or a clock that drifted.
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return nil, nil, reject(http.StatusForbidden, ReasonStale, "timestamp %q is not Unix seconds", ts)
		}
		if d := h.now().Sub(time.Unix(sec, 0)); d > ReplayWindow || d < -ReplayWindow {
			return nil, nil, reject(http.StatusForbidden, ReasonStale, "timestamp %s off the local clock", d.Round(time.Second))
		}
		return h.sendgridReceipts(body)
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

func (h *Handler) sendgridReceipts(body []byte) ([]Receipt, []string, *rejection) {
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, nil, reject(http.StatusBadRequest, ReasonMalformed, "body is not a JSON array of events: %v", err)
	}
	var rs []Receipt
	var ignored []string
	for _, m := range raw {
		var e sendgridEvent
		if err := json.Unmarshal(m, &e); err != nil || e.Event == "" {
			ignored = append(ignored, ignoredInvalid)
			continue
		}
		status, ok := sendgridStatuses[e.Event]
		if !ok {
			name := ignoredOther
			if sendgridEngagement[e.Event] {
				name = e.Event
			}
			ignored = append(ignored, name)
			continue
		}
		rc := Receipt{
			Provider:  "sendgrid",
			MessageID: e.SGMessageID,
			UserID:    string(e.UserID),
			Status:    status,
			EventID:   e.SGEventID,
			At:        h.now().UTC(),
		}
		if i := strings.IndexByte(rc.MessageID, '.'); i >= 0 {
			rc.MessageID = rc.MessageID[:i]
		}
		if rc.MessageID == "" && e.CampaignID == "" && e.UserID == "" {
			ignored = append(ignored, ignoredInvalid) // nothing to match it to a send
			continue
		}
		if rc.EventID == "" {
			rc.EventID = e.SGMessageID + ":" + e.Event + ":" + e.Timestamp.String()
		}
		if id, err := strconv.ParseInt(string(e.CampaignID), 10, 64); err == nil {
			rc.CampaignID = id
		}
		if sec, err := e.Timestamp.Int64(); err == nil && sec > 0 {
			rc.At = time.Unix(sec, 0).UTC()
		}
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
		rs = append(rs, rc)
	}
	return rs, ignored, nil
}
