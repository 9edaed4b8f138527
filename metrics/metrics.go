// Package metrics is delayd's Prometheus instrumentation: one registry per
// process holding every delayd_* metric (their names are part of the
// contract; docs/operating.md lists each), the gRPC server metrics, the Go
// runtime and process collectors, and delayd_build_info.
//
// The layers do not import Prometheus. They report through small interfaces
// they declare themselves, which *Metrics implements: the dispatcher reports
// delivery lateness and subscriber counts (dispatcher.Metrics), the
// reconciler its passes (mysqlstore.ReconcileMetrics); store calls are timed
// and their outcomes counted by wrapping the task store (InstrumentStore);
// delayd_tasks is read from the store when scraped (TaskCounts).
//
// # Cost
//
// Per-namespace label children are resolved once, on a namespace's first
// report, and kept in a map; a report is then a map lookup under a read
// lock and an atomic add, with no allocation (TestReportsDoNotAllocate).
// The store wrapper resolves its {store, op} children when built. The gRPC
// server metrics (the names and labels of go-grpc-middleware's Prometheus
// provider) are delayd's own interceptors: a method's children are resolved
// once (InitGRPC), a code's on its first occurrence, so a unary call costs a
// map lookup and four atomic adds and allocates nothing
// (TestGRPCInterceptorsDoNotAllocate). Subscribe's messages are not counted
// (see quietStreams) and there is no handling-time histogram.
//
// # Cardinality
//
// The only unbounded-looking label is namespace, and it is bounded: at most
// Options.MaxNamespaces namespaces get their own series; reports for any
// further namespace go to the series namespace="_other" (a name no real
// namespace can have). Task ids, keys and payloads never become labels.
// A deleted namespace's series are dropped (forget.go), so deleted
// namespaces neither accumulate nor pass their counts to a namespace
// re-created under the name.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/delayd/delayd/buildinfo"
)

// OtherNamespace is the namespace label of reports for namespaces beyond
// Options.MaxNamespaces.
const OtherNamespace = "_other"

// DefaultMaxNamespaces is Options.MaxNamespaces when unset.
const DefaultMaxNamespaces = 1000

// LatenessBuckets are the bucket bounds of delayd_delivery_lateness_seconds:
// 1 ms to 1 h.
var LatenessBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600,
}

// storeBuckets are the bucket bounds of delayd_store_call_duration_seconds:
// 100 µs to 10 s.
var storeBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Options configures New.
type Options struct {
	// MaxNamespaces is the most namespaces that get their own series; the
	// rest share namespace="_other". If unset or zero, 1000.
	MaxNamespaces int
	// Build is reported as delayd_build_info. If zero, buildinfo.Get().
	Build buildinfo.Info
}

// Metrics holds every metric of one delayd process. Its methods are safe for
// concurrent use.
type Metrics struct {
	reg   *prometheus.Registry
	maxNS int

	lateness    *prometheus.HistogramVec
	upserted    *prometheus.CounterVec
	removed     *prometheus.CounterVec
	acked       *prometheus.CounterVec
	nacked      *prometheus.CounterVec
	expired     *prometheus.CounterVec
	dead        *prometheus.CounterVec
	subscribers *prometheus.GaugeVec

	storeDur *prometheus.HistogramVec
	storeErr *prometheus.CounterVec

	reconcileDur      prometheus.Histogram
	reconcileRepaired prometheus.Counter
	reconcileFailed   prometheus.Counter

	libraryLoads *prometheus.CounterVec

	grpc *grpcMetrics

	push  *pushMetrics
	sched *scheduleMetrics

	mu  sync.RWMutex
	nss map[string]*nsChildren

	// sweep, when set (ForgetDeleted), drops deleted namespaces' series
	// at scrapes (forget.go).
	sweep *sweeper
}

// nsChildren are one namespace's pre-resolved series.
type nsChildren struct {
	born        time.Time // when the first of them was made (forget.go)
	lateness    prometheus.Observer
	upserted    prometheus.Counter
	removed     prometheus.Counter
	acked       prometheus.Counter
	nacked      prometheus.Counter
	expired     prometheus.Counter
	dead        prometheus.Counter
	subscribers prometheus.Gauge
}

