package durable

import (
	"context"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
)

// rebuild re-indexes every task of ns from MySQL, logging progress, then
// sets the index marker.
func (s *reconciler) rebuild(ctx context.Context, ns string) error {
	s.log.Warn("index marker missing: rebuilding the namespace's index from mysql", "namespace", ns)
	start := time.Now()
	scanned, restored, err := s.walkLogged(ctx, ns)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	if err := s.idx.MarkIndexed(cctx, ns); err != nil {
		return fmt.Errorf("mark indexed: %w", err)
	}
	s.log.Info("index rebuilt", "namespace", ns, "tasks", scanned, "restored", restored, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// walkLogged re-indexes every task of ns the index lacks or holds at an
// older version, in bounded batches, logging progress every few seconds.
func (s *reconciler) walkLogged(ctx context.Context, ns string) (scanned, restored int, err error) {
	after := ""
	lastLog := time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
		vs, err := s.db.ReadVersions(cctx, ns, after, s.batch)
		cancel()
		if err != nil {
			return scanned, restored, err
		}
		scanned += len(vs)
		cctx, cancel = context.WithTimeout(ctx, s.opTimeout)
		n, err := s.rebuildIDs(cctx, ns, vs)
		cancel()
		restored += n
		if err != nil {
			return scanned, restored, err
		}
		if len(vs) < s.batch {
			return scanned, restored, nil
		}
		after = vs[len(vs)-1].ID
		if time.Since(lastLog) >= 2*time.Second {
			lastLog = time.Now()
			s.log.Info("rebuilding index", "namespace", ns, "scanned", scanned, "restored", restored)
		}
		if err := s.lease.keep(ctx); err != nil {
			return scanned, restored, err
		}
	}
}

// rebuildIDs is the bulk form of a repair for a rebuild (the index lost
// the namespace, ack markers included, so there is nothing to honour): it
// restores the tasks of vs the index lacks or holds older without holding
// row locks, then reads their versions again and forgets from the index
// those MySQL deleted meanwhile (removed or acked), if the index still
// holds the version it restored.
func (s *reconciler) rebuildIDs(ctx context.Context, ns string, vs []storage.Version) (int, error) {
	// The index lost the namespace: nearly every task is needed, so read
	// them all (Restore itself skips what the index holds at the same or
	// a newer version).
	need := make([]string, len(vs))
	for i, v := range vs {
		need[i] = v.ID
	}
	tasks, err := s.db.ReadTasks(ctx, ns, need)
	if err != nil || len(tasks) == 0 {
		return 0, err
	}
	n, err := s.idx.Restore(ctx, ns, tasks, storage.RestoreParams{})
	if err != nil {
		return 0, fmt.Errorf("index restore: %w", err)
	}
	still, err := s.db.VersionsOf(ctx, ns, need)
	if err != nil {
		return n, err
	}
	now := make(map[string]storage.Version, len(still))
	for _, v := range still {
		now[v.ID] = v
	}
	var gone []storage.Version
	for _, t := range tasks {
		if _, ok := now[t.ID]; !ok {
			gone = append(gone, storage.Version{ID: t.ID, Incarnation: t.Incarnation, Generation: t.Generation})
		}
	}
	if len(gone) > 0 {
		if _, err := s.idx.Forget(ctx, ns, gone); err != nil {
			return n, fmt.Errorf("index forget of tasks deleted meanwhile: %w", err)
		}
	}
	return n, nil
}
