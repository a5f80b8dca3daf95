package sandbox_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/campaignctl/campaignctl/internal/testlog"
	"github.com/campaignctl/campaignctl/providers/receipts"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// refusalReceiver is an HTTP server running a receipts handler whose sink hands every receipt and
// refusal recorded to the channels.
type refusalReceiver struct {
	hs       *httptest.Server
	url      string
	handler  *receipts.Handler
	receipts chan receipts.Receipt
	refusals chan receipts.Refusal
}

func (rv *refusalReceiver) Record(_ context.Context, rs []receipts.Receipt) error {
	for _, r := range rs {
		rv.receipts <- r
	}
	return nil
}

func (rv *refusalReceiver) Refuse(_ context.Context, rs []receipts.Refusal) error {
	for _, r := range rs {
		rv.refusals <- r
	}
	return nil
}

// newRefusalReceiver reserves the receiver's address; start gives it its handler, once the sandbox that
// posts to it exists.
func newRefusalReceiver(t *testing.T) *refusalReceiver {
	t.Helper()
	hs := httptest.NewUnstartedServer(nil)
	t.Cleanup(hs.Close)
	return &refusalReceiver{hs: hs, url: "http://" + hs.Listener.Addr().String(),
		receipts: make(chan receipts.Receipt, 64), refusals: make(chan receipts.Refusal, 64)}
}

func (rv *refusalReceiver) start(h *receipts.Handler) {
	rv.handler = h
	rv.hs.Config.Handler = h
	rv.hs.Start()
}

func (rv *refusalReceiver) nextRefusal(t *testing.T) receipts.Refusal {
	t.Helper()
	select {
	case r := <-rv.refusals:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no refusal recorded within 5s")
	}
	return receipts.Refusal{}
}

func (rv *refusalReceiver) noRefusal(t *testing.T) {
	t.Helper()
	select {
	case r := <-rv.refusals:
		t.Errorf("unexpected refusal %+v", r)
	default:
	}
}

// controlPost posts body to a control endpoint and decodes the answer into v (when not nil).
func controlPost(t *testing.T, url, body string, v any) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("POST %s: decode %q: %v", url, raw, err)
		}
	}
	return resp.StatusCode
}

