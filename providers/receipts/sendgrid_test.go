package receipts_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/receipts"
)

const (
	sigHeader = "X-Twilio-Email-Event-Webhook-Signature"
	tsHeader  = "X-Twilio-Email-Event-Webhook-Timestamp"
)

// signer is SendGrid's side of the signed Event Webhook: a P-256 key that signs SHA-256(timestamp + body).
type signer struct {
	key    *ecdsa.PrivateKey
	public string // base64 PKIX DER, as SendGrid shows it
}

func newSigner(t *testing.T) signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return signer{key: key, public: base64.StdEncoding.EncodeToString(der)}
}

func (s signer) sign(t *testing.T, ts string, body []byte) string {
	t.Helper()
	h := sha256.Sum256(append([]byte(ts), body...))
	sig, err := ecdsa.SignASN1(rand.Reader, s.key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

// request is an Event Webhook POST of body with the given headers ("" leaves a header out).
func eventRequest(body []byte, sig, ts string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/sendgrid/events", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if sig != "" {
		r.Header.Set(sigHeader, sig)
	}
	if ts != "" {
		r.Header.Set(tsHeader, ts)
	}
	return r
}

// signedRequest is body signed now.
func (s signer) signedRequest(t *testing.T, body []byte) *http.Request {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	return eventRequest(body, s.sign(t, ts, body), ts)
}

const eventBatch = `[
 {"email":"ayse.yilmaz@example.com","timestamp":1700000000,"event":"processed","sg_event_id":"ev-proc","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-1","smtp-id":"<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>","campaign_id":"42","user_id":"u-1","category":["promo"]},
 {"email":"ayse.yilmaz@example.com","timestamp":1700000005,"event":"delivered","sg_event_id":"ev-deliv","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-1","response":"250 OK","campaign_id":"42","user_id":"u-1","campaign_nonce":"mab3c1"},
 {"email":"mehmet@example.com","timestamp":1700000006,"event":"deferred","sg_event_id":"ev-defer","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-2","response":"451 4.7.1 Try again later","attempt":"1","campaign_id":42,"user_id":"u-2"},
 {"email":"Zeynep@Example.com","timestamp":1700000007,"event":"bounce","type":"bounce","sg_event_id":"ev-bounce","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-3","reason":"550 5.1.1 <zeynep@example.com>: Recipient address rejected","status":"5.1.1","bounce_classification":"Invalid Address","campaign_id":"42","user_id":"u-3"},
 {"email":"ali@example.com","timestamp":1700000008,"event":"bounce","type":"blocked","sg_event_id":"ev-block","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-4","reason":"554 listed on a blocklist","campaign_id":"42","user_id":"u-4"},
 {"email":"can@example.com","timestamp":1700000009,"event":"dropped","sg_event_id":"ev-drop","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-5","reason":"Bounced Address","campaign_id":"42","user_id":"u-5"},
 {"email":"ayse.yilmaz@example.com","timestamp":1700000100,"event":"open","sg_event_id":"ev-open","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-1","useragent":"Mozilla","ip":"192.0.2.1","campaign_id":"42","user_id":"u-1"},
 {"email":"ayse.yilmaz@example.com","timestamp":1700000200,"event":"click","url":"https://example.com/x","sg_event_id":"ev-click","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-1","campaign_id":"42","user_id":"u-1"},
 {"email":"ayse.yilmaz@example.com","timestamp":1700000300,"event":"spamreport","sg_event_id":"ev-spam","sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-1"},
 {"email":"x@example.com","timestamp":1700000400,"event":"bounce","reason":"async bounce, no ids"},
 {"event":42},
 {"email":"other@example.com","timestamp":1700000500,"event":"delivered","sg_event_id":"ev-other","sg_message_id":"OtherSystem123.filter"}
]`

func TestSendGridEvents(t *testing.T) {
	sg := newSigner(t)
	var sk sink
	var logs bytes.Buffer
	h, err := receipts.SendGridHandler(sg.public, &sk, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if code := serve(h, sg.signedRequest(t, []byte(eventBatch))); code != http.StatusNoContent {
		t.Fatalf("status %d, want 204", code)
	}
	at := func(sec int64) time.Time { return time.Unix(sec, 0).UTC() }
	const mid = "LRzXl_NHStOGhQ4kofSm_A"
	want := []receipts.Receipt{
		{Provider: "sendgrid", MessageID: mid, CampaignID: 42, UserID: "u-1", Address: "ayse.yilmaz@example.com", Status: receipts.StatusProcessed, EventID: "ev-proc", At: at(1700000000)},
		{Provider: "sendgrid", MessageID: mid, CampaignID: 42, UserID: "u-1", CampaignNonce: "mab3c1", Address: "ayse.yilmaz@example.com", Status: receipts.StatusDelivered, EventID: "ev-deliv", At: at(1700000005)},
		{Provider: "sendgrid", MessageID: mid, CampaignID: 42, UserID: "u-2", Address: "mehmet@example.com", Status: receipts.StatusDeferred, Error: "451 4.7.1 Try again later", EventID: "ev-defer", At: at(1700000006)},
		{Provider: "sendgrid", MessageID: mid, CampaignID: 42, UserID: "u-3", Address: "zeynep@example.com", Status: receipts.StatusBounced, Error: "550 5.1.1 <Z***@Example.com>: Recipient address rejected", EventID: "ev-bounce", At: at(1700000007)},
		{Provider: "sendgrid", MessageID: mid, CampaignID: 42, UserID: "u-4", Address: "ali@example.com", Status: receipts.StatusBounced, Error: "blocked: 554 listed on a blocklist", EventID: "ev-block", At: at(1700000008)},
		{Provider: "sendgrid", MessageID: mid, CampaignID: 42, UserID: "u-5", Address: "can@example.com", Status: receipts.StatusDropped, Error: "Bounced Address", EventID: "ev-drop", At: at(1700000009)},
		// A spam report (as an unsubscribe) comes through the message: it reached the person, a receipt of
		// its delivery. Opens and clicks are not taken for one: they are counted only.
		{Provider: "sendgrid", MessageID: mid, Address: "ayse.yilmaz@example.com", Status: receipts.StatusDelivered, EventID: "ev-spam", At: at(1700000300)},
		{Provider: "sendgrid", MessageID: "OtherSystem123", Address: "other@example.com", Status: receipts.StatusDelivered, EventID: "ev-other", At: at(1700000500)},
	}
	if diff := cmp.Diff(want, sk.all()); diff != "" {
		t.Errorf("receipts (-want +got):\n%s", diff)
	}
	if len(sk.calls) != 1 {
		t.Errorf("sink called %d times, want once per request", len(sk.calls))
	}
	wantStats := receipts.Stats{
		Accepted: 1,
		Receipts: 8,
		Ignored:  map[string]int64{"open": 1, "click": 1, "invalid": 2},
		Rejected: map[string]int64{},
	}
	if diff := cmp.Diff(wantStats, h.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if strings.Contains(strings.ToLower(logs.String()), "@example.com") {
		t.Errorf("log contains an address:\n%s", logs.String())
	}
}

func TestSendGridRefused(t *testing.T) {
	sg := newSigner(t)
	var sk sink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`[{"email":"a@example.com","timestamp":1700000000,"event":"delivered","sg_event_id":"e1","sg_message_id":"m1.x","campaign_id":"1","user_id":"u"}]`)
	now := time.Now().Unix()
	ts := strconv.FormatInt(now, 10)
	sig := sg.sign(t, ts, body)
	tampered := bytes.Replace(body, []byte(`"delivered"`), []byte(`"bounce"   `), 1)
	stale := strconv.FormatInt(now-6*60, 10)
	future := strconv.FormatInt(now+6*60, 10)
	other := newSigner(t)

	tests := []struct {
		name   string
		req    *http.Request
		status int
		reason string
	}{
		{"no signature", eventRequest(body, "", ts), http.StatusForbidden, receipts.ReasonUnsigned},
		{"no timestamp", eventRequest(body, sig, ""), http.StatusForbidden, receipts.ReasonUnsigned},
		{"tampered body", eventRequest(tampered, sig, ts), http.StatusForbidden, receipts.ReasonBadSignature},
		{"body with a trailing newline", eventRequest(append(append([]byte{}, body...), '\n'), sig, ts), http.StatusForbidden, receipts.ReasonBadSignature},
		{"other timestamp than signed", eventRequest(body, sig, strconv.FormatInt(now-1, 10)), http.StatusForbidden, receipts.ReasonBadSignature},
		{"other key", eventRequest(body, other.sign(t, ts, body), ts), http.StatusForbidden, receipts.ReasonBadSignature},
		{"signature not base64", eventRequest(body, "%%%", ts), http.StatusForbidden, receipts.ReasonBadSignature},
		{"stale, signed", eventRequest(body, sg.sign(t, stale, body), stale), http.StatusForbidden, receipts.ReasonStale},
		{"future, signed", eventRequest(body, sg.sign(t, future, body), future), http.StatusForbidden, receipts.ReasonStale},
		{"timestamp not a number, signed", eventRequest(body, sg.sign(t, "yesterday", body), "yesterday"), http.StatusForbidden, receipts.ReasonStale},
		{"not a JSON array, signed", sg.signedRequest(t, []byte(`{"event":"delivered"}`)), http.StatusBadRequest, receipts.ReasonMalformed},
		{"not JSON, signed", sg.signedRequest(t, []byte(`delivered`)), http.StatusBadRequest, receipts.ReasonMalformed},
		{"too large", sg.signedRequest(t, bytes.Repeat([]byte(" "), receipts.MaxSendGridBody+1)), http.StatusRequestEntityTooLarge, receipts.ReasonMalformed},
	}
	wantRejected := map[string]int64{}
	for _, tt := range tests {
		if code := serve(h, tt.req); code != tt.status {
			t.Errorf("%s: status %d, want %d", tt.name, code, tt.status)
		}
		wantRejected[tt.reason]++
	}
	if got := sk.all(); len(got) != 0 {
		t.Errorf("refused requests recorded %+v", got)
	}
	if diff := cmp.Diff(wantRejected, h.Stats().Rejected); diff != "" {
		t.Errorf("rejected (-want +got):\n%s", diff)
	}

	// Inside the window, signed: accepted.
	within := strconv.FormatInt(now-4*60, 10)
	if code := serve(h, eventRequest(body, sg.sign(t, within, body), within)); code != http.StatusNoContent {
		t.Errorf("4 minutes old: status %d, want 204", code)
	}
	if got := sk.all(); len(got) != 1 || got[0].MessageID != "m1" || got[0].CampaignID != 1 {
		t.Errorf("recorded %+v", got)
	}
}

func TestSendGridSinkError(t *testing.T) {
	sg := newSigner(t)
	h, err := receipts.SendGridHandler(sg.public, &sink{err: errors.New("database down")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.SetStoreWait(300 * time.Millisecond) // an outage longer than the wait
	if code := serve(h, sg.signedRequest(t, []byte(eventBatch))); code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", code)
	}
	// Only engagement events: nothing to record, so the sink is not called and the request succeeds.
	only := []byte(`[{"email":"a@example.com","timestamp":1700000000,"event":"open","sg_event_id":"e","sg_message_id":"m.x"}]`)
	if code := serve(h, sg.signedRequest(t, only)); code != http.StatusNoContent {
		t.Errorf("engagement only: status %d, want 204", code)
	}
	if st := h.Stats(); st.SinkErrors != 1 || st.Accepted != 1 || st.Ignored["open"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestSendGridBadKey(t *testing.T) {
	edKey, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(edKey)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der384, err := x509.MarshalPKIXPublicKey(&p384.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]string{
		"empty":      "",
		"not base64": "not base64!",
		"not PKIX":   base64.StdEncoding.EncodeToString([]byte("hello")),
		"ed25519":    base64.StdEncoding.EncodeToString(der),
		"P-384":      base64.StdEncoding.EncodeToString(der384),
	} {
		if _, err := receipts.SendGridHandler(key, &sink{}, nil); err == nil {
			t.Errorf("%s key accepted", name)
		}
	}
}
