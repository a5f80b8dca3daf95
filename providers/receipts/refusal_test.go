package receipts_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/campaignctl/campaignctl/providers/receipts"
)

// bothSink records receipts and refusals; refuseErr, when set, fails Refuse.
type bothSink struct {
	sink
	rmu       sync.Mutex
	refusals  [][]receipts.Refusal
	refuseErr error
}

func (s *bothSink) Refuse(_ context.Context, rs []receipts.Refusal) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.refuseErr != nil {
		return s.refuseErr
	}
	s.refusals = append(s.refusals, rs)
	return nil
}

// backAfter makes the refusal sink take refusals again after d (its outage ends).
func (s *bothSink) backAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		s.rmu.Lock()
		s.refuseErr = nil
		s.rmu.Unlock()
	})
}

func (s *bothSink) allRefusals() []receipts.Refusal {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	var out []receipts.Refusal
	for _, c := range s.refusals {
		out = append(out, c...)
	}
	return out
}

func (s *bothSink) refuseCalls() int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return len(s.refusals)
}

const refusalBatch = `[
 {"email":"Ayse.Yilmaz@Example.com","timestamp":1700000300,"event":"unsubscribe","sg_event_id":"ev-unsub","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-1","campaign_id":"42","user_id":"u-1"},
 {"email":"mehmet@example.com","timestamp":1700000301,"event":"group_unsubscribe","asm_group_id":7,"sg_event_id":"ev-group","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-2","useragent":"Mozilla","ip":"192.0.2.1","campaign_id":42,"user_id":"u-2"},
 {"email":"zeynep@example.com","timestamp":1700000302,"event":"spamreport","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-3"},
 {"timestamp":1700000303,"event":"unsubscribe","sg_event_id":"ev-noaddr"},
 {"email":"can@example.com","timestamp":1700000304,"event":"delivered","sg_event_id":"ev-deliv","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-4","campaign_id":"42","user_id":"u-4"},
 {"email":"can@example.com","timestamp":1700000305,"event":"group_resubscribe","sg_event_id":"ev-resub","asm_group_id":7}
]`

