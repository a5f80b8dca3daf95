package twilio

import (
	"net/url"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
)

func TestCallbackURLNamesTheRecipient(t *testing.T) {
	for _, tc := range []struct {
		base     string
		want     url.Values
		fragment string
	}{
		{"https://hooks.example.com/twilio/status", url.Values{"campaign_id": {"42"}, "user_id": {"u 1&x=ş"}, "campaign_nonce": {"mab3c1"}}, ""},
		// Twilio's connection overrides stay at the end, where Twilio reads them.
		{"https://hooks.example.com/twilio/status?key=abc&campaign_id=7&campaign_nonce=old#rc=3&rp=5xx,ct", url.Values{"key": {"abc"}, "campaign_id": {"42"}, "user_id": {"u 1&x=ş"}, "campaign_nonce": {"mab3c1"}}, "rc=3&rp=5xx,ct"},
		{"https://hooks.example.com/twilio/status#rc=2", url.Values{"campaign_id": {"42"}, "user_id": {"u 1&x=ş"}, "campaign_nonce": {"mab3c1"}}, "rc=2"},
	} {
		prefix, end, err := callbackPrefix(tc.base)
		if err != nil {
			t.Fatalf("%s: %v", tc.base, err)
		}
		p := &Provider{callback: prefix, callbackEnd: end}
		got, err := url.Parse(p.callbackURL(providers.Message{CampaignID: 42, UserID: "u 1&x=ş", CampaignNonce: "mab3c1"}))
		if err != nil {
			t.Fatalf("%s: %v", tc.base, err)
		}
		if got.Host != "hooks.example.com" || got.Path != "/twilio/status" || got.Fragment != tc.fragment {
			t.Errorf("%s: callback %s", tc.base, got)
		}
		if q := got.Query(); q.Encode() != tc.want.Encode() {
			t.Errorf("%s: query %v, want %v", tc.base, q, tc.want)
		}
	}
}

// Receipts name their recipient exactly when each message carries the status callback: without one, the
// only callbacks are an account's or a Messaging Service's, which name the message SID alone.
func TestReceiptsNameTheRecipientOnlyWithTheCallback(t *testing.T) {
	for _, tc := range []struct {
		callback string
		want     bool
	}{
		{"", false},
		{"https://hooks.example.com/twilio/status", true},
	} {
		p, err := New(Config{AccountSID: "AC00000000000000000000000000000000", AuthToken: "token", From: "+905550000000", StatusCallback: tc.callback})
		if err != nil {
			t.Fatal(err)
		}
		if got := providers.ReceiptsNameRecipient(p); got != tc.want {
			t.Errorf("callback %q: receipts name the recipient %v, want %v", tc.callback, got, tc.want)
		}
	}
}
