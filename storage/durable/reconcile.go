package durable

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/delayd/delayd/storage"
)

// The reconciler makes the index agree with MySQL. Every replica runs the
// loop; only the holder of the leader lease (in Redis) works:
//
//   - every IndexCheckInterval, each namespace MySQL holds tasks of whose
//     index marker is missing (a cold start, a Redis restarted empty, a
//     FLUSHALL) is rebuilt from MySQL in bounded batches, then marked;
//   - once after start and then every ReconcileInterval, every task the
//     index lacks or holds at an older generation is re-indexed;
//   - with HistoryRetention, history rows past it are pruned.
//
// A follower only watches the markers until every namespace is indexed, to
// close Ready. Every replica also retries its own failed index writes
// (requestRepair) every IndexCheckInterval.
//
// A rebuild step reads ReconcileBatch primary keys (keyset pagination on
// (namespace, id)), asks the index for their generations, reads the full
// rows of those it lacks or holds older, and restores them. A task removed
// between that read and the restore would come back to life in the index;
// so the restored ids are read again and those MySQL no longer has are
// removed from the index again.
//
// The periodic pass must not resurrect acked tasks either: an ack takes the
// task out of the index first and deletes its row a moment later (group
// commit), so a task seen "in MySQL, not in the index" may be one being
// acked. The pass therefore only collects candidates, waits OpTimeout (by
// then every ack in flight has committed or failed), and restores the
// candidates that MySQL still has and the index still lacks. A rebuild does
// not wait: after a Redis loss an ack racing with it can at worst cause one
// more delivery.

// reconcileLoop runs until ctx is done.
func (s *Store) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.IndexCheckInterval)
	defer t.Stop()
	var lastFull time.Time // zero: a full pass is due once the index is complete
	for {
		lastFull = s.reconcileTick(ctx, lastFull)
		s.repairFailed(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcileTick is one turn of the loop; it returns when the last full
// pass ran.
func (s *Store) reconcileTick(ctx context.Context, lastFull time.Time) time.Time {
	lead, err := s.tryLead(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.warn("lead", "reconciler: cannot take the leader lease", "err", err)
		}
		return lastFull
	}
	if !lead {
		s.watchMarkers(ctx)
		return lastFull
	}
	nss, err := s.taskNamespaces(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.warn("namespaces", "reconciler: cannot list namespaces", "err", err)
		}
		return lastFull
	}
	complete := true
	for _, ns := range nss {
		ok, err := s.idx.Indexed(ctx, ns)
		if err != nil {
			complete = false
			if ctx.Err() == nil {
				s.warn("marker", "reconciler: cannot read index marker", "namespace", ns, "err", err)
			}
			break
		}
		if ok {
			continue
		}
		if err := s.rebuild(ctx, ns); err != nil {
			complete = false
			if ctx.Err() == nil {
				s.warn("rebuild", "reconciler: index rebuild failed; retrying", "namespace", ns, "err", err)
			}
			break
		}
	}
	if !complete {
		return lastFull
	}
	s.markReady()
	if !lastFull.IsZero() && time.Since(lastFull) < s.cfg.ReconcileInterval {
		return lastFull
	}
	start := time.Now()
	scanned, restored, err := s.fullPass(ctx, nss)
	if err != nil {
		if ctx.Err() == nil {
			s.warn("pass", "reconciler: pass failed; retrying next interval", "err", err)
		}
		return start
	}
	if restored > 0 {
		s.log.Warn("reconciler: re-indexed tasks the index lacked or held at an older generation",
			"restored", restored, "scanned", scanned, "took", time.Since(start).Round(time.Millisecond))
	} else {
		s.log.Debug("reconciler: index agrees with mysql", "scanned", scanned, "took", time.Since(start).Round(time.Millisecond))
	}
	s.pruneHistory(ctx)
	return start
}

// maxCandidates bounds the tasks one periodic pass collects to restore;
// the next pass takes the rest.
const maxCandidates = 100_000

