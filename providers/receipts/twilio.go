package receipts

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/twilio/twilio-go/client"

	"github.com/campaignctl/campaignctl/providers"
)

// twilioSignatureHeader carries base64(HMAC-SHA1(auth token, URL + sorted POST key+value pairs)).
const twilioSignatureHeader = "X-Twilio-Signature"

// maxSIDLen bounds MessageSid and MessageStatus (a SID is 34 characters).
const maxSIDLen = 64

// twilioStatuses maps the final and "sent" values of MessageStatus to Receipt statuses.
var twilioStatuses = map[string]string{
	"sent":        StatusSent,
	"delivered":   StatusDelivered,
	"undelivered": StatusUndelivered,
	"failed":      StatusFailed,
	"canceled":    StatusFailed,
}

// twilioInterim are the MessageStatus values that are not receipts: Twilio's steps before "sent", the
// WhatsApp read receipt after "delivered", and inbound messages.
var twilioInterim = map[string]bool{
	"accepted": true, "scheduled": true, "queued": true, "sending": true,
	"read": true, "receiving": true, "received": true, "partially_delivered": true,
}

// twilioErrors names the delivery error codes a status callback carries.
var twilioErrors = map[int]string{
	30001: "queue overflow",
	30002: "account suspended",
	30003: "unreachable destination handset",
	30004: "message blocked",
	30005: "unknown destination handset",
	30006: "landline or unreachable carrier",
	30007: "message filtered",
	30008: "unknown error",
	30034: "message from an unregistered number",
}

// TwilioHandler receives Twilio's message status callbacks (form-encoded POSTs to the StatusCallback
// URL of a message) and records them in sink.
//
// It verifies X-Twilio-Signature with twilio-go's RequestValidator and authToken, over the URL Twilio
// called and the POST form. Behind a reverse proxy that URL is not the one this server sees, so it is
// rebuilt as publicURL (scheme, host and any path prefix the proxy strips, e.g.
// "https://hooks.example.com/campaignctl") followed by the request's own path and query. An empty
// publicURL means the request's Host with http, or https under TLS. The validator tries the URL with
// and without the default port.
//
// The X-Twilio-Signature header is checked for before the body is read, and bodies over MaxTwilioBody
// are refused with 413 (see the package doc for the other limits).
//
// The form's MessageSid and MessageStatus are required; ErrorCode becomes Receipt.Error. The query
// parameters campaign_id and user_id of the callback URL, if present, become Receipt.CampaignID and
// UserID (a campaign_id that is not an integer makes the request malformed). Interim statuses (queued,
// sending, ...) are answered 204 and counted as ignored.
//
// An empty authToken refuses every request, since anyone can sign with an empty key. A nil log
// discards; a nil sink panics.
func TwilioHandler(authToken, publicURL string, sink Sink, log *slog.Logger) *Handler {
	if sink == nil {
		panic("receipts: nil Sink")
	}
	refusals, _ := sink.(RefusalSink)
	h := newHandler("twilio", sink, refusals, log, newLimits(MaxTwilioBody, twilioInFlight))
	twilioSigned(h, authToken, publicURL, "status callback", func(h *Handler, r *http.Request, form map[string]string) (batch, *rejection) {
		rs, ignored, rej := h.twilioReceipt(r, form)
		b := batch{receipts: rs, ignored: ignored}
		if rej == nil && h.refusals != nil && form["ErrorCode"] == twilioOptedOut && form["To"] != "" {
			// The recipient had replied STOP: Twilio sends them nothing more, and they have refused.
			sid := form["MessageSid"]
			b.refusals = append(b.refusals, Refusal{Provider: "twilio", Channel: ChannelSMS, Address: form["To"], Kind: RefusalOptedOut,
				EventID: sid + ":" + twilioOptedOut, At: h.now().UTC(), Evidence: cleanEvidence("twilio status callback " + sid + " error 21610 (the recipient replied STOP)")})
		}
		return b, rej
	})
	return h
}

// twilioOptedOut is Twilio's error 21610: the message was refused because its recipient had opted out.
const twilioOptedOut = "21610"

