package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/providers"
)

// withMetrics gives the fixture's handler a metrics registry of its own.
func (f *fixture) withMetrics(t *testing.T, edit func(*Config)) *metrics.Metrics {
	t.Helper()
	m := metrics.New(nil)
	cfg := Config{Store: f.store, Redis: f.rdb, Owner: "test", Metrics: m,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider},
		ProviderRates: map[string]float64{}}
	if edit != nil {
		edit(&cfg)
	}
	f.h = NewHandler(cfg)
	return m
}

// metric returns the series of family name with the given labels, or nil when it is not exported.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
	next:
		for _, m := range fam.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// histogram returns the sample count and sum of the histogram family name with the given labels.
func histogram(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	m := metric(t, reg, name, labels)
	if m == nil {
		t.Fatalf("no %s%v in the registry", name, labels)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// value returns the counter or gauge of family name with the given labels (0 when it is not exported).
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := metric(t, reg, name, labels)
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k {
			return l.GetValue() == v
		}
	}
	return false
}

// One SMS campaign with every kind of outcome: each counter ends at exactly the number of messages that
// met it, and every provider call is one latency observation.
func TestMetricsCountEveryOutcomeOfABatch(t *testing.T) {
	t.Parallel()
	// 30 customers, 16 eligible: u1 u2 u4 u7 u8 u11 u13 u14 u16 u17 u19 u22 u23 u26 u28 u29.
	f := plan(t, 30)
	m := f.withMetrics(t, nil)
	// u1 answers RET after the launch: skipped (revoked), no provider call.
	if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = $1`, phone(1)); err != nil {
		t.Fatal(err)
	}
	tries := map[string]int{}
	f.provider.fail = func(_ int, msg providers.Message) error {
		tries[msg.To]++
		switch msg.To {
		case phone(2): // refused for good
			return &providers.Error{Provider: "test", Status: 400, Code: 21610, Message: "opted out", Class: providers.Permanent}
		case phone(4): // answer lost
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		case phone(7): // two 503s, then accepted
			if tries[msg.To] <= 2 {
				return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient}
			}
		case phone(8): // one 429, then accepted
			if tries[msg.To] == 1 {
				return &providers.Error{Provider: "test", Status: 429, Code: 20429, RetryAfter: 10 * time.Millisecond, Class: providers.Transient}
			}
		case phone(11): // connection refused, then accepted
			if tries[msg.To] == 1 {
				return &providers.Error{Provider: "test", Class: providers.Transient, Err: errors.New("dial tcp: connection refused")}
			}
		}
		return nil
	}
	f.runAll(t)
	if got := f.provider.total(); got != 14 { // 13 sent + u4, accepted but unanswered
		t.Fatalf("provider accepted %d, want 14", got)
	}

	want := `
# HELP campaignctl_sends_total Messages by provider, channel and outcome: sent, failed, unknown, skipped, retried (transient answer), account_error, split (a request of many refused as a whole).
# TYPE campaignctl_sends_total counter
campaignctl_sends_total{channel="sms",outcome="account_error",provider="test"} 0
campaignctl_sends_total{channel="sms",outcome="failed",provider="test"} 1
campaignctl_sends_total{channel="sms",outcome="retried",provider="test"} 4
campaignctl_sends_total{channel="sms",outcome="sent",provider="test"} 13
campaignctl_sends_total{channel="sms",outcome="skipped",provider="test"} 1
campaignctl_sends_total{channel="sms",outcome="split",provider="test"} 0
campaignctl_sends_total{channel="sms",outcome="unknown",provider="test"} 1
# HELP campaignctl_retries_total Provider calls answered transiently (nothing accepted, tried again), by provider and reason: 429, 5xx, transport, other.
# TYPE campaignctl_retries_total counter
campaignctl_retries_total{provider="test",reason="429"} 1
campaignctl_retries_total{provider="test",reason="5xx"} 2
campaignctl_retries_total{provider="test",reason="other"} 0
campaignctl_retries_total{provider="test",reason="transport"} 1
# HELP campaignctl_claims_refused_total Sends not made because the recipient's claim (sent:<campaign>:<user>) was already taken: duplicate sends prevented (redelivered batches, another run of the same batch).
# TYPE campaignctl_claims_refused_total counter
campaignctl_claims_refused_total 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"campaignctl_sends_total", "campaignctl_retries_total", "campaignctl_claims_refused_total"); err != nil {
		t.Fatal(err)
	}
	// 19 provider calls: 13 accepted, 1 refused, 1 unanswered, 4 transient.
	n, sum := histogram(t, m.Registry(), "campaignctl_provider_request_duration_seconds", map[string]string{"provider": "test"})
	if n != 19 || sum <= 0 {
		t.Fatalf("provider latency: %d observations (sum %v), want 19", n, sum)
	}
	// One wait for the provider's (pausable) limit before each of the 19 calls (its pause is read even
	// without a cap, by the claim script). The campaign has no --rate: nothing to wait for, nothing observed.
	n, sum = histogram(t, m.Registry(), "campaignctl_limiter_wait_seconds", map[string]string{"key_kind": "provider", "provider": "test"})
	if n != 19 || sum <= 0 {
		t.Fatalf("provider limiter waits: %d observations (sum %vs), want 19", n, sum)
	}
	if n, _ := histogram(t, m.Registry(), "campaignctl_limiter_wait_seconds", map[string]string{"key_kind": "campaign"}); n != 0 {
		t.Fatalf("campaign limiter waits: %d observations for a campaign without --rate", n)
	}
	// A batch provider's request size is not observed for a provider that sends one message a call.
	if n, _ := histogram(t, m.Registry(), "campaignctl_provider_request_messages", map[string]string{"provider": "test"}); n != 0 {
		t.Fatalf("request sizes observed for a single-message provider: %d", n)
	}
	// The counters agree with Postgres.
	c := f.counts(t)
	if c.Sent != 13 || c.Failed != 1 || c.Unknown != 1 || c.Skipped != 1 {
		t.Fatalf("Postgres counts %+v", c)
	}
}

