package durable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/mysqlstore"
)

// The reconciler makes the index agree with MySQL, the authority. Every
// replica runs the loop; only the holder of the leader lease (in Redis)
// works, and it renews the lease between every bounded step:
//
//   - every IndexCheckInterval, each namespace MySQL holds tasks of whose
//     index marker is missing (a cold start, a Redis restarted empty, a
//     FLUSHALL) is rebuilt from MySQL in bounded batches, then marked;
//   - every ReconcileInterval, an incremental pass reads the versions of
//     the rows changed since the last pass (by update time, from one
//     index, minus a margin of twice OpTimeout for commits still in flight
//     and replicas' clock differences) and repairs every task whose index
//     version differs, then settles the ack markers left behind by acks
//     whose MySQL delete failed;
//   - once after start and then every FullReconcileInterval, a full pass
//     compares every row with the index (forward), every index entry with
//     MySQL (reverse: an entry whose task MySQL does not have, as a
//     restored snapshot or a promoted lagging replica leaves behind, is
//     forgotten if the index still holds that version), and settles every
//     ack marker left behind;
//   - with HistoryRetention, history rows past it are pruned after every
//     pass.
//
// A follower only watches the markers until every namespace is indexed, to
// close Ready. Every replica also repairs the tasks whose index write
// failed or was answered "stale" on it (requestRepair) every
// IndexCheckInterval.
//
// Every repair (repairIDs) runs in a MySQL transaction that holds the
// tasks' row locks while it reads the index and writes it: no upsert, ack
// delete or remove of those tasks commits meanwhile, so the index gets
// exactly the version MySQL holds (a repair: MySQL wins even over a version
// the index calls newer), and a task removed or acked at the same time is
// never brought back. An acked task is never brought back either when its
// MySQL delete failed (an outage): the ack left a marker in the index
// naming the acked version, the repair skips that version, deletes its
// row itself and drops the marker. No timer decides what was acked.

// reconcileLoop runs until ctx is done.
func (s *Store) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.IndexCheckInterval)
	defer t.Stop()
	var st passState
	for {
		s.reconcileTick(ctx, &st)
		s.repairFailed(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// passState is when the leader's passes ran last.
type passState struct {
	lastFull time.Time // zero: a full pass is due once the index is complete
	lastIncr time.Time
	// since is the incremental pass's watermark: it reads the rows updated
	// at or after it (Unix ms, the replicas' clocks).
	since int64
}

// margin is how far before its start a pass's watermark is set: commits
// stamped earlier (queued, or by a replica whose clock is behind) that
// land after the pass read past them are read again by the next pass.
func (s *Store) margin() time.Duration { return 2 * s.cfg.OpTimeout }

// reconcileTick is one turn of the loop.
func (s *Store) reconcileTick(ctx context.Context, st *passState) {
	lead, err := s.tryLead(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.warn("lead", "reconciler: cannot take the leader lease", "err", err)
		}
		return
	}
	if !lead {
		s.watchMarkers(ctx)
		st.lastFull = time.Time{} // a new term as leader starts with a full pass
		return
	}
	nss, err := s.taskNamespaces(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.warn("namespaces", "reconciler: cannot list namespaces", "err", err)
		}
		return
	}
	for _, ns := range nss {
		ok, err := s.idx.Indexed(ctx, ns)
		if err != nil {
			if ctx.Err() == nil {
				s.warn("marker", "reconciler: cannot read index marker", "namespace", ns, "err", err)
			}
			return
		}
		if ok {
			continue
		}
		if err := s.rebuild(ctx, ns); err != nil {
			if ctx.Err() == nil {
				s.warn("rebuild", "reconciler: index rebuild failed; retrying", "namespace", ns, "err", err)
			}
			return
		}
	}
	s.markReady()
	now := time.Now()
	if st.lastFull.IsZero() || now.Sub(st.lastFull) >= s.cfg.FullReconcileInterval {
		since := s.cfg.Clock.Now().Add(-s.margin()).UnixMilli()
		scanned, repaired, err := s.fullPass(ctx, nss)
		s.logPass("full", now, scanned, repaired, err)
		if err != nil {
			// try again after an incremental interval, not a full one
			st.lastFull = now.Add(-s.cfg.FullReconcileInterval + s.cfg.ReconcileInterval)
			return
		}
		st.lastFull, st.lastIncr, st.since = now, now, since
		s.pruneHistory(ctx)
		return
	}
	if now.Sub(st.lastIncr) >= s.cfg.ReconcileInterval {
		since := s.cfg.Clock.Now().Add(-s.margin()).UnixMilli()
		scanned, repaired, err := s.incrementalPass(ctx, st.since)
		if err == nil {
			var n int
			n, err = s.settleAcked(ctx, nss)
			repaired += n
		}
		s.logPass("incremental", now, scanned, repaired, err)
		if err == nil {
			st.lastIncr, st.since = now, since
		}
		s.pruneHistory(ctx)
	}
}