func TestSendGridRefusals(t *testing.T) {
	sg := newSigner(t)
	var sk bothSink
	var logs bytes.Buffer
	h, err := receipts.SendGridHandler(sg.public, &sk, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if code := serve(h, sg.signedRequest(t, []byte(refusalBatch))); code != http.StatusNoContent {
		t.Fatalf("status %d, want 204", code)
	}
	at := func(sec int64) time.Time { return time.Unix(sec, 0).UTC() }
	want := []receipts.Refusal{
		{Provider: "sendgrid", Channel: receipts.ChannelEmail, Address: "ayse.yilmaz@example.com", CampaignID: 42, UserID: "u-1",
			Kind: receipts.RefusalUnsubscribe, EventID: "ev-unsub", At: at(1700000300), Evidence: "sendgrid unsubscribe sg_event_id=ev-unsub"},
		{Provider: "sendgrid", Channel: receipts.ChannelEmail, Address: "mehmet@example.com", CampaignID: 42, UserID: "u-2",
			Kind: receipts.RefusalGroupUnsubscribe, EventID: "ev-group", At: at(1700000301), Evidence: "sendgrid group_unsubscribe sg_event_id=ev-group asm_group_id=7"},
		{Provider: "sendgrid", Channel: receipts.ChannelEmail, Address: "zeynep@example.com",
			Kind: receipts.RefusalSpamReport, EventID: "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-3:spamreport:1700000302", At: at(1700000302),
			Evidence: "sendgrid spamreport sg_message_id=LRzXl_NHStOGhQ4kofSm_A.filterdrecv-3 timestamp=1700000302"},
	}
	if diff := cmp.Diff(want, sk.allRefusals()); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
	if sk.refuseCalls() != 1 {
		t.Errorf("Refuse called %d times, want once per request", sk.refuseCalls())
	}
	// The delivery event is a receipt; so is each refusal that names its message: it came through the
	// message, which reached the person (a recipient recorded unknown becomes sent).
	var got []string
	for _, r := range sk.all() {
		if r.Status != receipts.StatusDelivered {
			t.Errorf("receipt %+v, want delivered", r)
		}
		got = append(got, r.EventID+"/"+r.UserID)
	}
	if diff := cmp.Diff([]string{"ev-unsub/u-1", "ev-group/u-2", "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-3:spamreport:1700000302/", "ev-deliv/u-4"}, got); diff != "" {
		t.Errorf("receipts (-want +got):\n%s", diff)
	}
	wantStats := receipts.Stats{
		Accepted: 1,
		Receipts: 4,
		Refusals: 3,
		Ignored:  map[string]int64{"invalid": 1, "group_resubscribe": 1},
		Rejected: map[string]int64{},
	}
	if diff := cmp.Diff(wantStats, h.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	for _, addr := range []string{"ayse.yilmaz@example.com", "mehmet@example.com", "zeynep@example.com", "can@example.com"} {
		if strings.Contains(strings.ToLower(logs.String()), addr) {
			t.Errorf("log contains %s:\n%s", addr, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "refusal recorded") || !strings.Contains(logs.String(), "a***@example.com") {
		t.Errorf("the refusals are not logged with the masked address:\n%s", logs.String())
	}
}

// An address quoted in a field that reaches the evidence is masked there.
func TestSendGridRefusalEvidenceHidesAddress(t *testing.T) {
	sg := newSigner(t)
	var sk bothSink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`[{"email":"ali@example.com","timestamp":1700000000,"event":"spamreport","sg_event_id":"id-for-ALI@example.com"}]`)
	if code := serve(h, sg.signedRequest(t, body)); code != http.StatusNoContent {
		t.Fatalf("status %d", code)
	}
	got := sk.allRefusals()
	if len(got) != 1 || strings.Contains(strings.ToLower(got[0].Evidence), "ali@example.com") || !strings.Contains(got[0].Evidence, "sendgrid spamreport") {
		t.Errorf("refusals %+v: the evidence must name the event and not the address", got)
	}
}

// SendGrid repeats a batch it saw fail, and sometimes one it did not: the refusals come again with the
// same EventIDs, so that a sink deduping on them records each once.
func TestSendGridRefusalReplay(t *testing.T) {
	sg := newSigner(t)
	var sk bothSink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The second and third events have neither sg_event_id nor sg_message_id, in the same second.
	body := []byte(`[
 {"email":"a@example.com","timestamp":1700000000,"event":"unsubscribe","sg_event_id":"ev-1"},
 {"email":"b@example.com","timestamp":1700000001,"event":"spamreport"},
 {"email":"c@example.com","timestamp":1700000001,"event":"spamreport"}
]`)
	for i := range 2 {
		if code := serve(h, sg.signedRequest(t, body)); code != http.StatusNoContent {
			t.Fatalf("post %d: status %d", i, code)
		}
	}
	got := sk.allRefusals()
	if len(got) != 6 {
		t.Fatalf("got %d refusals, want 3 per post: %+v", len(got), got)
	}
	ids := map[string]string{} // EventID -> address
	for i := range 3 {
		first, again := got[i], got[i+3]
		if first.EventID == "" || first.EventID != again.EventID {
			t.Errorf("%s: EventID %q then %q, want the same", first.Address, first.EventID, again.EventID)
		}
		if other, ok := ids[first.EventID]; ok {
			t.Errorf("%s and %s share EventID %q", other, first.Address, first.EventID)
		}
		ids[first.EventID] = first.Address
		if strings.Contains(first.EventID, "@") {
			t.Errorf("EventID %q holds the address", first.EventID)
		}
	}
	if st := h.Stats(); st.Refusals != 6 || st.Accepted != 2 {
		t.Errorf("stats %+v", st)
	}
}

// A RefusalSink failure answers 500 like a Sink failure, so that SendGrid posts the batch again.
func TestSendGridRefusalSinkError(t *testing.T) {
	sg := newSigner(t)
	sk := &bothSink{refuseErr: errors.New("database down")}
	h, err := receipts.SendGridHandler(sg.public, sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.SetStoreWait(300 * time.Millisecond) // an outage longer than the wait
	if code := serve(h, sg.signedRequest(t, []byte(refusalBatch))); code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", code)
	}
	if st := h.Stats(); st.SinkErrors != 1 || st.Accepted != 0 || st.Refusals != 0 || st.Receipts != 0 || len(st.Ignored) != 0 {
		t.Errorf("stats %+v, want one sink error and nothing counted", st)
	}
	// The repeat, once the sink is back, records them.
	sk.rmu.Lock()
	sk.refuseErr = nil
	sk.rmu.Unlock()
	if code := serve(h, sg.signedRequest(t, []byte(refusalBatch))); code != http.StatusNoContent {
		t.Fatalf("repeat: status %d, want 204", code)
	}
	if n := len(sk.allRefusals()); n != 3 {
		t.Errorf("repeat recorded %d refusals, want 3", n)
	}
}

// A Sink that is not a RefusalSink gets the refusal events that name their message as receipts of its
// delivery; the one that names none is counted as ignored, as before.
func TestSendGridRefusalsWithoutRefusalSink(t *testing.T) {
	sg := newSigner(t)
	var sk sink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code := serve(h, sg.signedRequest(t, []byte(refusalBatch))); code != http.StatusNoContent {
		t.Fatalf("status %d, want 204", code)
	}
	want := map[string]int64{"unsubscribe": 1, "group_resubscribe": 1}
	if diff := cmp.Diff(want, h.Stats().Ignored); diff != "" {
		t.Errorf("ignored (-want +got):\n%s", diff)
	}
	if st := h.Stats(); st.Refusals != 0 || st.Receipts != 4 {
		t.Errorf("stats %+v", st)
	}
}

// A forged refusal changes nothing.
func TestSendGridForgedRefusal(t *testing.T) {
	sg := newSigner(t)
	var sk bothSink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`[{"email":"a@example.com","timestamp":1700000000,"event":"delivered","sg_event_id":"e1","sg_message_id":"m1.x"}]`)
	forged := bytes.Replace(body, []byte(`"delivered"`), []byte(`"spamreport"`), 1)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	other := newSigner(t)
	for name, r := range map[string]*http.Request{
		"unsigned":      eventRequest(forged, "", ts),
		"body swapped":  eventRequest(forged, sg.sign(t, ts, body), ts),
		"other key":     eventRequest(forged, other.sign(t, ts, forged), ts),
		"stale, signed": eventRequest(forged, sg.sign(t, "1700000000", forged), "1700000000"),
	} {
		if code := serve(h, r); code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", name, code)
		}
	}
	if got := sk.allRefusals(); len(got) != 0 {
		t.Errorf("forged requests refused %+v", got)
	}
	if st := h.Stats(); st.Refusals != 0 || st.Accepted != 0 {
		t.Errorf("stats %+v", st)
	}
}

// Twilio's incoming-message webhook.

const (
	inboundSID  = "SM9876543210fedcba9876543210fedcba"
	inboundFrom = "+905321234567"
)

func inboundForm(body string) url.Values {
	return url.Values{
		"MessageSid":    {inboundSID},
		"SmsMessageSid": {inboundSID},
		"SmsSid":        {inboundSID},
		"AccountSid":    {"ACtest00000000000000000000000001"},
		"From":          {inboundFrom},
		"To":            {"+908501234567"},
		"Body":          {body},
		"NumMedia":      {"0"},
		"NumSegments":   {"1"},
		"SmsStatus":     {"received"},
		"FromCountry":   {"TR"},
		"ApiVersion":    {"2010-04-01"},
	}
}

// refusalSink records refusals only.
type refusalSink struct{ bothSink }

const (
	inboundPublic = "https://hooks.example.com"
	inboundPath   = "/twilio/inbound"
)

// inboundServe posts form, signed for the public URL, and returns the recorder.
func inboundServe(h http.Handler, form url.Values) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, twilioRequest("http://10.0.0.5:8080"+inboundPath, form, sign(twilioToken, inboundPublic+inboundPath, form)))
	return w
}

