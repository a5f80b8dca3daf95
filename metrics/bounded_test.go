package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stuckCollector is a collector whose read at scrape time never ends before release is closed.
type stuckCollector struct {
	desc    *prometheus.Desc
	release chan struct{}
}

func (c stuckCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c stuckCollector) Collect(ch chan<- prometheus.Metric) {
	<-c.release
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1)
}

// A collector that reads Redis at scrape time (Asynq's queue metrics) is given a bounded time: with Redis
// stalled, the scrape returns within it, with the other metrics, and says what it left out. Before, a
// scrape during a stall took 10 s, Prometheus's default scrape timeout, and lost every metric.
func TestAStalledCollectorDoesNotHoldTheScrape(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ok := prometheus.NewCounter(prometheus.CounterOpts{Name: "own_total", Help: "the worker's own"})
	ok.Inc()
	stuck := stuckCollector{desc: prometheus.NewDesc("stuck", "read at scrape time", nil, nil), release: make(chan struct{})}
	time.AfterFunc(3*time.Second, func() { close(stuck.release) }) // a stall of 3 s
	reg.MustRegister(ok, bounded(stuck, 200*time.Millisecond, prometheus.NewDesc("stuck_read", "h", nil, nil)))
	start := time.Now()
	mfs, err := reg.Gather()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the scrape took %v behind a stalled collector", took)
	}
	if err == nil || !strings.Contains(err.Error(), "not read within") {
		t.Fatalf("gather error %v; want the stalled collector named as left out", err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "own_total" {
		t.Fatalf("gathered %v; want the worker's own metric", mfs)
	}
	// Once the read ends in time, its metrics are there.
	fast := stuckCollector{desc: prometheus.NewDesc("fast", "read at scrape time", nil, nil), release: make(chan struct{})}
	close(fast.release)
	reg2 := prometheus.NewRegistry()
	reg2.MustRegister(bounded(fast, time.Second, prometheus.NewDesc("fast_read", "h", nil, nil)))
	if mfs, err := reg2.Gather(); err != nil || len(mfs) != 1 || mfs[0].GetName() != "fast" {
		t.Fatalf("gathered %v, %v; want the collector's metric", mfs, err)
	}
}
