package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// This file holds what durable mode (storage/durable) needs from the
// index besides the storage interfaces: re-indexing from the authority, the
// per-namespace index marker, a leader lease and namespace discovery.

// Restore re-indexes tasks of ns read from the durable authority, in one
// round trip per MaxBatch tasks or Options.MaxScriptBytes. A task is written unless the index already
// holds the same or a newer version of it ((incarnation, generation)
// order), or, with p.Repair, unless it holds that very version (the
// authority wins even over a version it never committed); and never when
// the task's ack marker names that version (see AckMarked). Scheduled tasks
// go to due at DueTime; delivered ones are re-indexed as scheduled, due at
// DueTime (their lease holder is presumed gone); dead ones go to dead at
// DeadTime (or UpdateTime, if DeadTime is zero). Incarnation, generation,
// attempt, kind, payload, last error and create/update times are kept as
// given, except that a task without a create time gets the Redis clock's
// now (and so does its update time, if it has none). A restored task's
// next delivery gets a sequence number from the clock, above any delivery
// made before (see Token.Delivery). Returns how many tasks were written.
func (s *Store) Restore(ctx context.Context, ns string, tasks []storage.Task, p storage.RestoreParams) (int, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).restore(ctx, tasks, p)
	}
	groups := make([][]storage.Task, n)
	for _, t := range tasks {
		sh := shardOf(t.ID, n)
		groups[sh] = append(groups[sh], t)
	}
	var shards []int
	for sh, g := range groups {
		if len(g) > 0 {
			shards = append(shards, sh)
		}
	}
	written := make([]int, n)
	err = fanOut(shards, func(sh int) error {
		var err error
		written[sh], err = s.shardOfN(ns, sh, n).restore(ctx, groups[sh], p)
		return err
	})
	total := 0
	for _, w := range written {
		total += w
	}
	return total, err
}

