package storagefake

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// The fake's task calls (storage.Tasks).

// Upsert creates or replaces tasks, in spec order, as upsert.lua does.
func (s *Store) Upsert(_ context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upsert(ns, specs)
}

// upsert is Upsert with s.mu held (UpdateSchedule creates firings with it).
func (s *Store) upsert(ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	if len(specs) > 0 {
		if err := s.claim(ns, specs[0].NamespaceIncarnation); err != nil {
			return nil, err
		}
	}
	now, nowUS := s.now()
	m := s.ns(ns)
	first, hasFirst := head(m)
	wake := false
	out := make([]storage.UpsertResult, len(specs))
	for i, sp := range specs {
		var due int64
		switch {
		case !sp.DueTime.IsZero():
			due = storage.DueMilli(sp.DueTime)
		case sp.Delay <= 0:
			due = now
		default:
			due = (nowUS + storage.DelayMicros(sp.Delay) + 999) / 1000
		}
		old := m[sp.ID]
		switch {
		case sp.CreateOnly && old != nil:
			out[i] = storage.UpsertResult{Task: old.view(), Refused: storage.RefusedExists}
			continue
		case sp.IfGeneration != 0 && (old == nil || !sp.IfVersion().Matches(old.task.Incarnation, old.task.Generation)):
			out[i] = storage.UpsertResult{Refused: storage.RefusedGeneration}
			if old != nil {
				out[i].Task = old.view()
			}
			continue
		}
		inc, gen, created, dseq, created1 := sp.Incarnation, sp.Generation, time.UnixMilli(now), int64(0), true
		keep := false
		if old != nil {
			o := old.task
			if sp.Incarnation == 0 {
				inc = o.Incarnation
				if sp.Generation == 0 {
					gen = o.Generation + 1
				} else if o.Generation > sp.Generation {
					keep = true
				}
			} else if !(storage.Version{Incarnation: sp.Incarnation, Generation: sp.Generation}).Newer(
				storage.Version{Incarnation: o.Incarnation, Generation: o.Generation}) {
				keep = true
			}
			if inc == o.Incarnation {
				created, dseq, created1 = o.CreateTime, old.dseq, false
			}
		} else {
			if inc == 0 {
				inc = nowUS
			}
			if gen == 0 {
				gen = 1
			}
		}
		if keep {
			t := old.view()
			stale := t.Generation > sp.Generation
			if sp.Incarnation != 0 {
				stale = storage.Version{Incarnation: t.Incarnation, Generation: t.Generation}.Newer(
					storage.Version{Incarnation: sp.Incarnation, Generation: sp.Generation})
			}
			out[i] = storage.UpsertResult{Task: t, Stale: stale}
			continue
		}
		r := &record{due: due, dseq: dseq, task: storage.Task{
			Namespace: ns, ID: sp.ID, Kind: sp.Kind, Payload: slices.Clone(sp.Payload),
			State: storage.StateScheduled, Generation: gen, Incarnation: inc,
			CreateTime: created, UpdateTime: time.UnixMilli(now), TraceParent: sp.TraceParent,
		}}
		m[sp.ID] = r
		res := storage.UpsertResult{Task: r.view(), Created: created1}
		if !hasFirst || due < first {
			first, hasFirst = due, true
			res.Earliest, wake = true, true
		}
		out[i] = res
	}
	if wake {
		s.publish(ns)
	}
	return out, nil
}

// Remove deletes a task in any state; with ifVersion only at that version.
func (s *Store) Remove(_ context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.nss[ns][id]
	if r == nil {
		return storage.StateUnspecified, storage.ErrNotFound
	}
	if !ifVersion.Matches(r.task.Incarnation, r.task.Generation) {
		ifVersion.ID = id
		return storage.StateUnspecified, &storage.ConflictError{Err: storage.ErrGenerationMismatch, Task: r.view(), Expected: ifVersion}
	}
	delete(s.nss[ns], id)
	return r.task.State, nil
}