// New returns a Metrics with every metric registered.
func New(opts Options) *Metrics {
	if opts.MaxNamespaces <= 0 {
		opts.MaxNamespaces = DefaultMaxNamespaces
	}
	if opts.Build == (buildinfo.Info{}) {
		opts.Build = buildinfo.Get()
	}
	ns := []string{"namespace"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, ns)
	}
	m := &Metrics{
		reg:   prometheus.NewRegistry(),
		maxNS: opts.MaxNamespaces,
		nss:   make(map[string]*nsChildren),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "delayd_delivery_lateness_seconds",
			Help:    "Time from a task's due time (or, for a task written with a due time already past, from when it was written) to its delivery being sent to a subscriber, by the store's clock.",
			Buckets: LatenessBuckets,
		}, ns),
		upserted: counter("delayd_tasks_upserted_total", "Tasks created or replaced (stale upserts not counted)."),
		removed:  counter("delayd_tasks_removed_total", "Tasks removed by RemoveTask."),
		acked:    counter("delayd_tasks_acked_total", "Deliveries acked (tokens answered OK)."),
		nacked:   counter("delayd_tasks_nacked_total", "Deliveries nacked (tokens answered OK), including those handed back when a subscriber's stream ended."),
		expired:  counter("delayd_leases_expired_total", "Deliveries whose lease ran out before an ack, taken back by the reaper."),
		dead:     counter("delayd_tasks_dead_total", "Tasks moved to the dead letters after their last attempt."),
		subscribers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "delayd_subscribers",
			Help: "Subscribe streams this replica serves.",
		}, ns),
		storeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "delayd_store_call_duration_seconds",
			Help:    "Duration of task store calls by store (redis, mysql) and operation.",
			Buckets: storeBuckets,
		}, []string{"store", "op"}),
		storeErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_store_errors_total",
			Help: "Task store calls that failed (unreachable, timed out, unexpected), by store and operation; not-found, stale and quota answers are not errors.",
		}, []string{"store", "op"}),
		reconcileDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "delayd_reconcile_pass_duration_seconds",
			Help:    "Duration of the durable-mode reconciler's passes, full and incremental (leader only).",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10 ms .. ~45 min
		}),
		reconcileRepaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayd_reconcile_repaired_total",
			Help: "Tasks the reconciler re-indexed because Redis lacked them or held an older generation.",
		}),
		reconcileFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayd_reconcile_pass_failures_total",
			Help: "Reconciler full passes that failed (retried next interval).",
		}),
		libraryLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_redis_library_loads_total",
			Help: "Loads of delayd's Lua library into a Redis server (FUNCTION LOAD), by reason: start (at start, on every master) or missing (a call found it gone: a restart without persistence, FUNCTION FLUSH, a new cluster node).",
		}, []string{"reason"}),
		// No handling-time histogram: it costs a label lookup and an
		// observation per call, and the latency that varies is the store's,
		// which delayd_store_call_duration_seconds times per op.
		grpc:  newGRPCMetrics(),
		push:  newPushMetrics(),
		sched: newScheduleMetrics(),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "delayd_build_info",
		Help:        "Always 1; the labels tell the version, commit and Go version of this delayd.",
		ConstLabels: prometheus.Labels{"version": opts.Build.Version, "commit": opts.Build.Commit, "goversion": opts.Build.GoVersion},
	})
	build.Set(1)
	m.reg.MustRegister(
		m.lateness, m.upserted, m.removed, m.acked, m.nacked, m.expired, m.dead, m.subscribers,
		m.storeDur, m.storeErr, m.reconcileDur, m.reconcileRepaired, m.reconcileFailed, m.libraryLoads,
		m.grpc, build, m.push.requests, m.push.duration,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.reg.MustRegister(m.sched.collectors()...)
	return m
}