// The SendGrid fake's refusal events reach receipts.SendGridHandler signed, with the custom args of the
// message they refuse.
func TestSendGridRefusalEvent(t *testing.T) {
	rv := newRefusalReceiver(t)
	var logs testlog.Buffer
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: rv.url + "/sendgrid/events", ReceiptDelay: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	h, err := receipts.SendGridHandler(s.SendGridEventPublicKey(), rv, nil)
	if err != nil {
		t.Fatal(err)
	}
	rv.start(h)

	m := sgMail(sgPersonalization("Ayse.Yilmaz@example.com", nil, map[string]string{"user_id": "u-7", "segment": "vip"}))
	m["custom_args"] = sgObj{"campaign_id": "42"}
	m["categories"] = []string{"promo"}
	if a := sgPost(t, srv, sgTestKey, m); a.status != http.StatusAccepted {
		t.Fatalf("send: %d %s", a.status, a.raw)
	}
	sgID := s.Messages()[0].SID

	// The address in another case: SendGrid matches addresses case-insensitively.
	var res sandbox.SendGridEventResult
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"unsubscribe","email":"ayse.yilmaz@EXAMPLE.com"}`, &res); code != http.StatusOK {
		t.Fatalf("control: %d %+v", code, res)
	}
	if res.Status != http.StatusNoContent || res.Error != "" || res.URL != rv.url+"/sendgrid/events" {
		t.Errorf("result %+v, want the receiver's 204", res)
	}
	wantEvent := map[string]any{"event": "unsubscribe", "email": "ayse.yilmaz@EXAMPLE.com", "campaign_id": "42", "user_id": "u-7",
		"segment": "vip", "category": []any{"promo"}, "sg_message_id": sgID, "smtp-id": "<" + sgID + "@sandbox.sendgrid.test>"}
	got := res.Event
	eventID, _ := got["sg_event_id"].(string)
	if ts, _ := got["timestamp"].(float64); eventID == "" || time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("sg_event_id %v, timestamp %v", got["sg_event_id"], got["timestamp"])
	}
	if diff := cmp.Diff(wantEvent, got, cmpopts.IgnoreMapEntries(func(k string, _ any) bool { return k == "sg_event_id" || k == "timestamp" })); diff != "" {
		t.Errorf("event posted (-want +got):\n%s", diff)
	}
	rf := rv.nextRefusal(t)
	want := receipts.Refusal{Provider: "sendgrid", Channel: receipts.ChannelEmail, Address: "ayse.yilmaz@example.com", CampaignID: 42, UserID: "u-7",
		Kind: receipts.RefusalUnsubscribe, EventID: eventID, Evidence: "sendgrid unsubscribe sg_event_id=" + eventID}
	if diff := cmp.Diff(want, rf, cmpopts.IgnoreFields(receipts.Refusal{}, "At")); diff != "" {
		t.Errorf("refusal (-want +got):\n%s", diff)
	}

	// Given campaign_id and user_id take the place of the message's; a group_unsubscribe names its group.
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"group_unsubscribe","email":"ayse.yilmaz@example.com","campaign_id":"7","user_id":"u-1"}`, &res); code != http.StatusOK {
		t.Fatalf("control: %d", code)
	}
	if res.Event["asm_group_id"] != float64(1) || res.Event["segment"] != "vip" || res.Event["sg_message_id"] != sgID {
		t.Errorf("group_unsubscribe event %v", res.Event)
	}
	if rf := rv.nextRefusal(t); rf.Kind != receipts.RefusalGroupUnsubscribe || rf.CampaignID != 7 || rf.UserID != "u-1" ||
		!strings.HasSuffix(rf.Evidence, " asm_group_id=1") {
		t.Errorf("refusal %+v", rf)
	}

	// An address the fake never sent to: no custom args, no message.
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"spamreport","email":"stranger@example.org","asm_group_id":3}`, &res); code != http.StatusOK {
		t.Fatalf("control: %d", code)
	}
	if _, ok := res.Event["sg_message_id"]; ok || res.Event["campaign_id"] != nil || res.Event["asm_group_id"] != float64(3) {
		t.Errorf("spamreport event %v", res.Event)
	}
	if rf := rv.nextRefusal(t); rf.Kind != receipts.RefusalSpamReport || rf.Address != "stranger@example.org" || rf.CampaignID != 0 || rf.UserID != "" {
		t.Errorf("refusal %+v", rf)
	}

	// The same event again, as SendGrid repeats events: the receiver sees the same EventID.
	repeat := `{"event":"unsubscribe","email":"ayse.yilmaz@example.com","sg_event_id":"` + eventID + `","timestamp":1700000000}`
	for range 2 {
		res = sandbox.SendGridEventResult{}
		if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", repeat, &res); code != http.StatusOK {
			t.Fatalf("control: %d", code)
		}
		if rf := rv.nextRefusal(t); rf.EventID != eventID || !rf.At.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("repeated refusal %+v, want EventID %s", rf, eventID)
		}
	}

	// A reset forgets the messages, and their custom args with them.
	s.Reset()
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"unsubscribe","email":"ayse.yilmaz@example.com"}`, &res); code != http.StatusOK {
		t.Fatalf("control: %d", code)
	}
	if res.Event["campaign_id"] != nil || res.Event["sg_message_id"] != nil {
		t.Errorf("after a reset the event still carries the message's args: %v", res.Event)
	}
	if rf := rv.nextRefusal(t); rf.CampaignID != 0 {
		t.Errorf("refusal %+v", rf)
	}

	if st := h.Stats(); st.Refusals != 6 || st.Rejected[receipts.ReasonBadSignature] != 0 {
		t.Errorf("receiver stats %+v", st)
	}
	if st := sgWaitEventStats(t, s, func(st sandbox.SendGridEventStats) bool { return st.Posted >= 7 }); st.Failed != 0 {
		t.Errorf("event stats %+v", st)
	}
	if strings.Contains(strings.ToLower(logs.String()), "ayse.yilmaz@") || strings.Contains(logs.String(), "stranger@") {
		t.Errorf("the sandbox logged an address:\n%s", logs.String())
	}
}