func TestTwilioInboundKeywords(t *testing.T) {
	tests := []struct {
		body    string
		keyword string // "": not a refusal
		word    string // as written, in the evidence
	}{
		{"RET", "RET", "RET"},
		{"ret", "RET", "ret"},
		{"Ret", "RET", "Ret"},
		{"  Ret.  ", "RET", "Ret"},
		{"Ret,teşekkürler", "RET", "Ret"},
		{"IPTAL", "IPTAL", "IPTAL"},
		{"iptal", "IPTAL", "iptal"},
		{"İptal", "IPTAL", "İptal"},
		{"İPTAL lütfen", "IPTAL", "İPTAL"},
		{"ıptal", "IPTAL", "ıptal"},
		{"I\u0307ptal", "IPTAL", "I\u0307ptal"}, // İ decomposed
		{"\"STOP\"", "STOP", "STOP"},
		{"stop!", "STOP", "stop"},
		{"\n\t- RET -", "RET", "RET"},
		{"Retro", "", ""},
		{"Merhaba, RET", "", ""},
		{"Teşekkürler", "", ""},
		{"RE T", "", ""},
		{"...", "", ""},
		{"", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			var sk refusalSink
			h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, &sk, nil)
			w := inboundServe(h, inboundForm(tt.body))
			if w.Code != http.StatusOK || w.Body.String() != `<?xml version="1.0" encoding="UTF-8"?><Response></Response>` ||
				w.Header().Get("Content-Type") != "text/xml" {
				t.Fatalf("answer %d %q %q, want 200 and an empty TwiML document", w.Code, w.Header().Get("Content-Type"), w.Body.String())
			}
			got := sk.allRefusals()
			st := h.Stats()
			if tt.keyword == "" {
				if len(got) != 0 {
					t.Errorf("refused %+v", got)
				}
				if st.Ignored["inbound_other"] != 1 || st.Accepted != 1 || st.Refusals != 0 {
					t.Errorf("stats %+v, want 1 accepted and inbound_other 1", st)
				}
				return
			}
			want := []receipts.Refusal{{
				Provider: "twilio", Channel: receipts.ChannelSMS, Address: inboundFrom, Kind: receipts.RefusalInbound,
				Keyword: tt.keyword, EventID: inboundSID, Evidence: "twilio inbound " + inboundSID + " " + strconv.Quote(tt.word),
			}}
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(receipts.Refusal{}, "At")); diff != "" {
				t.Errorf("refusals (-want +got):\n%s", diff)
			}
			if got[0].At.IsZero() {
				t.Error("At is zero")
			}
			if st.Refusals != 1 || st.Accepted != 1 || len(st.Ignored) != 0 {
				t.Errorf("stats %+v, want 1 refusal", st)
			}
		})
	}
}

