package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
)

// Sharded namespaces (NamespacePolicy.shards, storage.Policy.Shards).
//
// A namespace of n shards keeps its tasks in n groups of keys, shard k under
// the hash tag {ns#k} (keys.go), so the shards of one namespace spread over
// the masters of a Redis Cluster. A task lives in shard ShardOf(id, n): every
// operation on one task (upsert, get, remove, ack, nack, extend) stays a
// single script in a single slot; batch calls are split per shard and their
// answers put back in the caller's order. The storage interfaces stay
// shard-agnostic: callers name a namespace, and the store learns its shard
// count from a ShardCounter (Options.Shards; the daemon hands it the
// registry's policy) and fans out:
//
//   - Pop peeks the head of every shard's due tasks (lua/peekdue.lua, read
//     only), allocates its limit to the earliest ones across shards, and
//     pops that many from each shard: a page is in due order across the
//     whole namespace, so no shard waits behind another (the credit goes to
//     the oldest due tasks, wherever they are). A MaxRate cap keeps one
//     bucket, in shard 0: the pop takes its tokens first (lua/ratetake.lua)
//     and gives back what the shards did not use. With Kinds, the scan
//     window (storage.KindScanWindow) applies per shard.
//   - Reap splits its limit evenly across the shards, rotating the
//     remainder; NextWake is the earliest over all shards.
//   - Stats and DueKinds sum over the shards; List merges the shards' pages
//     in (score, id) order, and its cursor (the last task listed) is the
//     same for every shard, so paging stays stable.
//   - RemoveTasks' filter walk and ScanVersions/ScanAcked walk the shards
//     one after another (their cursors carry the shard); Requeue and Purge
//     of "all" take the shards in turn until the limit is used.
//   - DropNamespace, MarkIndexed, Indexed and ClaimIncarnation touch every
//     shard (each shard has its own life key and index marker).
//
// The shard count of a namespace is fixed when it is created: moving tasks
// between shards without losing or duplicating one while replicas write is
// not done, so the server refuses a change (FailedPrecondition).

// MaxShards is the most shards a namespace may have.
const MaxShards = storage.MaxShards

