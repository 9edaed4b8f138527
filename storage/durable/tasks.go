package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// storage.Tasks: MySQL first, then the index (see the package doc).

// Upsert creates or replaces tasks of ns: MySQL first (generation decided
// there), then the index with that generation. A relative delay is resolved
// by the index against its clock (Redis TIME, which decides due-ness) when
// it writes the task, and that due time is answered; MySQL keeps this
// replica's estimate of it (see now), which only matters if the task must
// be restored from MySQL. It returns only after the
// MySQL commit; an index failure after it is logged and repaired later
// (the result then has Earliest false). Specs with an explicit Generation
// are applied as such: Stale when MySQL holds a newer one. MySQL down:
// storage.ErrUnavailable and nothing written.
func (s *Store) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	// A write through a stale view of a deleted namespace is refused
	// before it reaches MySQL (the index keeps the namespace's
	// incarnation). MySQL, the authority, checks it again in the commit's
	// transaction (authority.Write.NSInc), which covers a write that
	// passed the index just before a DeleteNamespace and every write while
	// the index cannot answer.
	if inc := specs[0].NamespaceIncarnation; inc != 0 {
		if err := s.claimIncarnation(ctx, ns, inc); errors.Is(err, storage.ErrNamespaceEnded) {
			return nil, err
		}
	}
	now := s.clock.now(ctx, ns)
	rows := make([]authority.UpsertRow, len(specs))
	exact := false
	for i, sp := range specs {
		due := sp.DueTime
		if due.IsZero() {
			due = now.Add(sp.Delay)
		}
		payload := sp.Payload
		if payload == nil {
			payload = []byte{}
		}
		inc, exactInc := sp.Incarnation, sp.Incarnation != 0 && sp.Generation != 0
		if !exactInc {
			inc = s.newIncarnation(now)
		}
		rows[i] = authority.UpsertRow{ID: sp.ID, Kind: sp.Kind, Payload: payload, DueMS: storage.DueMilli(due), Gen: sp.Generation,
			Inc: inc, ExactInc: exactInc, Relative: sp.DueTime.IsZero(), Delay: sp.Delay, TraceParent: sp.TraceParent,
			CreateOnly: sp.CreateOnly, IfGen: max(sp.IfVersion().Generation, 0), IfInc: max(sp.IfVersion().Incarnation, 0)}
		if sp.Generation != 0 {
			exact = true
		}
	}
	s.ensureMarked(ctx, ns)
	if exact {
		return s.upsertExact(ctx, ns, rows, now.UnixMilli())
	}
	o := &op{Write: authority.Write{Kind: kindUpsert, NS: ns, NowMS: now.UnixMilli(), Rows: rows, NSInc: specs[0].NamespaceIncarnation}}
	if err := s.commit.submit(ctx, o); err != nil {
		return nil, err
	}
	res := o.Upserts
	for i := range res {
		if res[i].Refused != storage.NotRefused && res[i].Task.ID != "" {
			res[i].Task = s.current(ctx, ns, res[i].Task)
		}
	}
	if j := o.ix; j != nil && s.writers.awaitIndex(ctx, j) && j.err == nil {
		// The index's answers: whether the task became the earliest (to
		// wake dispatchers at once) and its own times, so a Get answers
		// the same task.
		for k, i := range j.rows {
			if !j.ok[k] {
				continue
			}
			r := j.res[k]
			res[i].Earliest = r.Earliest
			if !r.Task.DueTime.IsZero() {
				res[i].Task.DueTime = r.Task.DueTime
			}
			if !r.Task.CreateTime.IsZero() {
				res[i].Task.CreateTime = r.Task.CreateTime
			}
			if !r.Task.UpdateTime.IsZero() {
				res[i].Task.UpdateTime = r.Task.UpdateTime
			}
		}
	}
	return res, nil
}

// claimIncarnation asks the index whether the namespace incarnation inc of
// ns has ended (the namespace was deleted and re-created), without letting
// a hung index hold the write: it is skipped while the namespace's index
// queue is unhealthy and bounded by IndexWait (and half the caller's
// deadline) otherwise. When the index cannot answer, MySQL takes the
// write, as it does every write while Redis is down.
func (s *Store) claimIncarnation(ctx context.Context, ns string, inc int64) error {
	wait := s.writers.indexBudget(ctx, ns)
	if wait <= 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return s.idx.ClaimIncarnation(cctx, ns, inc)
}

// current returns the index's copy of t (a task MySQL holds, read for a
// refused conditional write) when the index holds that very version: it
// knows the state (DELIVERED, lease, attempts) MySQL does not. Otherwise,
// or if the index cannot answer, t as MySQL holds it.
func (s *Store) current(ctx context.Context, ns string, t storage.Task) storage.Task {
	it, err := s.idx.Get(ctx, ns, t.ID)
	if err != nil || it.Incarnation != t.Incarnation || it.Generation != t.Generation {
		return t
	}
	return it
}

