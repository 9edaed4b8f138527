package durable

import (
	"context"
	"fmt"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// storage.Schedules in durable mode: MySQL is the authority for schedules
// as for tasks. A step (UpdateSchedule with Fire) moves the schedule and
// inserts its firings in one MySQL transaction, then writes the firings
// it created to the index with the versions MySQL decided; an index
// failure after the commit is repaired as any upsert's is.

var _ storage.Schedules = (*Store)(nil)

// CreateSchedule implements storage.Schedules (MySQL).
func (s *Store) CreateSchedule(ctx context.Context, sc storage.Schedule) (storage.Schedule, error) {
	return s.db.CreateSchedule(ctx, sc)
}

// GetSchedule implements storage.Schedules (MySQL).
func (s *Store) GetSchedule(ctx context.Context, ns, id string) (storage.Schedule, error) {
	return s.db.GetSchedule(ctx, ns, id)
}

// ListSchedules implements storage.Schedules (MySQL).
func (s *Store) ListSchedules(ctx context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error) {
	return s.db.ListSchedules(ctx, ns, after, limit)
}

// DeleteSchedule implements storage.Schedules (MySQL).
func (s *Store) DeleteSchedule(ctx context.Context, ns, id string, ifVersion int64) error {
	return s.db.DeleteSchedule(ctx, ns, id, ifVersion)
}

// CountSchedules implements storage.Schedules (MySQL).
func (s *Store) CountSchedules(ctx context.Context, ns string) (int64, error) {
	return s.db.CountSchedules(ctx, ns)
}

// DropSchedules implements storage.Schedules (MySQL).
func (s *Store) DropSchedules(ctx context.Context, ns string) (int64, error) {
	return s.db.DropSchedules(ctx, ns)
}

// DueSchedules implements storage.Schedules: MySQL read at the index's
// clock (which decides due-ness) as this replica knows it.
func (s *Store) DueSchedules(ctx context.Context, limit int) (storage.DueSchedules, error) {
	return s.db.DueSchedules(ctx, s.now(ctx, "").UnixMilli(), limit)
}

// UpdateSchedule implements storage.Schedules: the schedule and its
// firings in one MySQL transaction, then the created firings in the
// index.
func (s *Store) UpdateSchedule(ctx context.Context, sc storage.Schedule, p storage.UpdateScheduleParams) (storage.UpdateScheduleResult, error) {
	if len(p.Fire) > storage.MaxFiringsPerStep {
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: %d firings, at most %d", sc.ID, len(p.Fire), storage.MaxFiringsPerStep)
	}
	ns := sc.Namespace
	var w *authority.Write
	if len(p.Fire) > 0 {
		now := s.now(ctx, ns)
		w = &authority.Write{Kind: kindUpsert, NS: ns, NowMS: now.UnixMilli(), Rows: make([]authority.UpsertRow, len(p.Fire))}
		for i, f := range p.Fire {
			if f.DueTime.IsZero() {
				return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: firing %q has no due time", sc.ID, f.ID)
			}
			payload := f.Payload
			if payload == nil {
				payload = []byte{}
			}
			w.Rows[i] = authority.UpsertRow{ID: f.ID, Kind: f.Kind, Payload: payload, DueMS: storage.DueMilli(f.DueTime),
				Inc: s.newIncarnation(now), CreateOnly: true, TraceParent: f.TraceParent}
			w.NSInc = max(w.NSInc, f.NamespaceIncarnation)
		}
		s.ensureMarked(ctx, ns)
	}
	stored, err := s.db.UpdateSchedule(ctx, sc, p.IfVersion, w)
	if err != nil {
		return storage.UpdateScheduleResult{}, err
	}
	res := storage.UpdateScheduleResult{Schedule: stored}
	if w == nil {
		return res, nil
	}
	res.Fired = w.Upserts
	var specs []storage.UpsertSpec
	var results []*storage.UpsertResult
	for i := range res.Fired {
		if res.Fired[i].Created {
			specs = append(specs, indexSpec(w.Rows[i], res.Fired[i].Task))
			results = append(results, &res.Fired[i])
		}
	}
	if len(specs) > 0 {
		s.indexWrite(ctx, ns, specs, results)
	}
	return res, nil
}
