package sandbox_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sendgrid/sendgrid-go/helpers/eventwebhook"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// sgEventPost is one Event Webhook post as the receiver got it.
type sgEventPost struct {
	body      []byte
	timestamp string
	signature string
}

// sgReceiver starts an Event Webhook receiver that hands each post to the returned channel and answers
// with the statuses given, in turn (then 200).
func sgReceiver(t *testing.T, statuses ...int) (*httptest.Server, <-chan sgEventPost) {
	t.Helper()
	posts := make(chan sgEventPost, 100)
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		status := http.StatusOK
		if len(statuses) > 0 {
			status, statuses = statuses[0], statuses[1:]
		}
		mu.Unlock()
		if status == http.StatusOK {
			posts <- sgEventPost{body: b, timestamp: r.Header.Get(eventwebhook.TimestampHTTPHeader), signature: r.Header.Get(eventwebhook.VerificationHTTPHeader)}
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv, posts
}

func sgNextPost(t *testing.T, posts <-chan sgEventPost) sgEventPost {
	t.Helper()
	select {
	case p := <-posts:
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no event post within 5s")
	}
	return sgEventPost{}
}

// sgVerify checks a post's signature the way SendGrid's receivers do, with sendgrid-go's helper: ECDSA
// P-256 over SHA-256(timestamp + body), against the published base64 PKIX key.
func sgVerify(t *testing.T, publicKey string, p sgEventPost) bool {
	t.Helper()
	pub, err := eventwebhook.ConvertPublicKeyBase64ToECDSA(publicKey)
	if err != nil {
		t.Fatalf("public key: %v", err)
	}
	ok, err := eventwebhook.VerifySignature(pub, p.body, p.signature, p.timestamp)
	return ok && err == nil
}

func TestSendGridEventWebhook(t *testing.T) {
	recv, posts := sgReceiver(t)
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: recv.URL + "/events", ReceiptDelay: 20 * time.Millisecond})

	// The public key is published like SendGrid's, behind the API key.
	var key struct {
		PublicKey string `json:"public_key"`
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v3/user/webhooks/event/settings/signed", nil)
	req.Header.Set("Authorization", "Bearer "+sgTestKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(resp.Body).Decode(&key); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("public key: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if key.PublicKey == "" || key.PublicKey != s.SendGridEventPublicKey() {
		t.Fatalf("published key %q differs from SendGridEventPublicKey %q", key.PublicKey, s.SendGridEventPublicKey())
	}
	if resp, err := http.Get(srv.URL + "/v3/user/webhooks/event/settings/signed"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("public key without the API key: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}

	recipients := []string{"ok@example.com", "bounce+1@example.com", "drop+1@example.org", "Defer+1@example.net"}
	var ps []sgObj
	for i, to := range recipients {
		ps = append(ps, sgPersonalization(to, nil, map[string]string{"user_id": fmt.Sprintf("u%d", i)}))
	}
	m := sgMail(ps...)
	m["custom_args"] = sgObj{"campaign_id": "42"}
	m["categories"] = []string{"promo"}
	sent := time.Now()
	a := sgPost(t, srv, sgTestKey, m)
	if a.status != http.StatusAccepted {
		t.Fatalf("send: %d %s", a.status, a.raw)
	}
	id := a.header.Get("X-Message-Id")

	p := sgNextPost(t, posts)
	if since := time.Since(sent); since < 20*time.Millisecond {
		t.Errorf("events came %v after the send, before ReceiptDelay", since)
	}
	if !sgVerify(t, key.PublicKey, p) {
		t.Errorf("signature does not verify")
	}
	tampered := p
	tampered.body = bytes.Replace(p.body, []byte(`"delivered"`), []byte(`"bounce"`), 1)
	if sgVerify(t, key.PublicKey, tampered) {
		t.Errorf("a tampered body verifies")
	}
	if ts, err := strconv.ParseInt(p.timestamp, 10, 64); err != nil || ts < sent.Unix() || ts > time.Now().Unix() {
		t.Errorf("timestamp header %q", p.timestamp)
	}

	var events []map[string]any
	if err := json.Unmarshal(p.body, &events); err != nil {
		t.Fatalf("decode events: %v", err)
	}
	// All eight events of one request come in one post, processed before the outcome.
	if len(events) != 8 {
		t.Fatalf("got %d events in the post, want 8: %s", len(events), p.body)
	}
	sids := make(map[string]string) // email -> SID of the recorded message
	for _, msg := range s.Messages() {
		sids[msg.To] = msg.SID
	}
	eventIDs := make(map[string]bool)
	want := map[string][]string{
		"ok@example.com": {"processed", "delivered"}, "bounce+1@example.com": {"processed", "bounce"},
		"drop+1@example.org": {"processed", "dropped"}, "Defer+1@example.net": {"processed", "deferred"},
	}
	got := make(map[string][]string)
	for _, ev := range events {
		email, _ := ev["email"].(string)
		got[email] = append(got[email], ev["event"].(string))
		i := slices.Index(recipients, email)
		sgID, _ := ev["sg_message_id"].(string)
		if sgID != sids[email] || !strings.HasPrefix(sgID, id+".") {
			t.Errorf("%s: sg_message_id %q, recorded SID %q, X-Message-Id %q", email, sgID, sids[email], id)
		}
		if ev["campaign_id"] != "42" || ev["user_id"] != fmt.Sprintf("u%d", i) {
			t.Errorf("%s: custom args campaign_id %v user_id %v", email, ev["campaign_id"], ev["user_id"])
		}
		if ts, _ := ev["timestamp"].(float64); int64(ts) < sent.Unix()-1 || int64(ts) > time.Now().Unix() {
			t.Errorf("%s: timestamp %v", email, ev["timestamp"])
		}
		if smtp, _ := ev["smtp-id"].(string); !strings.HasPrefix(smtp, "<") {
			t.Errorf("%s: smtp-id %v", email, ev["smtp-id"])
		}
		if cat, _ := ev["category"].([]any); len(cat) != 1 || cat[0] != "promo" {
			t.Errorf("%s: category %v", email, ev["category"])
		}
		eid, _ := ev["sg_event_id"].(string)
		if eid == "" || eventIDs[eid] {
			t.Errorf("sg_event_id %q empty or repeated", eid)
		}
		eventIDs[eid] = true
		switch ev["event"] {
		case "bounce":
			if ev["reason"] == nil || ev["status"] == nil || ev["type"] != "bounce" {
				t.Errorf("bounce event %v", ev)
			}
		case "dropped":
			if ev["reason"] == nil {
				t.Errorf("dropped event %v", ev)
			}
		case "deferred":
			if ev["attempt"] == nil || ev["response"] == nil {
				t.Errorf("deferred event %v", ev)
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events per recipient (-want +got):\n%s", diff)
	}

	sgWaitEventStats(t, s, func(st sandbox.SendGridEventStats) bool { return st.Posted == 1 })
	var st sandbox.SendGridEventStats
	getJSON(t, srv.URL+"/_sandbox/sendgrid/events/stats", &st)
	if diff := cmp.Diff(sandbox.SendGridEventStats{Posted: 1, Events: 8}, st); diff != "" {
		t.Errorf("event stats (-want +got):\n%s", diff)
	}
}

// sgWaitEventStats waits until the emitter's counters satisfy ok: the receiver sees a post before the
// emitter has read the answer and counted it.
func sgWaitEventStats(t *testing.T, s *sandbox.Server, ok func(sandbox.SendGridEventStats) bool) sandbox.SendGridEventStats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.SendGridEventStats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("event stats still %+v after 5s", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A receiver that fails gets the same events again, freshly signed, ReceiptDelay later.
func TestSendGridEventRetry(t *testing.T) {
	recv, posts := sgReceiver(t, http.StatusInternalServerError)
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: recv.URL, ReceiptDelay: 10 * time.Millisecond})
	if a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("a@example.com", nil, nil))); a.status != http.StatusAccepted {
		t.Fatalf("send: %d", a.status)
	}
	p := sgNextPost(t, posts)
	if !sgVerify(t, s.SendGridEventPublicKey(), p) {
		t.Errorf("the retried post does not verify")
	}
	st := sgWaitEventStats(t, s, func(st sandbox.SendGridEventStats) bool { return st.Posted == 1 })
	if st.Failed != 1 || st.Events != 2 || st.Dropped != 0 {
		t.Errorf("stats %+v, want one failure then two events", st)
	}
}

// SendGrid posts a batch its receiver refused again, later each time, for 24 hours: five refusals in a row
// (a webhooks process restarting, Postgres away without a spool) lose nothing. Before, the sandbox gave
// up after three attempts in a few hundred milliseconds, and its tests could not tell a receiver that
// loses receipts from a sandbox that dropped them. A batch being retried does not hold up newer ones.
func TestSendGridEventsAreRetriedLaterEachTimeWithoutHoldingUpNewerOnes(t *testing.T) {
	var mu sync.Mutex
	var refusedA int
	var order []string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(string(b), "a@example.com") && refusedA < 5 {
			refusedA++
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		switch {
		case strings.Contains(string(b), "a@example.com"):
			order = append(order, "a")
		case strings.Contains(string(b), "b@example.com"):
			order = append(order, "b")
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(recv.Close)
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: recv.URL, ReceiptDelay: 10 * time.Millisecond})
	if a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("a@example.com", nil, nil))); a.status != http.StatusAccepted {
		t.Fatalf("send: %d", a.status)
	}
	// b's message goes while a's events are being retried.
	sgWaitEventStats(t, s, func(st sandbox.SendGridEventStats) bool { return st.Failed >= 2 })
	if a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("b@example.com", nil, nil))); a.status != http.StatusAccepted {
		t.Fatalf("send: %d", a.status)
	}
	// Waits of 100, 200, 400, 800 and 1600 ms: about 3.1 s in all.
	start := time.Now()
	deadline := start.Add(8 * time.Second)
	var st sandbox.SendGridEventStats
	for st = s.SendGridEventStats(); st.Posted < 2 && time.Now().Before(deadline); st = s.SendGridEventStats() {
		time.Sleep(20 * time.Millisecond)
	}
	if st.Posted != 2 || st.Events != 4 || st.Failed != 5 || st.Dropped != 0 || st.Queued != 0 {
		t.Errorf("stats %+v, want both messages' events posted after a's 5 refusals, none dropped", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != "b" {
		t.Errorf("posts taken in the order %v, want b's before a's (a's retries must not hold up newer events)", order)
	}
}

// A receiver that never answers must not hold up sends.
func TestSendGridEventsNeverBlockSends(t *testing.T) {
	release := make(chan struct{})
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer recv.Close()
	defer close(release)
	s, srv := newSendGridSandbox(t, sandbox.Options{SendGridEventURL: recv.URL, ReceiptDelay: time.Millisecond})
	start := time.Now()
	for i := range 20 {
		if a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization(fmt.Sprintf("u%d@example.com", i), nil, nil))); a.status != http.StatusAccepted {
			t.Fatalf("send %d: %d", i, a.status)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("20 sends took %v while the receiver hung", d)
	}
	if st := s.SendGridEventStats(); st.Posted != 0 || st.Dropped != 0 {
		t.Errorf("stats %+v, want nothing posted or dropped yet", st)
	}
}

func TestSendGridEventURLMustBeLoopback(t *testing.T) {
	for _, u := range []string{"http://192.0.2.1/events", "http://example.com/events", "ftp://127.0.0.1/x", "http://[::1"} {
		s := sandbox.New(sandbox.Options{SendGridEventURL: u})
		if st := s.SendGridEventStats(); st.Disabled == "" {
			t.Errorf("%s: events not disabled: %+v", u, st)
		}
	}
	for _, u := range []string{"http://127.0.0.1:9/x", "http://localhost:9/x", "http://[::1]:9/x"} {
		s := sandbox.New(sandbox.Options{SendGridEventURL: u})
		if st := s.SendGridEventStats(); st.Disabled != "" {
			t.Errorf("%s refused: %s", u, st.Disabled)
		}
	}
}