// upsertExact applies specs that name their generation in MySQL (see
// authority.Store.UpsertExact), then writes the applied ones to the index
// in order, each with its generation.
func (s *Store) upsertExact(ctx context.Context, ns string, rows []authority.UpsertRow, nowMS int64) ([]storage.UpsertResult, error) {
	res, applied, err := s.db.UpsertExact(ctx, ns, rows, nowMS)
	if err != nil || len(applied) == 0 {
		return res, err
	}
	specs := make([]storage.UpsertSpec, len(applied))
	results := make([]*storage.UpsertResult, len(applied))
	for j, i := range applied {
		specs[j] = indexSpec(rows[i], res[i].Task)
		results[j] = &res[i]
	}
	s.indexWrite(ctx, ns, specs, results)
	return res, nil
}

// indexWrite writes specs (committed in MySQL) to the index and completes
// their results from its answers. On failure it logs, leaves the results
// as MySQL committed them (Earliest false) and queues the tasks for
// repair: the upserts are durable.
func (s *Store) indexWrite(ctx context.Context, ns string, specs []storage.UpsertSpec, results []*storage.UpsertResult) {
	res, err := s.idx.Upsert(ctx, ns, specs)
	if err == nil && len(res) != len(specs) {
		err = fmt.Errorf("index answered %d results for %d specs", len(res), len(specs))
	}
	if err != nil {
		s.warn.warn("index-write", "index write failed after the mysql commit; the tasks are durable and will be re-indexed",
			"namespace", ns, "tasks", len(specs), "err", err)
		ids := make([]string, len(specs))
		for i, sp := range specs {
			ids[i] = sp.ID
		}
		s.repairs.add(ns, ids)
		return
	}
	var stale []string
	for i, r := range results {
		if res[i].Stale {
			// The index holds a version MySQL did not just commit as the
			// newest: a concurrent newer write (harmless), or a version
			// MySQL never had or no longer has (a restored snapshot, a
			// promoted lagging replica). Either way the task is repaired
			// from MySQL, which wins, so it is never left hidden.
			stale = append(stale, specs[i].ID)
			continue
		}
		r.Earliest = res[i].Earliest
		if !res[i].Task.DueTime.IsZero() {
			r.Task.DueTime = res[i].Task.DueTime
		}
		if !res[i].Task.CreateTime.IsZero() {
			r.Task.CreateTime = res[i].Task.CreateTime
		}
		if !res[i].Task.UpdateTime.IsZero() {
			r.Task.UpdateTime = res[i].Task.UpdateTime
		}
	}
	if len(stale) > 0 {
		s.log.Info("the index held a newer version than mysql just committed; repairing from mysql", "namespace", ns, "tasks", len(stale))
		s.repairs.add(ns, stale)
	}
}

// ensureMarked sets the index marker of a namespace MySQL holds no task of
// yet, before its first write: such an index is complete by definition, so
// the reconciler need not rebuild it. (A namespace that has tasks in MySQL
// but no marker is left to the reconciler's rebuild.) Best effort: errors
// only mean the reconciler does the work.
func (s *Store) ensureMarked(ctx context.Context, ns string) {
	now := s.cfg.Clock.Now()
	s.marks.mu.Lock()
	done := s.marks.marked[ns]
	at, seen := s.marks.checked[ns]
	s.marks.mu.Unlock()
	if done || (seen && now.Sub(at) >= 0 && now.Sub(at) < time.Second) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.writers.waitBound(ctx, time.Now()))
	defer cancel()
	ok, err := s.idx.Indexed(ctx, ns)
	if err != nil {
		s.marks.mu.Lock()
		s.marks.checked[ns] = now // the index is down: do not ask on every write
		s.marks.mu.Unlock()
		return
	}
	if !ok {
		has, err := s.db.HasTasks(ctx, ns)
		switch {
		case err == nil && !has:
			ok = s.idx.MarkIndexed(ctx, ns) == nil
		case err == nil:
			s.marks.mu.Lock()
			s.marks.checked[ns] = now
			s.marks.mu.Unlock()
		}
	}
	if ok {
		s.marks.mu.Lock()
		s.marks.marked[ns] = true
		delete(s.marks.checked, ns)
		s.marks.mu.Unlock()
	}
}