// Keywords of one's own replace the defaults, matched with the same Turkish folding.
func TestTwilioInboundCustomKeywords(t *testing.T) {
	var sk refusalSink
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, []string{"İstemiyorum", " dur ", "two words"}, &sk, nil)
	for body, want := range map[string]string{
		"istemiyorum": "ISTEMIYORUM", "ISTEMIYORUM artık": "ISTEMIYORUM", "Dur": "DUR",
		"RET": "", "two words": "", "two": "",
	} {
		form := inboundForm(body)
		form.Set("MessageSid", "SM"+strconv.Itoa(len(body))+strings.Repeat("0", 10))
		sk.rmu.Lock()
		sk.refusals = nil
		sk.rmu.Unlock()
		if w := inboundServe(h, form); w.Code != http.StatusOK {
			t.Fatalf("%q: status %d", body, w.Code)
		}
		got := sk.allRefusals()
		switch {
		case want == "" && len(got) != 0:
			t.Errorf("%q refused %+v", body, got)
		case want != "" && (len(got) != 1 || got[0].Keyword != want):
			t.Errorf("%q: refusals %+v, want keyword %s", body, got, want)
		}
	}
}

// A message that is not a refusal changes nothing, and is logged with the number masked.
func TestTwilioInboundIgnored(t *testing.T) {
	var sk refusalSink
	var logs bytes.Buffer
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, &sk, slog.New(slog.NewTextHandler(&logs, nil)))
	if w := inboundServe(h, inboundForm("Kampanya ne zaman bitiyor?")); w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	if sk.refuseCalls() != 0 {
		t.Errorf("Refuse called for a message that is not a refusal")
	}
	if !strings.Contains(logs.String(), "level=INFO") || !strings.Contains(logs.String(), "not a refusal") ||
		!strings.Contains(logs.String(), "+905*****4567") {
		t.Errorf("info log with the masked number missing:\n%s", logs.String())
	}
	for _, secret := range []string{inboundFrom, "Kampanya", twilioToken} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("log contains %q:\n%s", secret, logs.String())
		}
	}
}

