package sandbox_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// messagesFromAPI is GET /_sandbox/messages, decoded.
func messagesFromAPI(t *testing.T, base string) []sandbox.Message {
	t.Helper()
	resp, err := http.Get(base + "/_sandbox/messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var msgs []sandbox.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// postReceipts is POST /_sandbox/receipts with body; it returns the status code.
func postReceipts(t *testing.T, base, body string) int {
	t.Helper()
	resp, err := http.Post(base+"/_sandbox/receipts", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// The message log says which messages had a receipt answered with a 2xx, and since when: the receiver's
// proof that the provider accepted them. A receipt the receiver refused proves nothing and is not noted.
func TestTwilioReceiptEvidenceInMessageLog(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	good := newReceiver(t, testToken)
	refusing := newReceiver(t, "anotherToken42")
	api := newRestClient(t, srv.URL, testSID, testToken)

	before := time.Now()
	sidGood := sendWithCallback(t, api, "+905551234567", good.url+"/twilio/status?campaign_id=1&user_id=a")
	sidRefused := sendWithCallback(t, api, "+905551234568", refusing.url+"/twilio/status?campaign_id=1&user_id=b")
	good.next(t, 2)
	waitReceiptStats(t, s, func(st sandbox.ReceiptStats) bool { return st.Pending == 0 && st.Sent == 2 && st.Failed == 2 })

	for _, msgs := range [][]sandbox.Message{s.Messages(), messagesFromAPI(t, srv.URL)} {
		if len(msgs) != 2 {
			t.Fatalf("%d messages, want 2", len(msgs))
		}
		for _, m := range msgs {
			switch m.SID {
			case sidGood:
				if m.Receipt != "delivered" || m.ReceiptAt.Before(m.At) || m.ReceiptAt.Before(before) || m.ReceiptAt.After(time.Now()) {
					t.Errorf("message with receipts answered: receipt %q at %v (accepted at %v), want delivered, after the acceptance", m.Receipt, m.ReceiptAt, m.At)
				}
				if m.ReceiptAt.Sub(m.At) < receiptDelay {
					t.Errorf("receipt noted %v after the acceptance, before the receipt delay %v", m.ReceiptAt.Sub(m.At), receiptDelay)
				}
			case sidRefused:
				if m.Receipt != "" || !m.ReceiptAt.IsZero() {
					t.Errorf("message whose receipts were refused: receipt %q at %v, want none", m.Receipt, m.ReceiptAt)
				}
			default:
				t.Errorf("unexpected message %s", m.SID)
			}
		}
	}
}

// The receipt delay and whether callbacks are sent at all change while the sandbox runs, for the messages
// accepted after the change.
func TestTwilioReceiptSettingsAtRuntime(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{ReceiptDelay: receiptDelay})
	rv := newReceiver(t, testToken)
	api := newRestClient(t, srv.URL, testSID, testToken)

	if got := s.Receipts(); got != (sandbox.ReceiptSettings{DelayMS: receiptDelay.Milliseconds()}) {
		t.Errorf("initial settings %+v, want the option's delay", got)
	}
	for _, bad := range []string{`{"delay_ms":-1}`, `{"delay_ms":600001}`, `{"delay":"1s"}`, `not json`} {
		if code := postReceipts(t, srv.URL, bad); code != http.StatusBadRequest {
			t.Errorf("POST /_sandbox/receipts %s answered %d, want 400", bad, code)
		}
	}

	// Off: the message is accepted and gets no callback.
	if code := postReceipts(t, srv.URL, `{"off":true}`); code != http.StatusOK {
		t.Fatalf("POST off answered %d", code)
	}
	sendWithCallback(t, api, "+905551234567", rv.url+"/s")
	time.Sleep(10 * receiptDelay)
	select {
	case r := <-rv.got:
		t.Errorf("receipt sent while off: %+v", r)
	default:
	}
	if st := s.ReceiptStats(); st.Disabled != 1 || st.Scheduled != 0 {
		t.Errorf("receipt stats %+v, want 1 disabled and nothing scheduled", st)
	}

	// On again, with a longer delay: the first callback comes no sooner than it.
	const delay = 300 * time.Millisecond
	if code := postReceipts(t, srv.URL, `{"delay_ms":300}`); code != http.StatusOK {
		t.Fatalf("POST delay answered %d", code)
	}
	resp, err := http.Get(srv.URL + "/_sandbox/receipts")
	if err != nil {
		t.Fatal(err)
	}
	var got sandbox.ReceiptSettings
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || got != (sandbox.ReceiptSettings{DelayMS: 300}) {
		t.Errorf("GET /_sandbox/receipts = %+v (%v), want delay 300 ms, on", got, err)
	}
	sent := time.Now()
	sendWithCallback(t, api, "+905551234569", rv.url+"/s")
	first := rv.next(t, 1)
	if waited := time.Since(sent); waited < delay {
		t.Errorf("first callback after %v, want at least %v", waited, delay)
	}
	rv.next(t, 1)
	if first[0].Status != "sent" {
		t.Errorf("first receipt %+v, want sent", first[0])
	}
}
