package storagefake

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// The fake's schedules (storage.Schedules): one map per namespace, and
// UpdateSchedule's firings created under the same lock as the schedule is
// written, as the real stores do in one script or transaction.

var _ storage.Schedules = (*Store)(nil)

// schedules returns ns's schedules (created on first use); s.mu is held.
func (s *Store) schedules(ns string) map[string]storage.Schedule {
	if s.scheds == nil {
		s.scheds = map[string]map[string]storage.Schedule{}
	}
	m := s.scheds[ns]
	if m == nil {
		m = map[string]storage.Schedule{}
		s.scheds[ns] = m
	}
	return m
}

// CreateSchedule implements storage.Schedules.
func (s *Store) CreateSchedule(_ context.Context, sc storage.Schedule) (storage.Schedule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.schedules(sc.Namespace)
	if _, ok := m[sc.ID]; ok {
		return storage.Schedule{}, fmt.Errorf("create schedule %q: %w", sc.ID, storage.ErrAlreadyExists)
	}
	now, _ := s.now()
	sc.Version, sc.CreateTime, sc.UpdateTime = 1, time.UnixMilli(now).UTC(), time.UnixMilli(now).UTC()
	sc.Template.Payload = slices.Clone(sc.Template.Payload)
	m[sc.ID] = sc
	return cloneSchedule(sc), nil
}

// GetSchedule implements storage.Schedules.
func (s *Store) GetSchedule(_ context.Context, ns, id string) (storage.Schedule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, ok := s.scheds[ns][id]
	if !ok {
		return storage.Schedule{}, fmt.Errorf("schedule %q: %w", id, storage.ErrNotFound)
	}
	return cloneSchedule(sc), nil
}

// ListSchedules implements storage.Schedules.
func (s *Store) ListSchedules(_ context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error) {
	limit = max(1, min(limit, MaxBatch))
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storage.Schedule
	for id, sc := range s.scheds[ns] {
		if id > after {
			out = append(out, cloneSchedule(sc))
		}
	}
	slices.SortFunc(out, func(a, b storage.Schedule) int { return strings.Compare(a.ID, b.ID) })
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// UpdateSchedule implements storage.Schedules.
func (s *Store) UpdateSchedule(_ context.Context, sc storage.Schedule, p storage.UpdateScheduleParams) (storage.UpdateScheduleResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.schedules(sc.Namespace)
	old, ok := m[sc.ID]
	switch {
	case !ok:
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: %w", sc.ID, storage.ErrNotFound)
	case old.Version != p.IfVersion:
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: version %d, expected %d: %w", sc.ID, old.Version, p.IfVersion, storage.ErrGenerationMismatch)
	}
	var fired []storage.UpsertResult
	if len(p.Fire) > 0 {
		specs := slices.Clone(p.Fire)
		for i := range specs {
			specs[i].CreateOnly = true
		}
		var err error
		if fired, err = s.upsert(sc.Namespace, specs); err != nil {
			return storage.UpdateScheduleResult{}, err
		}
	}
	now, _ := s.now()
	sc.Version, sc.CreateTime, sc.UpdateTime = old.Version+1, old.CreateTime, time.UnixMilli(now).UTC()
	sc.Template.Payload = slices.Clone(sc.Template.Payload)
	m[sc.ID] = sc
	return storage.UpdateScheduleResult{Schedule: cloneSchedule(sc), Fired: fired}, nil
}

// DeleteSchedule implements storage.Schedules.
func (s *Store) DeleteSchedule(_ context.Context, ns, id string, ifVersion int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.scheds[ns][id]
	switch {
	case !ok:
		return fmt.Errorf("delete schedule %q: %w", id, storage.ErrNotFound)
	case ifVersion != 0 && old.Version != ifVersion:
		return fmt.Errorf("delete schedule %q: version %d, expected %d: %w", id, old.Version, ifVersion, storage.ErrGenerationMismatch)
	}
	delete(s.scheds[ns], id)
	return nil
}

// CountSchedules implements storage.Schedules.
func (s *Store) CountSchedules(_ context.Context, ns string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.scheds[ns])), nil
}

// DueSchedules implements storage.Schedules.
func (s *Store) DueSchedules(_ context.Context, limit int) (storage.DueSchedules, error) {
	limit = max(1, min(limit, MaxBatch))
	s.mu.Lock()
	defer s.mu.Unlock()
	nowMS, _ := s.now()
	now := time.UnixMilli(nowMS).UTC()
	out := storage.DueSchedules{Now: now}
	for _, m := range s.scheds {
		var due []storage.Schedule
		for _, sc := range m {
			switch {
			case sc.Advance.IsZero():
			case !sc.Advance.After(now):
				due = append(due, sc)
			case out.Next.IsZero() || sc.Advance.Before(out.Next):
				out.Next = sc.Advance
			}
		}
		slices.SortFunc(due, func(a, b storage.Schedule) int {
			if c := a.Advance.Compare(b.Advance); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		if len(due) > limit {
			if n := due[limit].Advance; out.Next.IsZero() || n.Before(out.Next) {
				out.Next = n
			}
			due = due[:limit]
		}
		for _, sc := range due {
			out.Schedules = append(out.Schedules, cloneSchedule(sc))
		}
	}
	return out, nil
}

// DropSchedules implements storage.Schedules.
func (s *Store) DropSchedules(_ context.Context, ns string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(len(s.scheds[ns]))
	delete(s.scheds, ns)
	return n, nil
}

func cloneSchedule(sc storage.Schedule) storage.Schedule {
	sc.Template.Payload = slices.Clone(sc.Template.Payload)
	return sc
}