// RemoveTasks deletes p.IDs, or walks p.Filter as the Redis index does:
// scheduled, delivered, then dead tasks, each in set order, at most
// p.Limit (1..MaxBatch) examined per call.
func (s *Store) RemoveTasks(_ context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.nss[ns]
	if len(p.IDs) > 0 {
		res := storage.RemoveTasksResult{States: make([]storage.State, len(p.IDs))}
		for i, id := range p.IDs {
			if r, ok := m[id]; ok {
				res.States[i] = r.task.State
				delete(m, id)
				res.Removed++
			}
		}
		return res, nil
	}
	states := []storage.State{storage.StateScheduled, storage.StateDelivered, storage.StateDead}
	if p.Filter.State != storage.StateUnspecified {
		states = []storage.State{p.Filter.State}
	}
	var after *record
	if c := p.Cursor; c != "" {
		parts := strings.SplitN(strings.TrimPrefix(c, "f"), ":", 3)
		st, err := strconv.Atoi(parts[0])
		if !strings.HasPrefix(c, "f") || err != nil || len(parts) != 3 || !slices.Contains(states, storage.State(st)) {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", storage.ErrInvalidCursor)
		}
		sc, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", storage.ErrInvalidCursor)
		}
		states = states[slices.Index(states, storage.State(st)):]
		after = &record{task: storage.Task{ID: parts[2], State: storage.State(st)}, due: sc, lease: sc, died: sc}
	}
	budget := p.Limit
	if budget <= 0 || budget > MaxBatch {
		budget = MaxBatch
	}
	var res storage.RemoveTasksResult
	for _, st := range states {
		for _, r := range sorted(m, st) {
			if after != nil && after.task.State == st &&
				cmp.Or(cmp.Compare(r.score(), after.score()), strings.Compare(r.task.ID, after.task.ID)) <= 0 {
				continue
			}
			if budget == 0 {
				return res, nil
			}
			budget--
			res.Next = fmt.Sprintf("f%d:%d:%s", st, r.score(), r.task.ID)
			if (p.Filter.Kind == "" || r.task.Kind == p.Filter.Kind) && strings.HasPrefix(r.task.ID, p.Filter.IDPrefix) {
				delete(m, r.task.ID)
				res.Removed++
			}
		}
	}
	res.Next = ""
	return res, nil
}

// Get returns one task.
func (s *Store) Get(_ context.Context, ns, id string) (storage.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.nss[ns][id]
	if r == nil {
		return storage.Task{}, storage.ErrNotFound
	}
	return r.view(), nil
}

// List returns a page of one state's tasks in set order after p.Cursor,
// cut by p.MaxBytes as storage.ListParams says.
func (s *Store) List(_ context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	state := p.State
	if state == storage.StateUnspecified {
		state = storage.StateScheduled
	}
	limit := min(max(p.Limit, 1), MaxBatch)
	var after *record
	if cursor := p.Cursor; cursor != "" {
		parts := strings.SplitN(cursor, ":", 3)
		if len(parts) != 3 || parts[0] != strconv.Itoa(int(state)) {
			return nil, "", fmt.Errorf("list: %w", storage.ErrInvalidCursor)
		}
		sc, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("list: %w", storage.ErrInvalidCursor)
		}
		after = &record{task: storage.Task{ID: parts[2], State: state}, due: sc, lease: sc, died: sc}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		page []storage.Task
		recs []*record
	)
	for _, r := range sorted(s.nss[ns], state) {
		if after != nil && cmp.Or(cmp.Compare(r.score(), after.score()), strings.Compare(r.task.ID, after.task.ID)) <= 0 {
			continue
		}
		t := r.view()
		if p.NoPayload {
			t.Payload = nil
		}
		page = append(page, t)
		recs = append(recs, r)
		if len(page) == limit+1 {
			break
		}
	}
	more := len(page) > limit
	page = page[:min(len(page), limit)]
	if kept, cut := storage.CutPage(page, p.MaxBytes); cut {
		page, more = kept, true
	}
	next := ""
	if more {
		last := recs[len(page)-1]
		next = fmt.Sprintf("%d:%d:%s", state, last.score(), last.task.ID)
	}
	return page, next, nil
}
