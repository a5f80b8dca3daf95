package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

type sandboxOptions struct {
	addr                  string
	latency, receiptDelay time.Duration
	faults                sandbox.Faults
	twilioRate            float64
	sendgridRate, fcmRate float64
	sendgridEventURL      string
	iysRate               float64
	iysPullLag            time.Duration
	pprofAddr             string
}

func (o *sandboxOptions) validate() error {
	for name, r := range map[string]float64{
		"--fail-429": o.faults.Rate429, "--fail-500": o.faults.Rate500, "--fail-503": o.faults.Rate503,
		"--fail-raw-503": o.faults.RateRaw503, "--fail-timeout": o.faults.RateTimeout, "--fail-reset": o.faults.RateReset,
	} {
		if r < 0 || r > 1 {
			return usagef("%s %v: give a probability between 0 and 1", name, r)
		}
	}
	for name, r := range map[string]float64{"--twilio-rate": o.twilioRate, "--sendgrid-rate": o.sendgridRate, "--fcm-rate": o.fcmRate} {
		if r < 0 {
			return usagef("%s %v: give requests per second, or 0 for no cap", name, r)
		}
	}
	if err := o.faults.Validate(); err != nil {
		return usagef("--fail-only %q: %v", o.faults.Only, err)
	}
	if o.iysRate < 0 || o.iysPullLag < 0 {
		return usagef("--iys-rate and --iys-pull-lag must not be negative")
	}
	if o.receiptDelay < 0 {
		return usagef("--receipt-delay %v: give a duration of zero or more", o.receiptDelay)
	}
	return nil
}