// Versions returns, for each id of ns, the version the index holds (zero
// incarnation and generation where it holds none) and its ack marker (a
// token naming the acked delivery; Delivery 0 where there is none), in one
// round trip per MaxBatch ids. Payloads are not read.
func (s *Store) Versions(ctx context.Context, ns string, ids []string) ([]storage.Version, []storage.Token, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, nil, fmt.Errorf("versions: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).versions(ctx, ids)
	}
	vs := make([]storage.Version, len(ids))
	marks := make([]storage.Token, len(ids))
	idx := groupIndexes(n, len(ids), func(i int) string { return ids[i] })
	err = fanOut(groupShards(idx), func(sh int) error {
		part := make([]string, len(idx[sh]))
		for j, i := range idx[sh] {
			part[j] = ids[i]
		}
		v, m, err := s.shardOfN(ns, sh, n).versions(ctx, part)
		for j := range v {
			vs[idx[sh][j]], marks[idx[sh][j]] = v[j], m[j]
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return vs, marks, nil
}

// parseMark parses an ack marker ("inc,gen,dseq,attempt", decimal, as
// ack.lua writes it; markers written before the attempt was added have
// only the first three, and parse with Attempt 0).
func parseMark(ns, id, s string) (storage.Token, error) {
	f := strings.Split(s, ",")
	if len(f) != 3 && len(f) != 4 {
		return storage.Token{}, fmt.Errorf("ack marker %q of %q: %w", s, id, errBadRecord)
	}
	var n [4]int64
	for i := range f {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return storage.Token{}, fmt.Errorf("ack marker %q of %q: %w", s, id, errBadRecord)
		}
		n[i] = v
	}
	return storage.Token{Namespace: ns, ID: id, Incarnation: n[0], Generation: n[1], Delivery: n[2], Attempt: int32(n[3])}, nil
}

// markOf is the part of an ack marker that names the delivery
// ("inc,gen,dseq"; see ack.lua), which ClearAcked matches.
func markOf(t storage.Token) string {
	return strconv.FormatInt(t.Incarnation, 10) + "," + strconv.FormatInt(t.Generation, 10) + "," + strconv.FormatInt(t.Delivery, 10)
}

// ClearAcked drops the ack markers the tokens name (those that changed
// since are kept), once MySQL has deleted the acked versions. Returns how
// many it dropped.
func (s *Store) ClearAcked(ctx context.Context, ns string, marks []storage.Token) (int, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return 0, fmt.Errorf("clear acked: %w", err)
	}
	dropped := make([]int, n)
	err = byTokenShard(n, marks, func(sh int, _ []int, part []storage.Token) error {
		var err error
		dropped[sh], err = s.shardOfN(ns, sh, n).clearAcked(ctx, part)
		return err
	})
	total := 0
	for _, d := range dropped {
		total += d
	}
	return total, err
}

// ScanAcked returns one page (about count entries) of ns's ack markers from
// cursor (0 = the start) and the cursor of the next page (0 = done).
func (s *Store) ScanAcked(ctx context.Context, ns string, cursor uint64, count int) ([]storage.Token, uint64, error) {
	kv, next, err := s.hscanShards(ctx, "scan acked", ns, func(k nsKeys) string { return k.acked }, cursor, count)
	if err != nil {
		return nil, 0, err
	}
	out := make([]storage.Token, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m, err := parseMark(ns, kv[i], kv[i+1])
		if err != nil {
			s.log.Warn("scan acked: malformed ack marker", "namespace", ns, "id", kv[i], "err", err)
			continue
		}
		out = append(out, m)
	}
	return out, next, nil
}

// ScanVersions returns one page (about count tasks) of the versions the
// index holds for ns from cursor (0 = the start), and the cursor of the
// next page (0 = done). It reads headers only, never payloads. A task
// present during the whole scan is returned at least once.
func (s *Store) ScanVersions(ctx context.Context, ns string, cursor uint64, count int) ([]storage.Version, uint64, error) {
	kv, next, err := s.hscanShards(ctx, "scan versions", ns, func(k nsKeys) string { return k.meta }, cursor, count)
	if err != nil {
		return nil, 0, err
	}
	out := make([]storage.Version, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == hwmField {
			continue // the shard's high-water mark, not a task
		}
		r, err := decodeRecord(kv[i+1], "")
		if err != nil {
			continue // pop and reap move such a task to dead; nothing to compare
		}
		out = append(out, storage.Version{ID: kv[i], Incarnation: r.inc, Generation: r.gen})
	}
	return out, next, nil
}

func (s *Store) hscan(ctx context.Context, op, key string, cursor uint64, count int) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	kv, next, err := s.rdb.HScan(ctx, key, cursor, "", int64(max(count, 1))).Result()
	if err != nil {
		return nil, 0, wrapErr(op, err)
	}
	return kv, next, nil
}

// Forget removes each named version from the index if the index still
// holds exactly that version (in any state), and returns how many it
// removed. Durable mode's reconciler uses it for tasks MySQL does not have.
func (s *Store) Forget(ctx context.Context, ns string, vs []storage.Version) (int, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return 0, fmt.Errorf("forget: %w", err)
	}
	idx := groupIndexes(n, len(vs), func(i int) string { return vs[i].ID })
	removed := make([]int, n)
	err = fanOut(groupShards(idx), func(sh int) error {
		part := make([]storage.Version, len(idx[sh]))
		for j, i := range idx[sh] {
			part[j] = vs[i]
		}
		var err error
		removed[sh], err = s.shardOfN(ns, sh, n).forget(ctx, part)
		return err
	})
	total := 0
	for _, r := range removed {
		total += r
	}
	return total, err
}

// Indexed reports whether MarkIndexed was called for ns since the index was
// last emptied (a Redis without persistence loses the marker with the
// tasks, which is the point: durable mode then rebuilds ns from MySQL).
// A sharded namespace is indexed when every shard has the marker (each
// shard's marker lives, and is lost, with that shard's tasks).
func (s *Store) Indexed(ctx context.Context, ns string) (bool, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return false, fmt.Errorf("indexed: %w", err)
	}
	have := make([]bool, n)
	err = fanOut(allShards(n), func(sh int) error {
		var err error
		have[sh], err = s.shardOfN(ns, sh, n).indexed(ctx)
		return err
	})
	if err != nil {
		return false, err
	}
	return !slices.Contains(have, false), nil
}

