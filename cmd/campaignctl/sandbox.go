package main

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
	twilioInboundURL      string
	iysRate               float64
	netgsmPerNumber       int
	netgsmReports         int
	iysPullLag            time.Duration
	pprofAddr             string
	// --limit, --limit-concurrency, --limit-segments and --outage, as given.
	limits, concurrency, segments, outages []string
}

// pushback turns --limit, --limit-concurrency, --limit-segments and --outage into the sandbox's hidden
// limits and outage windows.
func (o *sandboxOptions) pushback() (map[string]sandbox.Limit, []sandbox.OutagePlan, error) {
	limits := make(map[string]sandbox.Limit)
	for _, f := range []struct {
		flag   string
		values []string
		set    func(*sandbox.Limit, int)
	}{
		{"--limit", o.limits, func(l *sandbox.Limit, n int) { l.Rate = n }},
		{"--limit-concurrency", o.concurrency, func(l *sandbox.Limit, n int) { l.Concurrency = n }},
		{"--limit-segments", o.segments, func(l *sandbox.Limit, n int) { l.Segments = n }},
	} {
		for _, v := range f.values {
			apis, val, err := parseAPIValue(v)
			num := -1
			if err == nil {
				num, err = strconv.Atoi(val)
			}
			if err == nil && num < 0 {
				err = errors.New("negative")
			}
			if err != nil {
				return nil, nil, usagef("%s %q: %v; give API=N, e.g. twilio=800 (API: twilio, netgsm, sendgrid, fcm, webhook, a comma-separated list or all; N: a whole number, 0 for no limit)", f.flag, v, err)
			}
			for _, a := range apis {
				l := limits[a]
				f.set(&l, num)
				limits[a] = l
				if err := sandbox.ValidateLimits(map[string]sandbox.Limit{a: l}); err != nil {
					return nil, nil, usagef("%s %q: %v", f.flag, v, err)
				}
			}
		}
	}
	var plans []sandbox.OutagePlan
	for _, v := range o.outages {
		p, err := parseOutage(v)
		if err != nil {
			return nil, nil, usagef("--outage %q: %v; give API=DURATION[@START][/MODE], e.g. twilio=20s@10s or sendgrid=5s/reset "+
				"(START: a duration after the sandbox starts or an RFC 3339 time, default now; MODE: 503, raw_503, reset or hang, default 503)", v, err)
		}
		plans = append(plans, p)
	}
	return limits, plans, nil
}

// parseAPIValue splits "API=VALUE", where API is one API, a comma-separated list of them or "all".
func parseAPIValue(v string) (apis []string, value string, err error) {
	i := strings.LastIndex(v, "=")
	if i < 0 {
		return nil, "", errors.New("no =")
	}
	names, value := strings.TrimSpace(v[:i]), strings.TrimSpace(v[i+1:])
	if names == "all" {
		return sandbox.APIs, value, nil
	}
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(sandbox.APIs, n) {
			return nil, "", fmt.Errorf("unknown API %q", n)
		}
		apis = append(apis, n)
	}
	return apis, value, nil
}

// parseOutage reads API=DURATION[@START][/MODE].
func parseOutage(v string) (sandbox.OutagePlan, error) {
	i := strings.Index(v, "=")
	if i < 0 {
		return sandbox.OutagePlan{}, errors.New("no =")
	}
	apis, _, err := parseAPIValue(v[:i+1])
	if err != nil {
		return sandbox.OutagePlan{}, err
	}
	p := sandbox.OutagePlan{Only: strings.Join(apis, ",")}
	spec := v[i+1:]
	if j := strings.LastIndex(spec, "/"); j >= 0 {
		p.Mode = sandbox.OutageMode(spec[j+1:])
		spec = spec[:j]
	}
	dur, start, hasStart := strings.Cut(spec, "@")
	if p.Duration, err = time.ParseDuration(dur); err != nil || p.Duration <= 0 {
		return p, fmt.Errorf("duration %q: give a positive duration such as 20s", dur)
	}
	if hasStart {
		if p.After, err = time.ParseDuration(start); err != nil {
			if p.Start, err = time.Parse(time.RFC3339Nano, start); err != nil {
				return p, fmt.Errorf("start %q: give a duration such as 10s or an RFC 3339 time", start)
			}
		}
	}
	return p, p.Validate()
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
	if o.netgsmReports < 0 {
		return usagef("--netgsm-reports-per-minute %d: give how many report queries Netgsm answers in a minute (its limit is 10), or 0 for no limit", o.netgsmReports)
	}
	if o.netgsmPerNumber < 0 {
		return usagef("--netgsm-per-number %d: give how many messages one number may take within a minute (Netgsm's limit is 20), or 0 for no limit", o.netgsmPerNumber)
	}
	if o.iysRate < 0 || o.iysPullLag < 0 {
		return usagef("--iys-rate and --iys-pull-lag must not be negative")
	}
	if o.receiptDelay < 0 {
		return usagef("--receipt-delay %v: give a duration of zero or more", o.receiptDelay)
	}
	if o.latency < 0 {
		return usagef("--latency %v: give a duration of zero or more, e.g. 20ms", o.latency)
	}
	return nil
}

