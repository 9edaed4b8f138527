package metrics

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/delayd/delayd/storage"
)

// This file drops the series of deleted namespaces, so /metrics neither
// keeps a namespace's series after it is deleted nor carries a deleted
// namespace's counts into one re-created under its name:
//   - at once on the replica that deletes it (the instrumented store's
//     DropNamespace, which DeleteNamespace calls);
//   - on every replica, at a scrape, at most once per sweep interval
//     (ForgetDeleted): the series of a namespace the registry no longer
//     has, or has re-created since its series began, are dropped. Reports
//     of calls that were in flight at the delete, which can make a series
//     again, are dropped by the next sweep the same way.
//
// A series' beginning (its first report on this replica, this replica's
// clock) is compared with the namespace's create time (the registry's
// clock, the store's): replicas whose clocks run behind the store's by
// more than the time from a create to their first report of it drop that
// report's counts once (a counter reset to Prometheus), never an old
// namespace's into a new one.

// Namespaces answers a namespace's registry record (its create time is its
// incarnation), storage.ErrNotFound when there is none:
// *tenancy.Registry's Namespace (a cached read; called with create false,
// so a sweep never creates a namespace).
type Namespaces interface {
	Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error)
}

// sweepTimeout bounds the lookups of one sweep.
const sweepTimeout = 2 * time.Second

// sweeper is ForgetDeleted's state.
type sweeper struct {
	src      Namespaces
	interval time.Duration
	mu       sync.Mutex // one sweep at a time; guards last
	last     time.Time
}

// ForgetDeleted makes the scrapes of Handler drop the series of deleted
// namespaces, reading src at most once per interval (if zero,
// DefaultTaskCountsInterval) per namespace that has series here (at most
// Options.MaxNamespaces lookups, bounded by 2 s). Call it once, before
// serving.
func (m *Metrics) ForgetDeleted(src Namespaces, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultTaskCountsInterval
	}
	m.sweep = &sweeper{src: src, interval: interval}
}

// sweeping wraps h so a scrape first sweeps, when due.
func (m *Metrics) sweeping(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sw := m.sweep; sw != nil && sw.mu.TryLock() {
			if time.Since(sw.last) >= sw.interval {
				m.sweepOnce(r.Context(), sw.src)
				sw.last = time.Now()
			}
			sw.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// sweepOnce drops the series of every namespace src no longer has, or has
// re-created since the series began.
func (m *Metrics) sweepOnce(ctx context.Context, src Namespaces) {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	for ns, born := range m.namespacesWithSeries() {
		n, err := src.Namespace(ctx, ns, false)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			m.ForgetNamespace(ns)
		case err != nil:
			if ctx.Err() != nil {
				return
			}
		case born.Before(n.CreateTime):
			m.ForgetNamespace(ns)
		}
	}
}

// namespacesWithSeries returns every namespace that has series here (not
// OtherNamespace) with when its earliest series began.
func (m *Metrics) namespacesWithSeries() map[string]time.Time {
	out := map[string]time.Time{}
	m.mu.RLock()
	for ns, c := range m.nss {
		out[ns] = c.born
	}
	m.mu.RUnlock()
	m.push.mu.RLock()
	for ns, c := range m.push.nss {
		if b, ok := out[ns]; !ok || c.born.Before(b) {
			out[ns] = c.born
		}
	}
	m.push.mu.RUnlock()
	delete(out, OtherNamespace)
	return out
}

// ForgetNamespace drops the series of namespace ns: its task counters,
// lateness histogram and push series. Its subscriber gauge goes only at
// zero (streams of a deleted namespace still open here count down to it
// as they end; a later forget or sweep takes it then). Reports made after
// it start new series from zero.
func (m *Metrics) ForgetNamespace(ns string) {
	if ns == OtherNamespace {
		return
	}
	m.mu.Lock()
	delete(m.nss, ns)
	for _, v := range []*prometheus.CounterVec{m.upserted, m.removed, m.acked, m.nacked, m.expired, m.dead} {
		v.DeleteLabelValues(ns)
	}
	m.lateness.DeleteLabelValues(ns)
	var g dto.Metric
	if gauge, err := m.subscribers.GetMetricWithLabelValues(ns); err == nil && gauge.Write(&g) == nil && g.GetGauge().GetValue() == 0 {
		m.subscribers.DeleteLabelValues(ns)
	}
	m.mu.Unlock()
	m.push.forget(ns)
}

// forget drops ns's push series.
func (p *pushMetrics) forget(ns string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.nss, ns)
	for o := range storage.NumPushOutcomes {
		p.requests.DeleteLabelValues(ns, o.String())
	}
	p.duration.DeleteLabelValues(ns)
}
