package twilio

import (
	"net/url"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
)

func TestCallbackURLNamesTheRecipient(t *testing.T) {
	for _, tc := range []struct {
		base string
		want url.Values
	}{
		{"https://hooks.example.com/twilio/status", url.Values{"campaign_id": {"42"}, "user_id": {"u 1&x=ş"}}},
		{"https://hooks.example.com/twilio/status?key=abc&campaign_id=7#frag", url.Values{"key": {"abc"}, "campaign_id": {"42"}, "user_id": {"u 1&x=ş"}}},
	} {
		prefix, err := callbackPrefix(tc.base)
		if err != nil {
			t.Fatalf("%s: %v", tc.base, err)
		}
		p := &Provider{callback: prefix}
		got, err := url.Parse(p.callbackURL(providers.Message{CampaignID: 42, UserID: "u 1&x=ş"}))
		if err != nil {
			t.Fatalf("%s: %v", tc.base, err)
		}
		if got.Host != "hooks.example.com" || got.Path != "/twilio/status" || got.Fragment != "" {
			t.Errorf("%s: callback %s", tc.base, got)
		}
		if q := got.Query(); q.Encode() != tc.want.Encode() {
			t.Errorf("%s: query %v, want %v", tc.base, q, tc.want)
		}
	}
}
