package redisstore

import (
	"context"
	"fmt"

	"github.com/delayd/delayd/storage"
)

// The Store's dead-letter calls (storage.DeadLetters): requeue and purge,
// over the shards in turn (shard_dead.go).

// Requeue moves dead tasks back to scheduled, due after p.Delay by the
// Redis clock, with attempts reset to 0 (generation and last error kept):
// p.IDs (those not dead are skipped), or with p.All the oldest p.Limit dead
// tasks (clamped to 1..MaxBatch). Returns where each moved task went.
func (s *Store) Requeue(ctx context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("requeue: %w", err)
	}
	var out []storage.Moved
	err = eachShardOf(n, p.All, p.Limit, p.IDs, func(sh int, ids []string, limit int) (int, error) {
		q := p
		q.IDs, q.Limit = ids, limit
		ms, err := s.shardOfN(ns, sh, n).requeue(ctx, q)
		out = append(out, ms...)
		return len(ms), err
	})
	return out, err
}

// Purge deletes dead tasks: p.IDs (those not dead are skipped), or with
// p.All the oldest p.Limit dead tasks (clamped to 1..MaxBatch). Returns the
// ids deleted.
func (s *Store) Purge(ctx context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	vs, err := s.PurgeVersions(ctx, ns, p)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.ID
	}
	return out, nil
}

// PurgeVersions is Purge answering the version of each task it deleted
// (durable mode deletes exactly those versions from MySQL).
func (s *Store) PurgeVersions(ctx context.Context, ns string, p storage.PurgeParams) ([]storage.Version, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", err)
	}
	var out []storage.Version
	err = eachShardOf(n, p.All, p.Limit, p.IDs, func(sh int, ids []string, limit int) (int, error) {
		q := p
		q.IDs, q.Limit = ids, limit
		vs, err := s.shardOfN(ns, sh, n).purge(ctx, q)
		out = append(out, vs...)
		return len(vs), err
	})
	return out, err
}

// eachChunk runs call once with no ids when all is set, else once per
// MaxBatch-sized chunk of ids.
func eachChunk(all bool, ids []string, call func(ids []string) error) error {
	if all {
		return call(nil)
	}
	return chunks(len(ids), func(lo, hi int) error { return call(ids[lo:hi]) })
}
