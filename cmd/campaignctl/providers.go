package main

import (
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/push"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
	"github.com/campaignctl/campaignctl/providers/twilio"
	"github.com/campaignctl/campaignctl/providers/webhook"
)

// providers builds the provider of every channel whose settings are present in the environment, and the
// provider-wide caps (TWILIO_RATE, SENDGRID_RATE, FCM_RATE). A channel half configured is an error that
// names what is missing; no channel at all is one too.
func (a *app) providers(timeout time.Duration) (map[campaign.Channel]providers.Provider, map[string]float64, error) {
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
			return nil, nil, usageError{err}
		}
		if err := add(campaign.ChannelSMS, p); err != nil {
			return nil, nil, err
		}
	}
	if a.anySet("SENDGRID_API_KEY", "SENDGRID_FROM") {
		p, err := sendgrid.New(sendgrid.Config{
			APIKey: a.getenv("SENDGRID_API_KEY"), From: a.getenv("SENDGRID_FROM"), FromName: a.getenv("SENDGRID_FROM_NAME"),
			BaseURL: a.getenv("SENDGRID_BASE_URL"), Timeout: 3 * timeout,
		})
		if err != nil {
			return nil, nil, usageError{err}
		}
		if err := add(campaign.ChannelEmail, p); err != nil {
			return nil, nil, err
		}
	}
	if a.anySet("GOOGLE_APPLICATION_CREDENTIALS", "FCM_PROJECT_ID") {
		p, err := push.New(push.Config{
			ProjectID: a.getenv("FCM_PROJECT_ID"), CredentialsFile: a.getenv("GOOGLE_APPLICATION_CREDENTIALS"),
			BaseURL: a.getenv("FCM_BASE_URL"), Timeout: timeout,
		})
		if err != nil {
			return nil, nil, usageError{err}
		}
		if err := add(campaign.ChannelPush, p); err != nil {
			return nil, nil, err
		}
	}
	if a.anySet("WEBHOOK_URL", "WEBHOOK_SECRET") {
		p, err := webhook.New(webhook.Config{URL: a.getenv("WEBHOOK_URL"), Secret: a.getenv("WEBHOOK_SECRET"), Timeout: timeout})
		if err != nil {
			return nil, nil, usageError{err}
		}
		if err := add(campaign.ChannelWebhook, p); err != nil {
			return nil, nil, err
		}
	}
	if len(provs) == 0 {
		return nil, nil, usagef("no provider is configured: set TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN and TWILIO_FROM (sms), SENDGRID_API_KEY and SENDGRID_FROM (email), GOOGLE_APPLICATION_CREDENTIALS (push), or WEBHOOK_URL and WEBHOOK_SECRET (webhook)")
	}
	return provs, rates, nil
}

func (a *app) anySet(names ...string) bool {
	for _, n := range names {
		if a.getenv(n) != "" {
			return true
		}
	}
	return false
}
