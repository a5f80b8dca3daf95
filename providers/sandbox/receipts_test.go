package sandbox_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twilio/twilio-go/client"
	openapi "github.com/twilio/twilio-go/rest/api/v2010"

	"github.com/campaignctl/campaignctl/providers/receipts"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// receiptDelay keeps the callback tests fast.
const receiptDelay = 5 * time.Millisecond

// receiver is an HTTP server running receipts.TwilioHandler; every receipt recorded arrives on got.
type receiver struct {
	url     string
	handler *receipts.Handler
	got     chan receipts.Receipt
}

func newReceiver(t *testing.T, token string) *receiver {
	t.Helper()
	hs := httptest.NewUnstartedServer(nil)
	rv := &receiver{url: "http://" + hs.Listener.Addr().String(), got: make(chan receipts.Receipt, 64)}
	rv.handler = receipts.TwilioHandler(token, rv.url, receipts.SinkFunc(func(_ context.Context, rs []receipts.Receipt) error {
		for _, r := range rs {
			rv.got <- r
		}
		return nil
	}), nil)
	hs.Config.Handler = rv.handler
	hs.Start()
	t.Cleanup(hs.Close)
	return rv
}

// next returns the next n receipts, failing the test if they do not come within 5 s.
func (rv *receiver) next(t *testing.T, n int) []receipts.Receipt {
	t.Helper()
	timeout := time.After(5 * time.Second)
	var out []receipts.Receipt
	for len(out) < n {
		select {
		case r := <-rv.got:
			out = append(out, r)
		case <-timeout:
			t.Fatalf("got %d receipts in 5s, want %d: %+v", len(out), n, out)
		}
	}
	return out
}

// rewrite points twilio-go, which always calls https://api.twilio.com, at the sandbox.
type rewrite struct {
	target *url.URL
	next   http.RoundTripper
}

func (rw rewrite) RoundTrip(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.Host = rw.target.Scheme, rw.target.Host, ""
	return rw.next.RoundTrip(out)
}

// newRestClient is twilio-go's Messages API pointed at the sandbox. (The root twilio package would pull
// in a JWT module go.sum does not have; the API service is all a send needs.)
func newRestClient(t *testing.T, sandboxURL, sid, token string) *openapi.ApiService {
	t.Helper()
	target, err := url.Parse(sandboxURL)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &client.Client{
		Credentials: client.NewCredentials(sid, token),
		HTTPClient:  &http.Client{Timeout: 5 * time.Second, Transport: rewrite{target: target, next: tr}},
	}
	c.SetAccountSid(sid)
	return openapi.NewApiService(&client.RequestHandler{Client: c})
}

// sendWithCallback sends one SMS through twilio-go with a StatusCallback and returns its SID.
func sendWithCallback(t *testing.T, api *openapi.ApiService, to, callback string) string {
	t.Helper()
	p := &openapi.CreateMessageParams{}
	p.SetTo(to)
	p.SetFrom("+14155550100")
	p.SetBody("Merhaba, kodunuz ABC123")
	p.SetStatusCallback(callback)
	msg, err := api.CreateMessage(p)
	if err != nil {
		t.Fatalf("create message to %s: %v", to, err)
	}
	if msg.Sid == nil {
		t.Fatal("no sid")
	}
	return *msg.Sid
}