// Twilio retries a message it saw fail: the refusal comes again with the same EventID.
func TestTwilioInboundReplay(t *testing.T) {
	var sk refusalSink
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, &sk, nil)
	for range 2 {
		if w := inboundServe(h, inboundForm("İPTAL")); w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
	}
	got := sk.allRefusals()
	if len(got) != 2 || got[0].EventID != inboundSID || got[1].EventID != got[0].EventID {
		t.Errorf("refusals %+v, want two with EventID %s", got, inboundSID)
	}
}

func TestTwilioInboundForged(t *testing.T) {
	var sk refusalSink
	var logs bytes.Buffer
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, &sk, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	harmless := inboundForm("Merhaba")
	good := sign(twilioToken, inboundPublic+inboundPath, harmless)
	other := inboundForm("RET")
	other.Set("From", "+905559999999")
	tests := []struct {
		name, path, sig string
		form            url.Values
	}{
		{"unsigned", inboundPath, "", inboundForm("RET")},
		{"garbage signature", inboundPath, "bm90IGEgc2lnbmF0dXJl", inboundForm("RET")},
		{"other token", inboundPath, sign("otherToken123", inboundPublic+inboundPath, inboundForm("RET")), inboundForm("RET")},
		{"body swapped", inboundPath, good, inboundForm("RET")},
		{"sender swapped", inboundPath, sign(twilioToken, inboundPublic+inboundPath, inboundForm("RET")), other},
		{"signed for the internal URL", inboundPath, sign(twilioToken, "http://10.0.0.5:8080"+inboundPath, inboundForm("RET")), inboundForm("RET")},
		{"signed for another route", inboundPath, sign(twilioToken, inboundPublic+"/twilio/status", inboundForm("RET")), inboundForm("RET")},
	}
	for _, tt := range tests {
		if code := serve(h, twilioRequest("http://10.0.0.5:8080"+tt.path, tt.form, tt.sig)); code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tt.name, code)
		}
	}
	if sk.refuseCalls() != 0 {
		t.Errorf("forged requests refused %+v", sk.allRefusals())
	}
	want := receipts.Stats{
		Ignored:  map[string]int64{},
		Rejected: map[string]int64{receipts.ReasonUnsigned: 1, receipts.ReasonBadSignature: 6},
	}
	if diff := cmp.Diff(want, h.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	for _, secret := range []string{twilioToken, good, inboundFrom, "+905559999999"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("log contains %q:\n%s", secret, logs.String())
		}
	}
	// An empty token refuses everything, even what it signs.
	empty := receipts.TwilioInboundHandler("", inboundPublic, nil, &sk, nil)
	form := inboundForm("RET")
	if code := serve(empty, twilioRequest(inboundPath, form, sign("", inboundPublic+inboundPath, form))); code != http.StatusForbidden {
		t.Errorf("empty token: status %d, want 403", code)
	}
	if sk.refuseCalls() != 0 {
		t.Errorf("refused with an empty token")
	}
}

