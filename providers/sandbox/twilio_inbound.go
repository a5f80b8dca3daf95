package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/campaignctl/campaignctl/providers"
)

// Twilio incoming messages
//
// A recipient who answers an SMS (RET, IPTAL, STOP, or anything else) makes Twilio post the answer to
// the messaging URL of the number it was sent to. The sandbox has no handsets, so the answer is made up
// through the control API:
//
//	POST /_sandbox/twilio/inbound  {"from":"+905321234567","to":"+908501234567","body":"RET"}
//
// posts, once and at once, to Options.TwilioInboundURL (loopback only, like the status callbacks) the
// form of Twilio's incoming-message webhook: MessageSid, SmsMessageSid and SmsSid (a new SM... SID, or
// "message_sid" to repeat one), AccountSid, From, To, Body, NumMedia "0", NumSegments, SmsStatus
// "received", ApiVersion, and FromCountry/ToCountry "TR" for Turkish numbers. It is signed
// as Twilio signs, with Options.TwilioAuthToken over the URL exactly as configured (see
// twilioSignature). "to" may be left out when the sandbox sent an SMS to "from": the answer then goes to
// the sender of the last one. The answer is a TwilioInboundResult: what was posted and what the
// receiver answered (see control_post.go for the status codes). Without a TwilioInboundURL or a
// TwilioAuthToken the request is answered 409.

// sandboxAccountSID is the AccountSid of incoming messages when the sandbox knows no account.
const sandboxAccountSID = "AC00000000000000000000000000000000"

// TwilioInbound is an incoming SMS to make up: what POST /_sandbox/twilio/inbound takes.
type TwilioInbound struct {
	// From is the recipient who answers, E.164.
	From string `json:"from"`
	// To is the number answered, E.164; empty means the sender of the last SMS the sandbox accepted to
	// From.
	To string `json:"to,omitempty"`
	// Body is the answer's text, at most 1600 characters.
	Body string `json:"body"`
	// MessageSID repeats an incoming message already posted, as Twilio does when the receiver failed;
	// empty means a new SM... SID.
	MessageSID string `json:"message_sid,omitempty"`
}

// TwilioInboundResult is what the sandbox posted for an incoming SMS and what the receiver answered.
type TwilioInboundResult struct {
	// MessageSID is the MessageSid posted.
	MessageSID string `json:"message_sid"`
	// URL is where it was posted (Options.TwilioInboundURL).
	URL string `json:"url"`
	// Form is the form posted, one value a field.
	Form map[string]string `json:"form"`
	// Status is the receiver's HTTP status; 0 when it did not answer.
	Status int `json:"status"`
	// Response is the start (4 KiB) of the receiver's answer: TwiML, for a receiver that replies.
	Response string `json:"response,omitempty"`
	// Error says why no answer came; "" when one did.
	Error string `json:"error,omitempty"`
}

// twilioInboundState is where incoming messages go.
type twilioInboundState struct {
	url      string // "" when none can be posted
	disabled string // why not, when Options.TwilioInboundURL is set but refused
	client   *http.Client
}

func (s *Server) twilioInboundRoutes() {
	st := &twilioInboundState{}
	if raw := s.opts.TwilioInboundURL; raw != "" {
		if _, err := parseLoopbackURL("the Twilio inbound URL", raw); err != nil {
			st.disabled = err.Error()
			s.logger.Error("sandbox twilio inbound messages disabled", "err", err)
		} else {
			st.url, st.client = raw, loopbackClient()
		}
	}
	s.inbound = st
	s.mux.HandleFunc("POST /_sandbox/twilio/inbound", func(w http.ResponseWriter, r *http.Request) {
		var in TwilioInbound
		if !decodeControl(w, r, &in, false) {
			return
		}
		res, err := s.PostTwilioInbound(r.Context(), in)
		writeControlPost(w, res, res.Status, err)
	})
}