// ShardOf is the shard of task id in a namespace of n shards: FNV-1a (32
// bit) of the id's bytes, modulo n. It is part of the stored layout: a task
// written under one function cannot be found under another.
func ShardOf(id string, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

func shardOf(id string, n int) int { return ShardOf(id, n) }

// ShardCounter tells the store how many shards a namespace has.
type ShardCounter interface {
	// Shards returns ns's shard count (1..MaxShards).
	Shards(ctx context.Context, ns string) (int, error)
	// Forget drops what is cached about ns (its namespace was deleted; a
	// namespace re-created under the name may have another count).
	Forget(ns string)
}

// FixedShards is a ShardCounter that gives every namespace the same count
// (tests, tools).
type FixedShards int

// Shards returns n, clamped to 1..MaxShards.
func (n FixedShards) Shards(context.Context, string) (int, error) {
	return min(max(int(n), 1), MaxShards), nil
}

// Forget does nothing.
func (FixedShards) Forget(string) {}

// ShardCacheTTL is how long a RegistryShards keeps a namespace's count.
const ShardCacheTTL = 10 * time.Second

// RegistryShards is a ShardCounter over a namespace registry: the count is
// the namespace's Policy.Shards (0 = 1), cached for ShardCacheTTL (it is
// fixed for the life of a namespace); while the registry cannot answer, the
// last count is kept. A namespace the registry does not
// have counts 1 shard and is not cached. A replica whose cache outlives a
// delete and re-creation of the namespace with another count writes
// through its stale view only until the namespace incarnation check refuses
// it (every shard's life key is ended by DropNamespace).
type RegistryShards struct {
	reg   atomic.Pointer[registryBox]
	cache sync.Map // ns -> shardEntry
}

type registryBox struct{ r storage.Registry }

type shardEntry struct {
	n  int
	at time.Time
}

// NewRegistryShards returns a RegistryShards over reg (nil: set it with
// Use before the first call).
func NewRegistryShards(reg storage.Registry) *RegistryShards {
	r := &RegistryShards{}
	if reg != nil {
		r.Use(reg)
	}
	return r
}

// Use makes reg the registry asked from now on (durable mode switches to the
// MySQL registry) and drops the cache.
func (r *RegistryShards) Use(reg storage.Registry) {
	r.reg.Store(&registryBox{reg})
	r.cache.Clear()
}

// Shards implements ShardCounter.
func (r *RegistryShards) Shards(ctx context.Context, ns string) (int, error) {
	last, cached := r.cache.Load(ns)
	if cached {
		if e := last.(shardEntry); time.Since(e.at) < ShardCacheTTL {
			return e.n, nil
		}
	}
	box := r.reg.Load()
	if box == nil {
		return 0, errors.New("shard count: no registry to read it from")
	}
	n, err := box.r.GetNamespace(ctx, ns)
	if errors.Is(err, storage.ErrNotFound) {
		return 1, nil
	}
	if err != nil {
		if cached {
			// The registry cannot answer (in durable mode: MySQL down or
			// hung). The count is fixed for the namespace's life, so keep
			// the last one for another ShardCacheTTL rather than fail
			// every Redis call of the namespace (acks, lease renewals,
			// pops) for as long as MySQL is out.
			e := last.(shardEntry)
			r.cache.Store(ns, shardEntry{n: e.n, at: time.Now()})
			return e.n, nil
		}
		return 0, fmt.Errorf("shard count of %q: %w", ns, err)
	}
	c := min(max(n.Policy.Shards, 1), MaxShards)
	r.cache.Store(ns, shardEntry{n: c, at: time.Now()})
	return c, nil
}

// Forget implements ShardCounter.
func (r *RegistryShards) Forget(ns string) { r.cache.Delete(ns) }

// shardCount is ns's shard count: 1 without Options.Shards. A call reads
// it once and builds every key it uses from that one count (keysForN), so
// a count changed meanwhile cannot mix two layouts in one call.
func (s *Store) shardCount(ctx context.Context, ns string) (int, error) {
	if s.shards == nil {
		return 1, nil
	}
	n, err := s.shards.Shards(ctx, ns)
	if err != nil {
		return 0, err
	}
	return min(max(n, 1), MaxShards), nil
}

// forgetShards drops the cached shard count of ns.
func (s *Store) forgetShards(ns string) {
	if s.shards != nil {
		s.shards.Forget(ns)
	}
}

// shardRetry is how soon a sharded NextWake asks again when a shard did
// not answer (its master failing over).
const shardRetry = 100 * time.Millisecond

// fanOutWidth bounds the script calls one fan-out has in flight at once.
const fanOutWidth = 32

// fanOut runs fn for each shard, concurrently (at most fanOutWidth at
// once), and returns the error of the first shard (in the order given)
// that failed.
func fanOut(shards []int, fn func(sh int) error) error {
	if len(shards) == 1 {
		return fn(shards[0])
	}
	for _, err := range fanOutEach(shards, fn) {
		if err != nil {
			return err
		}
	}
	return nil
}

// fanOutEach runs fn for each shard, concurrently (at most fanOutWidth at
// once), and answers every shard's error (nil where it worked), in the
// order given.
func fanOutEach(shards []int, fn func(sh int) error) []error {
	errs := make([]error, len(shards))
	sem := make(chan struct{}, fanOutWidth)
	var wg sync.WaitGroup
	for i, sh := range shards {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = fn(sh)
		}()
	}
	wg.Wait()
	return errs
}

// partial sums up fanOutEach: the first error when every shard failed, and
// whether any did.
func partial(errs []error) (allFailed error, anyFailed bool) {
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed == len(errs) && first != nil {
		return first, true
	}
	return nil, failed > 0
}

