package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
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

// The kinds of op (authority.WriteKind).
const (
	kindUpsert = authority.WriteUpsert // upsert with MySQL-assigned generations
	kindRemove = authority.WriteRemove // delete a task in any state
	kindAck    = authority.WriteAck    // delete acked generations
	kindMoved  = authority.WriteMoved  // write index transitions (nack, reap, requeue)
	kindEvents = authority.WriteEvents // append task events (no task row)
)

// committer is the group committer: its collector and workers, and the
// index writers it hands committed writes to. Start it, submit ops, Stop it
// once.
type committer struct {
	db interface {
		Commit(segs []authority.Segment) error
	}
	writers *indexWriters // where committed upserts and removes go
	log     *slog.Logger

	committers    int           // Config.Committers
	maxBatch      int           // Config.MaxBatch
	maxBatchBytes int           // Config.MaxBatchBytes
	linger        time.Duration // Config.Linger

	in      chan *op      // submitted ops, to the collector
	work    chan *batch   // formed batches, to the workers
	doneQ   chan *batch   // committed batches, back to the collector
	quit    chan struct{} // closed by Stop: refuse new ops
	started atomic.Bool
	wg      sync.WaitGroup // the collector and the workers

	startOnce, stopOnce sync.Once
}

func newCommitter(db interface {
	Commit([]authority.Segment) error
}, writers *indexWriters, cfg Config) *committer {
	return &committer{db: db, writers: writers, log: cfg.Logger,
		committers: cfg.Committers, maxBatch: cfg.MaxBatch, maxBatchBytes: cfg.MaxBatchBytes, linger: cfg.Linger,
		in: make(chan *op), work: make(chan *batch), doneQ: make(chan *batch), quit: make(chan struct{})}
}

// Start starts the collector and the workers.
func (c *committer) Start(context.Context) error {
	c.startOnce.Do(func() {
		c.started.Store(true)
		c.wg.Add(1 + c.committers)
		go func() { defer c.wg.Done(); c.collect() }()
		for range c.committers {
			go func() { defer c.wg.Done(); c.worker() }()
		}
	})
	return nil
}

// Stop refuses new ops (errStopped), commits every op already accepted and
// waits for the collector and the workers, or for ctx.
func (c *committer) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() { close(c.quit) })
	return waitCtx(ctx, c.wg.Wait)
}

// indexSpec is the index write of row r, which MySQL committed as t.
func indexSpec(r authority.UpsertRow, t storage.Task) storage.UpsertSpec {
	sp := specOf(t)
	sp.TraceParent = r.TraceParent
	if r.Relative {
		sp.DueTime, sp.Delay = time.Time{}, r.Delay
	}
	return sp
}

// op is one caller's write, waiting in the committer.
type op struct {
	authority.Write // what to write, and MySQL's results

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
func (s *committer) submit(ctx context.Context, o *op) error {
	if !s.started.Load() {
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
func (s *committer) collect() {
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
		for busy < s.committers && len(pending) > 0 && (ready || quitting || prows >= s.maxBatch) {
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
		if !quitting && prows < 2*s.maxBatch {
			in = s.in
		}
		var lingerC <-chan time.Time
		if lingering {
			lingerC = timer.C
		}
		select {
		case o := <-in:
			if len(pending) == 0 && !ready {
				if s.linger > 0 {
					timer.Reset(s.linger)
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
func (s *committer) form(pending []*op, inflight map[taskKey]int) (*batch, []*op) {
	b := &batch{}
	var rest []*op
	blocked := map[taskKey]bool{}
	rows, bytes := 0, 0
	for _, o := range pending {
		if len(b.ops) > 0 && (rows >= s.maxBatch || bytes >= s.maxBatchBytes) {
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
func (s *committer) worker() {
	for b := range s.work {
		s.runOnce(b.ops)
		s.doneQ <- b
	}
}

// runOnce commits ops (one batch) in one transaction, answers them, and queues the index
// side of the committed upserts and removes. If the transaction fails for
// a reason that is not MySQL's health (a bad row), each op is retried alone
// so one bad op does not fail the others.
func (s *committer) runOnce(ops []*op) {
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
			// for ended (see authority.Write.NSInc): nothing written.
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
	s.writers.enqueue(jobs)
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

// commitOps runs ops in one transaction (see authority.Authority.Commit).
func (s *committer) commitOps(ops []*op) error {
	segs := segments(ops)
	out := make([]authority.Segment, len(segs))
	writes := func(ops []*op) []*authority.Write {
		ws := make([]*authority.Write, len(ops))
		for i, o := range ops {
			ws[i] = &o.Write
		}
		return ws
	}
	for i, sg := range segs {
		out[i] = authority.Segment{Upserts: writes(sg.upserts), Removes: writes(sg.removes), Acks: writes(sg.acks), Moved: writes(sg.moved),
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
	owner := map[taskKey]authority.WriteKind{}
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
