package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// This file holds what durable mode (storage/durable) needs from the
// index besides the storage interfaces: re-indexing from the authority, the
// per-namespace index marker, a leader lease and namespace discovery.

// Restore re-indexes tasks of ns read from the durable authority, in one
// round trip per MaxBatch tasks. A task is written unless the index already
// holds the same or a newer generation of it. Scheduled tasks go to due at
// DueTime; delivered ones are re-indexed as scheduled, due at DueTime (their
// lease holder is presumed gone); dead ones go to dead at DeadTime (or
// UpdateTime, if DeadTime is zero). Generation, attempt, kind, payload, last
// error and create/update times are kept as given, except that a task
// without a create time gets the Redis clock's now (and so does its update
// time, if it has none): the create time names the incarnation in delivery
// tokens, and a token without one matches nothing. Returns how many tasks
// were written.
func (s *Store) Restore(ctx context.Context, ns string, tasks []storage.Task) (int, error) {
	k := keysFor(ns, shard)
	keys := []string{k.due, k.inflight, k.dead, k.task}
	written := 0
	err := chunks(len(tasks), func(lo, hi int) error {
		part := tasks[lo:hi]
		args := make([]any, 0, 3+5*len(part))
		args = append(args, s.wake, ns, len(part))
		for i := range part {
			t := &part[i]
			dead := t.State == storage.StateDead
			r := recordOf(t, dead)
			if dead {
				at := t.DeadTime
				if at.IsZero() {
					at = t.UpdateTime
				}
				args = append(args, t.ID, t.Generation, 3, toMS(at), r.encode())
			} else {
				args = append(args, t.ID, t.Generation, 1, toMS(t.DueTime), r.encode())
			}
		}
		v, err := s.run(ctx, "restore", scripts.restore, keys, args...)
		if err != nil {
			return err
		}
		n, err := replyInt(v)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		written += int(n)
		return nil
	})
	return written, err
}

// Generations returns the generation the index holds for each id of ns, 0
// where it holds none, in one round trip per MaxBatch ids.
func (s *Store) Generations(ctx context.Context, ns string, ids []string) ([]int64, error) {
	k := keysFor(ns, shard)
	out := make([]int64, 0, len(ids))
	err := chunks(len(ids), func(lo, hi int) error {
		args := make([]any, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			args = append(args, id)
		}
		rep, err := s.runSlice(ctx, "generations", scripts.generations, []string{k.task}, args...)
		if err != nil {
			return err
		}
		if len(rep) != hi-lo {
			return fmt.Errorf("generations: reply has %d values for %d ids", len(rep), hi-lo)
		}
		for _, v := range rep {
			g, err := replyInt(v)
			if err != nil {
				return fmt.Errorf("generations: %w", err)
			}
			out = append(out, g)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Indexed reports whether MarkIndexed was called for ns since the index was
// last emptied (a Redis without persistence loses the marker with the
// tasks, which is the point: durable mode then rebuilds ns from MySQL).
func (s *Store) Indexed(ctx context.Context, ns string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.rdb.Exists(ctx, keysFor(ns, shard).indexed).Result()
	if err != nil {
		return false, wrapErr("indexed", err)
	}
	return n == 1, nil
}

// MarkIndexed records that ns's index is complete.
func (s *Store) MarkIndexed(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Set(ctx, keysFor(ns, shard).indexed, "1", 0).Err(); err != nil {
		return wrapErr("mark indexed", err)
	}
	return nil
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

// Namespaces returns, sorted, the namespaces that have any key in Redis. It
// SCANs in bounded pages (each under the per-call timeout); on a cluster it
// scans every master.
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
				if ns, ok := namespaceOfKey(key); ok {
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