func TestTwilioInboundMalformed(t *testing.T) {
	var sk refusalSink
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, &sk, nil)
	noFrom := inboundForm("RET")
	noFrom.Del("From")
	noSID := inboundForm("RET")
	for _, k := range []string{"MessageSid", "SmsMessageSid", "SmsSid"} {
		noSID.Del(k)
	}
	for name, form := range map[string]url.Values{"no From": noFrom, "no MessageSid": noSID} {
		if w := inboundServe(h, form); w.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", name, w.Code)
		}
	}
	big := inboundForm("RET " + strings.Repeat("ş", receipts.MaxTwilioBody))
	if w := inboundServe(h, big); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("large form: status %d, want 413", w.Code)
	}
	if r := httptest.NewRequest(http.MethodGet, inboundPath, nil); serve(h, r) != http.StatusMethodNotAllowed {
		t.Errorf("GET not refused with 405")
	}
	if sk.refuseCalls() != 0 || h.Stats().Rejected[receipts.ReasonMalformed] != 4 {
		t.Errorf("stats %+v, refusals %+v", h.Stats(), sk.allRefusals())
	}
}

// A RefusalSink failure answers 500, so that Twilio posts the message again.
func TestTwilioInboundSinkError(t *testing.T) {
	sk := &refusalSink{}
	sk.refuseErr = errors.New("database down")
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil)
	h.SetStoreWait(300 * time.Millisecond) // an outage longer than the wait
	if w := inboundServe(h, inboundForm("RET")); w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", w.Code)
	}
	if st := h.Stats(); st.SinkErrors != 1 || st.Accepted != 0 || st.Refusals != 0 {
		t.Errorf("stats %+v, want one sink error and nothing accepted", st)
	}
	// A message that is not a refusal does not reach the sink, so it succeeds.
	if w := inboundServe(h, inboundForm("Merhaba")); w.Code != http.StatusOK {
		t.Errorf("non-refusal: status %d, want 200", w.Code)
	}
}

// An "RET" that comes while Postgres restarts is held, tried again, and recorded once Postgres is back,
// within the handler's wait: Twilio does not post an incoming message again after a 500 (not unless its
// URL asks for retries), so answering 500 at once lost the refusal, and the person who said no got the
// next campaign.
func TestTwilioInboundRefusalOutlivesAShortSinkOutage(t *testing.T) {
	sk := &bothSink{refuseErr: errors.New("database down")}
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil) // the default wait
	sk.backAfter(700 * time.Millisecond)
	start := time.Now()
	w := inboundServe(h, inboundForm("RET"))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d after %v, want 200 once the sink is back", w.Code, time.Since(start))
	}
	if got := sk.allRefusals(); len(got) != 1 || got[0].Address != inboundFrom {
		t.Fatalf("refusals recorded %+v, want the one of %s", got, inboundFrom)
	}
	if st := h.Stats(); st.SinkErrors != 0 || st.Refusals != 1 {
		t.Errorf("stats %+v, want the refusal counted and no sink error", st)
	}
}

func TestTwilioInboundNilSink(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a nil RefusalSink did not panic")
		}
	}()
	receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, nil, nil)
}