func TestSendGridRefusalEventRefused(t *testing.T) {
	// No event URL: nothing to post to.
	_, bare := newSendGridSandbox(t, sandbox.Options{})
	var e struct{ Error string }
	if code := controlPost(t, bare.URL+"/_sandbox/sendgrid/events", `{"event":"unsubscribe","email":"a@example.com"}`, &e); code != http.StatusConflict ||
		!strings.Contains(e.Error, "--sendgrid-event-url") {
		t.Errorf("no URL: %d %q, want 409 naming the flag", code, e.Error)
	}
	_, offsite := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: "http://192.0.2.1/events"})
	if code := controlPost(t, offsite.URL+"/_sandbox/sendgrid/events", `{"event":"unsubscribe","email":"a@example.com"}`, &e); code != http.StatusConflict ||
		!strings.Contains(e.Error, "loopback") {
		t.Errorf("non-loopback URL: %d %q, want 409 saying why", code, e.Error)
	}

	// A receiver that fails: its status is passed on, and the post counted as failed.
	recv, posts := sgReceiver(t, http.StatusInternalServerError)
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: recv.URL})
	var res sandbox.SendGridEventResult
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"spamreport","email":"a@example.com"}`, &res); code != http.StatusOK ||
		res.Status != http.StatusInternalServerError || res.Error == "" {
		t.Errorf("failing receiver: %d %+v", code, res)
	}
	// The next one goes through, signed like the fake's other events.
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"spamreport","email":"a@example.com"}`, &res); code != http.StatusOK || res.Status != http.StatusOK {
		t.Errorf("second post: %d %+v", code, res)
	}
	p := sgNextPost(t, posts)
	if !sgVerify(t, s.SendGridEventPublicKey(), p) {
		t.Error("the refusal event's signature does not verify")
	}
	var batch []map[string]any
	if err := json.Unmarshal(p.body, &batch); err != nil || len(batch) != 1 || batch[0]["event"] != "spamreport" || batch[0]["email"] != "a@example.com" {
		t.Errorf("posted %s (%v)", p.body, err)
	}
	if st := s.SendGridEventStats(); st.Failed != 1 || st.Posted != 1 || st.Events != 1 {
		t.Errorf("event stats %+v", st)
	}

	for name, body := range map[string]string{
		"not a refusal":  `{"event":"open","email":"a@example.com"}`,
		"no address":     `{"event":"unsubscribe"}`,
		"bad address":    `{"event":"unsubscribe","email":"not an address"}`,
		"unknown field":  `{"event":"unsubscribe","email":"a@example.com","emial":"x"}`,
		"negative group": `{"event":"group_unsubscribe","email":"a@example.com","asm_group_id":-1}`,
		"not JSON":       `unsubscribe`,
	} {
		if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", body, nil); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, code)
		}
	}

	// A receiver that is gone: 502, with what would have been posted. Port 1 (privileged, nothing listens):
	// a port taken and let go again may be handed to another test's server at once.
	gone := "http://127.0.0.1:1/events"
	_, srv = newSendGridSandbox(t, sandbox.Options{SendGridEventURL: gone})
	res = sandbox.SendGridEventResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/sendgrid/events", `{"event":"unsubscribe","email":"a@example.com"}`, &res); code != http.StatusBadGateway ||
		res.Status != 0 || res.Error == "" || res.Event["email"] != "a@example.com" {
		t.Errorf("receiver gone: %d %+v", code, res)
	}
}

