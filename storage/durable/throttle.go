package durable

import (
	"log/slog"
	"sync"
	"time"
)

// warnThrottle is how often one kind of repeated warning is logged; the
// repeats in between go to Debug.
const warnThrottle = 30 * time.Second

// throttle logs repeated warnings at Warn at most every warnThrottle per
// key (at Debug otherwise), so an outage does not flood the log. Every
// component of the store shares one.
type throttle struct {
	log    *slog.Logger
	mu     sync.Mutex
	warned map[string]time.Time // last time each key was logged at Warn
}

func newThrottle(log *slog.Logger) *throttle {
	return &throttle{log: log, warned: make(map[string]time.Time)}
}

// warn logs msg at Warn unless key was logged at Warn in the last
// warnThrottle, else at Debug.
func (w *throttle) warn(key, msg string, args ...any) {
	now := time.Now()
	w.mu.Lock()
	last, ok := w.warned[key]
	loud := !ok || now.Sub(last) >= warnThrottle
	if loud {
		w.warned[key] = now
	}
	w.mu.Unlock()
	if loud {
		w.log.Warn(msg, args...)
	} else {
		w.log.Debug(msg, args...)
	}
}
