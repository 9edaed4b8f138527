package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/delayd/delayd/storage/authority"
)

// This file runs group commits: the durable store gathers writes into
// segments and Commit runs them as multi-row statements in one transaction.

// taskKey names a task across namespaces.
type taskKey struct{ ns, id string }

// maxTxAttempts bounds how often Commit runs one transaction.
const maxTxAttempts = 8

// Commit runs segs, in order, in one transaction, and sets the writes'
// results. It runs the transaction again (up to maxTxAttempts times, after
// a short random pause, within OpTimeout) when MySQL rolled it back for a
// reason a retry can fix: a deadlock (InnoDB's duplicate-key checks take
// gap locks even in READ COMMITTED, so batches inserting neighbouring ids
// can deadlock), a lock wait timeout, a connection that was killed or reset
// before COMMIT was sent. A failure of COMMIT itself is not retried: its
// outcome is unknown (for an upsert the reconciler then indexes whatever
// MySQL kept).
func (s *Store) Commit(segs []authority.Segment) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	var err error
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		if attempt > 0 {
			s.log.Debug("mysql transaction rolled back; retrying", "attempt", attempt, "err", err)
			select {
			case <-time.After(retryPause(attempt)):
			case <-ctx.Done():
				return classify("mysql write", err)
			}
		}
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			live, err := s.checkIncarnations(ctx, tx, segs)
			if err != nil {
				return err
			}
			for _, sg := range live {
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

// checkIncarnations reads, with a shared lock held to the commit, the
// registry row of each namespace whose upserts or events in segs name an
// incarnation (one statement for the batch, by primary key) and marks
// Ended the upserts whose incarnation is not the namespace's live one: the
// name is gone, re-created (another create time), or its tasks are being
// dropped (DropTasks recorded the incarnation in delayd_namespace_born
// under the row's exclusive lock). Events are dropped when their
// incarnation has ended (nsIncarnations.ended): a call that changed a task
// just before a forced delete records its events after the drop deleted
// the namespace's history, and they must not become history a namespace
// re-created under the name could read. It returns segs without those
// writes, so one namespace's stale write fails only itself. The lock
// orders the commit and a concurrent DropTasks: a commit that read the row
// first is done before the drop starts deleting (and the drop takes its
// rows); one that reads it after sees the incarnation ended.
func (s *Store) checkIncarnations(ctx context.Context, tx *sql.Tx, segs []authority.Segment) ([]authority.Segment, error) {
	want := map[string]bool{}
	var names []string
	add := func(ws []*authority.Write) {
		for _, w := range ws {
			if w.NSInc != 0 && !want[w.NS] {
				want[w.NS] = true
				names = append(names, w.NS)
			}
		}
	}
	events := false
	for _, sg := range segs {
		for _, w := range sg.Upserts {
			w.Ended = false
		}
		add(sg.Upserts)
		add(sg.Events)
		events = events || len(sg.Events) > 0
	}
	if len(names) == 0 {
		return segs, nil
	}
	incs, err := readIncarnations(ctx, tx, names, events)
	if err != nil {
		return nil, err
	}
	out := make([]authority.Segment, len(segs))
	for i, sg := range segs {
		out[i] = sg
		out[i].Upserts, out[i].Events = nil, nil
		for _, w := range sg.Upserts {
			if w.NSInc != 0 && incs.live(w.NS) != w.NSInc {
				w.Ended, w.Upserts = true, nil
				continue
			}
			out[i].Upserts = append(out[i].Upserts, w)
		}
		for _, w := range sg.Events {
			if w.NSInc == 0 || !incs.ended(w.NS, w.NSInc) {
				out[i].Events = append(out[i].Events, w)
			}
		}
	}
	return out, nil
}

// nsIncarnations is what checkIncarnations read of some namespaces.
type nsIncarnations struct {
	create map[string]int64 // registry row's create_ms (the live incarnation, unless ended)
	born   map[string]int64 // delayd_namespace_born: the latest incarnation DropTasks ended
}

// live is ns's live incarnation; 0 when it has none (no registry row, or
// its incarnation was ended).
func (n nsIncarnations) live(ns string) int64 {
	if c, ok := n.create[ns]; ok && n.born[ns] < c {
		return c
	}
	return 0
}

// ended reports whether incarnation inc of ns has ended: DropTasks ended
// it (or a later one), or a later incarnation is registered.
func (n nsIncarnations) ended(ns string, inc int64) bool {
	return inc <= n.born[ns] || inc < n.create[ns]
}

// readIncarnations reads the registry rows of names with a shared lock
// (see checkIncarnations), and with ended, the ended incarnations of the
// names that have no registry row (deleted and not re-created: events of
// theirs come late).
func readIncarnations(ctx context.Context, tx *sql.Tx, names []string, ended bool) (nsIncarnations, error) {
	slices.Sort(names)
	out := nsIncarnations{create: map[string]int64{}, born: map[string]int64{}}
	var missing []string
	for start := 0; start < len(names); start += 1000 {
		chunk := names[start:min(start+1000, len(names))]
		err := queryPairs(ctx, tx, "SELECT n.name, n.create_ms, COALESCE(b.create_ms, 0) FROM delayd_namespaces n"+
			" LEFT JOIN delayd_namespace_born b ON b.name = n.name WHERE n.name IN ("+placeholders(len(chunk))+") LOCK IN SHARE MODE",
			chunk, func(name string, create, born int64) {
				out.create[name], out.born[name] = create, born
			})
		if err != nil {
			return nsIncarnations{}, fmt.Errorf("upsert: read namespace incarnations: %w", err)
		}
		for _, n := range chunk {
			if _, ok := out.create[n]; !ok {
				missing = append(missing, n)
			}
		}
	}
	if !ended {
		return out, nil
	}
	for start := 0; start < len(missing); start += 1000 {
		chunk := missing[start:min(start+1000, len(missing))]
		err := queryPairs(ctx, tx, "SELECT name, create_ms, 0 FROM delayd_namespace_born WHERE name IN ("+placeholders(len(chunk))+")",
			chunk, func(name string, born, _ int64) { out.born[name] = born })
		if err != nil {
			return nsIncarnations{}, fmt.Errorf("record events: read ended namespace incarnations: %w", err)
		}
	}
	return out, nil
}

// queryPairs runs q with names as its arguments and hands each row (a
// name and two numbers) to row.
func queryPairs(ctx context.Context, tx *sql.Tx, q string, names []string, row func(name string, a, b int64)) error {
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var a, b int64
		if err := rows.Scan(&name, &a, &b); err != nil {
			return err
		}
		row(name, a, b)
	}
	return rows.Err()
}

// retryPause is the pause before running a transaction again: a few
// milliseconds growing with the attempt, randomized so the transactions
// that deadlocked do not meet again.
func retryPause(attempt int) time.Duration {
	d := time.Duration(attempt) * 5 * time.Millisecond
	return d/2 + time.Duration(rand.Int64N(int64(d)))
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

// execSegment runs one segment's statements.
func (s *Store) execSegment(ctx context.Context, tx *sql.Tx, sg authority.Segment) error {
	if err := s.execUpserts(ctx, tx, sg.Upserts); err != nil {
		return err
	}
	if err := s.execMoved(ctx, tx, sg.Moved); err != nil {
		return err
	}
	if err := s.execAcks(ctx, tx, sg.Acks); err != nil {
		return err
	}
	if err := s.execRemoves(ctx, tx, sg.Removes); err != nil {
		return err
	}
	return s.execEvents(ctx, tx, sg.Events)
}