// Handler serves the registry in the Prometheus text (or OpenMetrics)
// format, for /metrics.
func (m *Metrics) Handler() http.Handler {
	return m.sweeping(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
}

// Register adds a collector (TaskCounts) to the registry.
func (m *Metrics) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// ObserveReadiness registers delayd_ready: 1 while ready returns nil, 0
// otherwise; ready is called on every scrape, bounded by 2 seconds (the
// same check /readyz answers with). Call it once.
func (m *Metrics) ObserveReadiness(ready func(ctx context.Context) error) error {
	return m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "delayd_ready",
		Help: "1 while this replica is ready to serve (store reachable, durable index complete, not shutting down), else 0; /readyz tells why.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if ready(ctx) != nil {
			return 0
		}
		return 1
	}))
}

// GRPCServerOptions returns the server options that record the standard
// grpc_server_* metrics of every call: started, handled by code, and
// messages received and sent, except the deliveries of Subscribe (see
// quietStreams). They chain interceptors: give them before any other so
// calls refused by authentication or limits are counted too. Call InitGRPC
// once the server's services are registered.
func (m *Metrics) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(m.grpc.unary),
		grpc.ChainStreamInterceptor(m.grpc.stream),
	}
}

// InitGRPC resolves the gRPC metrics' label children of every method the
// server has registered (a *grpc.Server, or anything that reports its
// services the same way), so that their calls never look a label up, and
// so that every method's started, received and sent series exist, at 0,
// from the start (grpc_server_handled_total gets a code's series when a
// call first ends with that code). Methods it does not know are resolved
// on their first call.
func (m *Metrics) InitGRPC(server interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}) {
	m.grpc.init(server.GetServiceInfo())
}

// quietStreams are the streams whose messages are not counted in
// grpc_server_msg_sent_total and grpc_server_msg_received_total: Subscribe
// sends one message per delivery, the busiest path of delayd. Its
// deliveries are counted by delayd_delivery_lateness_seconds_count (per
// namespace); the stream itself is still counted in
// grpc_server_started_total and grpc_server_handled_total, and its handler
// gets the stream as it came, unwrapped.
var quietStreams = map[string]bool{
	"/delayd.v1.DeliveryService/Subscribe": true,
}

// ns returns the namespace's children, creating them on first use (or the
// shared "_other" ones past MaxNamespaces).
func (m *Metrics) ns(name string) *nsChildren {
	m.mu.RLock()
	c := m.nss[name]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.nss[name]; c != nil {
		return c
	}
	if len(m.nss) >= m.maxNS {
		if c = m.nss[OtherNamespace]; c != nil {
			return c
		}
		name = OtherNamespace
	}
	c = &nsChildren{
		born:        time.Now(),
		lateness:    m.lateness.WithLabelValues(name),
		upserted:    m.upserted.WithLabelValues(name),
		removed:     m.removed.WithLabelValues(name),
		acked:       m.acked.WithLabelValues(name),
		nacked:      m.nacked.WithLabelValues(name),
		expired:     m.expired.WithLabelValues(name),
		dead:        m.dead.WithLabelValues(name),
		subscribers: m.subscribers.WithLabelValues(name),
	}
	m.nss[name] = c
	return c
}

// Delivered records that a delivery of ns was sent lateness after its due
// time (dispatcher.Metrics).
func (m *Metrics) Delivered(ns string, lateness time.Duration) {
	m.ns(ns).lateness.Observe(max(lateness, 0).Seconds())
}

// Subscribers moves ns's subscriber gauge by delta (dispatcher.Metrics).
func (m *Metrics) Subscribers(ns string, delta int) {
	m.ns(ns).subscribers.Add(float64(delta))
}

// LibraryLoaded counts one load of delayd's Lua library into a Redis server
// (redisstore.LibraryMetrics); reason is "start" or "missing".
func (m *Metrics) LibraryLoaded(reason string) {
	m.libraryLoads.WithLabelValues(reason).Inc()
}

// ReconcilePass records one reconciler full pass (mysqlstore.ReconcileMetrics):
// how long it took, how many tasks it re-indexed, and whether it failed.
func (m *Metrics) ReconcilePass(took time.Duration, repaired int, err error) {
	m.reconcileDur.Observe(took.Seconds())
	m.reconcileRepaired.Add(float64(repaired))
	if err != nil {
		m.reconcileFailed.Inc()
	}
}