// A redelivered batch finds every claim taken: nothing is sent again, and each prevented duplicate is
// counted.
func TestMetricsClaimsRefusedOnARedeliveredBatch(t *testing.T) {
	t.Parallel()
	f := plan(t, 30) // 16 eligible
	m := f.withMetrics(t, nil)
	f.runAll(t)
	sends := m.Registry()
	sent := map[string]string{"provider": "test", "channel": "sms", "outcome": "sent"}
	if got := value(t, sends, "campaignctl_sends_total", sent); got != 16 {
		t.Fatalf("sent %v, want 16", got)
	}
	refused := func() float64 { return value(t, sends, "campaignctl_claims_refused_total", nil) }
	if n := refused(); n != 0 {
		t.Fatalf("claims refused after a first delivery: %v", n)
	}
	calls, _ := histogram(t, sends, "campaignctl_provider_request_duration_seconds", map[string]string{"provider": "test"})

	// Postgres forgets the outcomes (a crash before the bulk write) and every batch is delivered again.
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `UPDATE campaign_recipients SET status = 'pending' WHERE campaign_id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, `UPDATE campaigns SET state = 'running' WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if n := refused(); n != 16 {
		t.Fatalf("claims refused on redelivery: %v, want 16", n)
	}
	if got := value(t, sends, "campaignctl_sends_total", sent); got != 16 || f.provider.total() != 16 {
		t.Fatalf("after redelivery: sends_total{sent} %v, provider %d; want 16 and 16", got, f.provider.total())
	}
	if again, _ := histogram(t, sends, "campaignctl_provider_request_duration_seconds", map[string]string{"provider": "test"}); again != calls {
		t.Fatalf("provider calls went from %d to %d on a redelivery", calls, again)
	}
}

// A campaign with --rate waits for its own bucket: the campaign limiter histogram is observed, by provider
// and never by campaign ID.
func TestMetricsCampaignRateWaits(t *testing.T) {
	t.Parallel()
	f := planWith(t, 10, func(s *campaign.Spec) { s.Rate = 20 }) // 5 eligible at 20/s
	m := f.withMetrics(t, nil)
	f.runAll(t)
	n, sum := histogram(t, m.Registry(), "campaignctl_limiter_wait_seconds", map[string]string{"key_kind": "campaign", "provider": "test"})
	if n != 5 || sum < 0.1 {
		t.Fatalf("campaign limiter: %d waits summing to %vs, want 5 adding up to about 0.2 s (5 at 20/s, burst 1)", n, sum)
	}
}