// logPass logs the outcome of one pass.
func (s *Store) logPass(kind string, start time.Time, scanned, repaired int, err error) {
	if !errors.Is(err, context.Canceled) {
		s.cfg.Metrics.ReconcilePass(time.Since(start), repaired, err)
	}
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err != nil:
		if !errors.Is(err, context.Canceled) {
			s.warn("pass", "reconciler: "+kind+" pass failed; retrying", "err", err, "scanned", scanned, "repaired", repaired)
		}
	case repaired > 0:
		s.log.Warn("reconciler: "+kind+" pass repaired tasks whose index entry differed from mysql",
			"repaired", repaired, "scanned", scanned, "took", took)
	default:
		s.log.Debug("reconciler: "+kind+" pass: index agrees with mysql", "scanned", scanned, "took", took)
	}
}

// incrementalPass repairs every task changed in MySQL at or after sinceMS
// whose index version differs.
func (s *Store) incrementalPass(ctx context.Context, sinceMS int64) (scanned, repaired int, err error) {
	lastLease := time.Now()
	cursor := sinceMS
	for {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		rows, err := s.db.ReadChanged(cctx, cursor, s.cfg.ReconcileBatch)
		cancel()
		if err != nil {
			return scanned, repaired, err
		}
		full := len(rows) == s.cfg.ReconcileBatch
		if full && rows[0].UpdateMS == rows[len(rows)-1].UpdateMS {
			// more changes in one millisecond than a page: read it whole
			cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			rows, err = s.db.ReadChangedAt(cctx, rows[0].UpdateMS)
			cancel()
			if err != nil {
				return scanned, repaired, err
			}
			cursor = rows[0].UpdateMS + 1
		} else if full {
			cursor = rows[len(rows)-1].UpdateMS // that millisecond is read again
		}
		scanned += len(rows)
		byNS := map[string][]storage.Version{}
		var order []string
		for _, r := range rows {
			if _, ok := byNS[r.NS]; !ok {
				order = append(order, r.NS)
			}
			byNS[r.NS] = append(byNS[r.NS], r.Version)
		}
		for _, ns := range order {
			n, err := s.checkVersions(ctx, ns, byNS[ns])
			repaired += n
			if err != nil {
				return scanned, repaired, err
			}
			if err := s.keepLease(ctx, &lastLease); err != nil {
				return scanned, repaired, err
			}
		}
		if !full {
			return scanned, repaired, nil
		}
	}
}

// settleAcked settles the ack markers of nss (the namespaces MySQL holds
// rows of: an ack whose delete did not reach MySQL left its row there):
// each marked version MySQL still has is deleted, and every marker whose
// version MySQL no longer has is dropped (see repairIDs).
func (s *Store) settleAcked(ctx context.Context, nss []string) (int, error) {
	lastLease := time.Now()
	settled := 0
	for _, ns := range nss {
		var cursor uint64
		for {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			marks, next, err := s.idx.ScanAcked(cctx, ns, cursor, s.cfg.ReconcileBatch)
			if err == nil && len(marks) > 0 {
				ids := make([]string, len(marks))
				for i, m := range marks {
					ids[i] = m.ID
				}
				var n int
				n, err = s.repairIDs(cctx, ns, ids)
				settled += n
			}
			cancel()
			if err != nil {
				return settled, err
			}
			if err := s.keepLease(ctx, &lastLease); err != nil {
				return settled, err
			}
			if next == 0 {
				break
			}
			cursor = next
		}
	}
	return settled, nil
}