// A post whose receipts cannot be written (Postgres refused one of them, or is down) has its refusals
// recorded all the same before it is answered 500: the provider posts it again, and a refusal that waited
// for the receipts would wait as long as they fail, while messages went on to the person who said no.
func TestRefusalsAreRecordedWhenTheReceiptsCannotBe(t *testing.T) {
	sg := newSigner(t)
	sk := bothSink{sink: sink{err: errors.New("record delivery receipts: invalid byte sequence")}}
	h, err := receipts.SendGridHandler(sg.public, &sk, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h.SetStoreWait(300 * time.Millisecond)
	if code := serve(h, sg.signedRequest(t, []byte(refusalBatch))); code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500 (the receipts were not written, the provider must post again)", code)
	}
	got := sk.allRefusals()
	if len(got) != 3 {
		t.Fatalf("refusals recorded: %d (%+v), want the 3 of the post", len(got), got)
	}
}

// An event time further ahead than a clock's error (milliseconds given for seconds, a bug upstream) is
// replaced by the arrival time: Postgres refuses a time beyond its range, the post's other events with it,
// and a refusal dated years ahead would outrank every consent the person gives until then.
func TestAnEventTimeFarAheadIsTheArrivalTime(t *testing.T) {
	sg := newSigner(t)
	var sk bothSink
	h, err := receipts.SendGridHandler(sg.public, &sk, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	soon := now.Add(time.Minute).Unix()
	body := fmt.Sprintf(`[
 {"email":"a@example.com","timestamp":%d,"event":"unsubscribe","sg_event_id":"ev-ms"},
 {"email":"b@example.com","timestamp":99999999999999,"event":"spamreport","sg_event_id":"ev-far"},
 {"email":"c@example.com","timestamp":%d,"event":"unsubscribe","sg_event_id":"ev-soon"},
 {"email":"d@example.com","timestamp":%d,"event":"delivered","sg_event_id":"ev-deliv","sg_message_id":"m1.filter","campaign_id":"1","user_id":"u1"}
]`, now.UnixMilli(), soon, now.UnixMilli())
	if code := serve(h, sg.signedRequest(t, []byte(body))); code != http.StatusNoContent {
		t.Fatalf("status %d, want 204", code)
	}
	after := time.Now().Add(time.Second)
	rs := sk.allRefusals()
	if len(rs) != 3 {
		t.Fatalf("refusals: %+v, want 3", rs)
	}
	for _, r := range rs {
		want := r.EventID == "ev-soon"
		if kept := r.At.Unix() == soon; kept != want {
			t.Errorf("refusal %s dated %s: kept its own time %v, want %v", r.EventID, r.At, kept, want)
		}
		if r.At.After(after.Add(time.Minute)) {
			t.Errorf("refusal %s dated %s, ahead of its arrival", r.EventID, r.At)
		}
	}
	rc := sk.all()
	if len(rc) != 1 || rc[0].At.After(after) || rc[0].At.Before(now.Add(-time.Second)) {
		t.Errorf("receipt dated far ahead: %+v, want its arrival time", rc)
	}
}

// An RET whose poster hangs up while the sink is briefly down (its own timeout passed during a Postgres
// restart) is recorded all the same once the sink is back: the writes outlive the request. Before, the
// cancelled request's context ended them, and the refusal was dropped (an outside run lost 9 of 2,000).
func TestARefusalIsRecordedWhenItsPosterHangsUpDuringASinkOutage(t *testing.T) {
	sk := &bothSink{refuseErr: errors.New("database down")}
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil) // the default wait
	sk.backAfter(700 * time.Millisecond)
	form := inboundForm("RET")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel) // the poster gives up
	r := twilioRequest("http://10.0.0.5:8080"+inboundPath, form, sign(twilioToken, inboundPublic+inboundPath, form)).WithContext(ctx)
	serve(h, r)
	if got := sk.allRefusals(); len(got) != 1 || got[0].Address != inboundFrom {
		t.Fatalf("refusals recorded %+v, want the one of %s though its poster hung up", got, inboundFrom)
	}
}
