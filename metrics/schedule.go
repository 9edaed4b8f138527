package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// scheduleMetrics are the schedule loop's series, resolved per namespace
// on its first step (so namespaces without schedules export none).
type scheduleMetrics struct {
	firings *prometheus.CounterVec
	skipped *prometheus.CounterVec
	lost    *prometheus.CounterVec

	mu  sync.RWMutex
	nss map[string]*scheduleChildren
}

// scheduleChildren are one namespace's pre-resolved schedule series.
type scheduleChildren struct {
	onTime, catchUp, skipped, lost prometheus.Counter
}

func newScheduleMetrics() *scheduleMetrics {
	return &scheduleMetrics{
		firings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_schedule_firings_total",
			Help: "Firings the schedules of a namespace created (each a task), by when: on_time (ahead of its slot), catch_up (a missed slot the catch-up policy fired).",
		}, []string{"namespace", "when"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_schedule_skipped_total",
			Help: "Slots the schedules of a namespace skipped: missed under catch-up none (or outside the window), or overlapping a pending firing.",
		}, []string{"namespace"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayd_schedule_steps_lost_total",
			Help: "Schedule steps this replica computed but another replica (or a change) applied first: the cost of every replica running the loop; nothing was written.",
		}, []string{"namespace"}),
		nss: make(map[string]*scheduleChildren),
	}
}

func (s *scheduleMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.firings, s.skipped, s.lost}
}

// children returns ns's schedule series, creating them on first use (the
// shared "_other" ones past maxNS namespaces).
func (s *scheduleMetrics) children(name string, maxNS int) *scheduleChildren {
	s.mu.RLock()
	c := s.nss[name]
	s.mu.RUnlock()
	if c != nil {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c = s.nss[name]; c != nil {
		return c
	}
	if len(s.nss) >= maxNS {
		if c = s.nss[OtherNamespace]; c != nil {
			return c
		}
		name = OtherNamespace
	}
	c = &scheduleChildren{onTime: s.firings.WithLabelValues(name, "on_time"), catchUp: s.firings.WithLabelValues(name, "catch_up"),
		skipped: s.skipped.WithLabelValues(name), lost: s.lost.WithLabelValues(name)}
	s.nss[name] = c
	return c
}

// ScheduleStep records one schedule step of ns applied by this replica
// (schedule.Metrics): firings created (missed ones among them) and slots
// skipped.
func (m *Metrics) ScheduleStep(ns string, fired, missed, skipped int) {
	c := m.sched.children(ns, m.maxNS)
	c.onTime.Add(float64(fired - missed))
	c.catchUp.Add(float64(missed))
	c.skipped.Add(float64(max(skipped, 0)))
}

// ScheduleLost records a step of ns another replica applied first
// (schedule.Metrics).
func (m *Metrics) ScheduleLost(ns string) {
	m.sched.children(ns, m.maxNS).lost.Inc()
}
