package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/delayd/delayd/storage"
)

// A shard's task calls: upsert, claim, remove, get, list and the
// RemoveTasks walk (Store.Upsert, ClaimIncarnation, Remove, RemoveTasks,
// Get, List fan them out).

// upsert runs the upsert script for specs, in calls of at most
// MaxBatch specs and Options.MaxScriptBytes. When the namespace
// incarnation the specs name has ended it fails with
// storage.ErrNamespaceEnded (a call split in several stops at the first
// refused one).
func (sh shard) upsert(ctx context.Context, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	ns := sh.ns
	k := sh.k
	keys := sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body, k.life, k.hwm)
	nsInc := nsIncarnation(specs)
	out := make([]storage.UpsertResult, 0, len(specs))
	size := func(i int) int { return len(specs[i].ID) + len(specs[i].Kind) + len(specs[i].Payload) }
	err := byteChunks(len(specs), sh.maxArgs, size, func(lo, hi int) error {
		part := specs[lo:hi]
		args := append(headArgs(4+10*len(part)), sh.wakeChannel(), ns, len(part))
		for i := range part {
			sp := &part[i]
			due := ""
			if !sp.DueTime.IsZero() {
				due = strconv.FormatInt(storage.DueMilli(sp.DueTime), 10)
			}
			inc := sp.Incarnation
			if sp.Generation == 0 {
				inc = 0
			}
			want := sp.IfVersion()
			args = append(args, sp.ID, due, storage.DelayMicros(sp.Delay), inc, sp.Generation, sp.Kind, sp.Payload,
				luaBool(sp.CreateOnly), max(want.Generation, 0), max(want.Incarnation, 0))
		}
		args = append(args, nsInc)
		raw, err := sh.runSlice(ctx, "upsert", scripts.upsert, keys, args...)
		if err != nil {
			return err
		}
		if endedReply(raw) {
			return fmt.Errorf("upsert: namespace %q incarnation %d: %w", ns, nsInc, storage.ErrNamespaceEnded)
		}
		rep, err := decodeReply("upsert", raw, rowsOf(1, 5, len(part)))
		if err != nil {
			return err
		}
		now, _ := replyInt(rep.head[0])
		for i := range part {
			sp := &part[i]
			v := rep.row(i)
			code, err := replyInt(v[0])
			if err != nil {
				return fmt.Errorf("upsert: %w", err)
			}
			if code == 5 || code == 6 {
				r := storage.UpsertResult{Refused: storage.RefusedExists}
				if code == 6 {
					r.Refused = storage.RefusedGeneration
				}
				if h, _ := replyString(v[1]); h != "" {
					if r.Task, err = decodeTask(ns, sp.ID, v[1], v[2], v[3], v[4]); err != nil {
						return fmt.Errorf("upsert: %w", err)
					}
				}
				out = append(out, r)
				continue
			}
			if code == 4 {
				t, err := decodeTask(ns, sp.ID, v[1], v[2], v[3], v[4])
				if err != nil {
					return fmt.Errorf("upsert: %w", err)
				}
				stale := t.Generation > sp.Generation
				if sp.Incarnation != 0 {
					stale = t.Incarnation > sp.Incarnation || (t.Incarnation == sp.Incarnation && t.Generation > sp.Generation)
				}
				out = append(out, storage.UpsertResult{Task: t, Stale: stale})
				continue
			}
			gen, _ := replyInt(v[1])
			created, _ := replyInt(v[2])
			due, _ := replyInt(v[3])
			inc, _ := replyInt(v[4])
			out = append(out, storage.UpsertResult{
				Task: storage.Task{
					Namespace:   ns,
					ID:          sp.ID,
					Kind:        sp.Kind,
					Payload:     sp.Payload,
					DueTime:     msTime(due),
					State:       storage.StateScheduled,
					Generation:  gen,
					Incarnation: inc,
					CreateTime:  msTime(created),
					UpdateTime:  msTime(now),
				},
				Created:  code&1 != 0,
				Earliest: code&2 != 0,
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claim is ClaimIncarnation for this shard (whose life key it checks).
func (sh shard) claim(ctx context.Context, inc int64) error {
	ns := sh.ns
	k := sh.k
	raw, err := sh.runSlice(ctx, "claim incarnation", scripts.upsert,
		sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body, k.life, k.hwm), append(headArgs(4), sh.wakeChannel(), ns, 0, inc)...)
	if err != nil {
		return err
	}
	if endedReply(raw) {
		return fmt.Errorf("claim: namespace %q incarnation %d: %w", ns, inc, storage.ErrNamespaceEnded)
	}
	_, err = decodeReply("claim incarnation", raw, rowsOf(1, 5, 0))
	return err
}

// remove is Remove on this shard (the task's).
func (sh shard) remove(ctx context.Context, id string, ifVersion storage.Version) (storage.State, error) {
	ns, k := sh.ns, sh.k
	ifGen, ifInc := max(ifVersion.Generation, 0), max(ifVersion.Incarnation, 0)
	if ifGen == 0 {
		ifInc = 0
	}
	// {state} or, refused on its version, {4, header, state, score, payload}.
	rep, err := sh.runRows(ctx, "remove", scripts.remove, sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body),
		rowsOf(1, 4, anyRows), append(headArgs(3), id, ifGen, ifInc)...)
	if err != nil {
		return 0, err
	}
	n, err := replyInt(rep.head[0])
	if err != nil {
		return 0, fmt.Errorf("remove: %w", err)
	}
	switch {
	case n == 4 && rep.n() == 1:
		v := rep.row(0)
		t, err := decodeTask(ns, id, v[0], v[1], v[2], v[3])
		if err != nil {
			return 0, fmt.Errorf("remove: %w", err)
		}
		return 0, &storage.ConflictError{Err: storage.ErrGenerationMismatch, Task: t, Expected: storage.Version{ID: id, Generation: ifGen, Incarnation: ifInc}}
	case n == 0:
		return 0, fmt.Errorf("remove %q: %w", id, storage.ErrNotFound)
	}
	return stateOf(n), nil
}

// removeIDs deletes ids[i] for each i of idx (all of this shard) and
// sets states[i] to the state each was in (StateUnspecified: none).
func (sh shard) removeIDs(ctx context.Context, ids []string, idx []int, states []storage.State) error {
	k := sh.k
	keys := sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body)
	args := append(headArgs(1+len(idx)), "ids")
	for _, i := range idx {
		args = append(args, ids[i])
	}
	rep, err := sh.runRows(ctx, "remove tasks", scripts.removeTasks, keys, rowsOf(1, 1, len(idx)), args...)
	if err != nil {
		return err
	}
	for j, i := range idx {
		c, err := replyInt(rep.body[j])
		if err != nil {
			return fmt.Errorf("remove tasks: %w", err)
		}
		if c != 0 {
			states[i] = stateOf(c)
		}
	}
	return nil
}

// walkStates is the order a filter walk goes through the states.
var walkStates = []storage.State{storage.StateScheduled, storage.StateDelivered, storage.StateDead}

// walk runs removetasks.lua's walk from p.Cursor until p.Limit tasks were
// examined or the walk is done.
func (sh shard) walk(ctx context.Context, p storage.RemoveTasksParams, dry bool) ([]storage.Version, string, error) {
	k := sh.k
	keys := sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body)
	state, score, id, err := parseWalkCursor(p.Cursor, p.Filter.State)
	if err != nil {
		return nil, "", err
	}
	budget := p.Limit
	if budget <= 0 || budget > MaxBatch {
		budget = MaxBatch
	}
	var out []storage.Version
	for {
		rep, err := sh.runRows(ctx, "remove tasks", scripts.removeTasks, keys, rowsOf(4, 3, anyRows),
			append(headArgs(8), "walk", luaBool(dry), int(state), score, id, budget, p.Filter.Kind, p.Filter.IDPrefix)...)
		if err != nil {
			return out, "", err
		}
		examined, _ := replyInt(rep.head[3])
		for i := range rep.n() {
			row := rep.row(i)
			vid, _ := replyString(row[0])
			inc, _ := replyInt(row[1])
			gen, _ := replyInt(row[2])
			out = append(out, storage.Version{ID: vid, Incarnation: inc, Generation: gen})
		}
		if more, _ := replyInt(rep.head[0]); more == 1 {
			sc, _ := replyString(rep.head[1])
			last, _ := replyString(rep.head[2])
			return out, walkCursor(state, sc, last), nil
		}
		// This state is done; the next one, if the filter allows, goes on
		// in the same call with the budget left (at most one script call
		// per state).
		if p.Filter.State != storage.StateUnspecified || int(state) >= len(walkStates) {
			return out, "", nil
		}
		state, score, id = walkStates[state], "", ""
		budget -= int(examined)
		if budget <= 0 {
			return out, walkCursor(state, "", ""), nil
		}
	}
}

// A walk cursor is "w<state>:<score>:<id>" (the last member examined) or
// "w<state>:" (the start of that state).
func walkCursor(state storage.State, score, id string) string {
	if score == "" {
		return "w" + strconv.Itoa(int(state)) + ":"
	}
	return "w" + strconv.Itoa(int(state)) + ":" + score + ":" + id
}

func parseWalkCursor(c string, filter storage.State) (state storage.State, score, id string, err error) {
	if c == "" {
		if filter != storage.StateUnspecified {
			return filter, "", "", nil
		}
		return storage.StateScheduled, "", "", nil
	}
	bad := fmt.Errorf("remove tasks: %w", storage.ErrInvalidCursor)
	st, rest, ok := strings.Cut(strings.TrimPrefix(c, "w"), ":")
	n, perr := strconv.Atoi(st)
	if !strings.HasPrefix(c, "w") || !ok || perr != nil || n < 1 || n > len(walkStates) {
		return 0, "", "", bad
	}
	state = storage.State(n)
	if filter != storage.StateUnspecified && filter != state {
		return 0, "", "", bad
	}
	if rest == "" {
		return state, "", "", nil
	}
	score, id, ok = strings.Cut(rest, ":")
	if _, perr := strconv.ParseInt(score, 10, 64); !ok || perr != nil || storage.ValidateTaskID(id) != nil {
		return 0, "", "", bad
	}
	return state, score, id, nil
}

// get is Get on this shard (the task's).
func (sh shard) get(ctx context.Context, id string) (storage.Task, error) {
	ns, k := sh.ns, sh.k
	raw, err := sh.runSlice(ctx, "get", scripts.get, []string{k.due, k.inflight, k.dead, k.meta, k.body}, id)
	if err != nil {
		return storage.Task{}, err
	}
	if len(raw) == 0 { // get.lua's "no such task"
		return storage.Task{}, fmt.Errorf("get %q: %w", id, storage.ErrNotFound)
	}
	rep, err := decodeReply("get", raw, fixed(4))
	if err != nil {
		return storage.Task{}, err
	}
	t, err := decodeTask(ns, id, rep.head[0], rep.head[1], rep.head[2], rep.head[3])
	if err != nil {
		return storage.Task{}, fmt.Errorf("get: %w", err)
	}
	if sh.traces {
		t.TraceParent = sh.readTrace(ctx, id)
	}
	return t, nil
}

// list is List of this shard; it also returns each task's score (its
// ZSET's order).
func (sh shard) list(ctx context.Context, p storage.ListParams) ([]storage.Task, []int64, string, error) {
	ns := sh.ns
	state := p.State
	if state == storage.StateUnspecified {
		state = storage.StateScheduled
	}
	k := sh.k
	var set string
	switch state {
	case storage.StateScheduled:
		set = k.due
	case storage.StateDelivered:
		set = k.inflight
	case storage.StateDead:
		set = k.dead
	default:
		return nil, nil, "", fmt.Errorf("list: unknown state %d", state)
	}
	limit := min(max(p.Limit, 1), MaxBatch)
	cs, cid, err := parseCursor(state, p.Cursor)
	if err != nil {
		return nil, nil, "", err
	}
	payloads := "1"
	if p.NoPayload {
		payloads = ""
	}
	// A trace context (kept apart from the header) is at most 64 bytes.
	fixedBytes := storage.TaskWireOverhead + len(ns) + 64
	rep, err := sh.runRows(ctx, "list", scripts.list, []string{set, k.meta, k.body}, rowsOf(3, 4, anyRows),
		limit, cs, cid, max(p.MaxBytes, 0), payloads, fixedBytes)
	if err != nil {
		return nil, nil, "", err
	}
	tasks := make([]storage.Task, 0, rep.n())
	scores := make([]int64, 0, cap(tasks))
	for i := range rep.n() {
		row := rep.row(i)
		id, err := replyString(row[0])
		if err != nil {
			return nil, nil, "", fmt.Errorf("list: %w", err)
		}
		t, err := decodeTask(ns, id, row[2], int64(state), row[1], row[3])
		if err != nil {
			return nil, nil, "", fmt.Errorf("list: %w", err)
		}
		if p.NoPayload {
			t.Payload = nil // an inline one came with the header
		}
		score, err := replyInt(row[1])
		if err != nil {
			return nil, nil, "", fmt.Errorf("list: %w", err)
		}
		tasks = append(tasks, t)
		scores = append(scores, score)
	}
	if kept, cut := storage.CutPage(tasks, p.MaxBytes); cut {
		last := len(kept) - 1
		return kept, scores[:len(kept)], makeCursor(state, scores[last], kept[last].ID), nil
	}
	next := ""
	if more, _ := replyInt(rep.head[0]); more == 1 {
		score, err := replyInt(rep.head[1])
		if err != nil {
			return nil, nil, "", fmt.Errorf("list: %w", err)
		}
		id, _ := replyString(rep.head[2])
		next = makeCursor(state, score, id)
	}
	return tasks, scores, next, nil
}

// A list cursor is "<state>:<score>:<id>": the last member of the previous
// page.
func makeCursor(state storage.State, score int64, id string) string {
	return strconv.Itoa(int(state)) + ":" + strconv.FormatInt(score, 10) + ":" + id
}

func parseCursor(state storage.State, c string) (score, id string, err error) {
	if c == "" {
		return "", "", nil
	}
	st, rest, ok1 := strings.Cut(c, ":")
	score, id, ok2 := strings.Cut(rest, ":")
	_, perr := strconv.ParseInt(score, 10, 64)
	if !ok1 || !ok2 || st != strconv.Itoa(int(state)) || perr != nil || storage.ValidateTaskID(id) != nil {
		return "", "", fmt.Errorf("list: %w", ErrInvalidCursor)
	}
	return score, id, nil
}