// fullPass compares every task of MySQL with the index (forward), every
// task of the index with MySQL (reverse), and settles every ack marker.
func (s *Store) fullPass(ctx context.Context, nss []string) (scanned, repaired int, err error) {
	lastLease := time.Now()
	for _, ns := range nss {
		after := ""
		for {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			vs, err := s.db.ReadVersions(cctx, ns, after, s.cfg.ReconcileBatch)
			cancel()
			if err != nil {
				return scanned, repaired, err
			}
			scanned += len(vs)
			n, err := s.checkVersions(ctx, ns, vs)
			repaired += n
			if err != nil {
				return scanned, repaired, err
			}
			if err := s.keepLease(ctx, &lastLease); err != nil {
				return scanned, repaired, err
			}
			if len(vs) < s.cfg.ReconcileBatch {
				break
			}
			after = vs[len(vs)-1].ID
		}
	}
	idxNS, err := s.ownedIndexNamespaces(ctx)
	if err != nil {
		return scanned, repaired, err
	}
	for _, ns := range idxNS {
		n, err := s.reversePass(ctx, ns, &lastLease)
		repaired += n
		if err != nil {
			return scanned, repaired, err
		}
	}
	return scanned, repaired, nil
}

// reversePass walks the index's entries of ns (headers only) and forgets
// those whose task MySQL does not have, repairs those MySQL holds at
// another version, and settles the ack markers of ns.
func (s *Store) reversePass(ctx context.Context, ns string, lastLease *time.Time) (repaired int, err error) {
	var cursor uint64
	for {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		page, next, err := s.idx.ScanVersions(cctx, ns, cursor, s.cfg.ReconcileBatch)
		if err == nil && len(page) > 0 {
			var n int
			n, err = s.forgetOrphans(cctx, ns, page)
			repaired += n
		}
		cancel()
		if err != nil {
			return repaired, err
		}
		if err := s.keepLease(ctx, lastLease); err != nil {
			return repaired, err
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	n, err := s.settleAcked(ctx, []string{ns})
	return repaired + n, err
}

// forgetOrphans takes index versions of ns, forgets those whose task MySQL
// does not have (if the index still holds that version), and repairs those
// MySQL holds at another version. The index entries were read before
// MySQL: an index write follows its MySQL commit, so an entry MySQL lacks
// here was never committed or was deleted since.
func (s *Store) forgetOrphans(ctx context.Context, ns string, page []storage.Version) (int, error) {
	ids := make([]string, len(page))
	for i, v := range page {
		ids[i] = v.ID
	}
	have, err := s.db.VersionsOf(ctx, ns, ids)
	if err != nil {
		return 0, err
	}
	inDB := make(map[string]storage.Version, len(have))
	for _, v := range have {
		inDB[v.ID] = v
	}
	var orphans []storage.Version
	var differ []string
	for _, v := range page {
		m, ok := inDB[v.ID]
		switch {
		case !ok:
			orphans = append(orphans, v)
		case m != v:
			differ = append(differ, v.ID)
		}
	}
	n := 0
	if len(orphans) > 0 {
		forgot, err := s.idx.Forget(ctx, ns, orphans)
		if err != nil {
			return 0, fmt.Errorf("index forget: %w", err)
		}
		if forgot > 0 {
			s.log.Warn("reconciler: removed index entries of tasks mysql does not have", "namespace", ns, "tasks", forgot)
		}
		n += forgot
	}
	if len(differ) > 0 {
		r, err := s.repairIDs(ctx, ns, differ)
		n += r
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// checkVersions compares MySQL versions of tasks of ns with the index and
// repairs (repairIDs) those that differ or carry an ack marker.
func (s *Store) checkVersions(ctx context.Context, ns string, vs []storage.Version) (int, error) {
	if len(vs) == 0 {
		return 0, nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = v.ID
	}
	have, marks, err := s.idx.Versions(cctx, ns, ids)
	if err != nil {
		return 0, fmt.Errorf("index versions: %w", err)
	}
	if len(have) != len(ids) || len(marks) != len(ids) {
		return 0, fmt.Errorf("index answered %d versions for %d ids", len(have), len(ids))
	}
	var need []string
	for i, v := range vs {
		if have[i] != v || marks[i].Delivery != 0 {
			need = append(need, v.ID)
		}
	}
	if len(need) == 0 {
		return 0, nil
	}
	return s.repairIDs(cctx, ns, need)
}

// repairIDs makes the index hold, for each named task of ns, exactly the
// version MySQL holds, under the rows' locks (see mysqlstore.Store.Repair
// and the top of this file): a task MySQL has at another version than the
// index is restored (RestoreParams.Repair); a version an ack marker names is not
// restored but deleted from MySQL (the ack's own delete failed or is in
// flight) and its marker dropped; a marker naming a version MySQL no longer
// has is dropped. Tasks MySQL does not have are left to the reverse pass.
// Returns how many tasks it restored or settled.
//
// It works in steps of at most repairStep tasks, each its own transaction:
// a step holds its rows' locks while it reads and writes the index, so a
// bounded step keeps writers of those tasks waiting only briefly, and a
// step that fails (a killed connection, a timeout) loses only itself:
// what the steps before it did stays done, and the next pass goes on from
// there. One transaction for a whole page (up to ReconcileBatch tasks)
// could outlast every connection of a troubled MySQL and never commit.
func (s *Store) repairIDs(ctx context.Context, ns string, ids []string) (int, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	done := 0
	for start := 0; start < len(ids); start += repairStep {
		n, err := s.repairStepIDs(ctx, ns, ids[start:min(start+repairStep, len(ids))])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// repairStep is the most tasks one repair transaction takes.
const repairStep = 100

// repairStepIDs is one step of repairIDs: ids (sorted, distinct) in one
// transaction.
func (s *Store) repairStepIDs(ctx context.Context, ns string, ids []string) (int, error) {
	var settled []storage.Token
	restored := 0
	err := s.db.Repair(ctx, ns, ids, func(ctx context.Context, held []storage.Task) ([]mysqlstore.AckRow, error) {
		settled, restored = settled[:0], 0
		have, marks, err := s.idx.Versions(ctx, ns, ids)
		if err != nil {
			return nil, fmt.Errorf("index versions: %w", err)
		}
		if len(have) != len(ids) || len(marks) != len(ids) {
			return nil, fmt.Errorf("index answered %d versions for %d ids", len(have), len(ids))
		}
		byID := make(map[string]storage.Task, len(held))
		for _, t := range held {
			byID[t.ID] = t
		}
		var restore []storage.Task
		var acked []mysqlstore.AckRow
		for i, id := range ids {
			t, ok := byID[id]
			v := storage.Version{ID: id, Incarnation: t.Incarnation, Generation: t.Generation}
			if m := marks[i]; m.Delivery != 0 {
				if ok && m.Incarnation == t.Incarnation && m.Generation == t.Generation {
					// The marker's attempt is the acked delivery's; MySQL's
					// is older (pops are not written through).
					attempt := m.Attempt
					if attempt == 0 {
						attempt = t.Attempt
					}
					acked = append(acked, mysqlstore.AckRow{ID: id, Inc: t.Incarnation, Gen: t.Generation, Attempt: attempt})
					settled = append(settled, m)
					continue
				}
				settled = append(settled, m) // that version is gone from mysql
			}
			if ok && have[i] != v {
				restore = append(restore, t)
			}
		}
		if len(restore) > 0 {
			n, err := s.idx.Restore(ctx, ns, restore, storage.RestoreParams{Repair: true})
			if err != nil {
				return nil, fmt.Errorf("index restore: %w", err)
			}
			restored = n
		}
		return acked, nil
	})
	if err != nil {
		return 0, err
	}
	if len(settled) > 0 {
		if _, err := s.idx.ClearAcked(ctx, ns, settled); err != nil {
			return restored, fmt.Errorf("index clear acked: %w", err)
		}
	}
	return restored + len(settled), nil
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

// walkLogged re-indexes every task of ns the index lacks or holds at an
// older version, in bounded batches, logging progress every few seconds.
func (s *Store) walkLogged(ctx context.Context, ns string) (scanned, restored int, err error) {
	after := ""
	lastLog, lastLease := time.Now(), time.Now()
	for {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		vs, err := s.db.ReadVersions(cctx, ns, after, s.cfg.ReconcileBatch)
		cancel()
		if err != nil {
			return scanned, restored, err
		}
		scanned += len(vs)
		cctx, cancel = context.WithTimeout(ctx, s.cfg.OpTimeout)
		n, err := s.rebuildIDs(cctx, ns, vs)
		cancel()
		restored += n
		if err != nil {
			return scanned, restored, err
		}
		if len(vs) < s.cfg.ReconcileBatch {
			return scanned, restored, nil
		}
		after = vs[len(vs)-1].ID
		if time.Since(lastLog) >= 2*time.Second {
			lastLog = time.Now()
			s.log.Info("rebuilding index", "namespace", ns, "scanned", scanned, "restored", restored)
		}
		if err := s.keepLease(ctx, &lastLease); err != nil {
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
func (s *Store) rebuildIDs(ctx context.Context, ns string, vs []storage.Version) (int, error) {
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

// repairFailed re-indexes, from MySQL, the tasks whose index write failed
// on this replica (or was answered "stale"), and forgets the index entries
// of those MySQL no longer has (a remove whose index side failed). It takes
// ReconcileBatch tasks at a time until the set is empty, a round fails, or
// maxRepairRounds rounds ran; what it cannot repair yet stays for the next
// turn.
func (s *Store) repairFailed(ctx context.Context) {
	for range maxRepairRounds {
		if !s.repairRound(ctx) || ctx.Err() != nil {
			return
		}
	}
}

// maxRepairRounds bounds one turn of repairFailed, so the reconciler's
// other work is not held up for long.
const maxRepairRounds = 100

// repairRound repairs up to ReconcileBatch tasks of the repair set; it
// reports whether it took any and repaired them all.
func (s *Store) repairRound(ctx context.Context) bool {
	s.repairMu.Lock()
	if len(s.repairs) == 0 {
		s.repairMu.Unlock()
		return false
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
	all := true
	for _, ns := range nss {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		n, err := s.repairIDs(cctx, ns, byNS[ns])
		if err == nil {
			var f int
			f, err = s.forgetGone(cctx, ns, byNS[ns])
			n += f
		}
		cancel()
		if err != nil {
			all = false
			s.requestRepair(ns, byNS[ns])
			if ctx.Err() == nil {
				s.log.Debug("index still unavailable for repairs", "namespace", ns, "err", err)
			}
			continue
		}
		s.log.Info("re-indexed tasks whose index write had failed", "namespace", ns, "tasks", len(byNS[ns]), "repaired", n)
	}
	return all
}

// forgetGone forgets the index entries of the named tasks of ns that MySQL
// does not have: the index's versions are read first, then MySQL's (see
// forgetOrphans), so an entry is forgotten only if MySQL deleted that very
// version.
func (s *Store) forgetGone(ctx context.Context, ns string, ids []string) (int, error) {
	have, _, err := s.idx.Versions(ctx, ns, ids)
	if err != nil {
		return 0, fmt.Errorf("index versions: %w", err)
	}
	var page []storage.Version
	for _, v := range have {
		if v.Incarnation != 0 || v.Generation != 0 {
			page = append(page, v)
		}
	}
	if len(page) == 0 {
		return 0, nil
	}
	return s.forgetOrphans(ctx, ns, page)
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

// ownedIndexNamespaces is the index's namespaces that this deployment's
// MySQL knows: it holds tasks of them or has them in its registry. The
// reverse pass forgets index entries MySQL lacks, so it must never walk a
// namespace another deployment (a Redis-only delayd, or a durable one with
// another MySQL) keeps in the same Redis: those entries are not orphans.
func (s *Store) ownedIndexNamespaces(ctx context.Context) ([]string, error) {
	idxNS, err := s.idx.Namespaces(ctx)
	if err != nil {
		return nil, fmt.Errorf("index namespaces: %w", err)
	}
	withTasks, err := s.taskNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	owned := make(map[string]bool, len(withTasks))
	for _, ns := range withTasks {
		owned[ns] = true
	}
	out := idxNS[:0]
	for _, ns := range idxNS {
		if !owned[ns] {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			_, err := s.db.GetNamespace(cctx, ns)
			cancel()
			switch {
			case errors.Is(err, storage.ErrNotFound):
				continue
			case err != nil:
				return nil, err
			}
		}
		out = append(out, ns)
	}
	return out, nil
}
