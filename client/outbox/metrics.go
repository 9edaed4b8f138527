package outbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the relay's Prometheus collectors. Create them with
// NewMetrics, register them with your registry (reg.MustRegister(m)) and
// pass them in Config.Metrics; several Outboxes may share one. A nil
// *Metrics records nothing.
type Metrics struct {
	latency prometheus.Histogram
	rows    *prometheus.CounterVec
	errors  prometheus.Counter
}

// NewMetrics returns the collectors:
//
//   - delayd_outbox_commit_to_accepted_seconds (histogram): from the
//     row's write (Upsert/Remove, just before the business commit) to
//     delayd accepting it, by the relay's clock;
//   - delayd_outbox_rows_total{result}: rows the relay finished:
//     "accepted" (upserts), "removed", "superseded" (an upsert whose arm
//     found a later version: sent before by a relay that died, or changed
//     by another writer), "failed" (refused as malformed; kept in the
//     table, see Outbox.Failed);
//   - delayd_outbox_relay_errors_total: rounds that failed (delayd or the
//     database unreachable, an item delayd could not take now) and were
//     retried after a backoff.
func NewMetrics() *Metrics {
	return &Metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "delayd_outbox_commit_to_accepted_seconds",
			Help:    "Time from an outbox row's write to delayd accepting it.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_outbox_rows_total",
			Help: "Outbox rows the relay finished, by result (accepted, removed, superseded, failed).",
		}, []string{"result"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayd_outbox_relay_errors_total",
			Help: "Relay rounds that failed and were retried after a backoff.",
		}),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.latency.Describe(ch)
	m.rows.Describe(ch)
	m.errors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.latency.Collect(ch)
	m.rows.Collect(ch)
	m.errors.Collect(ch)
}

func (m *Metrics) accepted(now time.Time, rs []*row, result string) {
	if m == nil || len(rs) == 0 {
		return
	}
	for _, r := range rs {
		m.latency.Observe(now.Sub(time.UnixMicro(r.createdUS)).Seconds())
	}
	m.rows.WithLabelValues(result).Add(float64(len(rs)))
}

func (m *Metrics) failed() {
	if m != nil {
		m.rows.WithLabelValues("failed").Inc()
	}
}

func (m *Metrics) roundFailed() {
	if m != nil {
		m.errors.Inc()
	}
}
