package durable

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// Task history in durable mode (storage.History): events are rows of
// MySQL's delayd_task_events, appended through the group committer like
// every other write (so they share transactions with the writes beside
// them), stamped with the index's clock as this replica knows it (now),
// and each namespace is trimmed to its cap every eighth of it written on
// this replica.
//
// The history's order is the rows' seq (the order they were written), and
// TaskEvents reads in it. The times follow it for one replica's writes of
// a namespace: now is the local clock plus an offset measured again every
// second, which can step back by the measurement's error (a few ms), so an
// event is never stamped before the previous one this replica wrote to the
// namespace. Replicas' estimates of the index's clock can differ by as
// much; between their events the seq decides.

// eventLog is what this replica's event writes of one namespace need.
type eventLog struct {
	count  atomic.Int64 // events written since the last trim
	lastMS atomic.Int64 // the latest event time stamped (Unix ms)
}

// RecordEvents appends p.Events to the history of incarnation
// p.Incarnation of ns in MySQL (the group commit drops them if the
// incarnation has ended). An event's Time, when set, is kept unless it is
// before the previous event this replica stamped in ns.
func (s *Store) RecordEvents(ctx context.Context, ns string, p storage.RecordParams) error {
	keep, events := p.Keep, p.Events
	if keep <= 0 || len(events) == 0 {
		return nil
	}
	v, _ := s.written.LoadOrStore(ns, new(eventLog))
	log := v.(*eventLog)
	now := s.now(ctx, ns)
	evs := make([]storage.Event, len(events))
	for i, e := range events {
		if e.Time.IsZero() {
			e.Time = now
		}
		e.Time = log.stamp(e.Time)
		evs[i] = e
	}
	o := &op{Write: authority.Write{Kind: kindEvents, NS: ns, NSInc: p.Incarnation, NowMS: now.UnixMilli(), Events: evs}}
	if err := s.commit.submit(ctx, o); err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	if log.count.Add(int64(len(evs))) >= max(keep/8, 64) {
		log.count.Store(0)
		if _, err := s.db.PruneEvents(ctx, ns, keep); err != nil {
			return fmt.Errorf("record events: trim to %d: %w", keep, err)
		}
	}
	return nil
}

// stamp is t, or the latest time stamped before it when t is earlier.
func (l *eventLog) stamp(t time.Time) time.Time {
	ms := t.UnixMilli()
	for {
		last := l.lastMS.Load()
		if ms <= last {
			return time.UnixMilli(last)
		}
		if l.lastMS.CompareAndSwap(last, ms) {
			return t
		}
	}
}

// TaskHistory pages through one task's events of one namespace
// incarnation in MySQL.
func (s *Store) TaskHistory(ctx context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error) {
	return s.db.TaskEvents(ctx, ns, p)
}

// Forecast counts the due forecast from the Redis index (MySQL is not
// read: the index holds every scheduled task's due time).
func (s *Store) Forecast(ctx context.Context, ns string) (storage.Forecast, error) {
	return s.idx.Forecast(ctx, ns)
}
