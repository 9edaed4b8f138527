package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayd/delayd/storage"
)

// pushMetrics are the HTTP push series, resolved per namespace on its
// first push (so namespaces that never push export none).
type pushMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	mu  sync.RWMutex
	nss map[string]*pushChildren
}

// pushChildren are one namespace's pre-resolved push series.
type pushChildren struct {
	born     time.Time // when they were made (forget.go)
	requests [storage.NumPushOutcomes]prometheus.Counter
	duration prometheus.Observer
}

// pushBuckets span a fast endpoint (5 ms) to a request cut at a long ack
// timeout.
var pushBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newPushMetrics() *pushMetrics {
	return &pushMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_push_requests_total",
			Help: "HTTP push requests by namespace and outcome: ok (2xx, acked), http_error (any other status, nacked), timeout (no answer within the ack timeout, nacked), connect_error (nacked), refused (an address the allow list refuses, nacked).",
		}, []string{"namespace", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "delayd_push_request_duration_seconds",
			Help:    "Duration of HTTP push requests, whatever their outcome.",
			Buckets: pushBuckets,
		}, []string{"namespace"}),
		nss: make(map[string]*pushChildren),
	}
}

// children returns ns's push series, creating them on first use (the
// shared "_other" ones past maxNS namespaces).
func (p *pushMetrics) children(name string, maxNS int) *pushChildren {
	p.mu.RLock()
	c := p.nss[name]
	p.mu.RUnlock()
	if c != nil {
		return c
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c = p.nss[name]; c != nil {
		return c
	}
	if len(p.nss) >= maxNS {
		if c = p.nss[OtherNamespace]; c != nil {
			return c
		}
		name = OtherNamespace
	}
	c = &pushChildren{born: time.Now(), duration: p.duration.WithLabelValues(name)}
	for o := range storage.NumPushOutcomes {
		c.requests[o] = p.requests.WithLabelValues(name, o.String())
	}
	p.nss[name] = c
	return c
}

// Pushed records one push request of ns (dispatcher.PushMetrics).
func (m *Metrics) Pushed(ns string, outcome storage.PushOutcome, took time.Duration) {
	c := m.push.children(ns, m.maxNS)
	if outcome < storage.NumPushOutcomes {
		c.requests[outcome].Inc()
	}
	c.duration.Observe(took.Seconds())
}