// An answer to an SMS reaches receipts.TwilioInboundHandler signed as Twilio signs, and becomes a refusal.
func TestTwilioInbound(t *testing.T) {
	rv := newRefusalReceiver(t)
	var logs testlog.Buffer
	// A query in the URL is part of what Twilio signs.
	inboundURL := rv.url + "/twilio/inbound?tenant=7"
	s, srv := newTwilioSandbox(t, sandbox.Options{TwilioInboundURL: inboundURL,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	rv.start(receipts.TwilioInboundHandler(testToken, rv.url, nil, rv, nil))

	const customer, shop = "+905321234567", "+908501234567"
	if a := postMessage(t, srv, testSID, testToken, map[string][]string{"To": {customer}, "From": {shop}, "Body": {"Kampanya: %20 indirim"}}); a.status != http.StatusCreated {
		t.Fatalf("send: %d %s", a.status, a.raw)
	}

	// No "to": the answer goes to the number that sent the SMS.
	var res sandbox.TwilioInboundResult
	res = sandbox.TwilioInboundResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/twilio/inbound", `{"from":"`+customer+`","body":"İptal"}`, &res); code != http.StatusOK {
		t.Fatalf("control: %d %+v", code, res)
	}
	if res.Status != http.StatusOK || res.Response != `<?xml version="1.0" encoding="UTF-8"?><Response></Response>` || res.Error != "" || res.URL != inboundURL {
		t.Errorf("result %+v, want the receiver's 200 and empty TwiML", res)
	}
	sid := res.MessageSID
	wantForm := map[string]string{
		"MessageSid": sid, "SmsMessageSid": sid, "SmsSid": sid, "AccountSid": testSID, "From": customer, "To": shop, "Body": "İptal",
		"NumMedia": "0", "NumSegments": "1", "SmsStatus": "received", "ApiVersion": "2010-04-01", "FromCountry": "TR", "ToCountry": "TR",
	}
	if diff := cmp.Diff(wantForm, res.Form); diff != "" {
		t.Errorf("form posted (-want +got):\n%s", diff)
	}
	if len(sid) != 34 || !strings.HasPrefix(sid, "SM") {
		t.Errorf("MessageSid %q", sid)
	}
	rf := rv.nextRefusal(t)
	want := receipts.Refusal{Provider: "twilio", Channel: receipts.ChannelSMS, Address: customer, Kind: receipts.RefusalInbound,
		Keyword: "IPTAL", EventID: sid, Evidence: "twilio inbound " + sid + ` "İptal"`}
	if diff := cmp.Diff(want, rf, cmpopts.IgnoreFields(receipts.Refusal{}, "At")); diff != "" {
		t.Errorf("refusal (-want +got):\n%s", diff)
	}

	// Twilio retries what failed with the same MessageSid: the refusal comes again with the same EventID.
	res = sandbox.TwilioInboundResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/twilio/inbound", `{"from":"`+customer+`","to":"`+shop+`","body":"RET","message_sid":"`+sid+`"}`, &res); code != http.StatusOK || res.Status != http.StatusOK {
		t.Fatalf("repeat: %d %+v", code, res)
	}
	if rf := rv.nextRefusal(t); rf.EventID != sid || rf.Keyword != "RET" {
		t.Errorf("repeated refusal %+v, want EventID %s", rf, sid)
	}

	// Not a refusal: answered, counted, nothing recorded.
	res = sandbox.TwilioInboundResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/twilio/inbound", `{"from":"`+customer+`","to":"`+shop+`","body":"Teşekkürler, geliyorum"}`, &res); code != http.StatusOK || res.Status != http.StatusOK {
		t.Fatalf("not a refusal: %d %+v", code, res)
	}
	if st := rv.handler.Stats(); st.Ignored["inbound_other"] != 1 || st.Refusals != 2 || len(st.Rejected) != 0 {
		t.Errorf("receiver stats %+v", st)
	}
	rv.noRefusal(t)
	if strings.Contains(logs.String(), customer) || strings.Contains(logs.String(), testToken) {
		t.Errorf("the sandbox logged the number or the token:\n%s", logs.String())
	}
	if len(s.Messages()) != 1 {
		t.Errorf("incoming messages were recorded as sent: %+v", s.Messages())
	}
}

