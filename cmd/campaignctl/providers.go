package main

import (
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/push"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
	"github.com/campaignctl/campaignctl/providers/twilio"
	"github.com/campaignctl/campaignctl/providers/webhook"
)

// providerSet is what a worker sends through: the provider of each channel, the fallback of a channel
// (SMS: Netgsm behind Twilio), and the provider-wide caps by provider name.
type providerSet struct {
	primary  map[campaign.Channel]providers.Provider
	fallback map[campaign.Channel]providers.Provider
	rates    map[string]float64
}

// providers builds the provider of every channel whose settings are present in the environment, and the
// provider-wide caps (TWILIO_RATE, SENDGRID_RATE, FCM_RATE, NETGSM_RATE). Netgsm sends SMS when Twilio is
// not configured, and is Twilio's fallback when both are. A channel half configured is an error that names
// what is missing; no channel at all is one too.
func (a *app) providers(timeout time.Duration) (providerSet, error) {
	fallback := map[campaign.Channel]providers.Provider{}
	provs := map[campaign.Channel]providers.Provider{}
	rates := map[string]float64{}
	add := func(ch campaign.Channel, p providers.Provider) error {
		r, err := a.channelRate(ch)
		if err != nil {
			return err
		}
		provs[ch], rates[p.Name()] = p, r
		return nil
	}
	if a.anySet("TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_FROM") {
		p, err := twilio.New(twilio.Config{
			AccountSID: a.getenv("TWILIO_ACCOUNT_SID"), AuthToken: a.getenv("TWILIO_AUTH_TOKEN"), From: a.getenv("TWILIO_FROM"),
			BaseURL: a.getenv("TWILIO_BASE_URL"), StatusCallback: a.getenv("TWILIO_STATUS_CALLBACK"), Timeout: timeout,
		})
		if err != nil {
			return providerSet{}, usageError{err}
		}
		if err := add(campaign.ChannelSMS, p); err != nil {
			return providerSet{}, err
		}
	}
	if a.anySet("NETGSM_USERCODE", "NETGSM_PASSWORD", "NETGSM_HEADER") {
		p, err := netgsm.New(netgsm.Config{
			UserCode: a.getenv("NETGSM_USERCODE"), Password: a.getenv("NETGSM_PASSWORD"), Header: a.getenv("NETGSM_HEADER"),
			BaseURL: a.getenv("NETGSM_BASE_URL"), Timeout: timeout,
		})
		if err != nil {
			return providerSet{}, usageError{err}
		}
		r, err := a.rate("NETGSM_RATE", defaultNetgsmRate)
		if err != nil {
			return providerSet{}, err
		}
		rates[p.Name()] = r
		if provs[campaign.ChannelSMS] != nil {
			fallback[campaign.ChannelSMS] = p
		} else {
			provs[campaign.ChannelSMS] = p
		}
	}
	if a.anySet("SENDGRID_API_KEY", "SENDGRID_FROM") {
		p, err := sendgrid.New(sendgrid.Config{
			APIKey: a.getenv("SENDGRID_API_KEY"), From: a.getenv("SENDGRID_FROM"), FromName: a.getenv("SENDGRID_FROM_NAME"),
			BaseURL: a.getenv("SENDGRID_BASE_URL"), Timeout: 3 * timeout,
		})
		if err != nil {
			return providerSet{}, usageError{err}
		}
		if err := add(campaign.ChannelEmail, p); err != nil {
			return providerSet{}, err
		}
	}
	if a.anySet("GOOGLE_APPLICATION_CREDENTIALS", "FCM_PROJECT_ID") {
		p, err := push.New(push.Config{
			ProjectID: a.getenv("FCM_PROJECT_ID"), CredentialsFile: a.getenv("GOOGLE_APPLICATION_CREDENTIALS"),
			BaseURL: a.getenv("FCM_BASE_URL"), Timeout: timeout,
		})
		if err != nil {
			return providerSet{}, usageError{err}
		}
		if err := add(campaign.ChannelPush, p); err != nil {
			return providerSet{}, err
		}
	}
	if a.anySet("WEBHOOK_URL", "WEBHOOK_SECRET") {
		p, err := webhook.New(webhook.Config{URL: a.getenv("WEBHOOK_URL"), Secret: a.getenv("WEBHOOK_SECRET"), Timeout: timeout})
		if err != nil {
			return providerSet{}, usageError{err}
		}
		if err := add(campaign.ChannelWebhook, p); err != nil {
			return providerSet{}, err
		}
	}
	if len(provs) == 0 {
		return providerSet{}, usagef("no provider is configured: set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and TWILIO_FROM (sms), NETGSM_USERCODE, NETGSM_PASSWORD and NETGSM_HEADER (sms), SENDGRID_API_KEY and SENDGRID_FROM (email), GOOGLE_APPLICATION_CREDENTIALS (push), or WEBHOOK_URL and WEBHOOK_SECRET (webhook)")
	}
	return providerSet{primary: provs, fallback: fallback, rates: rates}, nil
}

func (a *app) anySet(names ...string) bool {
	for _, n := range names {
		if a.getenv(n) != "" {
			return true
		}
	}
	return false
}
