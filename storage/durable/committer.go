package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/mysqlstore"
)

// The committer group-commits writes. One collector goroutine gathers the
// ops callers submit into batches (up to MaxBatch rows / MaxBatchBytes,
// lingering Linger for more when the queue runs dry) and hands each batch to
// one of Committers workers:
//
//	callers ──op──▶ collect ──batch──▶ worker: MySQL transaction ─▶ answers ─▶ index queue (indexqueue.go)
//
// A worker runs the batch's ops as multi-row statements in ONE transaction
// and answers them; the index side of upserts and removes goes to the index
// queues, whose writers apply it while the worker takes its next batch (a
// caller may wait for its own index write; see awaitIndex). Several workers
// commit at once, so their fsyncs share InnoDB's group commit; while all
// are busy, arriving ops queue into the next batch: the busier MySQL is, the
// larger the batches. A slow or hung index never holds a worker (only a
// full index queue would).
//
// Batches that run at the same time never touch the same task: an op whose
// task is in a batch still running waits (with every later op of that task)
// for the next batch, and a batch counts as running until its index jobs
// are queued. So the writes to one task reach MySQL and the index queue in
// the order they were submitted, and within one transaction the ops keep
// their order per task (see segments).

// The kinds of op (mysqlstore.WriteKind).
const (
	kindUpsert = mysqlstore.WriteUpsert // upsert with MySQL-assigned generations
	kindRemove = mysqlstore.WriteRemove // delete a task in any state
	kindAck    = mysqlstore.WriteAck    // delete acked generations
	kindMoved  = mysqlstore.WriteMoved  // write index transitions (nack, reap, requeue)
	kindEvents = mysqlstore.WriteEvents // append task events (no task row)
)

// indexSpec is the index write of row r, which MySQL committed as t.
func indexSpec(r mysqlstore.UpsertRow, t storage.Task) storage.UpsertSpec {
	sp := specOf(t)
	sp.TraceParent = r.TraceParent
	if r.Relative {
		sp.DueTime, sp.Delay = time.Time{}, r.Delay
	}
	return sp
}

// op is one caller's write, waiting in the committer.
type op struct {
	mysqlstore.Write // what to write, and MySQL's results

	// Results, set by the committer before done is closed.
	err  error
	ix   *indexJob // the index side of an upsert or remove, once committed
	done chan struct{}
}

// size returns the rows and payload bytes of o.
func (o *op) size() (rows, bytes int) {
	switch o.Kind {
	case kindUpsert:
		for _, r := range o.Rows {
			bytes += len(r.Payload) + len(r.Kind) + len(r.ID)
		}
		return len(o.Rows), bytes
	case kindAck:
		return len(o.Acks), 0
	case kindMoved:
		for _, m := range o.Moved {
			bytes += len(m.LastError)
		}
		return len(o.Moved), bytes
	case kindEvents:
		return len(o.Events), len(o.Events) * storage.EventWireSize
	default:
		return 1, 0
	}
}

// ids calls fn with every task id o writes.
func (o *op) ids(fn func(id string)) {
	switch o.Kind {
	case kindUpsert:
		for _, r := range o.Rows {
			fn(r.ID)
		}
	case kindRemove:
		fn(o.ID)
	case kindAck:
		for _, a := range o.Acks {
			fn(a.ID)
		}
	case kindMoved:
		for _, m := range o.Moved {
			fn(m.ID)
		}
	}
}

// hasIndexStage reports whether o still has index work after its commit.
func (o *op) hasIndexStage() bool {
	switch o.Kind {
	case kindUpsert:
		for _, r := range o.Upserts {
			if r.Refused == storage.NotRefused {
				return true
			}
		}
	case kindRemove:
		return !o.Mismatch
	}
	return false
}

// finish answers o's caller.
func (o *op) finish(err error) {
	if err != nil {
		o.err = err
	}
	close(o.done)
}