// twilioSigned makes h verify X-Twilio-Signature, as TwilioHandler describes, and hand the verified
// form to next. what names the requests in the log ("status callback").
func twilioSigned(h *Handler, authToken, publicURL, what string, next func(h *Handler, r *http.Request, form map[string]string) (batch, *rejection)) {
	if authToken == "" {
		h.log.Error("twilio auth token is empty: every " + what + " will be refused")
	}
	validator := client.NewRequestValidator(authToken)
	h.signatureHint = "TWILIO_AUTH_TOKEN here is not the account's primary auth token, or Twilio calls another URL than the one checked (give it as WEBHOOKS_PUBLIC_URL or --public-url)"
	base := strings.TrimRight(publicURL, "/")
	h.headers = func(r *http.Request) *rejection {
		if r.Header.Get(twilioSignatureHeader) == "" {
			return reject(http.StatusForbidden, ReasonUnsigned, "no %s header", twilioSignatureHeader)
		}
		return nil
	}
	h.parse = func(h *Handler, r *http.Request) (batch, *rejection) {
		// The signature covers the form, so the form is parsed first: from the body the handler bounded
		// (ParseForm reads a MaxBytesReader no further than its limit), and only if it is a plain form.
		if err := r.ParseForm(); err != nil {
			return batch{}, bodyRejection(err, h.limits.max)
		}
		params := make(map[string]string, len(r.PostForm))
		for k, v := range r.PostForm {
			params[k] = v[0] // what twilio-go's validator does with repeated keys
		}
		signedURL := signedURL(base, r)
		if authToken == "" || !validator.Validate(signedURL, params, r.Header.Get(twilioSignatureHeader)) {
			return batch{}, reject(http.StatusForbidden, ReasonBadSignature, "signature does not match %s", redactQuery(signedURL))
		}
		return next(h, r, params)
	}
}

func (h *Handler) twilioReceipt(r *http.Request, form map[string]string) ([]Receipt, []string, *rejection) {
	sid, raw := form["MessageSid"], form["MessageStatus"]
	if sid == "" {
		sid = form["SmsSid"] // older callbacks name it so
	}
	if raw == "" {
		raw = form["SmsStatus"]
	}
	if sid == "" || raw == "" || len(sid) > maxSIDLen || len(raw) > maxSIDLen {
		return nil, nil, reject(http.StatusBadRequest, ReasonMalformed, "MessageSid or MessageStatus missing or too long")
	}
	q := r.URL.Query()
	rc := Receipt{
		Provider:      "twilio",
		MessageID:     sid,
		UserID:        q.Get("user_id"),
		CampaignNonce: q.Get("campaign_nonce"),
		Address:       strings.TrimSpace(form["To"]),
		EventID:       sid + ":" + raw,
		At:            h.now().UTC(),
	}
	if c := q.Get("campaign_id"); c != "" {
		id, err := strconv.ParseInt(c, 10, 64)
		if err != nil {
			return nil, nil, reject(http.StatusBadRequest, ReasonMalformed, "campaign_id %q in the callback URL is not an integer", c)
		}
		rc.CampaignID = id
	}
	status, ok := twilioStatuses[raw]
	if !ok {
		name := ignoredOther
		if twilioInterim[raw] {
			name = raw
		}
		return nil, []string{name}, nil
	}
	rc.Status = status
	if code := form["ErrorCode"]; code != "" && code != "0" {
		n, err := strconv.Atoi(code)
		if err != nil {
			return nil, nil, reject(http.StatusBadRequest, ReasonMalformed, "ErrorCode %q is not a number", code)
		}
		rc.Error = "twilio " + code
		if text, ok := twilioErrors[n]; ok {
			rc.Error += ": " + text
		}
	} else if raw == "canceled" {
		rc.Error = "canceled"
	}
	h.log.Debug("twilio status callback", "message_id", sid, "status", raw, "error", rc.Error,
		"to", providers.MaskAddress(form["To"]), "campaign_id", rc.CampaignID)
	return []Receipt{rc}, nil, nil
}

// signedURL is the URL Twilio signed: base (or the request's own origin) and the request target as it
// arrived, so that its escaping is the caller's, not a re-encoding.
func signedURL(base string, r *http.Request) string {
	target := r.RequestURI
	if target == "" || !strings.HasPrefix(target, "/") { // a hand-made request, or absolute-form
		target = r.URL.RequestURI()
	}
	if base == "" {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		base = scheme + "://" + r.Host
	}
	return base + target
}

// redactQuery drops the query from a URL for the log: it may carry a user_id.
func redactQuery(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		return raw[:i] + "?…"
	}
	return raw
}
