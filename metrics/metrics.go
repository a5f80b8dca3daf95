// Package metrics is the worker's Prometheus instrumentation: what was sent through which provider and
// how it ended, how long provider calls and rate-limit waits take, the duplicate sends the claims
// prevented, the retries, each running campaign's progress and Asynq's queues. Everything lives on a
// registry of its own (never the global default), served by `campaignctl worker --metrics-addr` at
// /metrics next to /healthz and /readyz.
//
// The hot path costs no allocation: a batch run resolves its provider's label children once (For) and
// every send only adds to counters and observes histograms. Every method is safe on a nil *Metrics or
// *Sends, so a worker without --metrics-addr runs the same code and records nothing.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	asynqmetrics "github.com/hibiken/asynq/x/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// Namespace prefixes every metric of campaignctl's own.
const Namespace = "campaignctl"

// Outcomes counted by campaignctl_sends_total, one per message: what a provider call answered for it, or
// how it was settled without one.
const (
	// OutcomeSent: the provider accepted the message.
	OutcomeSent = "sent"
	// OutcomeFailed: the provider refused the recipient for good (invalid number, opted out), or the
	// message could not be rendered.
	OutcomeFailed = "failed"
	// OutcomeUnknown: the request was written but its answer was lost (the message may have gone out), or
	// the recipient was taken over from a run that died after Redis lost its data.
	OutcomeUnknown = "unknown"
	// OutcomeSkipped: not sent (consent revoked, frequency cap, campaign cancelled).
	OutcomeSkipped = "skipped"
	// OutcomeRetried: a transient answer (429, 5xx, transport error); nothing was accepted and the
	// message is tried again (in place, or by a later run).
	OutcomeRetried = "retried"
	// OutcomeAccountError: the provider refused the account rather than the recipient (bad credentials,
	// a sender the account may not use); the batch waits for an operator.
	OutcomeAccountError = "account_error"
	// OutcomeSplit: a request of many (SendGrid) refused as a whole; it is split in halves to find the
	// recipient at fault, and its messages are counted again in the halves.
	OutcomeSplit = "split"
)

// Reasons of campaignctl_retries_total.
const (
	Reason429       = "429"       // rate limited (HTTP 429, Twilio 20429)
	Reason5xx       = "5xx"       // server error
	ReasonTransport = "transport" // no HTTP answer: connection refused, reset before the request was written
	ReasonOther     = "other"     // any other transient answer
)

// Key kinds of campaignctl_limiter_wait_seconds.
const (
	KindProvider = "provider" // the provider-wide cap (TWILIO_RATE, ...) and its shared pause after a 429
	KindCampaign = "campaign" // the campaign's --rate
)

// reasons in the order of reasonIndex.
var reasons = [4]string{Reason429, Reason5xx, ReasonTransport, ReasonOther}

// Metrics holds the worker's collectors and their registry. The zero value is not usable: call New. A nil
// *Metrics records nothing.
type Metrics struct {
	reg      *prometheus.Registry
	log      *slog.Logger
	sends    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	messages *prometheus.HistogramVec
	wait     *prometheus.HistogramVec
	refused  prometheus.Counter
	retries  *prometheus.CounterVec
	pace     *prometheus.GaugeVec
	down     *prometheus.GaugeVec
	moves    *prometheus.CounterVec

	mu sync.Mutex
	by map[[2]string]*Sends
}

