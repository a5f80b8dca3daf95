package receipts

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/campaignctl/campaignctl/providers"
)

// ignoredInbound is the Stats.Ignored key of an incoming SMS that is not a refusal.
const ignoredInbound = "inbound_other"

// emptyTwiML is the answer to an incoming SMS: a TwiML document with nothing in it, so that Twilio sends
// no reply.
const emptyTwiML = `<?xml version="1.0" encoding="UTF-8"?><Response></Response>`

// TwilioInboundHandler receives Twilio's incoming-message webhook (the form-encoded POST to the
// messaging URL of a number: MessageSid, AccountSid, From, To, Body, NumMedia, ...) and records the
// refusals among the messages in sink.
//
// The request is verified exactly as TwilioHandler verifies status callbacks: X-Twilio-Signature with
// authToken over publicURL followed by the request's own path and query (the request's origin when
// publicURL is empty), checked for before the body is read, and bodies over MaxTwilioBody refused with
// 413; a forged or unsigned request is answered 403 and changes nothing. MessageSid and From are
// required (400 otherwise).
//
// A message is a refusal when the first word of its Body, after any leading spaces and punctuation and
// up to the next character that is not a letter or a digit, folds (see Refusal.Keyword: upper case, İ, ı
// and i as I) to one of keywords, folded the same way; nil or empty keywords mean
// DefaultRefusalKeywords. "ret", "Ret.", "İptal", "İPTAL lütfen" and "IPTAL" are refusals, "Retro" and
// "Merhaba, RET" are not. Only the first word counts, so "İptal etmeyin" is a refusal too: a message that
// opens with a refusal keyword is taken at its word, the side to err on with consent. A refusal becomes a Refusal of kind RefusalInbound from the sender's number, recorded with Refuse
// before the answer (a RefusalSink error answers 500, and Twilio tries again). Any other message is
// counted in Stats.Ignored["inbound_other"], logged at info with the number masked, and changes
// nothing.
//
// A recorded or ignored message is answered 200 with an empty TwiML document (Content-Type text/xml), so
// that Twilio sends no reply. An empty authToken refuses every request. A nil log discards; a nil sink
// panics.
func TwilioInboundHandler(authToken, publicURL string, keywords []string, sink RefusalSink, log *slog.Logger) *Handler {
	if sink == nil {
		panic("receipts: nil RefusalSink")
	}
	h := newHandler("twilio", nil, sink, log, newLimits(MaxTwilioBody, twilioInFlight))
	set, bad := keywordSet(keywords)
	if len(bad) > 0 {
		h.log.Error("twilio refusal keywords that are not one word never match", "keywords", bad)
	}
	h.answer = func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/xml")
		w.Header().Set("Content-Length", strconv.Itoa(len(emptyTwiML)))
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(emptyTwiML)) //nolint:errcheck // Twilio went away; it will post again
	}
	twilioSigned(h, authToken, publicURL, "incoming message", func(h *Handler, _ *http.Request, form map[string]string) (batch, *rejection) {
		return h.twilioInbound(form, set)
	})
	return h
}

func (h *Handler) twilioInbound(form map[string]string, keywords map[string]bool) (batch, *rejection) {
	sid, from := form["MessageSid"], form["From"]
	if sid == "" {
		sid = form["SmsMessageSid"]
	}
	if sid == "" {
		sid = form["SmsSid"]
	}
	if sid == "" || from == "" || len(sid) > maxSIDLen || len(from) > maxSIDLen {
		return batch{}, reject(http.StatusBadRequest, ReasonMalformed, "MessageSid or From missing or too long")
	}
	word := firstWord(form["Body"])
	keyword := foldKeyword(word)
	// Twilio flags a message it took as an opt-out (Advanced Opt-Out: its own words and the ones set up on
	// the Messaging Service, in any language) with OptOutType STOP, and stops sending to its sender.
	optOut := strings.EqualFold(form["OptOutType"], "STOP")
	if optOut && keyword == "" {
		keyword = "STOP"
	}
	if !optOut && (word == "" || !keywords[keyword]) {
		h.log.Info("twilio incoming message is not a refusal", "message_id", sid, "from", providers.MaskAddress(from))
		return batch{ignored: []string{ignoredInbound}}, nil
	}
	rf := Refusal{
		Provider: "twilio",
		Channel:  ChannelSMS,
		Address:  from,
		Kind:     RefusalInbound,
		Keyword:  keyword,
		EventID:  sid,
		At:       h.now().UTC(),
		Evidence: cleanEvidence("twilio inbound " + sid + " " + strconv.Quote(word)),
	}
	return batch{refusals: []Refusal{rf}}, nil
}