func (a *app) newSandboxCmd() *cobra.Command {
	var o sandboxOptions
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run a local imitation of the provider APIs (Twilio, Netgsm, SendGrid, FCM, webhook) and of İYS, with fault injection",
		Long: `Run a local imitation of the providers' APIs on --addr, for demos and tests. Point the workers at it:

  sms    TWILIO_BASE_URL=http://ADDR    Twilio's Messages API; credentials TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN
                                        (any alphanumeric pair when unset); signed status callbacks to the
                                        StatusCallback URL of each message (TWILIO_STATUS_CALLBACK on workers;
                                        retried as its connection overrides say, e.g. #rc=3&rp=5xx,ct);
                                        an answer to an SMS, signed with TWILIO_AUTH_TOKEN, to --twilio-inbound-url
                                        with POST /_sandbox/twilio/inbound {"from":"+905321234567","to":"+905550000000","body":"RET"}
  sms    NETGSM_BASE_URL=http://ADDR    Netgsm's REST v2 send (the SMS failover, or the SMS provider); credentials
                                        NETGSM_USERCODE and NETGSM_PASSWORD (any pair when unset); code 85 past
                                        --netgsm-per-number messages to one number within a minute; its report
                                        API (POST /sms/rest/v2/report, --netgsm-reports-per-minute): 1 delivered
                                        after --receipt-delay, or +9055501SSNNN's status SS (16: İYS rejected)
  email  SENDGRID_BASE_URL=http://ADDR  SendGrid v3 Mail Send; key SENDGRID_API_KEY (any when unset); signed
                                        Event Webhook posts to --sendgrid-event-url (a refused post is tried
                                        again, later each time, for 24 hours, as SendGrid does; public key at
                                        GET /v3/user/webhooks/event/settings/signed); a recipient's refusal with
                                        POST /_sandbox/sendgrid/events {"event":"unsubscribe","email":"a@example.com"}
                                        (also group_unsubscribe, spamreport; the custom args of the last message to it)
  push   FCM_BASE_URL=http://ADDR       FCM HTTP v1 with its OAuth2 token endpoint (POST /token)
  webhook POST http://ADDR/webhook      a receiver that checks the HMAC signature (WEBHOOK_SECRET)
  İYS    IYS_BASE_URL=http://ADDR       the İYS consent API (token, status, multi-status, changes pull);
                                        act as a citizen with POST /_sandbox/iys/consents
                                        {"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"IYS_MESAJ"}

Every accepted message is recorded: GET /_sandbox/messages, GET /_sandbox/stats,
POST /_sandbox/faults (JSON, e.g. {"rate_503":0.05}; "only":"twilio" aims them at one API), POST /_sandbox/reset.

Pushback, per API (twilio, netgsm, sendgrid, fcm, webhook; a comma-separated list, or all), for testing
how senders cope with a provider that pushes back:
  --limit twilio=800              a hidden rate limit: above 800 requests in any one second (all connections
                                  together) a request gets the provider's 429 with no Retry-After (Twilio code
                                  20429; SendGrid's X-RateLimit-Limit/Remaining/Reset; FCM QUOTA_EXCEEDED;
                                  Netgsm code 80 in a 200) and is not recorded
  --limit-concurrency twilio=100  at most 100 requests in flight, the excess refused the same way
  --limit-segments twilio=1000    at most 1000 SMS segments a second (Twilio counts MPS in segments)
  --outage twilio=20s@10s/503     a hard outage: 10s after the start, for 20s, every request to the API fails
                                  (503: the provider's JSON 503; raw_503: an HTML 503; reset: the connection is
                                  reset; hang: no answer until the client gives up), then it recovers by itself;
                                  START may be an RFC 3339 time, and leaving out @START means now
At runtime: GET/POST /_sandbox/limits ({"only":"twilio","rate":800,"concurrency":0,"segments":0}),
GET/POST /_sandbox/outages ({"only":"twilio","mode":"503","after_ms":0,"duration_ms":20000}; "start" takes an
RFC 3339 time; no duration: until stopped), POST /_sandbox/outages/stop ({"only":"twilio"}, or no body for all).
GET /_sandbox/timeline[?api=twilio][&since=UNIX] counts, per second of the sandbox's clock, the requests
accepted, hung and refused by reason (limit, concurrency, segments, outage, rate, fault_429, fault_500,
fault_503, fault_raw_503, fault_reset, request) and gone, with the totals, the limits and the outage windows;
GET /_sandbox/stats lists the outage windows too. Injected faults (--fail-*) apply to what the limits let
through.

Magic numbers fail permanently with Twilio's code: +905550021211 (invalid), +905550021610 (opted out),
+905550021614 (not mobile), +905550021408, +905550021606, +905550021635; +905550030003 (and 30005, 30006,
30007) are accepted and then undelivered. E-mail addresses starting bounce+, drop+ or defer+ are accepted
and then bounce, are dropped or deferred; those starting unsubscribed+ are dropped as on SendGrid's
unsubscribe list ("Unsubscribed Address").`,
		Example: `  campaignctl sandbox --addr 127.0.0.1:8025 --fail-503 0.05 --fail-429 0.02 --latency 20ms
  campaignctl sandbox --limit twilio=800 --limit sendgrid=20 --outage twilio=20s@10s --fail-500 0.01`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			limits, outages, err := o.pushback()
			if err != nil {
				return err
			}
			for flag, raw := range map[string]string{"--sendgrid-event-url": o.sendgridEventURL, "--twilio-inbound-url": o.twilioInboundURL} {
				if raw == "" {
					continue
				}
				// Accepted, it logged an error, said the events went there, and posted nothing.
				if err := sandbox.CheckLoopbackURL(flag, raw); err != nil {
					return usagef("sandbox: %v: give a URL on this machine, e.g. http://127.0.0.1:8090/...", err)
				}
			}
			if o.twilioInboundURL != "" && a.getenv("TWILIO_AUTH_TOKEN") == "" {
				return usagef("--twilio-inbound-url needs TWILIO_AUTH_TOKEN: the incoming SMS are signed with it, and the receiver verifies them with the same token")
			}
			log := a.logger()
			reports := o.netgsmReports // the sandbox's 0 is Netgsm's 10; the flag's is no limit
			if reports == 0 {
				reports = -1
			}
			s := sandbox.New(sandbox.Options{
				TwilioAccountSID:       a.getenv("TWILIO_ACCOUNT_SID"),
				TwilioAuthToken:        a.getenv("TWILIO_AUTH_TOKEN"),
				NetgsmUserCode:         a.getenv("NETGSM_USERCODE"),
				NetgsmPassword:         a.getenv("NETGSM_PASSWORD"),
				NetgsmPerNumber:        o.netgsmPerNumber,
				NetgsmReportsPerMinute: reports,
				Latency:                o.latency,
				Faults:                 o.faults,
				TwilioRate:             o.twilioRate,
				Logger:                 log,
				SendGridAPIKey:         a.getenv("SENDGRID_API_KEY"),
				SendGridRate:           o.sendgridRate,
				SendGridEventURL:       o.sendgridEventURL,
				TwilioInboundURL:       o.twilioInboundURL,
				FCMRate:                o.fcmRate,
				WebhookSecret:          a.getenv("WEBHOOK_SECRET"),
				ReceiptDelay:           o.receiptDelay,
				IYSUsername:            a.getenv("IYS_USERNAME"),
				IYSPassword:            a.getenv("IYS_PASSWORD"),
				IYSRate:                o.iysRate,
				IYSPullLag:             pullLag(o.iysPullLag),
				Limits:                 limits,
				Outages:                outages,
			})
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
			// Listening first: the address is announced only once it is ours.
			ln, err := net.Listen("tcp", o.addr)
			if err != nil {
				if errors.Is(err, syscall.EADDRINUSE) {
					return fmt.Errorf("sandbox: --addr %s is in use: stop what listens there, or give another --addr", o.addr)
				}
				if _, _, serr := net.SplitHostPort(o.addr); serr != nil {
					return usagef("sandbox: --addr %q is not an address to listen on: give HOST:PORT, e.g. 127.0.0.1:8025", o.addr)
				}
				var dnsErr *net.DNSError
				var addrErr *net.AddrError
				if errors.As(err, &dnsErr) || errors.As(err, &addrErr) {
					return usagef("sandbox: --addr %s: %v: give HOST:PORT of this machine, e.g. 127.0.0.1:8025", o.addr, err)
				}
				return fmt.Errorf("sandbox listen: %w", err)
			}
			defer ln.Close()
			fmt.Fprintf(a.stderr, "sandbox listening on http://%s (TWILIO_BASE_URL, NETGSM_BASE_URL, SENDGRID_BASE_URL, FCM_BASE_URL and IYS_BASE_URL=http://%s)\n", o.addr, o.addr)
			if o.sendgridEventURL != "" {
				fmt.Fprintf(a.stderr, "SendGrid events go to %s, signed with SENDGRID_WEBHOOK_PUBLIC_KEY=%s\n", o.sendgridEventURL, s.SendGridEventPublicKey())
			}
			if o.twilioInboundURL != "" {
				fmt.Fprintf(a.stderr, "Twilio incoming SMS (POST /_sandbox/twilio/inbound) go to %s, signed with TWILIO_AUTH_TOKEN\n", o.twilioInboundURL)
			}
			return sandbox.Serve(cmd.Context(), ln, s)
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
	f.StringVar(&o.twilioInboundURL, "twilio-inbound-url", "", "where to post the signed incoming SMS that POST /_sandbox/twilio/inbound makes up (loopback only; needs TWILIO_AUTH_TOKEN), e.g. http://127.0.0.1:8090/twilio/inbound")
	f.IntVar(&o.netgsmReports, "netgsm-reports-per-minute", 10, "report queries Netgsm answers in a minute, as Netgsm allows (code 80 beyond); 0 = no limit")
	f.IntVar(&o.netgsmPerNumber, "netgsm-per-number", 20, "messages one number takes from Netgsm within a minute, as Netgsm allows (code 85 beyond); 0 = no limit")
	f.Float64Var(&o.iysRate, "iys-rate", 10, "İYS requests per second per client, as İYS allows (real 429 H124 beyond); 0 = none")
	f.DurationVar(&o.iysPullLag, "iys-pull-lag", time.Hour, "how recent a consent change may be and still be left out of the İYS pull (İYS: 1h); 0 = none")
	f.StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's profiles at http://ADDR/debug/pprof/ on a loopback address (for benchmarks); empty: none")
	f.DurationVar(&o.receiptDelay, "receipt-delay", 200*time.Millisecond, "how long after acceptance delivery receipts are sent")
	f.StringArrayVar(&o.limits, "limit", nil, "API=R: a hidden limit of R requests in any one second, over it the provider's 429 without Retry-After (repeatable; API may be a comma-separated list or all)")
	f.StringArrayVar(&o.concurrency, "limit-concurrency", nil, "API=N: at most N requests in flight, the excess refused with the provider's 429 without Retry-After (repeatable)")
	f.StringArrayVar(&o.segments, "limit-segments", nil, "twilio=S: at most S SMS segments a second, the excess refused with 429 code 20429 without Retry-After")
	f.StringArrayVar(&o.outages, "outage", nil, "API=DURATION[@START][/MODE]: every request fails for DURATION from START (a duration after the start, or an RFC 3339 time; default now); MODE 503 (default), raw_503, reset or hang (repeatable)")
	return cmd
}

// pullLag maps the flag (0: list changes at once) to the sandbox option (negative: at once).
func pullLag(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