// New returns the worker's metrics on a registry of their own, with the Go runtime and process
// collectors. log receives scrape errors (nil: discarded).
func New(log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		log: log,
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "sends_total",
			Help: "Messages by provider, channel and outcome: sent, failed, unknown, skipped, retried (transient answer), account_error, split (a request of many refused as a whole).",
		}, []string{"provider", "channel", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "provider_request_duration_seconds",
			Help:    "Duration of provider calls, one observation per call (per message for Twilio, FCM and webhook, per request for SendGrid), whatever the answer.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"provider"}),
		messages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "provider_request_messages",
			Help:    "Messages per request of providers that take many in one request (SendGrid); _sum/_count is the mean request size.",
			Buckets: []float64{1, 10, 50, 100, 250, 500, 1000},
		}, []string{"provider"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "limiter_wait_seconds",
			Help:    "Time spent taking rate-limit tokens before a provider call (Redis round trips and sleeps, a provider's shared pause included), by kind of limit (provider, campaign) and provider.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"key_kind", "provider"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "claims_refused_total",
			Help: "Sends not made because the recipient's claim (sent:<campaign>:<user>) was already taken: duplicate sends prevented (redelivered batches, another run of the same batch).",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "retries_total",
			Help: "Provider calls answered transiently (nothing accepted, tried again), by provider and reason: 429, 5xx, transport, other.",
		}, []string{"provider", "reason"}),
		pace: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "provider_pace_per_second",
			Help: "The rate this worker paces its sends to a provider at, shared by every worker: the configured cap, lower while the provider pushes back (0: neither, no pace). Every worker reports the same figure: aggregate with max.",
		}, []string{"provider"}),
		down: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "provider_down",
			Help: "1 while the provider fails nearly every request (only a probe a second goes to it, over every worker), else 0.",
		}, []string{"provider"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "provider_pace_changes_total",
			Help: "Moves of a provider's shared pace, each counted by the one worker whose answers caused it (aggregate with sum): lowered, at_cap (back at the cap), down, up, paused (most 429s carried Retry-After).",
		}, []string{"provider", "event"}),
		by: map[[2]string]*Sends{},
	}
	m.reg.MustRegister(m.sends, m.duration, m.messages, m.wait, m.refused, m.retries, m.pace, m.down, m.moves,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Pace records the pace in force for provider and whether it is down, and counts event (a move of the
// pace, "" for none).
func (m *Metrics) Pace(provider string, rate float64, down bool, event string) {
	if m == nil {
		return
	}
	m.pace.WithLabelValues(provider).Set(rate)
	d := 0.0
	if down {
		d = 1
	}
	m.down.WithLabelValues(provider).Set(d)
	if event != "" {
		m.moves.WithLabelValues(provider, event).Inc()
	}
}

// Registry is the registry every collector of m is on.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Sends is the label children of one provider and channel, resolved once. A nil *Sends records nothing.
type Sends struct {
	// sends_total by outcome
	sent, failed, unknown, skipped, retried, accountError, split prometheus.Counter
	duration, messages                                           prometheus.Observer
	retry                                                        [4]prometheus.Counter // by reasonIndex
	refused                                                      prometheus.Counter
	waitProvider, waitCampaign                                   prometheus.Observer
}

// For returns the label children of provider and channel (created at zero on first use, so every outcome
// is exported from the start). Call it once per batch run, not per send.
func (m *Metrics) For(provider, channel string) *Sends {
	if m == nil {
		return nil
	}
	if provider == "" {
		provider = "none"
	}
	k := [2]string{provider, channel}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.by[k]; ok {
		return s
	}
	c := func(outcome string) prometheus.Counter { return m.sends.WithLabelValues(provider, channel, outcome) }
	s := &Sends{
		sent: c(OutcomeSent), failed: c(OutcomeFailed), unknown: c(OutcomeUnknown), skipped: c(OutcomeSkipped),
		retried: c(OutcomeRetried), accountError: c(OutcomeAccountError), split: c(OutcomeSplit),
		duration:     m.duration.WithLabelValues(provider),
		messages:     m.messages.WithLabelValues(provider),
		refused:      m.refused,
		waitProvider: m.wait.WithLabelValues(KindProvider, provider),
		waitCampaign: m.wait.WithLabelValues(KindCampaign, provider),
	}
	for i, r := range reasons {
		s.retry[i] = m.retries.WithLabelValues(provider, r)
	}
	m.by[k] = s
	return s
}

// Sent counts n messages the provider accepted.
func (s *Sends) Sent(n int) {
	if s != nil {
		s.sent.Add(float64(n))
	}
}

// Failed counts n messages refused for good.
func (s *Sends) Failed(n int) {
	if s != nil {
		s.failed.Add(float64(n))
	}
}

// Unknown counts n messages whose answer was lost.
func (s *Sends) Unknown(n int) {
	if s != nil {
		s.unknown.Add(float64(n))
	}
}

// Skipped counts n recipients settled without a send.
func (s *Sends) Skipped(n int) {
	if s != nil {
		s.skipped.Add(float64(n))
	}
}

// AccountError counts n messages of a call the provider refused for the account's sake.
func (s *Sends) AccountError(n int) {
	if s != nil {
		s.accountError.Add(float64(n))
	}
}

// Split counts the n messages of a request of many refused as a whole, about to be split.
func (s *Sends) Split(n int) {
	if s != nil {
		s.split.Add(float64(n))
	}
}

// Retried counts one provider call of n messages answered transiently with HTTP status (0: no answer)
// and provider code: n messages under sends_total{outcome="retried"}, one call under retries_total.
func (s *Sends) Retried(n, status, code int) {
	if s == nil {
		return
	}
	s.retried.Add(float64(n))
	s.retry[reasonIndex(status, code)].Inc()
}

// RetryReason is the retries_total reason of a transient answer with HTTP status (0: none) and provider
// code.
func RetryReason(status, code int) string { return reasons[reasonIndex(status, code)] }

func reasonIndex(status, code int) int {
	switch {
	case status == 429 || code == 20429:
		return 0
	case status >= 500:
		return 1
	case status == 0:
		return 2
	}
	return 3
}

// Request observes one provider call that took d.
func (s *Sends) Request(d time.Duration) {
	if s != nil {
		s.duration.Observe(d.Seconds())
	}
}

// BatchRequest observes one request of n messages (a provider that takes many) that took d.
func (s *Sends) BatchRequest(d time.Duration, n int) {
	if s != nil {
		s.duration.Observe(d.Seconds())
		s.messages.Observe(float64(n))
	}
}

// ClaimsRefused counts n sends not made because their claims were already taken.
func (s *Sends) ClaimsRefused(n int) {
	if s != nil && n > 0 {
		s.refused.Add(float64(n))
	}
}

// ProviderWait is the observer of waits for the provider-wide limit (nil for a nil s).
func (s *Sends) ProviderWait() prometheus.Observer {
	if s == nil {
		return nil
	}
	return s.waitProvider
}

// CampaignWait is the observer of waits for the campaign's limit (nil for a nil s).
func (s *Sends) CampaignWait() prometheus.Observer {
	if s == nil {
		return nil
	}
	return s.waitCampaign
}

// WatchQueues adds Asynq's queue metrics (asynq_queue_size, asynq_tasks_enqueued_total{state},
// asynq_queue_latency_seconds, asynq_tasks_processed_total, ...) read from rdb at scrape time, through
// asynq/x/metrics over an asynq.Inspector.
func (m *Metrics) WatchQueues(rdb redis.UniversalClient) error {
	if m == nil {
		return nil
	}
	return m.reg.Register(bounded(asynqmetrics.NewQueueMetricsCollector(asynq.NewInspectorFromRedisClient(rdb)), scrapeReadTimeout,
		prometheus.NewDesc("asynq_queue_metrics", "Asynq's queue metrics, read from Redis at scrape time.", nil, nil)))
}

// scrapeReadTimeout bounds each read at a scrape time (Asynq's queue metrics, the campaigns' progress):
// with Redis stalled, each of the queue metrics' reads waited for the client's timeout, and the scrape took
// 10 s, Prometheus's default scrape timeout, losing the worker's own metrics with it.
const scrapeReadTimeout = 3 * time.Second

// boundedCollector is a collector that reads at scrape time, given at most timeout: past it, the scrape
// goes on without its metrics, and with an error that says so (the registry's handler serves the rest).
type boundedCollector struct {
	prometheus.Collector
	timeout time.Duration
	desc    *prometheus.Desc
}

func bounded(c prometheus.Collector, timeout time.Duration, desc *prometheus.Desc) prometheus.Collector {
	return boundedCollector{Collector: c, timeout: timeout, desc: desc}
}

func (c boundedCollector) Collect(ch chan<- prometheus.Metric) {
	var got []prometheus.Metric
	done := make(chan struct{})
	go func() {
		defer close(done)
		inner := make(chan prometheus.Metric, 16)
		go func() { c.Collector.Collect(inner); close(inner) }()
		for m := range inner {
			got = append(got, m)
		}
	}()
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case <-done:
		for _, m := range got {
			ch <- m
		}
	case <-t.C:
		ch <- prometheus.NewInvalidMetric(c.desc, fmt.Errorf("not read within %v (Redis slow or away): left out of this scrape", c.timeout))
	}
}

// ValidateAddr checks a --metrics-addr value: host:port (host may be empty for every interface) with a
// port from 0 to 65535.
func ValidateAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (e.g. 127.0.0.1:9090): %v", addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || port == "" {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	} else if p > 65535 {
		return fmt.Errorf("%q: port %d is out of range", addr, p)
	}
	for _, r := range host {
		if r == '/' || r == ' ' || r == '?' || r == '#' {
			return fmt.Errorf("%q: %q is not a host name or IP address", addr, host)
		}
	}
	return nil
}

// Handler serves /metrics (the registry, in any format Prometheus asks for), /healthz (200 while the
// process serves: liveness) and /readyz (200 when ready returns nil, 503 with its error otherwise;
// ready may be nil).
func (m *Metrics) Handler(ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// A collector that cannot read Redis or Postgres must not hide the others.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      promLogger{m.log},
		Registry:      m.reg,
		Timeout:       20 * time.Second,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
			defer cancel()
			if err := ready(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, "not ready:", err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// promLogger routes promhttp's error log into slog.
type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) { p.l.Warn(fmt.Sprint(v...), "component", "metrics") }

// Serve serves h on ln until ctx ends, then shuts down, giving scrapes in flight up to 5 s.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
