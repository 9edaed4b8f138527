package durable

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// Task history in durable mode (storage.History): events are rows of
// MySQL's delayd_task_events, appended through the group committer like
// every other write (so they share transactions with the writes beside
// them), stamped with the index's clock as this replica knows it (now),
// and each namespace is trimmed to its cap every eighth of it written on
// this replica.

// RecordEvents appends events to ns's history in MySQL.
func (s *Store) RecordEvents(ctx context.Context, ns string, keep int64, events []storage.Event) error {
	if keep <= 0 || len(events) == 0 {
		return nil
	}
	now := s.now(ctx, ns)
	evs := make([]storage.Event, len(events))
	for i, e := range events {
		if e.Time.IsZero() {
			e.Time = now
		}
		evs[i] = e
	}
	o := &op{Write: authority.Write{Kind: kindEvents, NS: ns, NowMS: now.UnixMilli(), Events: evs}}
	if err := s.commit.submit(ctx, o); err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	v, _ := s.written.LoadOrStore(ns, new(atomic.Int64))
	n := v.(*atomic.Int64)
	if n.Add(int64(len(evs))) >= max(keep/8, 64) {
		n.Store(0)
		if _, err := s.db.PruneEvents(ctx, ns, keep); err != nil {
			return fmt.Errorf("record events: trim to %d: %w", keep, err)
		}
	}
	return nil
}

// TaskHistory pages through one task's events in MySQL.
func (s *Store) TaskHistory(ctx context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error) {
	return s.db.TaskEvents(ctx, ns, p)
}

// Forecast counts the due forecast from the Redis index (MySQL is not
// read: the index holds every scheduled task's due time).
func (s *Store) Forecast(ctx context.Context, ns string) (storage.Forecast, error) {
	return s.idx.Forecast(ctx, ns)
}