// allShards is 0..n-1.
func allShards(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// groupIndexes groups 0..count-1 by the shard of id(i), keeping order.
func groupIndexes(n, count int, id func(i int) string) [][]int {
	g := make([][]int, n)
	for i := range count {
		sh := shardOf(id(i), n)
		g[sh] = append(g[sh], i)
	}
	return g
}

// groupIDs groups ids by shard, keeping order.
func groupIDs(n int, ids []string) [][]string {
	g := make([][]string, n)
	for _, id := range ids {
		sh := shardOf(id, n)
		g[sh] = append(g[sh], id)
	}
	return g
}

// groupShards lists the shards whose group is not empty.
func groupShards[T any](g [][]T) []int {
	var out []int
	for sh, v := range g {
		if len(v) > 0 {
			out = append(out, sh)
		}
	}
	return out
}

// byTokenShard calls fn once per shard that tokens touch, concurrently,
// with the tokens of that shard and their indexes in tokens.
func byTokenShard(n int, tokens []storage.Token, fn func(sh int, idx []int, part []storage.Token) error) error {
	if n == 1 {
		idx := make([]int, len(tokens))
		for i := range idx {
			idx[i] = i
		}
		return fn(0, idx, tokens)
	}
	g := groupIndexes(n, len(tokens), func(i int) string { return tokens[i].ID })
	return fanOut(groupShards(g), func(sh int) error {
		part := make([]storage.Token, len(g[sh]))
		for j, i := range g[sh] {
			part[j] = tokens[i]
		}
		return fn(sh, g[sh], part)
	})
}

// eachShardOf runs a dead-letter call (Requeue, Purge) over the shards:
// with all, the shards in turn, each with the limit still unused, until it
// is used up; otherwise once per shard the ids touch, with that shard's
// ids. fn answers how many tasks it took.
func eachShardOf(n int, all bool, limit int, ids []string, fn func(sh int, ids []string, limit int) (int, error)) error {
	if n == 1 {
		_, err := fn(0, ids, limit)
		return err
	}
	if all {
		left := min(max(limit, 1), MaxBatch)
		for sh := 0; sh < n && left > 0; sh++ {
			got, err := fn(sh, nil, left)
			if err != nil {
				return err
			}
			left -= got
		}
		return nil
	}
	g := groupIDs(n, ids)
	for _, sh := range groupShards(g) {
		if _, err := fn(sh, g[sh], 0); err != nil {
			return err
		}
	}
	return nil
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

// popSharded: see the file comment.
func (s *Store) popSharded(ctx context.Context, ns string, n int, p storage.PopParams) ([]storage.Delivery, error) {
	limit := min(p.Limit, MaxBatch)
	type head struct {
		id    string
		score int64
		shard int
	}
	heads := make([][]head, n)
	window := 0
	if len(p.Kinds) > 0 {
		window = storage.KindScanWindow
	}
	// A shard that cannot be read (its master failing over) is left out of
	// this pop: the shards on the other masters keep delivering.
	errs := fanOutEach(allShards(n), func(sh int) error {
		k := keysForN(ns, sh, n)
		args := []any{limit, window}
		if window > 0 {
			for _, kind := range p.Kinds {
				args = append(args, kind)
			}
		}
		rep, err := s.runRows(ctx, "pop", scripts.peekDue, []string{k.due, k.meta}, rowsOf(1, 2, anyRows), args...)
		if err != nil {
			return err
		}
		for i := range rep.n() {
			row := rep.row(i)
			id, _ := replyString(row[0])
			score, err := replyInt(row[1])
			if err != nil {
				return fmt.Errorf("pop: %w", err)
			}
			heads[sh] = append(heads[sh], head{id, score, sh})
		}
		return nil
	})
	if err, _ := partial(errs); err != nil {
		return nil, err
	}
	all := slices.Concat(heads...)
	if len(all) == 0 {
		return nil, nil
	}
	slices.SortFunc(all, func(a, b head) int {
		return cmp.Or(cmp.Compare(a.score, b.score), strings.Compare(a.id, b.id))
	})
	want := min(limit, len(all))
	// A rate cap: the namespace's one bucket (in shard 0) grants the
	// tokens first; what the shards do not use is given back.
	granted := want
	rateKey := keysForN(ns, 0, n).rate
	burst := max(p.Burst, 1)
	if p.MaxRate > 0 {
		v, err := s.run(ctx, "pop", scripts.rateTake, []string{rateKey}, strconv.FormatFloat(p.MaxRate, 'g', -1, 64), burst, want, 0)
		if err != nil {
			return nil, err
		}
		g, err := replyInt(v)
		if err != nil {
			return nil, fmt.Errorf("pop: %w", err)
		}
		granted = int(g)
		if granted == 0 {
			return nil, nil
		}
	}
	counts := make([]int, n)
	for _, h := range all[:granted] {
		counts[h.shard]++
	}
	var shards []int
	for sh, c := range counts {
		if c > 0 {
			shards = append(shards, sh)
		}
	}
	q := p
	q.MaxRate = 0
	got := make([][]storage.Delivery, n)
	err := fanOut(shards, func(sh int) error {
		qq := q
		qq.Limit = counts[sh]
		r, err := s.shardOfN(ns, sh, n).pop(ctx, qq)
		got[sh] = r.Deliveries
		return err
	})
	out := slices.Concat(got...)
	slices.SortFunc(out, func(a, b storage.Delivery) int {
		return cmp.Or(a.Task.DueTime.Compare(b.Task.DueTime), strings.Compare(a.Task.ID, b.Task.ID))
	})
	if p.MaxRate > 0 && len(out) < granted {
		if _, rerr := s.run(ctx, "pop", scripts.rateTake, []string{rateKey},
			strconv.FormatFloat(p.MaxRate, 'g', -1, 64), burst, 0, granted-len(out)); rerr != nil {
			s.log.Warn("pop: giving unused dispatch tokens back failed; the namespace delivers a little under its cap for a moment", "namespace", ns, "err", rerr)
		}
	}
	if err != nil && len(out) == 0 {
		return nil, err
	}
	// Deliveries leased by the shards that answered are returned even when
	// another shard failed: dropping them would leave them leased until
	// their lease ends.
	return out, nil
}

// reapSharded splits limit evenly across the shards (the remainder goes to
// shards in turn, call after call) and reaps them concurrently.
func (s *Store) reapSharded(ctx context.Context, ns string, n, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	limit = min(limit, MaxBatch)
	start := int(s.reapTurn.Add(1)) % n
	counts := make([]int, n)
	for i := range n {
		sh := (start + i) % n
		counts[sh] = limit / n
		if i < limit%n {
			counts[sh]++
		}
	}
	var shards []int
	for sh, c := range counts {
		if c > 0 {
			shards = append(shards, sh)
		}
	}
	got := make([][]storage.Moved, n)
	err := fanOut(shards, func(sh int) error {
		var err error
		got[sh], err = s.shardOfN(ns, sh, n).reap(ctx, counts[sh], opts)
		return err
	})
	out := slices.Concat(got...)
	if err != nil && len(out) == 0 {
		return nil, err
	}
	return out, nil
}

// nextWakeSharded is the earliest next wake of any shard, with the latest
// now the shards answered.
func (s *Store) nextWakeSharded(ctx context.Context, ns string, n int) (next, now time.Time, ok bool, err error) {
	type ans struct {
		next, now time.Time
		ok        bool
	}
	as := make([]ans, n)
	errs := fanOutEach(allShards(n), func(sh int) error {
		a, b, c, err := s.shardOfN(ns, sh, n).nextWake(ctx)
		as[sh] = ans{a, b, c}
		return err
	})
	err, anyFailed := partial(errs)
	if err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	for i, a := range as {
		if errs[i] != nil {
			continue
		}
		if a.now.After(now) {
			now = a.now
		}
		if a.ok && (!ok || a.next.Before(next)) {
			next, ok = a.next, true
		}
	}
	// A shard that did not answer may have work at any time: look again
	// soon rather than sleep past it.
	if soon := now.Add(shardRetry); anyFailed && (!ok || next.After(soon)) {
		next, ok = soon, true
	}
	return next, now, ok, nil
}

// statsSharded sums the shards' counts; OldestDue is the earliest.
func (s *Store) statsSharded(ctx context.Context, ns string, n int) (storage.Stats, error) {
	sts := make([]storage.Stats, n)
	err := fanOut(allShards(n), func(sh int) error {
		var err error
		sts[sh], err = s.shardOfN(ns, sh, n).stats(ctx)
		return err
	})
	if err != nil {
		return storage.Stats{}, err
	}
	var out storage.Stats
	for _, st := range sts {
		if st.Now.After(out.Now) {
			out.Now = st.Now
		}
		out.Scheduled += st.Scheduled
		out.Delivered += st.Delivered
		out.Dead += st.Dead
		out.DueNow += st.DueNow
		if !st.OldestDue.IsZero() && (out.OldestDue.IsZero() || st.OldestDue.Before(out.OldestDue)) {
			out.OldestDue = st.OldestDue
		}
	}
	return out, nil
}

// dueKindsSharded sums the shards' counts; partial if any shard's is.
func (s *Store) dueKindsSharded(ctx context.Context, ns string, n int) (storage.DueKinds, error) {
	dks := make([]storage.DueKinds, n)
	err := fanOut(allShards(n), func(sh int) error {
		var err error
		dks[sh], err = s.shardOfN(ns, sh, n).dueKinds(ctx)
		return err
	})
	if err != nil {
		return storage.DueKinds{}, err
	}
	out := storage.DueKinds{Counts: map[string]int64{}}
	for _, dk := range dks {
		out.Partial = out.Partial || dk.Partial
		for kind, c := range dk.Counts {
			out.Counts[kind] += c
		}
	}
	return out, nil
}

// shardCursorBits is where a sharded HSCAN cursor keeps its shard: the top
// 8 bits (MaxShards is 256); Redis's own cursor keeps the rest.
const shardCursorBits = 56

// hscanShards is hscan over one hash per shard (key picks it), one shard
// after the other: the cursor carries the shard in its top bits.
func (s *Store) hscanShards(ctx context.Context, op, ns string, key func(nsKeys) string, cursor uint64, count int) ([]string, uint64, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", op, err)
	}
	if n == 1 {
		return s.hscan(ctx, op, key(keysFor(ns, 0)), cursor, count)
	}
	sh, inner := int(cursor>>shardCursorBits), cursor&(1<<shardCursorBits-1)
	if sh >= n {
		return nil, 0, fmt.Errorf("%s: %w", op, storage.ErrInvalidCursor)
	}
	kv, next, err := s.hscan(ctx, op, key(keysForN(ns, sh, n)), inner, count)
	if err != nil {
		return nil, 0, err
	}
	switch {
	case next >= 1<<shardCursorBits:
		return nil, 0, fmt.Errorf("%s: Redis cursor %d does not fit a sharded cursor", op, next)
	case next != 0:
		return kv, uint64(sh)<<shardCursorBits | next, nil
	case sh+1 < n:
		return kv, uint64(sh+1) << shardCursorBits, nil
	}
	return kv, 0, nil
}

// taskShard is the shard task id of ns lives in.
func (s *Store) taskShard(ctx context.Context, ns, id string) (shard, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return shard{}, err
	}
	return s.shardOfN(ns, shardOf(id, n), n), nil
}

// splitByShard splits count items by the shard of id(i), runs fn once per
// shard that has items (concurrently; directly when there is one shard)
// with that shard's items in order, and answers the results in item order.
// A failed shard fails the call; the other shards' items may have been
// applied (as when one call is split into several script calls).
func splitByShard[T, R any](n int, items []T, id func(i int) string, fn func(i int, part []T) ([]R, error)) ([]R, error) {
	if n == 1 {
		return fn(0, items)
	}
	g := groupIndexes(n, len(items), id)
	out := make([]R, len(items))
	err := fanOut(groupShards(g), func(sh int) error {
		part := make([]T, len(g[sh]))
		for j, i := range g[sh] {
			part[j] = items[i]
		}
		res, err := fn(sh, part)
		if err != nil {
			return err
		}
		for j, r := range res {
			out[g[sh][j]] = r
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