// MarkIndexed records that ns's index is complete.
func (s *Store) MarkIndexed(ctx context.Context, ns string) error {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return fmt.Errorf("mark indexed: %w", err)
	}
	return fanOut(allShards(n), func(sh int) error { return s.shardOfN(ns, sh, n).markIndexed(ctx) })
}

// TryLead acquires the leader lease called name for holder, or renews it
// when holder already has it, for ttl (millisecond precision) from now.
// It reports whether holder holds the lease. Atomic: of many replicas
// calling at once, one wins.
func (s *Store) TryLead(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	v, err := s.run(ctx, "try lead", scripts.tryLead, []string{leaderKey(name)}, holder, max(ttl.Milliseconds(), 1))
	if err != nil {
		return false, err
	}
	n, err := replyInt(v)
	if err != nil {
		return false, fmt.Errorf("try lead: %w", err)
	}
	return n == 1, nil
}

// scanCount is the COUNT hint of each SCAN page.
const scanCount = 1000

// Namespaces returns, sorted, the namespaces that have a key holding
// tasks, or durable mode's indexed marker (holdsTasks); the keys that
// outlive the tasks or expire on their own (life, hwm, request records,
// trace keys, rate buckets, subscriber sets, history, schedules) are no
// sign of one. A namespace whose tasks are all gone keeps its meta HASH,
// which holds the shard's high-water mark (hwmField), until DropNamespace:
// it is listed (with no tasks). It SCANs in bounded pages (each under the
// per-call timeout); on a cluster it scans every master.
func (s *Store) Namespaces(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	seen := make(map[string]struct{})
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			cctx, cancel := context.WithTimeout(ctx, s.timeout)
			keys, next, err := c.Scan(cctx, cursor, nsScanPattern, scanCount).Result()
			cancel()
			if err != nil {
				return wrapErr("namespaces", err)
			}
			mu.Lock()
			for _, key := range keys {
				if ns, ok := namespaceOfKey(key); ok && holdsTasks(key) {
					seen[ns] = struct{}{}
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.rdb)
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(seen))
	for ns := range seen {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, nil
}

// migratePage is how many legacy records Migrate converts per script call.
const migratePage = 500

// Migrate converts every task stored in the one-value record layout of
// delayd before the header/payload split (the namespace's "task" HASH) into
// the current layout (a header in "meta", the payload in "body"), in
// bounded steps (one HSCAN page and one script call of at most 500 records
// each), and returns how many records it converted. Converted tasks keep
// their state, due time, generation, attempts, kind, payload and last
// error; their incarnation is 0, which durable mode's schema migration
// gives pre-incarnation MySQL rows too, so both stores agree. It is safe to
// run again and on every replica at once; a record that cannot be parsed is
// left in place and logged. Run it before serving: replicas of the old
// version must be stopped first, since they read and write only the old
// layout.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	nss, err := s.Namespaces(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	total := 0
	for _, ns := range nss {
		n, err := s.migrateNamespace(ctx, ns)
		total += n
		if err != nil {
			return total, fmt.Errorf("migrate %s: %w", ns, err)
		}
		if n > 0 {
			s.log.Info("migrated task records to the header/payload layout", "namespace", ns, "tasks", n)
		}
	}
	return total, nil
}

func (s *Store) migrateNamespace(ctx context.Context, ns string) (int, error) {
	k := keysFor(ns, 0) // legacy records predate sharding: all in shard 0
	total := 0
	var cursor uint64
	for {
		kv, next, err := s.hscan(ctx, "migrate", k.legacy, cursor, migratePage)
		if err != nil {
			return total, err
		}
		args := make([]any, 0, 2*len(kv))
		for i := 0; i+1 < len(kv); i += 2 {
			r, err := legacyRecord(kv[i+1])
			if err != nil {
				s.log.Error("migrate: unreadable legacy task record left in place", "namespace", ns, "id", kv[i], "err", err)
				continue
			}
			args = append(args, kv[i], kv[i+1], r.header(), r.bodyValue())
		}
		if len(args) > 0 {
			v, err := s.run(ctx, "migrate", scripts.migrate, []string{k.legacy, k.meta, k.body}, args...)
			if err != nil {
				return total, err
			}
			n, _ := replyInt(v)
			total += int(n)
		}
		if next == 0 {
			return total, nil
		}
		cursor = next
	}
}
