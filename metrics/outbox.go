package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// outboxCollector reads the İYS outbox (the refusals received through the messages, to register in İYS)
// at scrape time.
type outboxCollector struct {
	db              Querier
	timeout         time.Duration
	states, overdue *prometheus.Desc
}

// outboxStates are the states of iys_outbox, each exported even at 0.
var outboxStates = []string{"waiting", "sent", "accepted", "already", "refused"}

// WatchOutbox adds campaignctl_iys_outbox{state} (the RETs of the İYS outbox by state) and
// campaignctl_iys_outbox_overdue (those still not registered two business days after their refusal: alert
// on > 0; the law allows three), read from Postgres at scrape time.
func (m *Metrics) WatchOutbox(db Querier) error {
	if m == nil {
		return nil
	}
	return m.reg.Register(&outboxCollector{
		db: db, timeout: 5 * time.Second,
		states: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "iys", "outbox"),
			"RETs received through the messages (unsubscribes, spam reports, SMS refusals) to register in İYS, by state: waiting, sent (result awaited), accepted, already (RET in İYS before), refused (by İYS).",
			[]string{"state"}, nil),
		overdue: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "iys", "outbox_overdue"),
			"RETs still not registered in İYS two business days after the refusal (law 6563 allows three): run campaignctl iys push.",
			nil, nil),
	})
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.states
	ch <- c.overdue
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := c.collect(ctx, ch); err != nil {
		ch <- prometheus.NewInvalidMetric(c.states, err)
	}
}

func (c *outboxCollector) collect(ctx context.Context, ch chan<- prometheus.Metric) error {
	rows, err := c.db.Query(ctx, `SELECT state, count(*), count(*) FILTER (WHERE state IN ('waiting', 'sent') AND due_at < now()) FROM iys_outbox GROUP BY state`)
	if err != nil {
		return fmt.Errorf("iys outbox: %w", err)
	}
	defer rows.Close()
	counts := map[string]int64{}
	var overdue int64
	for rows.Next() {
		var state string
		var n, late int64
		if err := rows.Scan(&state, &n, &late); err != nil {
			return fmt.Errorf("iys outbox: %w", err)
		}
		counts[state] = n
		overdue += late
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("iys outbox: %w", err)
	}
	for _, st := range outboxStates {
		ch <- prometheus.MustNewConstMetric(c.states, prometheus.GaugeValue, float64(counts[st]), st)
	}
	ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, float64(overdue))
	return nil
}