// fullPass walks every task of nss and re-indexes those the index lacks
// or holds at an older generation, after the grace wait described above.
func (s *Store) fullPass(ctx context.Context, nss []string) (scanned, restored int, err error) {
	cands := map[string][]string{}
	var order []string
	total := 0
	lastLease := time.Now()
	for _, ns := range nss {
		after := ""
		for total < maxCandidates {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			keys, need, err := s.compare(cctx, ns, after)
			cancel()
			if err != nil {
				return scanned, 0, err
			}
			scanned += len(keys)
			if len(need) > 0 {
				if _, ok := cands[ns]; !ok {
					order = append(order, ns)
				}
				cands[ns] = append(cands[ns], need...)
				total += len(need)
			}
			if len(keys) < s.cfg.ReconcileBatch {
				break
			}
			after = keys[len(keys)-1].id
			if err := s.keepLease(ctx, &lastLease); err != nil {
				return scanned, 0, err
			}
		}
	}
	if total == 0 {
		return scanned, 0, nil
	}
	s.log.Info("reconciler: tasks missing from the index; restoring them after a grace period",
		"tasks", total, "grace", s.cfg.OpTimeout)
	select {
	case <-ctx.Done():
		return scanned, 0, ctx.Err()
	case <-time.After(s.cfg.OpTimeout):
	}
	for _, ns := range order {
		ids := cands[ns]
		for start := 0; start < len(ids); start += s.cfg.ReconcileBatch {
			chunk := ids[start:min(start+s.cfg.ReconcileBatch, len(ids))]
			cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			n, err := s.restoreMissing(cctx, ns, chunk)
			cancel()
			restored += n
			if err != nil {
				return scanned, restored, err
			}
			if err := s.keepLease(ctx, &lastLease); err != nil {
				return scanned, restored, err
			}
		}
	}
	return scanned, restored, nil
}

// keepLease renews the leader lease during a long pass, at most every
// third of its TTL, and fails when it was lost.
func (s *Store) keepLease(ctx context.Context, last *time.Time) error {
	if time.Since(*last) < s.cfg.LeaderTTL/3 {
		return nil
	}
	*last = time.Now()
	lead, err := s.tryLead(ctx)
	if err != nil {
		return err
	}
	if !lead {
		return errors.New("leader lease lost")
	}
	return nil
}

// compare reads the next ReconcileBatch (id, generation) of ns after id
// `after` and returns them with the ids the index lacks or holds older.
func (s *Store) compare(ctx context.Context, ns, after string) ([]keyGen, []string, error) {
	keys, err := s.readGenerations(ctx, ns, after, s.cfg.ReconcileBatch)
	if err != nil || len(keys) == 0 {
		return keys, nil, err
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.id
	}
	have, err := s.idx.Generations(ctx, ns, ids)
	if err != nil {
		return keys, nil, fmt.Errorf("index generations: %w", err)
	}
	if len(have) != len(ids) {
		return keys, nil, fmt.Errorf("index answered %d generations for %d ids", len(have), len(ids))
	}
	var need []string
	for i, k := range keys {
		if have[i] < k.gen {
			need = append(need, k.id)
		}
	}
	return keys, need, nil
}

// restoreMissing reads the named tasks from MySQL again and restores those
// the index still lacks or holds older.
func (s *Store) restoreMissing(ctx context.Context, ns string, ids []string) (int, error) {
	tasks, err := s.readTasks(ctx, ns, ids)
	if err != nil || len(tasks) == 0 {
		return 0, err
	}
	now := make([]string, len(tasks))
	for i, t := range tasks {
		now[i] = t.ID
	}
	have, err := s.idx.Generations(ctx, ns, now)
	if err != nil {
		return 0, fmt.Errorf("index generations: %w", err)
	}
	if len(have) != len(now) {
		return 0, fmt.Errorf("index answered %d generations for %d ids", len(have), len(now))
	}
	var need []string
	for i, t := range tasks {
		if have[i] < t.Generation {
			need = append(need, t.ID)
		}
	}
	if len(need) == 0 {
		return 0, nil
	}
	return s.restoreIDs(ctx, ns, need)
}

// tryLead takes or renews the leader lease.
func (s *Store) tryLead(ctx context.Context) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	return s.idx.TryLead(cctx, s.leader, s.cfg.Holder, s.cfg.LeaderTTL)
}

// watchMarkers closes Ready once every namespace is indexed (by the
// leader). After that a follower has nothing to watch.
func (s *Store) watchMarkers(ctx context.Context) {
	select {
	case <-s.ready:
		return
	default:
	}
	nss, err := s.taskNamespaces(ctx)
	if err != nil {
		return
	}
	for _, ns := range nss {
		ok, err := s.idx.Indexed(ctx, ns)
		if err != nil || !ok {
			return
		}
	}
	s.markReady()
}

// markReady closes Ready (once).
func (s *Store) markReady() {
	s.readyOnce.Do(func() {
		s.log.Info("index complete: every namespace is indexed from mysql")
		close(s.ready)
	})
}

// taskNamespaces lists the namespaces MySQL holds tasks of.
func (s *Store) taskNamespaces(ctx context.Context) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	return s.db.TaskNamespaces(cctx)
}