// submit hands o to the committer and waits for its answer (o.err), or
// for ctx. A write whose caller gave up may still be committed.
func (s *Store) submit(ctx context.Context, o *op) error {
	if !s.started {
		return errors.New("durable: store not started")
	}
	o.done = make(chan struct{})
	select {
	case s.in <- o:
	case <-s.quit:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// batch is a set of ops one worker commits together.
type batch struct {
	ops  []*op
	keys []taskKey // every task the ops touch (with repeats)
}

// collect forms batches and hands them to the workers. It returns when
// Stop closed quit and every op it accepted has been answered; then it
// closes work so the workers end.
func (s *Store) collect() {
	defer close(s.work)
	var (
		pending   []*op // accepted, not yet dispatched, in order
		prows     int   // rows in pending
		inflight  = map[taskKey]int{}
		busy      int  // batches dispatched and not done
		ready     bool // pending may go out (linger over, or full)
		lingering bool // timer runs
		quitting  bool
		quit      = s.quit
		timer     = time.NewTimer(time.Hour)
	)
	timer.Stop()
	for {
		for busy < s.cfg.Committers && len(pending) > 0 && (ready || quitting || prows >= s.cfg.MaxBatch) {
			b, rest := s.form(pending, inflight)
			if b == nil {
				break // everything pending waits for a running batch
			}
			pending, prows = rest, 0
			for _, o := range pending {
				r, _ := o.size()
				prows += r
			}
			for _, k := range b.keys {
				inflight[k]++
			}
			busy++
			s.work <- b
		}
		if len(pending) == 0 {
			ready = false
		}
		if quitting && busy == 0 && len(pending) == 0 {
			return
		}
		var in chan *op
		if !quitting && prows < 2*s.cfg.MaxBatch {
			in = s.in
		}
		var lingerC <-chan time.Time
		if lingering {
			lingerC = timer.C
		}
		select {
		case o := <-in:
			if len(pending) == 0 && !ready {
				if s.cfg.Linger > 0 {
					timer.Reset(s.cfg.Linger)
					lingering = true
				} else {
					ready = true
				}
			}
			pending = append(pending, o)
			r, _ := o.size()
			prows += r
		case <-lingerC:
			lingering, ready = false, true
		case b := <-s.doneQ:
			busy--
			for _, k := range b.keys {
				if inflight[k]--; inflight[k] == 0 {
					delete(inflight, k)
				}
			}
		case <-quit:
			quit, quitting = nil, true
		}
	}
}

// form takes from pending, in order, the ops that touch no task of a
// running batch (nor of an earlier op that has to wait), up to the batch
// bounds. It returns nil when every pending op waits.
func (s *Store) form(pending []*op, inflight map[taskKey]int) (*batch, []*op) {
	b := &batch{}
	var rest []*op
	blocked := map[taskKey]bool{}
	rows, bytes := 0, 0
	for _, o := range pending {
		if len(b.ops) > 0 && (rows >= s.cfg.MaxBatch || bytes >= s.cfg.MaxBatchBytes) {
			rest = append(rest, o)
			continue
		}
		wait := false
		o.ids(func(id string) {
			k := taskKey{o.NS, id}
			if inflight[k] > 0 || blocked[k] {
				wait = true
			}
		})
		if wait {
			o.ids(func(id string) { blocked[taskKey{o.NS, id}] = true })
			rest = append(rest, o)
			continue
		}
		b.ops = append(b.ops, o)
		o.ids(func(id string) { b.keys = append(b.keys, taskKey{o.NS, id}) })
		r, by := o.size()
		rows, bytes = rows+r, bytes+by
	}
	if len(b.ops) == 0 {
		return nil, pending
	}
	return b, rest
}

// worker commits batches until collect closes work.
func (s *Store) worker() {
	for b := range s.work {
		s.run(b.ops)
		s.doneQ <- b
	}
}

// run commits ops in one transaction, answers them, and queues the index
// side of the committed upserts and removes. If the transaction fails for
// a reason that is not MySQL's health (a bad row), each op is retried alone
// so one bad op does not fail the others.
func (s *Store) run(ops []*op) {
	err := s.commitOps(ops)
	if err != nil && len(ops) > 1 && !errors.Is(err, storage.ErrUnavailable) {
		s.log.Warn("group commit failed; committing its writes one by one", "ops", len(ops), "err", err)
		for _, o := range ops {
			o.err = s.commitOps([]*op{o})
		}
	} else {
		for _, o := range ops {
			o.err = err
		}
	}
	for _, o := range ops {
		if o.err == nil && o.Ended {
			// MySQL found the namespace incarnation the write was made
			// for ended (see mysqlstore.Write.NSInc): nothing written.
			o.err = fmt.Errorf("upsert: namespace %q incarnation %d: %w", o.NS, o.NSInc, storage.ErrNamespaceEnded)
		}
	}
	var jobs []*indexJob
	now := time.Now()
	for _, o := range ops {
		if o.err == nil && o.hasIndexStage() {
			o.ix = jobOf(o, now)
			jobs = append(jobs, o.ix)
		}
	}
	for _, o := range ops {
		o.finish(nil)
	}
	s.enqueue(jobs)
}

// jobOf is the index side of o, which MySQL committed at now: each upsert
// row with the version MySQL gave it (not the rows whose condition failed:
// nothing was written), or the remove.
func jobOf(o *op, now time.Time) *indexJob {
	j := &indexJob{kind: o.Kind, ns: o.NS, committed: now, id: o.ID, mysqlPrev: o.MySQLState, done: make(chan struct{})}
	if o.Kind == kindUpsert {
		for i, r := range o.Rows {
			if o.Upserts[i].Refused != storage.NotRefused {
				continue
			}
			j.specs = append(j.specs, indexSpec(r, o.Upserts[i].Task))
			j.absolute = append(j.absolute, o.Upserts[i].Task.DueTime)
			j.rows = append(j.rows, i)
		}
	}
	return j
}

// commitOps runs ops in one transaction (see mysqlstore.Store.Commit).
func (s *Store) commitOps(ops []*op) error {
	segs := segments(ops)
	out := make([]mysqlstore.Segment, len(segs))
	writes := func(ops []*op) []*mysqlstore.Write {
		ws := make([]*mysqlstore.Write, len(ops))
		for i, o := range ops {
			ws[i] = &o.Write
		}
		return ws
	}
	for i, sg := range segs {
		out[i] = mysqlstore.Segment{Upserts: writes(sg.upserts), Removes: writes(sg.removes), Acks: writes(sg.acks), Moved: writes(sg.moved),
			Events: writes(sg.events)}
	}
	return s.db.Commit(out)
}

// segment is a run of ops that touch disjoint tasks per kind: within a
// segment no task is written by two kinds, so the kinds' statements may run
// in any order. Ops of one kind may repeat a task; their statements keep
// the ops' order.
type segment struct {
	upserts, removes, acks, moved, events []*op
}

// segments splits ops, in order, into segments: an op that touches a task
// an op of another kind touched in the current segment starts a new one.
func segments(ops []*op) []segment {
	var out []segment
	var cur segment
	owner := map[taskKey]mysqlstore.WriteKind{}
	for _, o := range ops {
		conflict := false
		o.ids(func(id string) {
			if k, ok := owner[taskKey{o.NS, id}]; ok && k != o.Kind {
				conflict = true
			}
		})
		if conflict {
			out = append(out, cur)
			cur = segment{}
			clear(owner)
		}
		o.ids(func(id string) { owner[taskKey{o.NS, id}] = o.Kind })
		switch o.Kind {
		case kindUpsert:
			cur.upserts = append(cur.upserts, o)
		case kindRemove:
			cur.removes = append(cur.removes, o)
		case kindAck:
			cur.acks = append(cur.acks, o)
		case kindMoved:
			cur.moved = append(cur.moved, o)
		case kindEvents:
			cur.events = append(cur.events, o) // no task row: never a conflict
		}
	}
	return append(out, cur)
}

// specOf is the index write of a task MySQL committed: exactly its
// version.
func specOf(t storage.Task) storage.UpsertSpec {
	return storage.UpsertSpec{ID: t.ID, Kind: t.Kind, Payload: t.Payload, DueTime: t.DueTime,
		Generation: t.Generation, Incarnation: t.Incarnation}
}

// indexWrite writes specs (committed in MySQL) to the index and completes
// their results from its answers. On failure it logs, leaves the results
// as MySQL committed them (Earliest false) and queues the tasks for
// repair: the upserts are durable.
func (s *Store) indexWrite(ctx context.Context, ns string, specs []storage.UpsertSpec, results []*storage.UpsertResult) {
	res, err := s.idx.Upsert(ctx, ns, specs)
	if err == nil && len(res) != len(specs) {
		err = fmt.Errorf("index answered %d results for %d specs", len(res), len(specs))
	}
	if err != nil {
		s.warn("index-write", "index write failed after the mysql commit; the tasks are durable and will be re-indexed",
			"namespace", ns, "tasks", len(specs), "err", err)
		ids := make([]string, len(specs))
		for i, sp := range specs {
			ids[i] = sp.ID
		}
		s.requestRepair(ns, ids)
		return
	}
	var stale []string
	for i, r := range results {
		if res[i].Stale {
			// The index holds a version MySQL did not just commit as the
			// newest: a concurrent newer write (harmless), or a version
			// MySQL never had or no longer has (a restored snapshot, a
			// promoted lagging replica). Either way the task is repaired
			// from MySQL, which wins, so it is never left hidden.
			stale = append(stale, specs[i].ID)
			continue
		}
		r.Earliest = res[i].Earliest
		if !res[i].Task.DueTime.IsZero() {
			r.Task.DueTime = res[i].Task.DueTime
		}
		if !res[i].Task.CreateTime.IsZero() {
			r.Task.CreateTime = res[i].Task.CreateTime
		}
		if !res[i].Task.UpdateTime.IsZero() {
			r.Task.UpdateTime = res[i].Task.UpdateTime
		}
	}
	if len(stale) > 0 {
		s.log.Info("the index held a newer version than mysql just committed; repairing from mysql", "namespace", ns, "tasks", len(stale))
		s.requestRepair(ns, stale)
	}
}
