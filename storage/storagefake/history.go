package storagefake

import (
	"context"
	"strconv"
	"time"

	"github.com/delayd/delayd/storage"
)

// histEntry is one kept event and its sequence number (the cursor).
type histEntry struct {
	seq int64
	e   storage.Event
}

// histKey names the history of one namespace incarnation.
type histKey struct {
	ns  string
	inc int64
}

// histEnded reports whether DropNamespace has ended incarnation inc of ns,
// as the Redis index's life key tells; called with s.mu held.
func (s *Store) histEnded(ns string, inc int64) bool {
	l := s.lives[ns]
	return l.ended > 0 && inc <= l.ended
}

// RecordEvents appends p.Events to the history of incarnation
// p.Incarnation of ns, keeping the newest p.Keep; events of an ended
// incarnation are dropped.
func (s *Store) RecordEvents(_ context.Context, ns string, p storage.RecordParams) error {
	if p.Keep <= 0 || len(p.Events) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.histEnded(ns, p.Incarnation) {
		return nil
	}
	if s.hist == nil {
		s.hist = map[histKey][]histEntry{}
	}
	now, _ := s.now()
	k := histKey{ns, p.Incarnation}
	h := s.hist[k]
	for _, e := range p.Events {
		if e.Time.IsZero() {
			e.Time = time.UnixMilli(now)
		}
		s.histSeq++
		h = append(h, histEntry{seq: s.histSeq, e: e})
	}
	if int64(len(h)) > p.Keep {
		h = append([]histEntry(nil), h[int64(len(h))-p.Keep:]...)
	}
	s.hist[k] = h
	return nil
}

// TaskHistory pages through the kept events of task p.ID in the history of
// incarnation p.Incarnation of ns.
func (s *Store) TaskHistory(_ context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error) {
	after := int64(0)
	if p.Cursor != "" {
		n, err := strconv.ParseInt(p.Cursor, 10, 64)
		if err != nil || n < 0 {
			return nil, "", storage.ErrInvalidCursor
		}
		after = n
	}
	limit := min(max(p.Limit, 1), MaxBatch)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.histEnded(ns, p.Incarnation) {
		return nil, "", nil
	}
	var out []storage.Event
	size := 0
	for _, h := range s.hist[histKey{ns, p.Incarnation}] {
		if h.seq <= after || h.e.ID != p.ID {
			continue
		}
		size += storage.EventSize(h.e)
		if len(out) > 0 && p.MaxBytes > 0 && size > p.MaxBytes {
			return out, strconv.FormatInt(after, 10), nil
		}
		out = append(out, h.e)
		after = h.seq
		if len(out) == limit {
			return out, strconv.FormatInt(after, 10), nil
		}
	}
	return out, "", nil
}

// Forecast counts ns's scheduled tasks due per minute over the next hour
// and per hour over the next day.
func (s *Store) Forecast(_ context.Context, ns string) (storage.Forecast, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	out := storage.Forecast{Now: time.UnixMilli(now), PerMinute: make([]int64, storage.ForecastMinutes), PerHour: make([]int64, storage.ForecastHours)}
	for _, r := range s.nss[ns] {
		if r.task.State != storage.StateScheduled || r.due <= now {
			continue
		}
		if i := (r.due - now - 1) / 60000; i < storage.ForecastMinutes {
			out.PerMinute[i]++
		}
		if i := (r.due - now - 1) / 3600000; i < storage.ForecastHours {
			out.PerHour[i]++
		}
	}
	return out, nil
}