// postForm sends a message with a plain form POST, authenticated as sid/token, and returns the status.
func postForm(t *testing.T, sandboxURL, sid, token string, form url.Values) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, sandboxURL+"/2010-04-01/Accounts/"+sid+"/Messages.json", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(sid, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// waitReceiptStats waits until the sandbox's receipt counters satisfy ok.
func waitReceiptStats(t *testing.T, s *sandbox.Server, ok func(sandbox.ReceiptStats) bool) sandbox.ReceiptStats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.ReceiptStats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("receipt stats %+v never reached the expected state", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestTwilioStatusCallbacks(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	rv := newReceiver(t, testToken)
	api := newRestClient(t, srv.URL, testSID, testToken)

	sid := sendWithCallback(t, api, "+905551234567", rv.url+"/twilio/status?campaign_id=42&user_id=u-7")
	got := rv.next(t, 2)
	want := []receipts.Receipt{
		{Provider: "twilio", MessageID: sid, CampaignID: 42, UserID: "u-7", Address: "+905551234567", Status: receipts.StatusSent, EventID: sid + ":sent"},
		{Provider: "twilio", MessageID: sid, CampaignID: 42, UserID: "u-7", Address: "+905551234567", Status: receipts.StatusDelivered, EventID: sid + ":delivered"},
	}
	for i := range got {
		got[i].At = time.Time{}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("receipts (-want +got):\n%s", diff)
	}
	st := waitReceiptStats(t, s, func(st sandbox.ReceiptStats) bool { return st.Sent == 2 && st.Pending == 0 })
	if diff := cmp.Diff(sandbox.ReceiptStats{Scheduled: 1, Sent: 2}, st); diff != "" {
		t.Errorf("sandbox receipt stats (-want +got):\n%s", diff)
	}
	if hs := rv.handler.Stats(); hs.Accepted != 2 || hs.Receipts != 2 || len(hs.Rejected) != 0 {
		t.Errorf("handler stats %+v", hs)
	}

	// The control API shows the same counters.
	resp, err := http.Get(srv.URL + "/_sandbox/receipts/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var fromAPI sandbox.ReceiptStats
	if err := json.NewDecoder(resp.Body).Decode(&fromAPI); err != nil {
		t.Fatal(err)
	}
	if fromAPI != st {
		t.Errorf("GET /_sandbox/receipts/stats = %+v, want %+v", fromAPI, st)
	}
}

// The magic receipt numbers end undelivered (or failed) with their error code.
func TestTwilioStatusCallbackMagicNumbers(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	rv := newReceiver(t, testToken)
	api := newRestClient(t, srv.URL, testSID, testToken)

	want := map[string][]string{} // by SID: "status|error" of each receipt, in order
	cases := []struct {
		to       string
		statuses []string
		err      string
	}{
		{"+905550030003", []string{"sent", "undelivered"}, "twilio 30003: unreachable destination handset"},
		{"+905550030005", []string{"sent", "undelivered"}, "twilio 30005: unknown destination handset"},
		{"+905550030006", []string{"sent", "undelivered"}, "twilio 30006: landline or unreachable carrier"},
		{"+905550030007", []string{"sent", "undelivered"}, "twilio 30007: message filtered"},
		{"+905550030001", []string{"failed"}, "twilio 30001: queue overflow"},
		{"+905550030008", []string{"sent", "delivered"}, ""}, // not a magic receipt number
	}
	total := 0
	for _, c := range cases {
		sid := sendWithCallback(t, api, c.to, rv.url+"/status")
		for i, st := range c.statuses {
			e := ""
			if i == len(c.statuses)-1 {
				e = c.err
			}
			want[sid] = append(want[sid], st+"|"+e)
		}
		total += len(c.statuses)
	}
	got := map[string][]string{}
	for _, r := range rv.next(t, total) {
		got[r.MessageID] = append(got[r.MessageID], r.Status+"|"+r.Error)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("receipts by message (-want +got):\n%s", diff)
	}
}

// Callbacks signed with another auth token than the receiver's are refused with 403 and counted on
// both sides; nothing reaches the sink.
func TestTwilioStatusCallbackWrongToken(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	rv := newReceiver(t, "anotherToken42")
	api := newRestClient(t, srv.URL, testSID, testToken)

	sendWithCallback(t, api, "+905551234567", rv.url+"/status")
	st := waitReceiptStats(t, s, func(st sandbox.ReceiptStats) bool { return st.Failed == 2 })
	if st.Sent != 0 || st.Pending != 0 {
		t.Errorf("sandbox receipt stats %+v, want 2 failed and nothing else", st)
	}
	hs := rv.handler.Stats()
	if hs.Rejected[receipts.ReasonBadSignature] != 2 || hs.Accepted != 0 {
		t.Errorf("handler stats %+v, want 2 bad_signature", hs)
	}
	select {
	case r := <-rv.got:
		t.Errorf("forged callback recorded: %+v", r)
	default:
	}
}

// Only loopback callback URLs are called; the others are refused without a request.
func TestTwilioStatusCallbackNotLoopback(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	for _, cb := range []string{"http://example.com/status", "http://192.0.2.1/status", "ftp://127.0.0.1/status", "http://user:pw@127.0.0.1/status", "::"} {
		form := url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}, "Body": {"hi"}, "StatusCallback": {cb}}
		if code := postForm(t, srv.URL, testSID, testToken, form); code != http.StatusCreated {
			t.Fatalf("callback %q: send answered %d, want 201", cb, code)
		}
	}
	if diff := cmp.Diff(sandbox.ReceiptStats{Refused: 5}, s.ReceiptStats()); diff != "" {
		t.Errorf("receipt stats (-want +got):\n%s", diff)
	}
}

// A message sent through a Messaging Service gets callbacks too; one without StatusCallback none.
func TestTwilioStatusCallbackMessagingService(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	rv := newReceiver(t, testToken)
	form := url.Values{"To": {"+905551234567"}, "MessagingServiceSid": {"MG0123"}, "Body": {"hi"}, "StatusCallback": {rv.url + "/s?campaign_id=5"}}
	if code := postForm(t, srv.URL, testSID, testToken, form); code != http.StatusCreated {
		t.Fatalf("send answered %d", code)
	}
	form.Del("StatusCallback")
	if code := postForm(t, srv.URL, testSID, testToken, form); code != http.StatusCreated {
		t.Fatalf("send answered %d", code)
	}
	got := rv.next(t, 2)
	if got[0].Status != receipts.StatusSent || got[1].Status != receipts.StatusDelivered || got[1].CampaignID != 5 {
		t.Errorf("receipts %+v", got)
	}
	st := waitReceiptStats(t, s, func(st sandbox.ReceiptStats) bool { return st.Pending == 0 })
	if st.Scheduled != 1 || st.Sent != 2 {
		t.Errorf("receipt stats %+v, want 1 scheduled, 2 sent", st)
	}
}

// A message accepted and then left hanging by the timeout fault is delivered all the same: its receipts
// are what tells the engine that the ambiguous send went out.
func TestTwilioStatusCallbackAfterTimeout(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay, Faults: sandbox.Faults{RateTimeout: 1}})
	rv := newReceiver(t, testToken)
	form := url.Values{"To": {"+905551234567"}, "From": {"+14155550100"}, "Body": {"hi"}, "StatusCallback": {rv.url + "/s"}}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/"+testSID+"/Messages.json", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(testSID, testToken)
	if resp, err := (&http.Client{Timeout: 200 * time.Millisecond}).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("send answered %d, want a timeout", resp.StatusCode)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || !msgs[0].Hung {
		t.Fatalf("messages %+v, want one hung", msgs)
	}
	got := rv.next(t, 2)
	if got[0].MessageID != msgs[0].SID || got[0].Status != receipts.StatusSent || got[1].Status != receipts.StatusDelivered {
		t.Errorf("receipts %+v, want sent then delivered for %s", got, msgs[0].SID)
	}
}

