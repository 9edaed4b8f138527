package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
)

// The committer is a two-stage pipeline that group-commits writes:
//
//	callers ──op──▶ collect (stage 1: MySQL) ──batch──▶ indexLoop (stage 2: index) ──▶ done
//
// Stage 1 is one goroutine: it gathers the ops that are waiting (up to
// MaxBatch rows / MaxBatchBytes, lingering Linger for more when the queue
// runs dry), runs them as multi-row statements in ONE transaction, and
// passes the committed batch on. Stage 2 is one goroutine: it applies the
// index side of upserts and removes in commit order, then answers the
// callers. While stage 2 indexes batch n, stage 1 already commits batch
// n+1, and callers arriving meanwhile queue for batch n+2: the busier
// MySQL is, the larger the batches.
//
// Because both stages are serial, writes to one task reach MySQL and the
// index in the same order. Within one transaction the ops keep their order
// for each task (see segments).

// opKind is what an op does.
type opKind uint8

const (
	kindUpsert opKind = iota + 1 // upsert with MySQL-assigned generations
	kindRemove                   // delete a task in any state
	kindAck                      // delete acked generations
	kindMoved                    // write index transitions (nack, reap, requeue)
)

// upsertRow is one resolved upsert spec.
type upsertRow struct {
	id      string
	kind    string
	payload []byte
	dueMS   int64
	gen     int64 // explicit generation; 0 = assigned by MySQL
}

// ackRow is one acked delivery.
type ackRow struct {
	id      string
	gen     int64
	attempt int32
}

// op is one caller's write, waiting in the committer.
type op struct {
	kind  opKind
	ns    string
	nowMS int64

	rows  []upsertRow     // kindUpsert
	id    string          // kindRemove
	acks  []ackRow        // kindAck
	moved []storage.Moved // kindMoved

	// Results, set by the committer before done is closed.
	upserts []storage.UpsertResult // kindUpsert
	prev    storage.State          // kindRemove
	mysqlSt storage.State          // kindRemove: state MySQL held; 0 = no row
	err     error
	done    chan struct{}
}

// size returns the rows and payload bytes of o.
func (o *op) size() (rows, bytes int) {
	switch o.kind {
	case kindUpsert:
		for _, r := range o.rows {
			bytes += len(r.payload) + len(r.kind) + len(r.id)
		}
		return len(o.rows), bytes
	case kindAck:
		return len(o.acks), 0
	case kindMoved:
		for _, m := range o.moved {
			bytes += len(m.LastError)
		}
		return len(o.moved), bytes
	default:
		return 1, 0
	}
}

// ids calls fn with every task id o writes.
func (o *op) ids(fn func(id string)) {
	switch o.kind {
	case kindUpsert:
		for _, r := range o.rows {
			fn(r.id)
		}
	case kindRemove:
		fn(o.id)
	case kindAck:
		for _, a := range o.acks {
			fn(a.id)
		}
	case kindMoved:
		for _, m := range o.moved {
			fn(m.ID)
		}
	}
}

// hasIndexStage reports whether o still has index work after its commit.
func (o *op) hasIndexStage() bool { return o.kind == kindUpsert || o.kind == kindRemove }

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
		return errors.New("mysqlstore: store not started")
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

// collect is stage 1. It returns when Stop closes quit, after committing
// what it holds; then it closes indexQ so stage 2 drains and ends.
func (s *Store) collect() {
	defer close(s.indexQ)
	var timer *time.Timer
	for {
		var first *op
		select {
		case first = <-s.in:
		case <-s.quit:
			return
		}
		batch := []*op{first}
		rows, bytes := first.size()
		var lingerC <-chan time.Time
		if s.cfg.Linger > 0 {
			if timer == nil {
				timer = time.NewTimer(s.cfg.Linger)
			} else {
				timer.Reset(s.cfg.Linger)
			}
			lingerC = timer.C
		}
	gather:
		for rows < s.cfg.MaxBatch && bytes < s.cfg.MaxBatchBytes {
			var o *op
			select {
			case o = <-s.in:
			default:
				if lingerC == nil {
					break gather
				}
				select {
				case o = <-s.in:
				case <-lingerC:
					lingerC = nil
					break gather
				case <-s.quit:
					break gather
				}
			}
			batch = append(batch, o)
			r, b := o.size()
			rows, bytes = rows+r, bytes+b
		}
		if lingerC != nil && !timer.Stop() {
			<-timer.C
		}
		s.commit(batch)
	}
}

// commit runs batch in one transaction and passes it to stage 2. If the
// transaction fails for a reason that is not MySQL's health (a bad row),
// each op is retried alone so one bad op does not fail the others.
func (s *Store) commit(batch []*op) {
	err := s.commitOps(batch)
	if err != nil && len(batch) > 1 && !unavailable(err) {
		s.log.Warn("group commit failed; committing its writes one by one", "ops", len(batch), "err", err)
		for _, o := range batch {
			o.err = s.commitOps([]*op{o})
		}
	} else {
		for _, o := range batch {
			o.err = err
		}
	}
	var next []*op
	for _, o := range batch {
		switch {
		case o.err != nil:
			o.finish(nil)
		case o.hasIndexStage():
			next = append(next, o)
		default:
			o.finish(nil)
		}
	}
	if len(next) > 0 {
		s.indexQ <- next
	}
}

