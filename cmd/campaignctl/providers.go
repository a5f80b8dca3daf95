package main

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/push"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
	"github.com/campaignctl/campaignctl/providers/twilio"
	"github.com/campaignctl/campaignctl/providers/webhook"
)

// Provider-wide caps unless the environment says otherwise, in messages per second.
const (
	// defaultTwilioRate is Twilio's documented short-code throughput ("over 100 segments/s"): a safe cap
	// that never earns a 20429 storm. Long codes need TWILIO_RATE=1.
	defaultTwilioRate = 100.0
	// defaultNetgsmRate is a cautious cap for Netgsm, which publishes none and answers code 80 beyond
	// what the account allows; raise NETGSM_RATE for your contract.
	defaultNetgsmRate = 50.0
	// defaultSendGridRate: SendGrid publishes no mail/send limit; plan quotas and reputation are what bite.
	// 1000 e-mails a second (one full request) is a safe start; raise SENDGRID_RATE for your plan.
	defaultSendGridRate = 1000.0
	// defaultFCMRate is half of FCM's default quota (600,000 messages a minute per project).
	defaultFCMRate = 5000.0
	// defaultWebhookRate protects an in-house receiver; raise WEBHOOK_RATE to what it takes.
	defaultWebhookRate = 100.0
)

// providerSpec registers one provider adapter with the CLI: the channel it sends (a channel's own
// registration is campaign.ChannelSpec), the settings that configure it, its provider-wide cap and how it
// is built. The first configured provider of a channel, in providerSpecs' order, sends it; a second one is
// its fallback (see worker.Config.Fallback).
type providerSpec struct {
	// name is the adapter's Name(), which keys its cap.
	name    string
	channel campaign.Channel
	// settings are the variables that configure the adapter: any of them set means it is to be used (its
	// constructor then names what else is missing). needs are the ones a working setup sets, for the
	// message when no provider is configured.
	settings, needs []string
	// rateEnv names the provider-wide cap's variable, defaultRate its value when unset.
	rateEnv     string
	defaultRate float64
	// segments says the cap counts SMS segments, not messages (Twilio's MPS; the adapter's
	// providers.SegmentPaced).
	segments bool
	build    func(a *app, o sendOpts) (providers.Provider, error)
	// check, when set, refuses a launch on the channel whose settings would make bad messages, before
	// anything is written.
	check func(a *app) error
}

// sendOpts is how a process talks to its providers: how long one request may take, and the most requests
// it has in flight at once (the size of each provider's connection pool; 0: the default).
type sendOpts struct {
	timeout time.Duration
	conns   int
}

// providerSpecs lists every provider adapter the CLI can send through.
func providerSpecs() []providerSpec {
	return []providerSpec{
		{
			name: "twilio", channel: campaign.ChannelSMS,
			settings: []string{"TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_FROM"},
			rateEnv:  "TWILIO_RATE", defaultRate: defaultTwilioRate, segments: true,
			build: func(a *app, o sendOpts) (providers.Provider, error) {
				return twilio.New(twilio.Config{
					AccountSID: a.getenv("TWILIO_ACCOUNT_SID"), AuthToken: a.getenv("TWILIO_AUTH_TOKEN"), From: a.getenv("TWILIO_FROM"),
					BaseURL: a.getenv("TWILIO_BASE_URL"), StatusCallback: a.getenv("TWILIO_STATUS_CALLBACK"), Timeout: o.timeout, Conns: o.conns,
				})
			},
		},
		{
			// Netgsm sends SMS when Twilio is not configured, and is Twilio's fallback when both are.
			name: "netgsm", channel: campaign.ChannelSMS,
			settings: []string{"NETGSM_USERCODE", "NETGSM_PASSWORD", "NETGSM_HEADER"},
			rateEnv:  "NETGSM_RATE", defaultRate: defaultNetgsmRate,
			build: func(a *app, o sendOpts) (providers.Provider, error) {
				return netgsm.New(netgsm.Config{
					UserCode: a.getenv("NETGSM_USERCODE"), Password: a.getenv("NETGSM_PASSWORD"), Header: a.getenv("NETGSM_HEADER"),
					BaseURL: a.getenv("NETGSM_BASE_URL"), Timeout: o.timeout, Conns: o.conns,
				})
			},
		},
		{
			name: "sendgrid", channel: campaign.ChannelEmail,
			settings: []string{"SENDGRID_API_KEY", "SENDGRID_FROM"},
			rateEnv:  "SENDGRID_RATE", defaultRate: defaultSendGridRate,
			build: func(a *app, o sendOpts) (providers.Provider, error) {
				// One request carries up to 1000 recipients: it is given longer.
				return sendgrid.New(sendgrid.Config{
					APIKey: a.getenv("SENDGRID_API_KEY"), From: a.getenv("SENDGRID_FROM"), FromName: a.getenv("SENDGRID_FROM_NAME"),
					BaseURL: a.getenv("SENDGRID_BASE_URL"), Timeout: 3 * o.timeout, Conns: o.conns,
				})
			},
			check: func(a *app) error {
				if strings.ContainsFunc(a.getenv("SENDGRID_FROM_NAME"), unicode.IsControl) {
					return usagef("SENDGRID_FROM_NAME holds a line break or another control character, which would write a header of its own: set it to the sender's name on one line; nothing was written or sent")
				}
				return nil
			},
		},
		{
			name: "fcm", channel: campaign.ChannelPush,
			settings: []string{"GOOGLE_APPLICATION_CREDENTIALS", "FCM_PROJECT_ID"}, needs: []string{"GOOGLE_APPLICATION_CREDENTIALS"},
			rateEnv: "FCM_RATE", defaultRate: defaultFCMRate,
			build: func(a *app, o sendOpts) (providers.Provider, error) {
				return push.New(push.Config{
					ProjectID: a.getenv("FCM_PROJECT_ID"), CredentialsFile: a.getenv("GOOGLE_APPLICATION_CREDENTIALS"),
					BaseURL: a.getenv("FCM_BASE_URL"), Timeout: o.timeout, Conns: o.conns,
				})
			},
		},
		{
			name: "webhook", channel: campaign.ChannelWebhook,
			settings: []string{"WEBHOOK_URL", "WEBHOOK_SECRET"},
			rateEnv:  "WEBHOOK_RATE", defaultRate: defaultWebhookRate,
			build: func(a *app, o sendOpts) (providers.Provider, error) {
				return webhook.New(webhook.Config{URL: a.getenv("WEBHOOK_URL"), Secret: a.getenv("WEBHOOK_SECRET"), Timeout: o.timeout, Conns: o.conns})
			},
		},
	}
}

