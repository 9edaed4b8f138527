package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// Task events (delayd_task_events, migration 0005): appended by group
// commits (WriteEvents), read by TaskEvents, trimmed by PruneEvents.

// eventRowsPerStatement bounds one multi-row INSERT of events.
const eventRowsPerStatement = 500

// maxReasonBytes is the reason column's width.
const maxReasonBytes = 1024

// execEvents appends the events of ws in order, in multi-row INSERTs.
func (s *Store) execEvents(ctx context.Context, tx *sql.Tx, ws []*authority.Write) error {
	var rows []any
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		q := "INSERT INTO delayd_task_events (namespace, incarnation, id, event_ms, kind, key_id, generation, due_ms, attempt, replica, lateness_ms, reason, retry_after_ms, schedule_id, slot_ms) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?),", n), ",")
		if _, err := tx.ExecContext(ctx, q, rows...); err != nil {
			return fmt.Errorf("record events: %w", err)
		}
		rows, n = rows[:0], 0
		return nil
	}
	for _, w := range ws {
		for _, e := range w.Events {
			var due int64
			if !e.Due.IsZero() {
				due = storage.DueMilli(e.Due)
			}
			reason := e.Reason
			if len(reason) > maxReasonBytes {
				reason = strings.ToValidUTF8(reason[:maxReasonBytes], "")
			}
			rows = append(rows, w.NS, w.NSInc, e.ID, e.Time.UnixMilli(), uint8(e.Kind), e.KeyID, e.Generation, due, e.Attempt,
				e.Replica, e.Lateness.Milliseconds(), reason, e.RetryAfter.Milliseconds(), e.Schedule, storage.UnixMS(e.Slot))
			if n++; n == eventRowsPerStatement {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// TaskEvents reads up to limit events of task id of incarnation
// p.Incarnation of ns after seq cursor (a decimal seq; "" = from the
// first), in order, cut by maxBytes of storage.EventSize (0 = no cut; the
// first event always goes), and the cursor of the next page ("" = none
// left). An incarnation that has ended (delayd_namespace_born holds it or
// a later one; a later one is registered) has none: the events of a
// deleted namespace are never read by its successor, not even through a
// replica's stale view of the old one.
func (s *Store) TaskEvents(ctx context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error) {
	var after int64
	if p.Cursor != "" {
		n, err := strconv.ParseInt(p.Cursor, 10, 64)
		if err != nil || n < 0 {
			return nil, "", storage.ErrInvalidCursor
		}
		after = n
	}
	limit := min(max(p.Limit, 1), 1000)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, "SELECT seq, event_ms, kind, key_id, generation, due_ms, attempt, replica, lateness_ms, reason, retry_after_ms, schedule_id, slot_ms"+
		" FROM delayd_task_events WHERE namespace = ? AND id = ? AND seq > ? AND incarnation = ?"+
		" AND NOT EXISTS (SELECT 1 FROM delayd_namespace_born b WHERE b.name = ? AND b.create_ms >= ?)"+
		" AND NOT EXISTS (SELECT 1 FROM delayd_namespaces n WHERE n.name = ? AND n.create_ms > ?)"+
		" ORDER BY seq LIMIT ?", ns, p.ID, after, p.Incarnation, ns, p.Incarnation, ns, p.Incarnation, limit+1)
	if err != nil {
		return nil, "", classify("task history", err)
	}
	defer rows.Close()
	var out []storage.Event
	size, last := 0, after
	for rows.Next() {
		var seq, at, gen, due, late, retry, slot int64
		var kind uint8
		var attempt int32
		e := storage.Event{ID: p.ID}
		if err := rows.Scan(&seq, &at, &kind, &e.KeyID, &gen, &due, &attempt, &e.Replica, &late, &e.Reason, &retry, &e.Schedule, &slot); err != nil {
			return nil, "", classify("task history", err)
		}
		e.Kind, e.Time, e.Generation, e.Attempt = storage.EventKind(kind), time.UnixMilli(at), gen, attempt
		e.Lateness, e.RetryAfter = time.Duration(late)*time.Millisecond, time.Duration(retry)*time.Millisecond
		if due != 0 {
			e.Due = time.UnixMilli(due)
		}
		if slot != 0 {
			e.Slot = time.UnixMilli(slot)
		}
		size += storage.EventSize(e)
		if len(out) == limit || (len(out) > 0 && p.MaxBytes > 0 && size > p.MaxBytes) {
			return out, strconv.FormatInt(last, 10), nil // more remain
		}
		out = append(out, e)
		last = seq
	}
	if err := rows.Err(); err != nil {
		return nil, "", classify("task history", err)
	}
	return out, "", nil
}

// PruneEvents deletes ns's events but the newest keep (keep 0: all of
// them), in bounded deletes, and returns how many it deleted.
func (s *Store) PruneEvents(ctx context.Context, ns string, keep int64) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	cut := int64(1<<63 - 1)
	if keep > 0 {
		err := s.db.QueryRowContext(cctx, "SELECT seq FROM delayd_task_events WHERE namespace = ? ORDER BY seq DESC LIMIT 1 OFFSET ?", ns, keep).Scan(&cut)
		if err == sql.ErrNoRows {
			return 0, nil // not more than keep
		}
		if err != nil {
			return 0, classify("prune events", err)
		}
		cut++ // delete seq < cut: the row found and everything older
	}
	var deleted int64
	for range 1000 {
		res, err := s.db.ExecContext(cctx, "DELETE FROM delayd_task_events WHERE namespace = ? AND seq < ? ORDER BY seq LIMIT 10000", ns, cut)
		if err != nil {
			return deleted, classify("prune events", err)
		}
		n, _ := res.RowsAffected()
		deleted += n
		if n < 10000 {
			break
		}
	}
	return deleted, nil
}
