package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/delayd/delayd/storage"
)

// The Store's task calls (storage.Tasks and storage.Index's lookups by id):
// each counts the namespace's shards, splits its items by shard and runs
// the shard's call (shard_tasks.go) on each, merging the answers.

// Upsert creates or replaces tasks of ns, in one round trip per MaxBatch
// specs or Options.MaxScriptBytes, whichever comes first. Due times are resolved with the Redis clock when DueTime is zero.
// Results are in spec order. When any task becomes the earliest of ns, the
// namespace is published on the wake channel. Conditional specs
// (CreateOnly, IfGeneration) are decided in the same script, against what
// is stored at that instant and what earlier specs of the call wrote.
//
// Unless Options.NoCoalesce is set, a call of fewer than CoalesceMax specs
// made while another such call of ns is in flight waits for it and then goes
// out together with the other calls that queued meanwhile, in one script
// call: it behaves as if the calls ran one after another in arrival order,
// and an error of the shared script call is every caller's error. A call
// whose ctx ends while it waits returns ctx's error, with its specs not
// written; once sent, it returns the script call's answer (see coalescer).
func (s *Store) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	for i := range specs {
		if specs[i].NamespaceIncarnation != specs[0].NamespaceIncarnation {
			return nil, fmt.Errorf("upsert: specs name namespace incarnations %d and %d; one call writes for one",
				specs[0].NamespaceIncarnation, specs[i].NamespaceIncarnation)
		}
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("upsert: %w", err)
	}
	return splitByShard(n, specs, func(i int) string { return specs[i].ID }, func(i int, part []storage.UpsertSpec) ([]storage.UpsertResult, error) {
		return s.upsertOn(ctx, s.shardOfN(ns, i, n), part)
	})
}

// upsertOn writes specs, all of shard sh: coalesced with concurrent calls
// of the same shard unless Options.NoCoalesce says otherwise, then their
// trace contexts kept (Options.Traces).
func (s *Store) upsertOn(ctx context.Context, sh shard, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	var res []storage.UpsertResult
	var err error
	if s.noCo || len(specs) == 0 || len(specs) >= CoalesceMax {
		res, err = sh.upsert(ctx, specs)
	} else {
		res, err = s.co.do(ctx, coKey{ns: sh.ns, sh: sh.i}, specs, sh.upsert)
	}
	if err == nil && s.traces {
		sh.writeTraces(ctx, specs, res)
	}
	return res, err
}

// ClaimIncarnation checks, as an upsert for incarnation inc of ns (the
// namespace's create time, ms) would, that neither it nor a later one has
// ended, and records it as the latest that writes. storage.ErrNamespaceEnded when it ended. Durable mode calls it
// before writing to MySQL.
func (s *Store) ClaimIncarnation(ctx context.Context, ns string, inc int64) error {
	if inc <= 0 {
		return nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	return fanOut(allShards(n), func(i int) error { return s.shardOfN(ns, i, n).claim(ctx, inc) })
}

// nsIncarnation is the namespace incarnation specs are written for (they
// all carry the same; Upsert checks).
func nsIncarnation(specs []storage.UpsertSpec) int64 {
	if len(specs) == 0 {
		return 0
	}
	return specs[0].NamespaceIncarnation
}

// Remove deletes the task in any state and returns the state it was in;
// storage.ErrNotFound if there was no such task. With ifVersion.Generation
// set, the task is deleted only when its stored version matches (the
// generation, and the incarnation unless ifVersion.Incarnation is zero),
// checked in the same script; otherwise a *storage.ConflictError carries
// the stored task.
func (s *Store) Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	sh, err := s.taskShard(ctx, ns, id)
	if err != nil {
		return 0, fmt.Errorf("remove: %w", err)
	}
	return sh.remove(ctx, id, ifVersion)
}

// RemoveTasks deletes p.IDs (at most MaxBatch; those that do not exist are
// skipped) in one script call, or examines at most p.Limit (clamped to
// 1..MaxBatch) tasks of the p.Filter walk from p.Cursor and deletes those
// that match, in one script call per state walked. The walk goes through
// the scheduled, then the delivered, then the dead tasks (only p.Filter.
// State's when set), each in its ZSET's order. Each match is decided and
// deleted atomically; a task that moves while the walk runs (rescheduled,
// delivered) may be missed or examined twice.
func (s *Store) RemoveTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	if len(p.IDs) > 0 {
		if len(p.IDs) > MaxBatch {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %d ids; at most %d per call", len(p.IDs), MaxBatch)
		}
		n, err := s.shardCount(ctx, ns)
		if err != nil {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", err)
		}
		groups := groupIndexes(n, len(p.IDs), func(i int) string { return p.IDs[i] })
		states := make([]storage.State, len(p.IDs))
		err = fanOut(groupShards(groups), func(i int) error {
			return s.shardOfN(ns, i, n).removeIDs(ctx, p.IDs, groups[i], states)
		})
		res := storage.RemoveTasksResult{States: states}
		for _, st := range states {
			if st != storage.StateUnspecified {
				res.Removed++
			}
		}
		return res, err
	}
	vs, next, err := s.walk(ctx, ns, p, false)
	return storage.RemoveTasksResult{Removed: int64(len(vs)), Next: next}, err
}

// MatchTasks is the walk of RemoveTasks (p.Filter from p.Cursor, at most
// p.Limit tasks examined) without deleting anything: it returns the
// version of each task that matches and the cursor of the next page.
// Durable mode deletes exactly those versions from MySQL, then forgets
// them here.
func (s *Store) MatchTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) ([]storage.Version, string, error) {
	return s.walk(ctx, ns, p, true)
}

