package metrics

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayd/delayd/storage"
)

// TaskSource is what TaskCounts reads: the namespaces and their counts.
// The Redis index answers both cheaply (ZCARD and ZCOUNT per namespace, no
// scan of the tasks).
type TaskSource interface {
	Namespaces(ctx context.Context) ([]string, error)
	Stats(ctx context.Context, ns string) (storage.Stats, error)
}

// Defaults of TaskCounts.
const (
	// DefaultTaskCountsInterval is the least time between two reads of the
	// store: scrapes in between are answered from the last read.
	DefaultTaskCountsInterval = 10 * time.Second
	// taskCountsTimeout bounds one read of the store.
	taskCountsTimeout = 5 * time.Second
)

var (
	tasksDesc = prometheus.NewDesc("delayd_tasks",
		"Tasks held per namespace and state (scheduled, delivered, dead), as the store counts them; read at most every 10 s.",
		[]string{"namespace", "state"}, nil)
	dueDesc = prometheus.NewDesc("delayd_tasks_due",
		"Scheduled tasks whose due time has passed and that no subscriber has taken yet.",
		[]string{"namespace"}, nil)
)

// TaskCounts is a collector for delayd_tasks and delayd_tasks_due: on a
// scrape it reads every namespace's counts from the store, unless it read
// them less than the interval ago, and serves the last counts when a read
// fails. Build it with NewTaskCounts and Register it.
type TaskCounts struct {
	src      TaskSource
	interval time.Duration
	maxNS    int

	mu     sync.Mutex
	readAt time.Time
	counts map[string]storage.Stats
}

// NewTaskCounts returns a TaskCounts reading src at most every interval
// (if zero, DefaultTaskCountsInterval), with m's namespace bound.
func (m *Metrics) NewTaskCounts(src TaskSource, interval time.Duration) *TaskCounts {
	if interval <= 0 {
		interval = DefaultTaskCountsInterval
	}
	return &TaskCounts{src: src, interval: interval, maxNS: m.maxNS}
}

// Describe implements prometheus.Collector.
func (c *TaskCounts) Describe(ch chan<- *prometheus.Desc) {
	ch <- tasksDesc
	ch <- dueDesc
}

// Collect implements prometheus.Collector.
func (c *TaskCounts) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil || time.Since(c.readAt) >= c.interval {
		if counts, err := c.read(); err == nil {
			c.counts, c.readAt = counts, time.Now()
		}
	}
	for ns, st := range c.counts {
		ch <- prometheus.MustNewConstMetric(tasksDesc, prometheus.GaugeValue, float64(st.Scheduled), ns, "scheduled")
		ch <- prometheus.MustNewConstMetric(tasksDesc, prometheus.GaugeValue, float64(st.Delivered), ns, "delivered")
		ch <- prometheus.MustNewConstMetric(tasksDesc, prometheus.GaugeValue, float64(st.Dead), ns, "dead")
		ch <- prometheus.MustNewConstMetric(dueDesc, prometheus.GaugeValue, float64(st.DueNow), ns)
	}
}

// read counts every namespace; past maxNS namespaces, the rest are summed
// under OtherNamespace.
func (c *TaskCounts) read() (map[string]storage.Stats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), taskCountsTimeout)
	defer cancel()
	names, err := c.src.Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	slices.Sort(names) // the first maxNS by name keep their own series
	out := make(map[string]storage.Stats, min(len(names), c.maxNS+1))
	for i, ns := range names {
		st, err := c.src.Stats(ctx, ns)
		if err != nil {
			return nil, err
		}
		key := ns
		if i >= c.maxNS {
			key = OtherNamespace
		}
		sum := out[key]
		sum.Scheduled += st.Scheduled
		sum.Delivered += st.Delivered
		sum.Dead += st.Dead
		sum.DueNow += st.DueNow
		out[key] = sum
	}
	return out, nil
}