func TestTwilioInboundRefused(t *testing.T) {
	const body = `{"from":"+905321234567","to":"+908501234567","body":"RET"}`
	var e struct{ Error string }
	_, bare := newTwilioSandbox(t, sandbox.Options{})
	if code := controlPost(t, bare.URL+"/_sandbox/twilio/inbound", body, &e); code != http.StatusConflict || !strings.Contains(e.Error, "--twilio-inbound-url") {
		t.Errorf("no URL: %d %q, want 409 naming the flag", code, e.Error)
	}
	_, offsite := newTwilioSandbox(t, sandbox.Options{TwilioInboundURL: "http://example.com/in"})
	if code := controlPost(t, offsite.URL+"/_sandbox/twilio/inbound", body, &e); code != http.StatusConflict || !strings.Contains(e.Error, "loopback") {
		t.Errorf("non-loopback URL: %d %q", code, e.Error)
	}
	// No auth token to sign with (any credentials accepted): refused rather than signed with nothing.
	noToken := sandbox.New(sandbox.Options{TwilioInboundURL: "http://127.0.0.1:9/in"})
	if _, err := noToken.PostTwilioInbound(context.Background(), sandbox.TwilioInbound{From: "+905321234567", To: "+908501234567", Body: "RET"}); err == nil ||
		!strings.Contains(err.Error(), "TWILIO_AUTH_TOKEN") {
		t.Errorf("no token: %v", err)
	}

	// A receiver with another token refuses the signature; its 403 is passed on.
	rv := newRefusalReceiver(t)
	_, srv := newTwilioSandbox(t, sandbox.Options{TwilioInboundURL: rv.url + "/twilio/inbound"})
	rv.start(receipts.TwilioInboundHandler("someOtherToken", rv.url, nil, rv, nil))
	var res sandbox.TwilioInboundResult
	res = sandbox.TwilioInboundResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/twilio/inbound", body, &res); code != http.StatusOK || res.Status != http.StatusForbidden {
		t.Errorf("other token: %d %+v, want the receiver's 403", code, res)
	}
	rv.noRefusal(t)
	if st := rv.handler.Stats(); st.Rejected[receipts.ReasonBadSignature] != 1 {
		t.Errorf("receiver stats %+v", st)
	}

	for name, b := range map[string]string{
		"from not E.164":        `{"from":"05321234567","to":"+908501234567","body":"RET"}`,
		"to not E.164":          `{"from":"+905321234567","to":"0850","body":"RET"}`,
		"no to, nothing sent":   `{"from":"+905321234567","body":"RET"}`,
		"body too long":         `{"from":"+905321234567","to":"+908501234567","body":"` + strings.Repeat("x", 1601) + `"}`,
		"message_sid not an SM": `{"from":"+905321234567","to":"+908501234567","body":"RET","message_sid":"MM123"}`,
		"unknown field":         `{"from":"+905321234567","to":"+908501234567","bdy":"RET"}`,
		"message_sid not alnum": `{"from":"+905321234567","to":"+908501234567","body":"RET","message_sid":"SM 1"}`,
		"not JSON":              `RET`,
	} {
		if code := controlPost(t, srv.URL+"/_sandbox/twilio/inbound", b, nil); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, code)
		}
	}
	rv.noRefusal(t)

	// A receiver that is gone: 502, with the form that would have been posted (port 1, as above).
	gone := "http://127.0.0.1:1/in"
	_, srv = newTwilioSandbox(t, sandbox.Options{TwilioInboundURL: gone})
	res = sandbox.TwilioInboundResult{}
	if code := controlPost(t, srv.URL+"/_sandbox/twilio/inbound", body, &res); code != http.StatusBadGateway || res.Status != 0 || res.Error == "" || res.Form["Body"] != "RET" {
		t.Errorf("receiver gone: %d %+v", code, res)
	}
}