// rebuild re-indexes every task of ns from MySQL, logging progress, then
// sets the index marker.
func (s *Store) rebuild(ctx context.Context, ns string) error {
	s.log.Warn("index marker missing: rebuilding the namespace's index from mysql", "namespace", ns)
	start := time.Now()
	scanned, restored, err := s.walkLogged(ctx, ns)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	if err := s.idx.MarkIndexed(cctx, ns); err != nil {
		return fmt.Errorf("mark indexed: %w", err)
	}
	s.log.Info("index rebuilt", "namespace", ns, "tasks", scanned, "restored", restored, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// walkLogged re-indexes every task of ns the index lacks or holds older,
// in bounded batches, logging progress every few seconds.
func (s *Store) walkLogged(ctx context.Context, ns string) (scanned, restored int, err error) {
	after := ""
	lastLog, lastLease := time.Now(), time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		keys, need, err := s.compare(cctx, ns, after)
		if err == nil && len(need) > 0 {
			var n int
			n, err = s.restoreIDs(cctx, ns, need)
			restored += n
		}
		cancel()
		scanned += len(keys)
		if err != nil {
			return scanned, restored, err
		}
		if len(keys) < s.cfg.ReconcileBatch {
			return scanned, restored, nil
		}
		after = keys[len(keys)-1].id
		if time.Since(lastLog) >= 2*time.Second {
			lastLog = time.Now()
			s.log.Info("rebuilding index", "namespace", ns, "scanned", scanned, "restored", restored)
		}
		if err := s.keepLease(ctx, &lastLease); err != nil {
			return scanned, restored, err
		}
	}
}

// restoreIDs reads the named tasks from MySQL and restores them into the
// index; then removes again from the index those MySQL no longer has
// (acked or removed meanwhile).
func (s *Store) restoreIDs(ctx context.Context, ns string, ids []string) (int, error) {
	tasks, err := s.readTasks(ctx, ns, ids)
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, nil
	}
	n, err := s.idx.Restore(ctx, ns, tasks)
	if err != nil {
		return 0, fmt.Errorf("index restore: %w", err)
	}
	restoredIDs := make([]string, len(tasks))
	for i, t := range tasks {
		restoredIDs[i] = t.ID
	}
	still, err := s.readTasks(ctx, ns, restoredIDs)
	if err != nil {
		return n, err
	}
	present := make(map[string]bool, len(still))
	for _, t := range still {
		present[t.ID] = true
	}
	for _, id := range restoredIDs {
		if present[id] {
			continue
		}
		if _, err := s.idx.Remove(ctx, ns, id); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return n, fmt.Errorf("index remove of a task deleted meanwhile: %w", err)
		}
	}
	return n, nil
}

// keyGen is one primary key and its generation.
type keyGen struct {
	id  string
	gen int64
}

// readGenerations reads up to limit (id, generation) of ns after id, in id
// order (keyset pagination on the primary key).
func (s *Store) readGenerations(ctx context.Context, ns, after string, limit int) ([]keyGen, error) {
	keys, err := s.db.ReadGenerations(ctx, ns, after, limit)
	out := make([]keyGen, len(keys))
	for i, k := range keys {
		out[i] = keyGen{id: k.ID, gen: k.Gen}
	}
	return out, err
}

// readTasks reads the named tasks of ns (those that exist).
func (s *Store) readTasks(ctx context.Context, ns string, ids []string) ([]storage.Task, error) {
	return s.db.ReadTasks(ctx, ns, ids)
}

// repairFailed re-indexes, from MySQL, the tasks whose index write failed
// on this replica. Those it cannot repair yet stay for the next turn.
func (s *Store) repairFailed(ctx context.Context) {
	s.repairMu.Lock()
	if len(s.repairs) == 0 {
		s.repairMu.Unlock()
		return
	}
	byNS := map[string][]string{}
	taken := 0
	for k := range s.repairs {
		if taken >= s.cfg.ReconcileBatch {
			break
		}
		byNS[k.ns] = append(byNS[k.ns], k.id)
		delete(s.repairs, k)
		taken++
	}
	s.repairMu.Unlock()
	nss := make([]string, 0, len(byNS))
	for ns := range byNS {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	for _, ns := range nss {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		n, err := s.restoreIDs(cctx, ns, byNS[ns])
		cancel()
		if err != nil {
			s.requestRepair(ns, byNS[ns])
			if ctx.Err() == nil {
				s.log.Debug("index still unavailable for repairs", "namespace", ns, "err", err)
			}
			continue
		}
		s.log.Info("re-indexed tasks whose index write had failed", "namespace", ns, "tasks", len(byNS[ns]), "restored", n)
	}
}

// pruneHistory deletes history rows older than HistoryRetention, in
// bounded batches.
func (s *Store) pruneHistory(ctx context.Context) {
	if s.cfg.HistoryRetention <= 0 {
		return
	}
	cutoff := s.cfg.Clock.Now().Add(-s.cfg.HistoryRetention)
	total := int64(0)
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		n, err := s.db.PruneHistory(cctx, cutoff, 1000)
		cancel()
		if err != nil {
			s.warn("prune", "reconciler: pruning history failed", "err", err)
			return
		}
		total += n
		if n < 1000 {
			break
		}
	}
	if total > 0 {
		s.log.Info("pruned task history", "rows", total, "retention", s.cfg.HistoryRetention)
	}
}