// A provider that takes many recipients a request: one latency observation per request, the size of each
// request, and the request refused as a whole counted as split.
func TestMetricsBatchProviderRequests(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	seedEmailAudience(t, db, "example.com")
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{
		Name: "mail", Channel: campaign.ChannelEmail, CodePool: "p",
		AudienceSQL: `SELECT user_id, email, first_name FROM customers`,
		Subject:     `{{.first_name}}`, Message: `Kodunuz {{.code}}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &batchProvider{max: 4, accepted: map[string][]providers.Message{}}
	m := metrics.New(nil)
	h := NewHandler(Config{Store: campaign.NewStore(db), Redis: rdb, Owner: "test", Metrics: m, Unsubscribe: testSigner,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p}, ProviderRates: map[string]float64{"batch": 1000}})
	if err := h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	// Requests of 4 ok, 4 refused -> 2 ok, 2 refused -> 1 ok, 1 failed; 2 ok: 7 requests of 16 messages.
	if len(p.requests) != 7 {
		t.Fatalf("%d requests, want 7", len(p.requests))
	}
	want := `
# HELP campaignctl_sends_total Messages by provider, channel and outcome: sent, failed, unknown, skipped, retried (transient answer), account_error, split (a request of many refused as a whole).
# TYPE campaignctl_sends_total counter
campaignctl_sends_total{channel="email",outcome="account_error",provider="batch"} 0
campaignctl_sends_total{channel="email",outcome="failed",provider="batch"} 1
campaignctl_sends_total{channel="email",outcome="retried",provider="batch"} 0
campaignctl_sends_total{channel="email",outcome="sent",provider="batch"} 9
campaignctl_sends_total{channel="email",outcome="skipped",provider="batch"} 0
campaignctl_sends_total{channel="email",outcome="split",provider="batch"} 6
campaignctl_sends_total{channel="email",outcome="unknown",provider="batch"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "campaignctl_sends_total"); err != nil {
		t.Fatal(err)
	}
	if n, _ := histogram(t, m.Registry(), "campaignctl_provider_request_duration_seconds", map[string]string{"provider": "batch"}); n != 7 {
		t.Fatalf("provider latency: %d observations, want one per request (7)", n)
	}
	if n, sum := histogram(t, m.Registry(), "campaignctl_provider_request_messages", map[string]string{"provider": "batch"}); n != 7 || sum != 16 {
		t.Fatalf("request sizes: %d requests of %v messages, want 7 of 16", n, sum)
	}
	// The provider's cap is taken per request (WaitN): one wait per request.
	if n, _ := histogram(t, m.Registry(), "campaignctl_limiter_wait_seconds", map[string]string{"key_kind": "provider", "provider": "batch"}); n != 7 {
		t.Fatalf("provider limiter: %d waits, want 7", n)
	}
	// Delivered again after Postgres forgot the sends: every claim is found taken, nothing is requested.
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET status = 'pending' WHERE campaign_id = $1 AND status = 'sent'`, rep.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE campaigns SET state = 'running' WHERE id = $1`, rep.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.requests) != 7 {
		t.Fatalf("redelivery made %d requests", len(p.requests)-7)
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP campaignctl_claims_refused_total Sends not made because the recipient's claim (sent:<campaign>:<user>) was already taken: duplicate sends prevented (redelivered batches, another run of the same batch).
# TYPE campaignctl_claims_refused_total counter
campaignctl_claims_refused_total 9
`), "campaignctl_claims_refused_total"); err != nil {
		t.Fatal(err)
	}
}

// Without metrics the handler runs exactly as before.
func TestMetricsAbsentChangeNothing(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	f.runAll(t)
	if got := f.provider.total(); got != 16 {
		t.Fatalf("sent %d without metrics, want 16", got)
	}
}
