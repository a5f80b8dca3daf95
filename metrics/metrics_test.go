package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/metrics"
	"github.com/campaignctl/campaignctl/worker"
)

func TestMetricsNilRecordsNothingAndDoesNotPanic(t *testing.T) {
	var m *metrics.Metrics
	s := m.For("twilio", "sms")
	if s != nil {
		t.Fatal("a nil *Metrics handed out label children")
	}
	s.Sent(1)
	s.Failed(1)
	s.Unknown(1)
	s.Skipped(1)
	s.AccountError(1)
	s.Split(2)
	s.Retried(1, 503, 0)
	s.Request(time.Second)
	s.BatchRequest(time.Second, 10)
	s.ClaimsRefused(1)
	if s.ProviderWait() != nil || s.CampaignWait() != nil {
		t.Fatal("a nil *Sends handed out observers")
	}
	if m.Registry() != nil || m.WatchQueues(nil) != nil || m.WatchCampaigns(nil, nil, nil) != nil {
		t.Fatal("a nil *Metrics registered something")
	}
}

// The per-send calls resolve nothing and allocate nothing.
func TestMetricsHotPathDoesNotAllocate(t *testing.T) {
	m := metrics.New(nil)
	s := m.For("twilio", "sms")
	if m.For("twilio", "sms") != s {
		t.Fatal("For resolved the same provider and channel twice")
	}
	wait := s.ProviderWait()
	allocs := testing.AllocsPerRun(1000, func() {
		s.Sent(1)
		s.Retried(1, 429, 20429)
		s.Request(15 * time.Millisecond)
		s.BatchRequest(15*time.Millisecond, 500)
		s.ClaimsRefused(1)
		wait.Observe(0.002)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per send", allocs)
	}
}

func TestMetricsRetryReason(t *testing.T) {
	for _, tt := range []struct {
		status, code int
		want         string
	}{
		{429, 0, "429"}, {400, 20429, "429"}, {503, 0, "5xx"}, {500, 0, "5xx"}, {0, 0, "transport"}, {408, 0, "other"},
	} {
		if got := metrics.RetryReason(tt.status, tt.code); got != tt.want {
			t.Errorf("RetryReason(%d, %d) = %q, want %q", tt.status, tt.code, got, tt.want)
		}
	}
}

func TestMetricsValidateAddr(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:9090", ":9090", "localhost:0", "[::1]:9090", "0.0.0.0:65535"} {
		if err := metrics.ValidateAddr(ok); err != nil {
			t.Errorf("ValidateAddr(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"9090", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-1", "http://127.0.0.1:9090", "a b:90"} {
		if err := metrics.ValidateAddr(bad); err == nil {
			t.Errorf("ValidateAddr(%q) accepted it", bad)
		}
	}
}

// Progress of running campaigns only, read from the Redis counters and the planned count in Postgres at
// scrape time: a campaign that finishes disappears at the next scrape.
func TestMetricsCampaignProgressOfRunningCampaigns(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	var ids []int64
	for _, c := range []struct {
		name, state string
		eligible    int
	}{{"a", "running", 100}, {"b", "running", 5}, {"c", "completed", 50}, {"d", "paused", 7}} {
		var id int64
		if err := db.QueryRow(ctx, `INSERT INTO campaigns (name, channel, state, message, audience_sql, batch_size, eligible)
			VALUES ($1, 'sms', $2, 'x', 'SELECT 1', 500, $3) RETURNING id`, c.name, c.state, c.eligible).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if err := rdb.HSet(ctx, worker.ProgressKey(id), "sent", 60, "failed", 3, "skipped", 2, "unknown", 1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// b has no counters yet.
	rdb.Del(ctx, worker.ProgressKey(ids[1]))
	m := metrics.New(nil)
	if err := m.WatchCampaigns(db, rdb, worker.ProgressKey); err != nil {
		t.Fatal(err)
	}
	head := `# HELP campaignctl_campaign_recipients Recipients of each running campaign by status: planned, sent, failed, skipped, unknown, pending (from the Redis progress counters, read at scrape time).
# TYPE campaignctl_campaign_recipients gauge
`
	want := head + `campaignctl_campaign_recipients{campaign="1",status="failed"} 3
campaignctl_campaign_recipients{campaign="1",status="pending"} 34
campaignctl_campaign_recipients{campaign="1",status="planned"} 100
campaignctl_campaign_recipients{campaign="1",status="sent"} 60
campaignctl_campaign_recipients{campaign="1",status="skipped"} 2
campaignctl_campaign_recipients{campaign="1",status="unknown"} 1
campaignctl_campaign_recipients{campaign="2",status="failed"} 0
campaignctl_campaign_recipients{campaign="2",status="pending"} 5
campaignctl_campaign_recipients{campaign="2",status="planned"} 5
campaignctl_campaign_recipients{campaign="2",status="sent"} 0
campaignctl_campaign_recipients{campaign="2",status="skipped"} 0
campaignctl_campaign_recipients{campaign="2",status="unknown"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "campaignctl_campaign_recipients"); err != nil {
		t.Fatal(err)
	}
	// Campaign 1 completes and campaign 2 sends: read again at the next scrape.
	if _, err := db.Exec(ctx, `UPDATE campaigns SET state = 'completed' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	rdb.HIncrBy(ctx, worker.ProgressKey(ids[1]), "sent", 4)
	want = head + `campaignctl_campaign_recipients{campaign="2",status="failed"} 0
campaignctl_campaign_recipients{campaign="2",status="pending"} 1
campaignctl_campaign_recipients{campaign="2",status="planned"} 5
campaignctl_campaign_recipients{campaign="2",status="sent"} 4
campaignctl_campaign_recipients{campaign="2",status="skipped"} 0
campaignctl_campaign_recipients{campaign="2",status="unknown"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "campaignctl_campaign_recipients"); err != nil {
		t.Fatal(err)
	}
}

// /metrics serves campaignctl's families and Asynq's queue metrics from one registry; /healthz and
// /readyz answer.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	for b := 0; b < 3; b++ {
		task, err := worker.NewBatchTask(1, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.EnqueueContext(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	m := metrics.New(nil)
	m.For("twilio", "sms").Sent(3)
	if err := m.WatchQueues(rdb); err != nil {
		t.Fatal(err)
	}
	if err := m.WatchCampaigns(db, rdb, worker.ProgressKey); err != nil {
		t.Fatal(err)
	}
	notReady := errors.New("redis: connection refused")
	ready := func(context.Context) error { return notReady }
	srv := httptest.NewServer(m.Handler(func(ctx context.Context) error { return ready(ctx) }))
	defer srv.Close()

	err := testutil.ScrapeAndCompare(srv.URL+"/metrics", strings.NewReader(`
# HELP asynq_queue_size Number of tasks in a queue
# TYPE asynq_queue_size gauge
asynq_queue_size{queue="campaigns"} 3
# HELP campaignctl_sends_total Messages by provider, channel and outcome: sent, failed, unknown, skipped, retried (transient answer), account_error, split (a request of many refused as a whole).
# TYPE campaignctl_sends_total counter
campaignctl_sends_total{channel="sms",outcome="account_error",provider="twilio"} 0
campaignctl_sends_total{channel="sms",outcome="failed",provider="twilio"} 0
campaignctl_sends_total{channel="sms",outcome="retried",provider="twilio"} 0
campaignctl_sends_total{channel="sms",outcome="sent",provider="twilio"} 3
campaignctl_sends_total{channel="sms",outcome="skipped",provider="twilio"} 0
campaignctl_sends_total{channel="sms",outcome="split",provider="twilio"} 0
campaignctl_sends_total{channel="sms",outcome="unknown",provider="twilio"} 0
`), "asynq_queue_size", "campaignctl_sends_total")
	if err != nil {
		t.Fatal(err)
	}
	body := get(t, srv.URL+"/metrics", 200)
	for _, family := range []string{
		"# TYPE campaignctl_provider_request_duration_seconds histogram",
		"# TYPE campaignctl_provider_request_messages histogram",
		"# TYPE campaignctl_limiter_wait_seconds histogram",
		"# TYPE campaignctl_claims_refused_total counter",
		"# TYPE campaignctl_retries_total counter",
		`asynq_tasks_enqueued_total{queue="campaigns",state="pending"} 3`,
		`asynq_queue_latency_seconds{queue="campaigns"}`,
		"go_goroutines",
	} {
		if !strings.Contains(body, family) {
			t.Errorf("/metrics lacks %q", family)
		}
	}
	if body := get(t, srv.URL+"/healthz", 200); body != "ok\n" {
		t.Errorf("/healthz: %q", body)
	}
	if body := get(t, srv.URL+"/readyz", 503); !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz while not ready: %q", body)
	}
	ready = func(context.Context) error { return nil }
	get(t, srv.URL+"/readyz", 200)
}

// A collector that cannot read Postgres does not take the other metrics down with it.
func TestMetricsEndpointSurvivesAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	dead, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	m := metrics.New(nil)
	m.For("twilio", "sms").Sent(1)
	if err := m.WatchCampaigns(dead, rdb, worker.ProgressKey); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	body := get(t, srv.URL+"/metrics", 200)
	if !strings.Contains(body, `campaignctl_sends_total{channel="sms",outcome="sent",provider="twilio"} 1`) {
		t.Fatalf("/metrics with Postgres down:\n%s", body)
	}
}

func TestMetricsServeStopsWithTheContext(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- metrics.Serve(ctx, ln, metrics.New(nil).Handler(nil)) }()
	get(t, "http://"+ln.Addr().String()+"/healthz", 200)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("still listening after Serve returned")
	}
}

func get(t *testing.T, url string, status int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		t.Fatalf("GET %s: %d, want %d\n%s", url, resp.StatusCode, status, b)
	}
	return string(b)
}
