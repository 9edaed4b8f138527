package redisstore

import (
	"context"
	"fmt"

	"github.com/delayd/delayd/storage"
)

// The Store's counts: Stats and DueKinds, summed over the shards
// (shard_stats.go).

// Stats counts ns's tasks per state, how many scheduled tasks are due by
// the Redis clock, and the earliest due time.
func (s *Store) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.Stats{}, fmt.Errorf("stats: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).stats(ctx)
	}
	return s.statsSharded(ctx, ns, n)
}

// DueKinds counts ns's due tasks per kind among the first
// storage.KindScanWindow of them, by the Redis clock (lua/duekinds.lua).
func (s *Store) DueKinds(ctx context.Context, ns string) (storage.DueKinds, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.DueKinds{}, fmt.Errorf("due kinds: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).dueKinds(ctx)
	}
	return s.dueKindsSharded(ctx, ns, n)
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
