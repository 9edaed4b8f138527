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
	// Forecast counts the tasks falling due per minute and per hour (one
	// ZCOUNT per bucket, 84 per namespace shard).
	Forecast(ctx context.Context, ns string) (storage.Forecast, error)
}

// forecastWindows are the values of delayd_tasks_due_forecast's within
// label: how far ahead, and how many of the forecast's minutes (m) or
// hours (h) that sums. A fixed set, so the series stay bounded.
var forecastWindows = []struct {
	label   string
	minutes int // sum of PerMinute[:minutes]; 0: use hours
	hours   int // sum of PerHour[:hours]
}{{"5m", 5, 0}, {"15m", 15, 0}, {"1h", 0, 1}, {"6h", 0, 6}, {"24h", 0, 24}}

// forecastTotals sums f over forecastWindows.
func forecastTotals(f storage.Forecast) []int64 {
	out := make([]int64, len(forecastWindows))
	for i, w := range forecastWindows {
		for _, n := range f.PerMinute[:min(w.minutes, len(f.PerMinute))] {
			out[i] += n
		}
		for _, n := range f.PerHour[:min(w.hours, len(f.PerHour))] {
			out[i] += n
		}
	}
	return out
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
	forecastDesc = prometheus.NewDesc("delayd_tasks_due_forecast",
		"Scheduled tasks that fall due within the next `within` (5m, 15m, 1h, 6h, 24h; not those due now), per namespace, counted from the index; read at most every 10 s.",
		[]string{"namespace", "within"}, nil)
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
	// ahead is each namespace's forecastTotals.
	ahead map[string][]int64
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
	ch <- forecastDesc
}

// Collect implements prometheus.Collector.
func (c *TaskCounts) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil || time.Since(c.readAt) >= c.interval {
		if counts, ahead, err := c.read(); err == nil {
			c.counts, c.ahead, c.readAt = counts, ahead, time.Now()
		}
	}
	for ns, totals := range c.ahead {
		for i, w := range forecastWindows {
			ch <- prometheus.MustNewConstMetric(forecastDesc, prometheus.GaugeValue, float64(totals[i]), ns, w.label)
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
func (c *TaskCounts) read() (map[string]storage.Stats, map[string][]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), taskCountsTimeout)
	defer cancel()
	names, err := c.src.Namespaces(ctx)
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(names) // the first maxNS by name keep their own series
	out := make(map[string]storage.Stats, min(len(names), c.maxNS+1))
	ahead := make(map[string][]int64, min(len(names), c.maxNS+1))
	for i, ns := range names {
		st, err := c.src.Stats(ctx, ns)
		if err != nil {
			return nil, nil, err
		}
		f, err := c.src.Forecast(ctx, ns)
		if err != nil {
			return nil, nil, err
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
		totals := forecastTotals(f)
		if prev := ahead[key]; prev != nil {
			for j := range totals {
				totals[j] += prev[j]
			}
		}
		ahead[key] = totals
	}
	return out, ahead, nil
}