func (a *app) newSandboxCmd() *cobra.Command {
	var o sandboxOptions
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run a local imitation of the provider APIs (Twilio, SendGrid, FCM, webhook) with fault injection",
		Long: `Run a local imitation of the providers' APIs on --addr, for demos and tests. Point the workers at it:

  sms    TWILIO_BASE_URL=http://ADDR    Twilio's Messages API; credentials TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN
                                        (any alphanumeric pair when unset); signed status callbacks to the
                                        StatusCallback URL of each message (TWILIO_STATUS_CALLBACK on workers)
  sms    NETGSM_BASE_URL=http://ADDR    Netgsm's REST v2 send (the SMS failover); credentials NETGSM_USERCODE and
                                        NETGSM_PASSWORD (any pair when unset)
  email  SENDGRID_BASE_URL=http://ADDR  SendGrid v3 Mail Send; key SENDGRID_API_KEY (any when unset); signed
                                        Event Webhook posts to --sendgrid-event-url (public key at
                                        GET /v3/user/webhooks/event/settings/signed)
  push   FCM_BASE_URL=http://ADDR       FCM HTTP v1 with its OAuth2 token endpoint (POST /token)
  webhook POST http://ADDR/webhook      a receiver that checks the HMAC signature (WEBHOOK_SECRET)
  İYS    IYS_BASE_URL=http://ADDR       the İYS consent API (token, status, multi-status, changes pull);
                                        act as a citizen with POST /_sandbox/iys/consents
                                        {"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_MESAJ"}

Every accepted message is recorded: GET /_sandbox/messages, GET /_sandbox/stats,
POST /_sandbox/faults (JSON, e.g. {"rate_503":0.05}; "only":"twilio" aims them at one API), POST /_sandbox/reset.

Magic numbers fail permanently with Twilio's code: +905550021211 (invalid), +905550021610 (opted out),
+905550021614 (not mobile), +905550021408, +905550021606, +905550021635; +905550030003 (and 30005, 30006,
30007) are accepted and then undelivered. E-mail addresses starting bounce+, drop+ or defer+ are accepted
and then bounce, are dropped or deferred.`,
		Example: `  campaignctl sandbox --addr 127.0.0.1:8025 --fail-503 0.05 --fail-429 0.02 --latency 20ms`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			log := a.logger()
			s := sandbox.New(sandbox.Options{
				TwilioAccountSID: a.getenv("TWILIO_ACCOUNT_SID"),
				TwilioAuthToken:  a.getenv("TWILIO_AUTH_TOKEN"),
				NetgsmUserCode:   a.getenv("NETGSM_USERCODE"),
				NetgsmPassword:   a.getenv("NETGSM_PASSWORD"),
				Latency:          o.latency,
				Faults:           o.faults,
				TwilioRate:       o.twilioRate,
				Logger:           log,
				SendGridAPIKey:   a.getenv("SENDGRID_API_KEY"),
				SendGridRate:     o.sendgridRate,
				SendGridEventURL: o.sendgridEventURL,
				FCMRate:          o.fcmRate,
				WebhookSecret:    a.getenv("WEBHOOK_SECRET"),
				ReceiptDelay:     o.receiptDelay,
				IYSUsername:      a.getenv("IYS_USERNAME"),
				IYSPassword:      a.getenv("IYS_PASSWORD"),
				IYSRate:          o.iysRate,
				IYSPullLag:       pullLag(o.iysPullLag),
			})
			fmt.Fprintf(a.stderr, "sandbox listening on http://%s (TWILIO_BASE_URL, SENDGRID_BASE_URL and FCM_BASE_URL=http://%s)\n", o.addr, o.addr)
			if o.sendgridEventURL != "" {
				fmt.Fprintf(a.stderr, "SendGrid events go to %s, signed with SENDGRID_WEBHOOK_PUBLIC_KEY=%s\n", o.sendgridEventURL, s.SendGridEventPublicKey())
			}
			if o.pprofAddr != "" {
				if err := metrics.ValidateAddr(o.pprofAddr); err != nil {
					return usagef("--pprof-addr %v", err)
				}
				if host, _, _ := net.SplitHostPort(o.pprofAddr); !isLoopbackHost(host) {
					return usagef("--pprof-addr %s: bind profiles to a loopback address, e.g. 127.0.0.1:6061", o.pprofAddr)
				}
				stop, err := servePprof(cmd.Context(), o.pprofAddr, log)
				if err != nil {
					return err
				}
				defer stop()
			}
			return sandbox.ListenAndServe(cmd.Context(), o.addr, s)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "addr", "127.0.0.1:8025", "listen address")
	f.DurationVar(&o.latency, "latency", 0, "added to every provider request")
	f.Float64Var(&o.faults.Rate429, "fail-429", 0, "probability of a 429 (Twilio 20429)")
	f.Float64Var(&o.faults.Rate500, "fail-500", 0, "probability of a JSON 500")
	f.Float64Var(&o.faults.Rate503, "fail-503", 0, "probability of a JSON 503")
	f.Float64Var(&o.faults.RateRaw503, "fail-raw-503", 0, "probability of an HTML 503")
	f.Float64Var(&o.faults.RateTimeout, "fail-timeout", 0, "probability of accepting, then never answering")
	f.Float64Var(&o.faults.RateReset, "fail-reset", 0, "probability of closing the connection without answering")
	f.StringVar(&o.faults.Only, "fail-only", "", "inject the faults only into these APIs, comma-separated (twilio, netgsm, sendgrid, fcm, webhook); empty: all")
	f.Float64Var(&o.twilioRate, "twilio-rate", 0, "server-side cap in requests per second per account (real 429s); 0 = none")
	f.Float64Var(&o.sendgridRate, "sendgrid-rate", 0, "server-side cap in mail/send requests per second per API key (real 429s); 0 = none")
	f.Float64Var(&o.fcmRate, "fcm-rate", 0, "server-side cap in messages per second per project (real 429 QUOTA_EXCEEDED); 0 = none")
	f.StringVar(&o.sendgridEventURL, "sendgrid-event-url", "", "where to post signed SendGrid delivery events (loopback only), e.g. http://127.0.0.1:8090/sendgrid/events")
	f.Float64Var(&o.iysRate, "iys-rate", 10, "İYS requests per second per client, as İYS allows (real 429 H124 beyond); 0 = none")
	f.DurationVar(&o.iysPullLag, "iys-pull-lag", time.Hour, "how recent a consent change may be and still be left out of the İYS pull (İYS: 1h); 0 = none")
	f.StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's profiles at http://ADDR/debug/pprof/ on a loopback address (for benchmarks); empty: none")
	f.DurationVar(&o.receiptDelay, "receipt-delay", 200*time.Millisecond, "how long after acceptance delivery receipts are sent")
	return cmd
}

// pullLag maps the flag (0: list changes at once) to the sandbox option (negative: at once).
func pullLag(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
