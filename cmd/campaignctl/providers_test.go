package main

import (
	"io"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// Which provider sends SMS, which fails over, and which cap a launch's ETA uses: Twilio alone, Netgsm
// alone, or Twilio with Netgsm as its fallback.
func TestSMSProvidersAndTheirCaps(t *testing.T) {
	t.Parallel()
	twilio := map[string]string{"TWILIO_ACCOUNT_SID": "ACx", "TWILIO_AUTH_TOKEN": "tok", "TWILIO_FROM": "+905550000000", "TWILIO_RATE": "80"}
	netgsm := map[string]string{"NETGSM_USERCODE": "850", "NETGSM_PASSWORD": "pw", "NETGSM_HEADER": "KAMPANYA", "NETGSM_RATE": "30"}
	both := map[string]string{}
	for _, m := range []map[string]string{twilio, netgsm} {
		for k, v := range m {
			both[k] = v
		}
	}
	for _, tc := range []struct {
		name              string
		env               map[string]string
		primary, fallback string
		rate              float64
	}{
		{"twilio alone", twilio, "twilio", "", 80},
		{"netgsm alone", netgsm, "netgsm", "", 30},
		{"both", both, "twilio", "netgsm", 80},
	} {
		a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return tc.env[k] }}
		set, err := a.providers(sendOpts{timeout: time.Second})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		fb := ""
		if p := set.fallback[campaign.ChannelSMS]; p != nil {
			fb = p.Name()
		}
		rate, _, err := a.channelRate(campaign.ChannelSMS)
		if err != nil || set.primary[campaign.ChannelSMS].Name() != tc.primary || fb != tc.fallback || rate != tc.rate {
			t.Errorf("%s: sms by %s, fallback %q, launch cap %v (%v); want %s, %q, %v", tc.name,
				set.primary[campaign.ChannelSMS].Name(), fb, rate, err, tc.primary, tc.fallback, tc.rate)
		}
		if set.rates["netgsm"] != 0 && set.rates["netgsm"] != 30 {
			t.Errorf("%s: netgsm cap %v, want NETGSM_RATE", tc.name, set.rates["netgsm"])
		}
	}
}