// A status callback URL's connection overrides (#rc=3&rp=5xx) make Twilio retry a callback its receiver
// answered 5xx; the fragment is not sent, and the signature covers the URL the receiver sees. Without them
// a 5xx is final, as with Twilio.
func TestTwilioStatusCallbackConnectionOverrides(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	got := make(chan receipts.Receipt, 8)
	// Signatures checked against the URL each request was sent to (no public URL given).
	handler := receipts.TwilioHandler(testToken, "", receipts.SinkFunc(func(_ context.Context, rs []receipts.Receipt) error {
		for _, r := range rs {
			got <- r
		}
		return nil
	}), nil)
	rv := &receiver{handler: handler, got: got}
	var refuse atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Fragment != "" || strings.Contains(r.RequestURI, "#") {
			t.Errorf("the fragment was sent: %s", r.RequestURI)
		}
		if refuse.Add(-1) >= 0 {
			http.Error(w, "busy", http.StatusInternalServerError)
			return
		}
		handler.ServeHTTP(w, r)
	}))
	defer hs.Close()
	api := newRestClient(t, srv.URL, testSID, testToken)

	refuse.Store(2)
	sid := sendWithCallback(t, api, "+905551234567", hs.URL+"/twilio/status?campaign_id=42&user_id=u-7#rc=3&rp=5xx")
	two := rv.next(t, 2)
	if two[0].MessageID != sid || two[1].Status != receipts.StatusDelivered {
		t.Errorf("receipts after two 500s under rc=3: %+v", two)
	}
	st := waitReceiptStats(t, s, func(st sandbox.ReceiptStats) bool { return st.Pending == 0 })
	if st.Sent != 2 || st.Retried != 2 || st.Failed != 0 {
		t.Errorf("sandbox receipt stats %+v, want 2 sent after 2 retries, none failed", st)
	}

	// No overrides: Twilio retries only a connection that failed; the 500 is final.
	refuse.Store(1)
	sendWithCallback(t, api, "+905551234568", hs.URL+"/twilio/status?campaign_id=42&user_id=u-8")
	st = waitReceiptStats(t, s, func(st sandbox.ReceiptStats) bool { return st.Pending == 0 && st.Sent+st.Failed == 4 })
	if st.Failed != 1 || st.Retried != 2 {
		t.Errorf("sandbox receipt stats %+v, want the 500 final (1 failed) and no new retry", st)
	}
	rv.next(t, 1) // the final status, delivered
}
