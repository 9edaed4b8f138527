package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// The authority's maintenance: purging dead tasks, deleting versions the
// reconciler found gone, repairing rows under their locks, pruning task
// history and dropping a namespace's tasks.

// Purge deletes the named tasks that are dead in MySQL and returns their
// ids.
func (s *Store) Purge(ctx context.Context, ns string, ids []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	var deleted []string
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		deleted = deleted[:0]
		for start := 0; start < len(ids); start += 1000 {
			chunk := ids[start:min(start+1000, len(ids))]
			args := []any{ns, dbDead}
			for _, id := range chunk {
				args = append(args, id)
			}
			where := " WHERE namespace = ? AND state = ? AND id IN (" + placeholders(len(chunk)) + ")"
			rows, err := tx.QueryContext(ctx, "SELECT id FROM delayd_tasks"+where+" FOR UPDATE", args...)
			if err != nil {
				return err
			}
			n := len(deleted)
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return err
				}
				deleted = append(deleted, id)
			}
			if err := rows.Close(); err != nil {
				return err
			}
			if len(deleted) > n {
				if _, err := tx.ExecContext(ctx, "DELETE FROM delayd_tasks"+where, args...); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, classify("purge", err)
	}
	return deleted, nil
}

// DeleteVersions deletes exactly the named versions of tasks of ns (in any
// state); a row at another version is left alone.
func (s *Store) DeleteVersions(ctx context.Context, ns string, vs []storage.Version) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	for start := 0; start < len(vs); start += maxStmtRows {
		chunk := vs[start:min(start+maxStmtRows, len(vs))]
		var b strings.Builder
		args := []any{ns}
		b.WriteString("DELETE FROM delayd_tasks WHERE namespace = ? AND (")
		for i, v := range chunk {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString("(id = ? AND incarnation = ? AND generation = ?)")
			args = append(args, v.ID, v.Incarnation, v.Generation)
		}
		b.WriteString(")")
		if _, err := s.db.ExecContext(ctx, b.String(), args...); err != nil {
			return classify("purge", err)
		}
	}
	return nil
}

// Repair runs one repair of the named tasks of ns in a transaction that
// holds their rows' locks throughout: it reads the rows (FOR UPDATE, in
// primary-key order), calls decide with them (decide makes the index agree
// and returns the versions it found acked there), deletes those acked
// versions (copying them to the history table when HistoryRetention is
// set), and commits. While decide runs, no write of those tasks (an
// upsert, an ack's delete, a remove) can commit, so what it writes to the
// index is what MySQL holds until after the commit.
func (s *Store) Repair(ctx context.Context, ns string, ids []string, decide func(ctx context.Context, held []storage.Task) ([]authority.AckRow, error)) error {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var held []storage.Task
		for start := 0; start < len(ids); start += 1000 {
			chunk := ids[start:min(start+1000, len(ids))]
			args := []any{ns}
			for _, id := range chunk {
				args = append(args, id)
			}
			q := "SELECT " + taskColumns + " FROM delayd_tasks WHERE namespace = ? AND id IN (" + placeholders(len(chunk)) + ") ORDER BY id FOR UPDATE"
			if err := queryTasks(ctx, tx, q, args, func(t storage.Task) { held = append(held, t) }); err != nil {
				return fmt.Errorf("repair: read: %w", err)
			}
		}
		acked, err := decide(ctx, held)
		if err != nil || len(acked) == 0 {
			return err
		}
		return s.execAcks(ctx, tx, []*authority.Write{{Kind: authority.WriteAck, NS: ns, NowMS: time.Now().UnixMilli(), Acks: acked}})
	})
	if err != nil {
		return classify("repair", err)
	}
	return nil
}

// PruneHistory deletes up to limit history rows acked before cutoff and
// returns how many it deleted.
func (s *Store) PruneHistory(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM delayd_task_history WHERE acked_ms < ? ORDER BY acked_ms LIMIT ?", cutoff.UnixMilli(), limit)
	if err != nil {
		return 0, classify("prune history", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// endIncarnation records incarnation inc of ns as ended in
// delayd_namespace_born (kept if a later one is recorded), under the
// exclusive lock of the namespace's registry row: a group commit that read
// the row (checkIncarnations) before has committed, and every later one
// refuses the incarnation's upserts. An incarnation older than the live
// one ends nothing live (the row's create time stays above it).
func (s *Store) endIncarnation(ctx context.Context, ns string, inc int64) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var create int64
		err := tx.QueryRowContext(ctx, "SELECT create_ms FROM delayd_namespaces WHERE name = ? FOR UPDATE", ns).Scan(&create)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO delayd_namespace_born (name, create_ms) VALUES (?, ?)"+
			" ON DUPLICATE KEY UPDATE create_ms = GREATEST(create_ms, VALUES(create_ms))", ns, inc)
		return err
	})
}

// DropTasks deletes every task of ns, in batches of 10,000 rows, and
// returns how many there were. With an incarnation (the namespace's create
// time, ms; 0 = none) it first ends it (endIncarnation), so no group
// commit writes a task of it after the rows are gone.
func (s *Store) DropTasks(ctx context.Context, ns string, incarnation int64) (int64, error) {
	if incarnation != 0 {
		if err := s.endIncarnation(ctx, ns, incarnation); err != nil {
			return 0, classify("drop namespace", err)
		}
	}
	var deleted int64
	for attempt := 0; ; {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		res, err := s.db.ExecContext(cctx, "DELETE FROM delayd_tasks WHERE namespace = ? LIMIT 10000", ns)
		cancel()
		if err != nil && retryable(err) && attempt < maxTxAttempts-1 {
			attempt++
			time.Sleep(retryPause(attempt)) // deadlocked with concurrent writes: again
			continue
		}
		if err != nil {
			return deleted, classify("drop namespace", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return deleted, classify("drop namespace", err)
		}
		deleted += n
		if n < 10000 {
			return deleted, nil
		}
	}
}