// Remove deletes the task from MySQL, then from the index, and returns the
// state it was in (the index's, which knows DELIVERED; else MySQL's).
// ErrNotFound if neither had it. With ifVersion set, MySQL decides: the
// row is deleted only at that version, else a *storage.ConflictError
// carries the stored task and nothing is touched. MySQL down:
// ErrUnavailable and nothing touched. It answers only once the index
// removed the task too, so no delivery starts after it returned; when the
// index does not answer in time (see Config.IndexWait), ErrUnavailable:
// the task is gone from the authority, its index removal stays queued (and
// in the repair set if it fails), and a retry answers when the index has
// it done.
func (s *Store) Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	ifGen, ifInc := max(ifVersion.Generation, 0), max(ifVersion.Incarnation, 0)
	if ifGen == 0 {
		ifInc = 0
	}
	o := &op{Write: authority.Write{Kind: kindRemove, NS: ns, NowMS: s.cfg.Clock.Now().UnixMilli(), ID: id, IfGen: ifGen, IfInc: ifInc}}
	if err := s.commit.submit(ctx, o); err != nil {
		return storage.StateUnspecified, err
	}
	if o.Mismatch {
		t := o.Current
		if full, err := s.db.Get(ctx, ns, id); err == nil && full.Generation == t.Generation && full.Incarnation == t.Incarnation {
			t = full
		}
		return storage.StateUnspecified, &storage.ConflictError{Err: storage.ErrGenerationMismatch, Task: s.current(ctx, ns, t),
			Expected: storage.Version{ID: id, Generation: ifGen, Incarnation: ifInc}}
	}
	j := o.ix
	if !s.writers.awaitIndex(ctx, j) {
		return storage.StateUnspecified, fmt.Errorf("remove: deleted from mysql; the index removal is still pending (retry): %w", storage.ErrUnavailable)
	}
	if j.err != nil {
		return storage.StateUnspecified, fmt.Errorf("remove: index (the task is already deleted from mysql; retry): %w", j.err)
	}
	switch {
	case j.prev != storage.StateUnspecified:
		return j.prev, nil
	case j.mysqlPrev != storage.StateUnspecified:
		return j.mysqlPrev, nil
	}
	return storage.StateUnspecified, fmt.Errorf("remove: %w", storage.ErrNotFound)
}

// removeConcurrency bounds the removes RemoveTasks submits at once for a
// list of ids (the committer gathers them into a few transactions).
const removeConcurrency = 256

// RemoveTasks deletes the tasks p selects. Named ids go through the
// committer as removes, MySQL first (as Remove does, concurrently). A
// filter page is matched in the index (which knows every state; the
// reconciler keeps it complete), then exactly the matched versions are
// deleted from MySQL, then forgotten by the index: a task upserted since
// the match keeps its new version in both. Removed counts what the index
// deleted. MySQL down: ErrUnavailable and nothing touched; index down after
// the MySQL delete: ErrUnavailable, and the same call again finishes it.
//
// When the index has lost the namespace (no marker, no task: a Redis that
// restarted empty, before the rebuild reaches it), the filter is matched
// in MySQL instead, page by page in id order, with a cursor of its own (as
// List does); DELIVERED then matches nothing.
func (s *Store) RemoveTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	if len(p.IDs) > 0 {
		return s.removeIDs(ctx, ns, p.IDs)
	}
	after, ok := strings.CutPrefix(p.Cursor, mysqlCursor)
	if !ok && p.Cursor == "" {
		// A filter matched in MySQL deletes there only: do it when the
		// index has lost ns, never when it merely cannot be read (its
		// entries would outlive the rows).
		lost, err := s.indexLost(ctx, ns)
		ok = err == nil && lost
	}
	if ok {
		return s.removeMatchingMySQL(ctx, ns, p, after)
	}
	vs, next, err := s.idx.MatchTasks(ctx, ns, p)
	if err != nil || len(vs) == 0 {
		return storage.RemoveTasksResult{Next: next}, err
	}
	if err := s.db.DeleteVersions(ctx, ns, vs); err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", err)
	}
	n, err := s.idx.Forget(ctx, ns, vs)
	if err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: index (the tasks are already deleted from mysql; retry): %w", err)
	}
	return storage.RemoveTasksResult{Removed: int64(n), Next: next}, nil
}

// removeMatchingMySQL is RemoveTasks of a filter matched in MySQL: up to
// p.Limit (1..1,000) matching tasks after id `after`, deleted by exact
// version, then forgotten by the index (in case the rebuild re-indexed
// them meanwhile). Removed counts the versions matched.
func (s *Store) removeMatchingMySQL(ctx context.Context, ns string, p storage.RemoveTasksParams, after string) (storage.RemoveTasksResult, error) {
	limit := p.Limit
	if limit <= 0 || limit > s.cfg.ReconcileBatch {
		limit = min(s.cfg.ReconcileBatch, 1000)
	}
	vs, err := s.db.MatchVersions(ctx, ns, p.Filter, after, limit)
	if err != nil || len(vs) == 0 {
		return storage.RemoveTasksResult{}, err
	}
	if err := s.db.DeleteVersions(ctx, ns, vs); err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", err)
	}
	if _, err := s.idx.Forget(ctx, ns, vs); err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: index (the tasks are already deleted from mysql; retry): %w", err)
	}
	res := storage.RemoveTasksResult{Removed: int64(len(vs))}
	if len(vs) == limit {
		res.Next = mysqlCursor + vs[len(vs)-1].ID
	}
	return res, nil
}

