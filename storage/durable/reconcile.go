package durable

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
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
// failed or was answered "stale" on it (the repair set) every
// IndexCheckInterval.
//
// The parts: the reconciler (this file: its loop, one turn of it in
// runOnce, readiness), its leaderLease (leader.go), its passes (passes.go,
// rebuild.go), the repairer (repair.go) and the pruner (prune.go).
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

// reconciler is the loop above, one per replica. Start it, Stop it once.
type reconciler struct {
	db      authority.Authority
	idx     Index
	log     *slog.Logger
	warn    *throttle
	metrics ReconcileMetrics
	clock   storage.Clock
	lease   *leaderLease
	repair  *repairer
	prune   *pruner

	opTimeout     time.Duration // Config.OpTimeout
	fullInterval  time.Duration // Config.FullReconcileInterval
	interval      time.Duration // Config.ReconcileInterval
	checkInterval time.Duration // Config.IndexCheckInterval
	batch         int           // Config.ReconcileBatch

	st passState // the loop's own

	ready     chan struct{} // closed once every namespace is indexed
	readyOnce sync.Once

	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	startOnce, stopOnce sync.Once
}

// Start runs the loop until Stop.
func (s *reconciler) Start(context.Context) error {
	s.startOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			t := time.NewTicker(s.checkInterval)
			defer t.Stop()
			for {
				s.runOnce(ctx)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	})
	return nil
}

// Stop cancels the loop (a pass in flight ends at its next call) and
// waits for it, or for ctx.
func (s *reconciler) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
	})
	return waitCtx(ctx, s.wg.Wait)
}

// runOnce is one turn of the loop: the leader's work (tick) or a
// follower's watch, then this replica's own repairs.
func (s *reconciler) runOnce(ctx context.Context) {
	s.tick(ctx, &s.st)
	s.repair.repairFailed(ctx)
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
func (s *reconciler) margin() time.Duration { return 2 * s.opTimeout }

// tick is the leader's turn: rebuild namespaces whose marker is missing,
// close Ready, then a full or an incremental pass when one is due. A
// follower watches the markers.
func (s *reconciler) tick(ctx context.Context, st *passState) {
	lead, err := s.lease.tryLead(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.warn.warn("lead", "reconciler: cannot take the leader lease", "err", err)
		}
		return
	}
	if !lead {
		s.watchMarkers(ctx)
		st.lastFull = time.Time{} // a new term as leader starts with a full pass
		return
	}
	ctx, stop := s.lease.hold(ctx)
	defer stop()
	nss, err := s.taskNamespaces(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.warn.warn("namespaces", "reconciler: cannot list namespaces", "err", err)
		}
		return
	}
	for _, ns := range nss {
		ok, err := s.idx.Indexed(ctx, ns)
		if err != nil {
			if ctx.Err() == nil {
				s.warn.warn("marker", "reconciler: cannot read index marker", "namespace", ns, "err", err)
			}
			return
		}
		if ok {
			continue
		}
		if err := s.rebuild(ctx, ns); err != nil {
			if ctx.Err() == nil {
				s.warn.warn("rebuild", "reconciler: index rebuild failed; retrying", "namespace", ns, "err", err)
			}
			return
		}
	}
	s.markReady()
	now := time.Now()
	if st.lastFull.IsZero() || now.Sub(st.lastFull) >= s.fullInterval {
		since := s.clock.Now().Add(-s.margin()).UnixMilli()
		scanned, repaired, err := s.fullPass(ctx, nss)
		s.logPass("full", now, scanned, repaired, err)
		if err != nil {
			// try again after an incremental interval, not a full one
			st.lastFull = now.Add(-s.fullInterval + s.interval)
			return
		}
		st.lastFull, st.lastIncr, st.since = now, now, since
		s.prune.runOnce(ctx)
		return
	}
	if now.Sub(st.lastIncr) >= s.interval {
		since := s.clock.Now().Add(-s.margin()).UnixMilli()
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
		s.prune.runOnce(ctx)
	}
}

// logPass logs the outcome of one pass.
func (s *reconciler) logPass(kind string, start time.Time, scanned, repaired int, err error) {
	if !errors.Is(err, context.Canceled) {
		s.metrics.ReconcilePass(time.Since(start), repaired, err)
	}
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err != nil:
		if !errors.Is(err, context.Canceled) {
			s.warn.warn("pass", "reconciler: "+kind+" pass failed; retrying", "err", err, "scanned", scanned, "repaired", repaired)
		}
	case repaired > 0:
		s.log.Warn("reconciler: "+kind+" pass repaired tasks whose index entry differed from mysql",
			"repaired", repaired, "scanned", scanned, "took", took)
	default:
		s.log.Debug("reconciler: "+kind+" pass: index agrees with mysql", "scanned", scanned, "took", took)
	}
}

// watchMarkers closes Ready once every namespace is indexed (by the
// leader). After that a follower has nothing to watch.
func (s *reconciler) watchMarkers(ctx context.Context) {
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
func (s *reconciler) markReady() {
	s.readyOnce.Do(func() {
		s.log.Info("index complete: every namespace is indexed from mysql")
		close(s.ready)
	})
}

// taskNamespaces lists the namespaces MySQL holds tasks of.
func (s *reconciler) taskNamespaces(ctx context.Context) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	return s.db.TaskNamespaces(cctx)
}
