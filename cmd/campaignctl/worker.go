package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers/twilio"
	"github.com/campaignctl/campaignctl/worker"
)

type workerOptions struct {
	concurrency int
	shutdown    time.Duration
	recordWait  time.Duration
	timeout     time.Duration
	metricsAddr string
	pprofAddr   string
	memoryMiB   int
}

func (o *workerOptions) validate() error {
	if o.concurrency < 1 || o.concurrency > 1000 {
		return usagef("--concurrency %d: give 1 to 1000 batches at once", o.concurrency)
	}
	if o.timeout < 100*time.Millisecond || o.timeout > 5*time.Minute {
		return usagef("--provider-timeout %v: give 100ms to 5m, e.g. --provider-timeout 10s", o.timeout)
	}
	if o.shutdown < time.Second || o.shutdown > time.Hour {
		return usagef("--shutdown-timeout %v: give 1s to 1h, e.g. --shutdown-timeout 30s (the in-flight sends finish and their outcomes are written within it)", o.shutdown)
	}
	if o.recordWait < time.Second || o.recordWait > time.Hour {
		return usagef("--record-wait %v: give 1s to 1h, e.g. --record-wait 2m (how long a run holds its outcomes while Postgres cannot take them)", o.recordWait)
	}
	if o.metricsAddr != "" {
		if err := metrics.ValidateAddr(o.metricsAddr); err != nil {
			return usagef("--metrics-addr %v", err)
		}
	}
	if o.memoryMiB < 0 || o.memoryMiB > 1<<20 {
		return usagef("--memory-limit %d: give MiB (e.g. 80), or 0 for none", o.memoryMiB)
	}
	if o.pprofAddr != "" {
		if err := metrics.ValidateAddr(o.pprofAddr); err != nil {
			return usagef("--pprof-addr %v", err)
		}
		if host, _, _ := net.SplitHostPort(o.pprofAddr); !isLoopbackHost(host) {
			return usagef("--pprof-addr %s: profiles show the process's memory; bind them to a loopback address, e.g. 127.0.0.1:6060", o.pprofAddr)
		}
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
  sms      TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, TWILIO_FROM [TWILIO_BASE_URL, TWILIO_STATUS_CALLBACK, TWILIO_RATE]
           and/or NETGSM_USERCODE, NETGSM_PASSWORD, NETGSM_HEADER [NETGSM_BASE_URL, NETGSM_RATE]: with both,
           Netgsm is the failover: a message Twilio refuses without accepting it (5xx, no connection, the
           account) goes through Netgsm at once, and after 3 such refusals in a row Twilio is left alone for
           5 s, then tried again (30 s after an account refusal); never after a timeout (Twilio may have
           sent it), nor after a 429 unless Twilio is down by every worker's answers (the shared pace slows
           Twilio instead)
  email    SENDGRID_API_KEY, SENDGRID_FROM [SENDGRID_FROM_NAME, SENDGRID_BASE_URL, SENDGRID_RATE]; commercial
           e-mail also WEBHOOKS_PUBLIC_URL and UNSUBSCRIBE_SECRET (each message's signed one-click unsubscribe
           link, served by campaignctl webhooks) [UNSUBSCRIBE_MAILTO: a mailbox the header offers too]
  push     GOOGLE_APPLICATION_CREDENTIALS [FCM_PROJECT_ID, FCM_BASE_URL, FCM_RATE]
  webhook  WEBHOOK_URL, WEBHOOK_SECRET [WEBHOOK_RATE]

Push and webhook opt-ins are read again at send time: the worker runs the campaign's audience query for
each chunk's users on AUDIENCE_DATABASE_URL (default: the engine database), as the launch did.`,
		Example: `  campaignctl worker --concurrency 16
  TWILIO_RATE=50 campaignctl worker --provider-timeout 5s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			log := a.logger()
			applyMemoryLimit(o.memoryMiB, cmd.Flags().Changed("memory-limit"), log)
			// Each batch run has up to a window of one-message sends out at once.
			set, err := a.providers(sendOpts{timeout: o.timeout, conns: o.concurrency * worker.DefaultSendWindow})
			if err != nil {
				return err
			}
			a.engineConns = worker.EngineConns
			svc, err := a.openServices(ctx, 0)
			if err != nil {
				return err
			}
			defer svc.Close()
			var m *metrics.Metrics
			if o.metricsAddr != "" {
				var stop func()
				if m, stop, err = serveMetrics(ctx, o.metricsAddr, svc, log); err != nil {
					return err
				}
				// Served until the worker has stopped: a graceful shutdown stays observable.
				defer stop()
			}
			if o.pprofAddr != "" {
				stop, err := servePprof(ctx, o.pprofAddr, log)
				if err != nil {
					return err
				}
				defer stop()
			}
			signer, err := a.unsubscribeSigner()
			if err != nil {
				return err
			}
			mailto, err := a.unsubscribeMailto()
			if err != nil {
				return err
			}
			if signer == nil && set.primary[campaign.ChannelEmail] != nil {
				log.Warn("this worker sends no commercial e-mail (its batches wait for a worker that can): set WEBHOOKS_PUBLIC_URL and UNSUBSCRIBE_SECRET to sign their one-click unsubscribe links")
			}
			owner := state.LocalOwner()
			live := worker.NewLiveness(svc.engine, log)
			// Push and webhook opt-ins are read again from the audience at send time, on a pool of their
			// own: it connects when a campaign first needs it, and never takes the engine's few connections.
			acfg, err := poolConfig(a.audienceDBURL(), a.audienceDBName(), 4)
			if err != nil {
				return err
			}
			audience, err := pgxpool.NewWithConfig(ctx, acfg)
			if err != nil {
				return fmt.Errorf("postgres: %w", err)
			}
			defer audience.Close()
			h := worker.NewHandler(worker.Config{
				OptIns:            &campaign.OptIns{Pool: audience},
				Unsubscribe:       signer,
				UnsubscribeMailto: mailto,
				Store:             svc.store,
				Redis:             svc.redis,
				Providers:         set.primary,
				Fallback:          set.fallback,
				ProviderRates:     set.rates,
				Logger:            log,
				Owner:             owner,
				Liveness:          live,
				// A chunk's lease and an unanswered claim must outlive the slowest provider call.
				LeaseTTL:      3 * o.timeout,
				InFlightGrace: 3 * o.timeout,
				RecordWait:    o.recordWait,
				Metrics:       m,
			})
			channels := make([]string, 0, len(set.primary))
			for ch, p := range set.primary {
				desc := fmt.Sprintf("%s=%s (%s)", ch, p.Name(), capText(set.rates[p.Name()]))
				if fb := set.fallback[ch]; fb != nil {
					desc += fmt.Sprintf(", failing over to %s (%s)", fb.Name(), capText(set.rates[fb.Name()]))
				}
				channels = append(channels, desc)
			}
			slices.Sort(channels)
			// The heartbeat notes the in-flight grace for resume --resend-unknown, at start and every beat after,
			// so that it outlives a Redis that lost its data.
			info := state.WorkerInfo{Owner: owner, Providers: map[string]string{}, Commercial: map[string]bool{}, InFlightGrace: 3 * o.timeout,
				Holder: live.Key()}
			for ch, p := range set.primary {
				info.Providers[string(ch)] = p.Name()
				info.Commercial[string(ch)] = !ch.Spec().Unsubscribe || signer != nil
			}
			beat, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
			beatDone := make(chan struct{})
			go func() { defer close(beatDone); worker.Heartbeat(beat, svc.redis, info, h.NoteFailover) }()
			defer func() { stopBeat(); <-beatDone }()
			log.Info("worker started", "concurrency", o.concurrency, "providers", strings.Join(channels, ", "), "pid", os.Getpid())
			err = worker.Serve(ctx, svc.redis, h, worker.ServerConfig{Concurrency: o.concurrency, ShutdownTimeout: o.shutdown, Logger: log})
			log.Info("worker stopped")
			return err
		},
	}
	cmd.Flags().IntVar(&o.concurrency, "concurrency", 16, "batches this process sends at once")
	cmd.Flags().IntVar(&o.memoryMiB, "memory-limit", 64, "soft limit of the Go heap in MiB: the garbage collector works harder near it (GOMEMLIMIT, when set, wins unless this flag is given); 0: none")
	cmd.Flags().StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's profiles (net/http/pprof) at http://ADDR/debug/pprof/ on a loopback address, e.g. 127.0.0.1:6060; empty: none")
	cmd.Flags().DurationVar(&o.timeout, "provider-timeout", twilio.DefaultTimeout, "how long one provider request may take; a chunk whose worker died is taken over after 3 times this")
	cmd.Flags().DurationVar(&o.shutdown, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight batches may finish before the rest is handed back")
	cmd.Flags().DurationVar(&o.recordWait, "record-wait", worker.DefaultRecordWait, "how long a run holds its chunk's outcomes while Postgres cannot take them (a restart, a failover) before it leaves them to the claims in Redis")
	cmd.Flags().StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (with /healthz and /readyz), e.g. 127.0.0.1:9090; empty: none")
	return cmd
}

// serveMetrics listens on addr and serves the worker's metrics there (campaignctl_*, Asynq's queues, the
// progress of running campaigns, Go and process metrics) until stop is called.
func serveMetrics(ctx context.Context, addr string, svc *services, log *slog.Logger) (*metrics.Metrics, func(), error) {
	m := metrics.New(log)
	if err := m.WatchQueues(svc.redis); err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	if err := m.WatchCampaigns(svc.engine, svc.redis, worker.ProgressKey); err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	if err := m.WatchOutbox(svc.engine); err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr %s: cannot listen: %w", addr, err)
	}
	ready := worker.Ready(svc.redis, svc.engine)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(sctx, ln, m.Handler(ready)); err != nil {
			log.Error("metrics server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("metrics served", "url", "http://"+ln.Addr().String()+"/metrics")
	return m, func() { cancel(); <-done }, nil
}

// servePprof serves Go's profiles (CPU, heap, goroutines, …) at http://addr/debug/pprof/ until stop is
// called, for `go tool pprof` and scripts/bench.sh --profile.
func servePprof(ctx context.Context, addr string, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr %s: cannot listen: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(sctx, ln, mux); err != nil {
			log.Error("pprof server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("profiles served", "url", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() { cancel(); <-done }, nil
}

// applyMemoryLimit sets the Go runtime's soft memory limit to mib MiB (0: none), unless GOMEMLIMIT is set
// and the flag was not given. Under the limit, the collector runs half as often as Go's default
// (GOGC=200, unless GOGC is set): a worker trades a little memory it is allowed for CPU.
func applyMemoryLimit(mib int, given bool, log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" && !given {
		return
	}
	if mib == 0 {
		debug.SetMemoryLimit(math.MaxInt64)
		return
	}
	debug.SetMemoryLimit(int64(mib) << 20)
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	log.Debug("memory limit", "mib", mib)
}

// capText says a provider's cap for the worker's start log: "100/s", or "no cap" for 0.
func capText(rate float64) string {
	if rate <= 0 {
		return "no cap"
	}
	return fmt.Sprintf("%g/s", rate)
}
