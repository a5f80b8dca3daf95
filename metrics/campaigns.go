package metrics

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Querier runs a query (a *pgxpool.Pool does).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// MaxCampaigns bounds how many running campaigns campaignctl_campaign_recipients reports (the newest):
// its campaign label must stay bounded.
const MaxCampaigns = 100

// progressStatuses are the fields of a campaign's progress hash, as the worker writes them.
var progressStatuses = []string{"sent", "failed", "skipped", "unknown"}

// campaignCollector reads the progress of running campaigns at scrape time: which campaigns run and how
// many recipients each planned from Postgres, their counters from the Redis progress hashes (one
// pipelined round trip). Nothing is kept between scrapes, so a campaign that stops running disappears.
type campaignCollector struct {
	db      Querier
	rdb     redis.UniversalClient
	key     func(campaignID int64) string
	timeout time.Duration
	desc    *prometheus.Desc
}

// WatchCampaigns adds campaignctl_campaign_recipients{campaign,status}: for each running campaign (at
// most MaxCampaigns, the newest), planned (eligible at launch), sent, failed, skipped and unknown (from
// its Redis progress hash, named by key: worker.ProgressKey) and pending (planned less the others). The
// counters are the same fast view `status --watch` draws; Postgres stays the truth.
func (m *Metrics) WatchCampaigns(db Querier, rdb redis.UniversalClient, key func(campaignID int64) string) error {
	if m == nil {
		return nil
	}
	return m.reg.Register(&campaignCollector{
		db: db, rdb: rdb, key: key, timeout: scrapeReadTimeout,
		desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "campaign", "recipients"),
			"Recipients of each running campaign by status: planned, sent, failed, skipped, unknown, pending (from the Redis progress counters, read at scrape time).",
			[]string{"campaign", "status"}, nil),
	})
}

func (c *campaignCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *campaignCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := c.collect(ctx, ch); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
	}
}

func (c *campaignCollector) collect(ctx context.Context, ch chan<- prometheus.Metric) error {
	rows, err := c.db.Query(ctx, `SELECT id, eligible FROM campaigns WHERE state = 'running' ORDER BY id DESC LIMIT $1`, MaxCampaigns)
	if err != nil {
		return fmt.Errorf("campaign progress: running campaigns: %w", err)
	}
	type running struct{ id, planned int64 }
	var cs []running
	for rows.Next() {
		var r running
		if err := rows.Scan(&r.id, &r.planned); err != nil {
			rows.Close()
			return fmt.Errorf("campaign progress: %w", err)
		}
		cs = append(cs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("campaign progress: running campaigns: %w", err)
	}
	if len(cs) == 0 {
		return nil
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(cs))
	for i, r := range cs {
		cmds[i] = pipe.HMGet(ctx, c.key(r.id), progressStatuses...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("campaign progress: Redis: %w", err)
	}
	for i, r := range cs {
		id := strconv.FormatInt(r.id, 10)
		vals := cmds[i].Val()
		done := int64(0)
		for j, st := range progressStatuses {
			var n int64
			if j < len(vals) {
				if s, ok := vals[j].(string); ok {
					n, _ = strconv.ParseInt(s, 10, 64)
				}
			}
			done += n
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), id, st)
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(r.planned), id, "planned")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(max(r.planned-done, 0)), id, "pending")
	}
	return nil
}