// removeIDs removes each id as Remove does, at most removeConcurrency at
// once, and answers the state each was in (States) and how many existed.
// The first failure is returned (with the results of the others).
func (s *Store) removeIDs(ctx context.Context, ns string, ids []string) (storage.RemoveTasksResult, error) {
	var (
		mu     sync.Mutex
		first  error
		wg     sync.WaitGroup
		sem    = make(chan struct{}, removeConcurrency)
		states = make([]storage.State, len(ids))
		seen   = make(map[string]bool, len(ids))
	)
	for i, id := range ids {
		if seen[id] {
			continue // a repeat answers StateUnspecified, as the index does
		}
		seen[id] = true
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			st, err := s.Remove(ctx, ns, id, storage.Version{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				states[i] = st
			case errors.Is(err, storage.ErrNotFound):
			case first == nil:
				first = err
			}
		}()
	}
	wg.Wait()
	res := storage.RemoveTasksResult{States: states}
	for _, st := range states {
		if st != storage.StateUnspecified {
			res.Removed++
		}
	}
	if first != nil {
		return res, fmt.Errorf("remove tasks: %w", first)
	}
	return res, nil
}

// Get returns the task from the index or, when the index does not have it
// (or cannot be reached), from MySQL.
func (s *Store) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	t, err := s.idx.Get(ctx, ns, id)
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrUnavailable) {
		return storage.Task{}, err
	}
	mt, merr := s.db.Get(ctx, ns, id)
	if merr != nil {
		if errors.Is(merr, storage.ErrNotFound) && errors.Is(err, storage.ErrUnavailable) {
			return storage.Task{}, err
		}
		return storage.Task{}, merr
	}
	return mt, nil
}

// mysqlCursor prefixes the cursors of pages read from MySQL.
const mysqlCursor = "m:"

// List pages through the index. It reads MySQL instead when the index
// cannot be reached, or when the index holds no task of the namespace at
// all and has no index marker for it (Redis lost its data and the rebuild
// has not reached the namespace yet). MySQL does not know which tasks are
// in flight: a MySQL page of StateDelivered is empty and tasks in flight
// are listed as scheduled. A cursor from one source continues in that
// source.
func (s *Store) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	if strings.HasPrefix(p.Cursor, mysqlCursor) {
		p.Cursor = p.Cursor[len(mysqlCursor):]
		return s.listMySQL(ctx, ns, p)
	}
	state := p.State
	if state == storage.StateUnspecified {
		state = storage.StateScheduled
	}
	ts, next, err := s.idx.List(ctx, ns, p)
	if p.Cursor != "" || state == storage.StateDelivered {
		return ts, next, err
	}
	p.State = state
	if err != nil {
		if errors.Is(err, storage.ErrUnavailable) {
			return s.listMySQL(ctx, ns, p)
		}
		return ts, next, err
	}
	if len(ts) == 0 {
		// An empty page from an index that lost ns, or that cannot say
		// whether it did, is not an answer: MySQL, the authority, gives it
		// (an index error here used to return the empty page as if ns had
		// no tasks: TestListFallsBackWhenTheIndexCannotSay).
		if lost, err := s.indexLost(ctx, ns); lost || err != nil {
			return s.listMySQL(ctx, ns, p)
		}
	}
	return ts, next, nil
}

// listMySQL pages through MySQL (within the same byte budget); its cursors
// carry the mysqlCursor prefix.
func (s *Store) listMySQL(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	ts, next, err := s.db.List(ctx, ns, p)
	if next != "" {
		next = mysqlCursor + next
	}
	return ts, next, err
}

// indexLost reports whether the index holds nothing of ns and no marker
// says that is complete; err when the index cannot say (its marker or its
// counts unreadable).
func (s *Store) indexLost(ctx context.Context, ns string) (bool, error) {
	ok, err := s.idx.Indexed(ctx, ns)
	if err != nil || ok {
		return false, err
	}
	st, err := s.idx.Stats(ctx, ns)
	if err != nil {
		return false, err
	}
	return st.Scheduled+st.Delivered+st.Dead == 0, nil
}