// PostTwilioInbound posts the incoming SMS in to Options.TwilioInboundURL, signed, as Twilio would, and
// returns what it posted and what the receiver answered. It fails, posting nothing, when in is not a
// message Twilio could deliver, or when the sandbox has no inbound URL or auth token; a receiver that
// fails or does not answer is reported in the result, not as an error.
func (s *Server) PostTwilioInbound(ctx context.Context, in TwilioInbound) (TwilioInboundResult, error) {
	st := s.inbound
	switch {
	case st.url == "" && st.disabled != "":
		return TwilioInboundResult{}, fmt.Errorf("%w: %s", errNotConfigured, st.disabled)
	case st.url == "":
		return TwilioInboundResult{}, fmt.Errorf("%w: no Twilio inbound URL: start the sandbox with --twilio-inbound-url (Options.TwilioInboundURL)", errNotConfigured)
	case s.opts.TwilioAuthToken == "":
		return TwilioInboundResult{}, fmt.Errorf("%w: no Twilio auth token to sign with: start the sandbox with TWILIO_AUTH_TOKEN set to the token the receiver verifies with", errNotConfigured)
	}
	form, err := s.twilioInboundForm(in)
	if err != nil {
		return TwilioInboundResult{}, err
	}
	header := http.Header{
		"Content-Type":       {"application/x-www-form-urlencoded"},
		"User-Agent":         {"TwilioProxy/1.1"},
		"X-Twilio-Signature": {twilioSignature(s.opts.TwilioAuthToken, st.url, form)},
	}
	res := TwilioInboundResult{MessageSID: form.Get("MessageSid"), URL: st.url, Form: make(map[string]string, len(form))}
	for k := range form {
		res.Form[k] = form.Get(k)
	}
	status, answer, err := postForAnswer(ctx, st.client, st.url, header, strings.NewReader(form.Encode()))
	res.Status, res.Response = status, string(answer)
	if err != nil {
		res.Error = err.Error()
	}
	s.logger.Info("sandbox twilio inbound message posted", "message_sid", res.MessageSID,
		"from", providers.MaskAddress(in.From), "status", status, "err", res.Error)
	return res, nil
}

// twilioInboundForm is the webhook form of in, or why there is none.
func (s *Server) twilioInboundForm(in TwilioInbound) (url.Values, error) {
	to, account := in.To, s.opts.TwilioAccountSID
	if to == "" || account == "" {
		// The last SMS to the sender says which number it answers and under which account.
		ms := s.log.list(in.From)
		for i := len(ms) - 1; i >= 0; i-- {
			if m := ms[i]; m.Provider == "twilio" && isE164(m.From) {
				if to == "" {
					to = m.From
				}
				if account == "" {
					account = m.AccountSID
				}
				break
			}
		}
	}
	if account == "" {
		account = sandboxAccountSID
	}
	switch {
	case !isE164(in.From):
		return nil, fmt.Errorf("%w: from %q is not an E.164 number such as +905321234567", errInvalid, in.From)
	case in.To == "" && to == "":
		return nil, fmt.Errorf("%w: no \"to\" given, and the sandbox sent no SMS to %s to take it from: give \"to\", the number the reply goes to (TWILIO_FROM)", errInvalid, providers.MaskAddress(in.From))
	case !isE164(to):
		return nil, fmt.Errorf("%w: to %q is not an E.164 number", errInvalid, to)
	case utf8.RuneCountInString(in.Body) > twilioMaxBody:
		return nil, fmt.Errorf("%w: body over %d characters", errInvalid, twilioMaxBody)
	case in.MessageSID != "" && (!strings.HasPrefix(in.MessageSID, "SM") || len(in.MessageSID) > 64 || !isAlnum(in.MessageSID)):
		return nil, fmt.Errorf("%w: message_sid %q is not an SM... SID", errInvalid, in.MessageSID)
	}
	sid := in.MessageSID
	if sid == "" {
		sid = newSID("SM")
	}
	_, segments := providers.SMSSegments(in.Body)
	form := url.Values{
		"MessageSid":    {sid},
		"SmsMessageSid": {sid},
		"SmsSid":        {sid},
		"AccountSid":    {account},
		"From":          {in.From},
		"To":            {to},
		"Body":          {in.Body},
		"NumMedia":      {"0"},
		"NumSegments":   {strconv.Itoa(max(segments, 1))},
		"SmsStatus":     {"received"},
		"ApiVersion":    {"2010-04-01"},
	}
	if c := phoneCountry(in.From); c != "" {
		form.Set("FromCountry", c)
	}
	if c := phoneCountry(to); c != "" {
		form.Set("ToCountry", c)
	}
	return form, nil
}

// phoneCountry is the ISO country of a Turkish number, "" for the others (Twilio sends an empty field
// when it does not know).
func phoneCountry(e164 string) string {
	if strings.HasPrefix(e164, "+90") {
		return "TR"
	}
	return ""
}
