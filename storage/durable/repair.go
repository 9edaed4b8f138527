package durable

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// maxRepairs bounds the failed index writes a replica remembers to repair
// itself; past it, the reconciler's periodic pass repairs the rest.
const maxRepairs = 100_000

// repairSet is the tasks whose index write failed or was answered "stale"
// on this replica (the index writers add them), which the repairer
// re-indexes from MySQL as soon as the index answers again.
type repairSet struct {
	mu sync.Mutex
	m  map[taskKey]struct{}
}

func newRepairSet() *repairSet { return &repairSet{m: make(map[taskKey]struct{})} }

// add remembers tasks of ns whose index write failed (up to maxRepairs).
func (r *repairSet) add(ns string, ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if len(r.m) >= maxRepairs {
			return
		}
		r.m[taskKey{ns, id}] = struct{}{}
	}
}

// take removes up to n tasks from the set and returns them by namespace;
// nil when the set is empty.
func (r *repairSet) take(n int) map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) == 0 {
		return nil
	}
	byNS := map[string][]string{}
	taken := 0
	for k := range r.m {
		if taken >= n {
			break
		}
		byNS[k.ns] = append(byNS[k.ns], k.id)
		delete(r.m, k)
		taken++
	}
	return byNS
}

// repairer makes the index hold exactly what MySQL holds for named tasks,
// under the rows' locks (repairIDs), for the reconciler's passes and for
// this replica's failed index writes (repairFailed).
type repairer struct {
	db        authority.Authority
	idx       Index
	log       *slog.Logger
	set       *repairSet
	batch     int           // Config.ReconcileBatch
	opTimeout time.Duration // Config.OpTimeout

	// step is how many tasks the next repair transaction takes (0:
	// repairStep): halved after a step that failed, down to one task,
	// and doubled after one that committed, up to repairStep.
	step atomic.Int64
}

// repairIDs makes the index hold, for each named task of ns, exactly the
// version MySQL holds, under the rows' locks (see authority.Authority.Repair
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
// For the same reason a step that failed halves the next one (down to one
// task) and one that committed doubles it again: when connections live
// shorter than a step takes — killed by an operator's watchdog, cut by a
// proxy, or a step slowed by a starved machine — the steps shrink until
// they fit, so the passes still get through instead of failing the same
// step for ever.
func (s *repairer) repairIDs(ctx context.Context, ns string, ids []string) (int, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	done := 0
	for start := 0; start < len(ids); {
		end := min(start+s.stepSize(), len(ids))
		n, err := s.repairStepIDs(ctx, ns, ids[start:end])
		done += n
		if err != nil {
			s.step.Store(int64(max(1, (end-start)/2)))
			return done, err
		}
		s.step.Store(int64(min(repairStep, max(s.stepSize(), 2*(end-start)))))
		start = end
	}
	return done, nil
}

// repairStep is the most tasks one repair transaction takes.
const repairStep = 100

// stepSize is how many tasks the next repair step takes.
func (s *repairer) stepSize() int {
	if n := s.step.Load(); n > 0 {
		return int(n)
	}
	return repairStep
}

// repairStepIDs is one step of repairIDs: ids (sorted, distinct) in one
// transaction.
func (s *repairer) repairStepIDs(ctx context.Context, ns string, ids []string) (int, error) {
	var settled []storage.Token
	restored := 0
	err := s.db.Repair(ctx, ns, ids, func(ctx context.Context, held []storage.Task) ([]authority.AckRow, error) {
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
		var acked []authority.AckRow
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
					acked = append(acked, authority.AckRow{ID: id, Inc: t.Incarnation, Gen: t.Generation, Attempt: attempt})
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

// repairFailed re-indexes, from MySQL, the tasks whose index write failed
// on this replica (or was answered "stale"), and forgets the index entries
// of those MySQL no longer has (a remove whose index side failed). It takes
// ReconcileBatch tasks at a time until the set is empty, a round fails, or
// maxRepairRounds rounds ran; what it cannot repair yet stays for the next
// turn.
func (s *repairer) repairFailed(ctx context.Context) {
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
func (s *repairer) repairRound(ctx context.Context) bool {
	byNS := s.set.take(s.batch)
	if byNS == nil {
		return false
	}
	nss := make([]string, 0, len(byNS))
	for ns := range byNS {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	all := true
	for _, ns := range nss {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
		n, err := s.repairIDs(cctx, ns, byNS[ns])
		if err == nil {
			var f int
			f, err = s.forgetGone(cctx, ns, byNS[ns])
			n += f
		}
		cancel()
		if err != nil {
			all = false
			s.set.add(ns, byNS[ns])
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
func (s *repairer) forgetGone(ctx context.Context, ns string, ids []string) (int, error) {
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

// forgetOrphans takes index versions of ns, forgets those whose task MySQL
// does not have (if the index still holds that version), and repairs those
// MySQL holds at another version. The index entries were read before
// MySQL: an index write follows its MySQL commit, so an entry MySQL lacks
// here was never committed or was deleted since.
func (s *repairer) forgetOrphans(ctx context.Context, ns string, page []storage.Version) (int, error) {
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
