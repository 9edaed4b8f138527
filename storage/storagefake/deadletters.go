package storagefake

import (
	"context"
	"slices"
	"time"

	"github.com/delayd/delayd/storage"
)

// The fake's dead letters and counts (storage.DeadLetters, storage.Counter).

// selectDead returns the dead records p selects (ids or the oldest Limit).
func (s *Store) selectDead(ns string, ids []string, all bool, limit int) []*record {
	m := s.nss[ns]
	if all {
		d := sorted(m, storage.StateDead)
		return d[:min(len(d), min(max(limit, 1), MaxBatch))]
	}
	var out []*record
	for _, id := range ids {
		if r := m[id]; r != nil && r.task.State == storage.StateDead && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// Requeue moves dead tasks back to scheduled, attempts reset.
func (s *Store) Requeue(_ context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	first, hasFirst := head(s.nss[ns])
	due := now + max(p.Delay.Milliseconds(), 0)
	var moved []storage.Moved
	for _, r := range s.selectDead(ns, p.IDs, p.All, p.Limit) {
		r.task.State, r.task.Attempt, r.due, r.died = storage.StateScheduled, 0, due, 0
		r.task.UpdateTime = time.UnixMilli(now)
		moved = append(moved, storage.Moved{ID: r.task.ID, Incarnation: r.task.Incarnation,
			Generation: r.task.Generation, State: storage.StateScheduled, DueTime: time.UnixMilli(due), LastError: r.task.LastError})
	}
	if len(moved) > 0 && (!hasFirst || due < first) {
		s.publish(ns)
	}
	return moved, nil
}

// Purge deletes the dead tasks p selects.
func (s *Store) Purge(_ context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.selectDead(ns, p.IDs, p.All, p.Limit) {
		delete(s.nss[ns], r.task.ID)
		out = append(out, r.task.ID)
	}
	return out, nil
}

// DueKinds counts due tasks per kind among the first KindScanWindow, as
// duekinds.lua does.
func (s *Store) DueKinds(_ context.Context, ns string) (storage.DueKinds, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	out := storage.DueKinds{Counts: map[string]int64{}}
	n := 0
	for _, r := range sorted(s.nss[ns], storage.StateScheduled) {
		if r.due > now {
			break
		}
		if n == storage.KindScanWindow {
			out.Partial = true
			break
		}
		n++
		out.Counts[r.task.Kind]++
	}
	return out, nil
}

// Stats counts one namespace's tasks per state.
func (s *Store) Stats(_ context.Context, ns string) (storage.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	st := storage.Stats{Now: time.UnixMilli(now)}
	var oldest int64
	for _, r := range s.nss[ns] {
		switch r.task.State {
		case storage.StateScheduled:
			st.Scheduled++
			if r.due <= now {
				st.DueNow++
			}
			if oldest == 0 || r.due < oldest {
				oldest = r.due
			}
		case storage.StateDelivered:
			st.Delivered++
		case storage.StateDead:
			st.Dead++
		}
	}
	if oldest != 0 {
		st.OldestDue = time.UnixMilli(oldest)
	}
	return st, nil
}

// DropNamespace deletes every task of ns and returns how many it deleted;
// with an incarnation it ends it as the Redis index does (see Upsert).
func (s *Store) DropNamespace(_ context.Context, ns string, incarnation int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lives[ns]; incarnation > l.ended {
		l.ended = incarnation
		s.lives[ns] = l
	}
	n := int64(len(s.nss[ns]))
	delete(s.nss, ns)
	if incarnation > 0 {
		// A deleted namespace's history goes with it, as in the real stores.
		for k := range s.hist {
			if k.ns == ns && k.inc <= incarnation {
				delete(s.hist, k)
			}
		}
	}
	return n, nil
}