// Get returns one task; storage.ErrNotFound if there is none.
func (s *Store) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	sh, err := s.taskShard(ctx, ns, id)
	if err != nil {
		return storage.Task{}, fmt.Errorf("get: %w", err)
	}
	return sh.get(ctx, id)
}

// List returns one page of the tasks of one state (see
// storage.ListParams): the list script stops before the byte budget
// (p.MaxBytes) and this method cuts again by the exact size, so a page
// never holds more than p.Limit (at most MaxBatch) tasks nor, past its
// first task, more than p.MaxBytes. Order: due time, lease deadline, death
// time; ties by id. The cursor is opaque; one made for another state fails
// with ErrInvalidCursor. Paging is stable: a task that stays where it is is
// listed exactly once.
func (s *Store) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, "", fmt.Errorf("list: %w", err)
	}
	if n == 1 {
		ts, _, next, err := s.shardOfN(ns, 0, 1).list(ctx, p)
		return ts, next, err
	}
	return s.listSharded(ctx, ns, n, p)
}

// listSharded merges the shards' pages: each shard lists from the same
// cursor; merged tasks are kept only up to the earliest last task of a
// shard that has more (past it, that shard's next tasks are unknown), then
// cut to the limit and byte budget.
func (s *Store) listSharded(ctx context.Context, ns string, n int, p storage.ListParams) ([]storage.Task, string, error) {
	state := p.State
	if state == storage.StateUnspecified {
		state = storage.StateScheduled
	}
	type item struct {
		t     storage.Task
		score int64
	}
	pages := make([][]item, n)
	more := make([]bool, n)
	cs, cid, err := parseCursor(state, p.Cursor)
	if err != nil {
		return nil, "", err
	}
	csN, _ := strconv.ParseInt(cs, 10, 64)
	after := func(score int64, id string) bool {
		return cs == "" || score > csN || (score == csN && id > cid)
	}
	err = fanOut(allShards(n), func(sh int) error {
		q := p
		// A shard that does not hold the cursor's task reads from the first
		// task at the cursor's due time and skips those that sort before
		// the cursor: a page of only those is empty but not the end, so
		// read on from where it stopped, still skipping up to the cursor.
		for {
			ts, scores, next, err := s.shardOfN(ns, sh, n).list(ctx, q)
			if err != nil {
				return err
			}
			for i := range ts {
				if after(scores[i], ts[i].ID) {
					pages[sh] = append(pages[sh], item{ts[i], scores[i]})
				}
			}
			more[sh] = next != ""
			if len(pages[sh]) > 0 || next == "" {
				return nil
			}
			q.Cursor = next
		}
	})
	if err != nil {
		return nil, "", err
	}
	less := func(a, b item) int {
		return cmp.Or(cmp.Compare(a.score, b.score), strings.Compare(a.t.ID, b.t.ID))
	}
	var cutoff *item
	var all []item
	for sh, pg := range pages {
		all = append(all, pg...)
		if more[sh] && len(pg) > 0 {
			if last := pg[len(pg)-1]; cutoff == nil || less(last, *cutoff) < 0 {
				cutoff = &last
			}
		}
	}
	slices.SortFunc(all, less)
	hasMore := cutoff != nil
	if cutoff != nil {
		k := 0
		for k < len(all) && less(all[k], *cutoff) <= 0 {
			k++
		}
		all = all[:k]
	}
	limit := min(max(p.Limit, 1), MaxBatch)
	if len(all) > limit {
		all, hasMore = all[:limit], true
	}
	tasks := make([]storage.Task, len(all))
	for i := range all {
		tasks[i] = all[i].t
	}
	kept, cut := storage.CutPage(tasks, p.MaxBytes)
	if !cut && !hasMore {
		return kept, "", nil
	}
	if len(kept) == 0 {
		return kept, "", nil
	}
	last := all[len(kept)-1]
	return kept, makeCursor(state, last.score, last.t.ID), nil
}

// A sharded walk cursor is "s<shard>/" followed by that shard's walk
// cursor (see walkCursor); one namespace of one shard uses the plain form.
func (s *Store) walk(ctx context.Context, ns string, p storage.RemoveTasksParams, dry bool) ([]storage.Version, string, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, "", fmt.Errorf("remove tasks: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, 1).walk(ctx, p, dry)
	}
	sh, inner := 0, ""
	if p.Cursor != "" {
		rest, ok := strings.CutPrefix(p.Cursor, "s")
		num, in, ok2 := strings.Cut(rest, "/")
		v, perr := strconv.Atoi(num)
		if !ok || !ok2 || perr != nil || v < 0 || v >= n {
			return nil, "", fmt.Errorf("remove tasks: %w", storage.ErrInvalidCursor)
		}
		sh, inner = v, in
	}
	q := p
	q.Cursor = inner
	vs, next, err := s.shardOfN(ns, sh, n).walk(ctx, q, dry)
	if err != nil {
		return vs, "", err
	}
	switch {
	case next != "":
		return vs, "s" + strconv.Itoa(sh) + "/" + next, nil
	case sh+1 < n:
		return vs, "s" + strconv.Itoa(sh+1) + "/", nil
	}
	return vs, "", nil
}

// taskShard is the shard task id of ns lives in.
func (s *Store) taskShard(ctx context.Context, ns, id string) (shard, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return shard{}, err
	}
	return s.shardOfN(ns, shardOf(id, n), n), nil
}
