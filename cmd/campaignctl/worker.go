package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers/twilio"
	"github.com/campaignctl/campaignctl/worker"
)

type workerOptions struct {
	concurrency int
	shutdown    time.Duration
	timeout     time.Duration
}

func (o *workerOptions) validate() error {
	if o.concurrency < 1 || o.concurrency > 1000 {
		return usagef("--concurrency %d: give 1 to 1000 batches at once", o.concurrency)
	}
	if o.timeout < 100*time.Millisecond || o.timeout > 5*time.Minute {
		return usagef("--provider-timeout %v: give 100ms to 5m, e.g. --provider-timeout 10s", o.timeout)
	}
	return nil
}

func (a *app) newWorkerCmd() *cobra.Command {
	var o workerOptions
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run one worker process: take batches from the queue and send them",
		Long: `Run one worker process. Run as many as you like, on as many machines: the rate caps
(TWILIO_RATE and each campaign's --rate) hold over all of them together.

A worker sends the channels whose provider is configured:
  sms    TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, TWILIO_FROM [TWILIO_BASE_URL, TWILIO_STATUS_CALLBACK, TWILIO_RATE]
  email  SENDGRID_API_KEY, SENDGRID_FROM [SENDGRID_FROM_NAME, SENDGRID_BASE_URL, SENDGRID_RATE]
  push     GOOGLE_APPLICATION_CREDENTIALS [FCM_PROJECT_ID, FCM_BASE_URL, FCM_RATE]
  webhook  WEBHOOK_URL, WEBHOOK_SECRET [WEBHOOK_RATE]`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			log := a.logger()
			provs, rates, err := a.providers(o.timeout)
			if err != nil {
				return err
			}
			engine, rdb, closeAll, err := a.openServices(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			host, _ := os.Hostname()
			h := worker.NewHandler(worker.Config{
				Store:         campaign.NewStore(engine),
				Redis:         rdb,
				Providers:     provs,
				ProviderRates: rates,
				Logger:        log,
				Owner:         fmt.Sprintf("%s:%d", host, os.Getpid()),
				// A chunk's lease and an unanswered claim must outlive the slowest provider call.
				LeaseTTL:      3 * o.timeout,
				InFlightGrace: 3 * o.timeout,
			})
			channels := make([]string, 0, len(provs))
			for ch, p := range provs {
				channels = append(channels, fmt.Sprintf("%s=%s (%g/s)", ch, p.Name(), rates[p.Name()]))
			}
			slices.Sort(channels)
			log.Info("worker started", "concurrency", o.concurrency, "providers", strings.Join(channels, ", "), "pid", os.Getpid())
			err = worker.Serve(ctx, rdb, h, worker.ServerConfig{Concurrency: o.concurrency, ShutdownTimeout: o.shutdown, Logger: log})
			log.Info("worker stopped")
			return err
		},
	}
	cmd.Flags().IntVar(&o.concurrency, "concurrency", 16, "batches this process sends at once")
	cmd.Flags().DurationVar(&o.timeout, "provider-timeout", twilio.DefaultTimeout, "how long one provider request may take; a chunk whose worker died is taken over after 3 times this")
	cmd.Flags().DurationVar(&o.shutdown, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight batches may finish before the rest is handed back")
	return cmd
}