// required is what a working setup of the provider sets.
func (ps providerSpec) required() []string {
	if ps.needs != nil {
		return ps.needs
	}
	return ps.settings
}

// providerSet is what a worker sends through: the provider of each channel, the fallback of a channel
// (SMS: Netgsm behind Twilio), and the provider-wide caps by provider name.
type providerSet struct {
	primary  map[campaign.Channel]providers.Provider
	fallback map[campaign.Channel]providers.Provider
	rates    map[string]float64
}

// providers builds the provider of every channel whose settings are present in the environment, and the
// provider-wide caps (TWILIO_RATE, SENDGRID_RATE, ...: each providerSpec's rateEnv). A provider half
// configured is an error that names what is missing; no provider at all is one too.
func (a *app) providers(o sendOpts) (providerSet, error) {
	set := providerSet{primary: map[campaign.Channel]providers.Provider{}, fallback: map[campaign.Channel]providers.Provider{}, rates: map[string]float64{}}
	var hints []string
	for _, ps := range providerSpecs() {
		hints = append(hints, fmt.Sprintf("%s (%s)", andList(ps.required()), ps.channel))
		// A cap that cannot be read is refused even for a provider not configured here: a typo in
		// FCM_RATE is found by the worker it was meant for, and by this one.
		if _, err := a.rate(ps.rateEnv, ps.defaultRate); err != nil {
			return providerSet{}, err
		}
		if !a.anySet(ps.settings...) {
			continue
		}
		p, err := ps.build(a, o)
		if err != nil {
			return providerSet{}, usageError{err}
		}
		r, err := a.rate(ps.rateEnv, ps.defaultRate)
		if err != nil {
			return providerSet{}, err
		}
		set.rates[p.Name()] = r
		switch {
		case set.primary[ps.channel] == nil:
			set.primary[ps.channel] = p
		case set.fallback[ps.channel] == nil:
			set.fallback[ps.channel] = p
		default:
			return providerSet{}, usagef("%s, %s and %s are all configured for %s; a channel sends through one provider and fails over to a second: unset the settings of one",
				set.primary[ps.channel].Name(), set.fallback[ps.channel].Name(), p.Name(), ps.channel)
		}
	}
	if len(set.primary) == 0 {
		return providerSet{}, usagef("no provider is configured: set %s", strings.Join(hints[:len(hints)-1], ", ")+", or "+hints[len(hints)-1])
	}
	return set, nil
}

// channelRate is the provider-wide cap of the channel's provider: the cap of its first configured
// provider (TWILIO_RATE, or NETGSM_RATE when Netgsm alone sends SMS), or of its first registered one when
// none is configured here; segments says that cap counts SMS segments.
func (a *app) channelRate(ch campaign.Channel) (rate float64, segments bool, err error) {
	var first *providerSpec
	for _, ps := range providerSpecs() {
		if ps.channel != ch {
			continue
		}
		if a.anySet(ps.settings...) {
			first = &ps
			break
		}
		if first == nil {
			first = &ps
		}
	}
	if first == nil {
		return 0, false, nil
	}
	rate, err = a.rate(first.rateEnv, first.defaultRate)
	return rate, first.segments, err
}

// launchChecks runs the checks of the channel's providers that refuse a launch (see providerSpec.check).
func (a *app) launchChecks(ch campaign.Channel) error {
	for _, ps := range providerSpecs() {
		if ps.channel == ch && ps.check != nil {
			if err := ps.check(a); err != nil {
				return err
			}
		}
	}
	return nil
}

// andList joins names as a sentence does: "A", "A and B", "A, B and C".
func andList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func (a *app) anySet(names ...string) bool {
	for _, n := range names {
		if a.getenv(n) != "" {
			return true
		}
	}
	return false
}
