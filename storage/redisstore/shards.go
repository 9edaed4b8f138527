package redisstore

import (
	"context"
	"errors"
	"fmt"
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
// bit) of the id's bytes, modulo n (storage.ShardOf, which schedules'
// firing ids use too). It is part of the stored layout: a task written
// under one function cannot be found under another.
func ShardOf(id string, n int) int { return storage.ShardOf(id, n) }

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
