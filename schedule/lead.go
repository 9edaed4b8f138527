package schedule

import (
	"sync"
	"time"
)

// A firing is created a lookahead before its slot, so a step may come that
// much late and its firing still waits in the index before it is due. A
// loop whose pass over its due schedules takes longer than that (10,000
// schedules on one minute, on an oversubscribed machine) steps the last
// ones after their slots: their firings are late, and past the grace they
// count as missed. So the loop watches how late its steps come (lag: the
// store's time of the step minus the schedule's Advance) and widens the
// lookahead it plans with to twice the worst lag of the last window or
// two, up to maxLead; the next slots are then decided early enough.
// A lag above maxLead is an outage being caught up, not a slow pass, and
// does not count.

const (
	// maxLead bounds the widened lookahead.
	maxLead = time.Minute
	// leadWindow is how long a lag seen keeps the lookahead wide (it
	// counts for this window and the next).
	leadWindow = 5 * time.Minute
)

// lead tracks the worst step lag of the current and the previous window,
// by the loop's clock.
type lead struct {
	mu        sync.Mutex
	base      time.Duration
	start     time.Time     // the current window's start
	cur, prev time.Duration // the worst lags of the current and previous windows
}

// note records one step's lag at local time now.
func (l *lead) note(lag time.Duration, now time.Time) {
	if lag <= 0 || lag > maxLead {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	l.cur = max(l.cur, lag)
}

// lookahead answers the lookahead to plan with at local time now: the
// configured one, or twice the worst recent lag rounded up to a second,
// at most maxLead.
func (l *lead) lookahead(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	wide := (2*max(l.cur, l.prev) + time.Second - 1).Truncate(time.Second)
	return max(l.base, min(wide, maxLead))
}

func (l *lead) roll(now time.Time) {
	switch {
	case l.start.IsZero():
		l.start = now
	case now.Sub(l.start) >= 2*leadWindow:
		l.start, l.cur, l.prev = now, 0, 0
	case now.Sub(l.start) >= leadWindow:
		l.start, l.cur, l.prev = l.start.Add(leadWindow), 0, l.cur
	}
}
