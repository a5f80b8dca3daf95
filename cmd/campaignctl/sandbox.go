package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

type sandboxOptions struct {
	addr       string
	latency    time.Duration
	faults     sandbox.Faults
	twilioRate float64
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
	if o.twilioRate < 0 {
		return usagef("--twilio-rate %v: give requests per second, or 0 for no cap", o.twilioRate)
	}
	return nil
}

func (a *app) newSandboxCmd() *cobra.Command {
	var o sandboxOptions
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run a local imitation of the provider APIs (Twilio Messages) with fault injection",
		Long: `Run a local imitation of Twilio's Messages API on --addr, for demos and tests.

Point the workers at it with TWILIO_BASE_URL=http://ADDR. It accepts the credentials in
TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN (any alphanumeric pair when they are unset), answers as Twilio
does, and records every accepted message: GET /_sandbox/messages, GET /_sandbox/stats,
POST /_sandbox/faults (JSON, e.g. {"rate_503":0.05}), POST /_sandbox/reset.

Magic numbers fail permanently with Twilio's code: +905550021211 (invalid), +905550021610 (opted out),
+905550021614 (not mobile), +905550021408, +905550021606, +905550021635.`,
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
				Latency:          o.latency,
				Faults:           o.faults,
				TwilioRate:       o.twilioRate,
				Logger:           log,
			})
			fmt.Fprintf(a.stderr, "sandbox listening on http://%s (Twilio: TWILIO_BASE_URL=http://%s)\n", o.addr, o.addr)
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
	f.Float64Var(&o.twilioRate, "twilio-rate", 0, "server-side cap in requests per second per account (real 429s); 0 = none")
	return cmd
}