// commitOps runs ops in one transaction, retrying it (at most twice) when
// MySQL rolled it back for a reason a retry can fix: a deadlock, a lock
// wait timeout, a connection that was killed or reset before COMMIT was
// sent. A failure of COMMIT itself is not retried: its outcome is unknown
// (for an upsert the reconciler then indexes whatever MySQL kept).
func (s *Store) commitOps(ops []*op) error {
	ctx, cancel := s.opCtx()
	defer cancel()
	segs := segments(ops)
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			s.warn("retry", "mysql transaction rolled back; retrying", "attempt", attempt, "err", err)
			select {
			case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
			case <-ctx.Done():
				return classify("mysql write", err)
			}
		}
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			for _, sg := range segs {
				if err := s.execSegment(ctx, tx, sg); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			return nil
		}
		var ce *commitError
		if errors.As(err, &ce) || !retryable(err) {
			break
		}
	}
	return classify("mysql write", err)
}

// commitError marks a failed COMMIT: the transaction may or may not have
// been applied.
type commitError struct{ err error }

func (e *commitError) Error() string { return "commit: " + e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// inTx runs fn in a transaction and commits it. Connections are READ
// COMMITTED (see readCommittedConnector).
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return &commitError{err}
	}
	return nil
}

// segment is a run of ops that touch disjoint tasks per kind: within a
// segment no task is written by two kinds, so the kinds' statements may run
// in any order. Ops of one kind may repeat a task; their statements keep
// the ops' order.
type segment struct {
	upserts, removes, acks, moved []*op
}

// segments splits ops, in order, into segments: an op that touches a task
// an op of another kind touched in the current segment starts a new one.
func segments(ops []*op) []segment {
	var out []segment
	var cur segment
	owner := map[taskKey]opKind{}
	for _, o := range ops {
		conflict := false
		o.ids(func(id string) {
			if k, ok := owner[taskKey{o.ns, id}]; ok && k != o.kind {
				conflict = true
			}
		})
		if conflict {
			out = append(out, cur)
			cur = segment{}
			clear(owner)
		}
		o.ids(func(id string) { owner[taskKey{o.ns, id}] = o.kind })
		switch o.kind {
		case kindUpsert:
			cur.upserts = append(cur.upserts, o)
		case kindRemove:
			cur.removes = append(cur.removes, o)
		case kindAck:
			cur.acks = append(cur.acks, o)
		case kindMoved:
			cur.moved = append(cur.moved, o)
		}
	}
	return append(out, cur)
}

// execSegment runs one segment's statements.
func (s *Store) execSegment(ctx context.Context, tx *sql.Tx, sg segment) error {
	if err := s.execUpserts(ctx, tx, sg.upserts); err != nil {
		return err
	}
	if err := s.execMoved(ctx, tx, sg.moved); err != nil {
		return err
	}
	if err := s.execAcks(ctx, tx, sg.acks); err != nil {
		return err
	}
	return s.execRemoves(ctx, tx, sg.removes)
}

// indexLoop is stage 2: it applies committed upserts and removes to the
// index in commit order and answers their callers. It ends when stage 1
// closes indexQ.
func (s *Store) indexLoop() {
	for batch := range s.indexQ {
		s.applyIndex(batch)
	}
}

// applyIndex writes one committed batch to the index. Upserts of one
// namespace go in one index call (the last write of each task, with its
// MySQL generation); removes go one by one. Segments keep per-task order.
func (s *Store) applyIndex(batch []*op) {
	ctx, cancel := s.opCtx()
	defer cancel()
	for _, sg := range segments(batch) {
		s.indexUpserts(ctx, sg.upserts)
		for _, o := range sg.removes {
			s.indexRemove(ctx, o)
		}
	}
	for _, o := range batch {
		o.finish(nil)
	}
}

// indexUpserts writes committed upserts to the index: per namespace one
// call with every row in commit order, each with its MySQL generation (a
// task written twice in the batch goes twice, in order, so per-spec answers
// such as Earliest are the index's own). The index's create and update
// times are copied into the results, so a Get answers the same task.
func (s *Store) indexUpserts(ctx context.Context, ops []*op) {
	byNS := map[string][]*op{}
	var order []string
	for _, o := range ops {
		if _, ok := byNS[o.ns]; !ok {
			order = append(order, o.ns)
		}
		byNS[o.ns] = append(byNS[o.ns], o)
	}
	for _, ns := range order {
		var results []*storage.UpsertResult
		var specs []storage.UpsertSpec
		for _, o := range byNS[ns] {
			for i := range o.upserts {
				results = append(results, &o.upserts[i])
				specs = append(specs, specOf(o.upserts[i].Task))
			}
		}
		s.indexWrite(ctx, ns, specs, results)
	}
}

// specOf is the index write of a task MySQL committed.
func specOf(t storage.Task) storage.UpsertSpec {
	return storage.UpsertSpec{ID: t.ID, Kind: t.Kind, Payload: t.Payload, DueTime: t.DueTime, Generation: t.Generation}
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
	for i, r := range results {
		if res[i].Stale {
			continue // a newer generation is already indexed
		}
		r.Earliest = res[i].Earliest
		if !res[i].Task.CreateTime.IsZero() {
			r.Task.CreateTime = res[i].Task.CreateTime
		}
		if !res[i].Task.UpdateTime.IsZero() {
			r.Task.UpdateTime = res[i].Task.UpdateTime
		}
	}
}

// indexRemove removes one task from the index after its MySQL delete.
func (s *Store) indexRemove(ctx context.Context, o *op) {
	st, err := s.idx.Remove(ctx, o.ns, o.id)
	switch {
	case err == nil:
		o.prev = st
	case errors.Is(err, storage.ErrNotFound):
		if o.mysqlSt == storage.StateUnspecified {
			o.err = fmt.Errorf("remove: %w", storage.ErrNotFound)
		} else {
			o.prev = o.mysqlSt
		}
	default:
		o.err = fmt.Errorf("remove: index (the task is already deleted from mysql; retry): %w", err)
	}
}
