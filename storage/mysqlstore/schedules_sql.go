package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// Schedules in MySQL (delayd_schedules, migration 0007), for durable mode:
// MySQL is the authority for schedules as for tasks. UpdateSchedule moves
// a schedule and inserts its firings into delayd_tasks in one transaction
// (the row lock on the schedule orders racing steps), so a slot becomes a
// task exactly once; durable mode then writes the firings to the index.

const scheduleColumns = "namespace, id, version, record, create_ms, update_ms"

// scanSchedule reads one row of scheduleColumns.
func scanSchedule(sc interface{ Scan(...any) error }) (storage.Schedule, error) {
	var (
		s              storage.Schedule
		rec            []byte
		create, update int64
	)
	if err := sc.Scan(&s.Namespace, &s.ID, &s.Version, &rec, &create, &update); err != nil {
		return storage.Schedule{}, err
	}
	if err := storage.UnmarshalSchedule(rec, &s); err != nil {
		return storage.Schedule{}, fmt.Errorf("schedule %q: %w", s.ID, err)
	}
	s.CreateTime, s.UpdateTime = msTime(create).UTC(), msTime(update).UTC()
	return s, nil
}

// CreateSchedule implements authority.Authority (storage.Schedules).
func (s *Store) CreateSchedule(ctx context.Context, sc storage.Schedule) (storage.Schedule, error) {
	rec, err := storage.MarshalSchedule(sc)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("create schedule: %w", err)
	}
	now := s.now(ctx, sc.Namespace).UnixMilli()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	_, err = s.db.ExecContext(ctx, "INSERT INTO delayd_schedules ("+scheduleColumns+", advance_ms) VALUES (?, ?, 1, ?, ?, ?, ?)",
		sc.Namespace, sc.ID, rec, now, now, storage.UnixMS(sc.Advance))
	if isDuplicate(err) {
		return storage.Schedule{}, fmt.Errorf("create schedule %q: %w", sc.ID, storage.ErrAlreadyExists)
	}
	if err != nil {
		return storage.Schedule{}, classify("create schedule", err)
	}
	sc.Version, sc.CreateTime, sc.UpdateTime = 1, msTime(now).UTC(), msTime(now).UTC()
	return sc, nil
}

// GetSchedule implements authority.Authority (storage.Schedules).
func (s *Store) GetSchedule(ctx context.Context, ns, id string) (storage.Schedule, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	sc, err := scanSchedule(s.db.QueryRowContext(ctx, "SELECT "+scheduleColumns+" FROM delayd_schedules WHERE namespace = ? AND id = ?", ns, id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Schedule{}, fmt.Errorf("schedule %q: %w", id, storage.ErrNotFound)
	}
	if err != nil {
		return storage.Schedule{}, classify("get schedule", err)
	}
	return sc, nil
}

// ListSchedules implements authority.Authority (storage.Schedules).
func (s *Store) ListSchedules(ctx context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error) {
	limit = max(1, min(limit, 1000))
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	out, err := s.querySchedules(ctx, "SELECT "+scheduleColumns+" FROM delayd_schedules WHERE namespace = ? AND id > ? ORDER BY id LIMIT ?", ns, after, limit+1)
	if err != nil {
		return nil, false, classify("list schedules", err)
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

func (s *Store) querySchedules(ctx context.Context, q string, args ...any) ([]storage.Schedule, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Schedule
	for rows.Next() {
		sc, err := scanSchedule(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, rows.Err()
}

// UpdateSchedule implements authority.Authority: in one transaction, the
// schedule's row is locked and compared with ifVersion, w's rows (the
// step's firings, create-only) are inserted as a group commit's upserts
// are (w's results are set), and the row is replaced. ErrNotFound,
// ErrGenerationMismatch and ErrNamespaceEnded change nothing. Deadlocks
// and lock waits are retried as Commit retries them.
func (s *Store) UpdateSchedule(ctx context.Context, sc storage.Schedule, ifVersion int64, w *authority.Write) (storage.Schedule, error) {
	rec, err := storage.MarshalSchedule(sc)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("update schedule: %w", err)
	}
	now := s.now(ctx, sc.Namespace).UnixMilli()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	var created int64
	for attempt := 0; ; attempt++ {
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			var ver int64
			err := tx.QueryRowContext(ctx, "SELECT version, create_ms FROM delayd_schedules WHERE namespace = ? AND id = ? FOR UPDATE",
				sc.Namespace, sc.ID).Scan(&ver, &created)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("update schedule %q: %w", sc.ID, storage.ErrNotFound)
			case err != nil:
				return err
			case ver != ifVersion:
				return fmt.Errorf("update schedule %q: version %d, expected %d: %w", sc.ID, ver, ifVersion, storage.ErrGenerationMismatch)
			}
			if w != nil && len(w.Rows) > 0 {
				segs, err := s.checkIncarnations(ctx, tx, []authority.Segment{{Upserts: []*authority.Write{w}}})
				if err != nil {
					return err
				}
				if w.Ended {
					return fmt.Errorf("update schedule %q: namespace %q incarnation %d: %w", sc.ID, sc.Namespace, w.NSInc, storage.ErrNamespaceEnded)
				}
				if err := s.execUpserts(ctx, tx, segs[0].Upserts); err != nil {
					return err
				}
			}
			_, err = tx.ExecContext(ctx, "UPDATE delayd_schedules SET version = ?, record = ?, advance_ms = ?, update_ms = ? WHERE namespace = ? AND id = ?",
				ifVersion+1, rec, storage.UnixMS(sc.Advance), now, sc.Namespace, sc.ID)
			return err
		})
		var ce *commitError
		if err == nil || errors.As(err, &ce) || !retryable(err) || attempt+1 >= maxTxAttempts {
			break
		}
		select {
		case <-time.After(retryPause(attempt + 1)):
		case <-ctx.Done():
			return storage.Schedule{}, classify("update schedule", err)
		}
	}
	if err != nil {
		return storage.Schedule{}, classify("update schedule", err)
	}
	sc.Version, sc.CreateTime, sc.UpdateTime = ifVersion+1, msTime(created).UTC(), msTime(now).UTC()
	return sc, nil
}

// DeleteSchedule implements authority.Authority (storage.Schedules).
func (s *Store) DeleteSchedule(ctx context.Context, ns, id string, ifVersion int64) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	q, args := "DELETE FROM delayd_schedules WHERE namespace = ? AND id = ?", []any{ns, id}
	if ifVersion != 0 {
		q, args = q+" AND version = ?", append(args, ifVersion)
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return classify("delete schedule", err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return nil
	}
	cur, err := s.GetSchedule(ctx, ns, id)
	if err != nil {
		return fmt.Errorf("delete schedule: %w", err)
	}
	return fmt.Errorf("delete schedule %q: version %d, expected %d: %w", id, cur.Version, ifVersion, storage.ErrGenerationMismatch)
}

// CountSchedules implements authority.Authority (storage.Schedules).
func (s *Store) CountSchedules(ctx context.Context, ns string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	var n int64
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM delayd_schedules WHERE namespace = ?", ns).Scan(&n); err != nil {
		return 0, classify("count schedules", err)
	}
	return n, nil
}

// DueSchedules is storage.Schedules' DueSchedules at the time nowMS (the
// durable store passes the index's clock): at most limit schedules per
// namespace whose advance_ms has come, earliest first, by one window
// query over the advance_ms key.
func (s *Store) DueSchedules(ctx context.Context, nowMS int64, limit int) (storage.DueSchedules, error) {
	limit = max(1, min(limit, 1000))
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	out := storage.DueSchedules{Now: msTime(nowMS).UTC()}
	rows, err := s.db.QueryContext(ctx, "SELECT "+scheduleColumns+", advance_ms, rn FROM ("+
		"SELECT "+scheduleColumns+", advance_ms, ROW_NUMBER() OVER (PARTITION BY namespace ORDER BY advance_ms, id) AS rn"+
		" FROM delayd_schedules WHERE advance_ms > 0 AND advance_ms <= ?) d WHERE rn <= ? ORDER BY advance_ms", nowMS, limit+1)
	if err != nil {
		return storage.DueSchedules{}, classify("due schedules", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			sc             storage.Schedule
			rec            []byte
			create, update int64
			advance, rn    int64
		)
		if err := rows.Scan(&sc.Namespace, &sc.ID, &sc.Version, &rec, &create, &update, &advance, &rn); err != nil {
			return storage.DueSchedules{}, classify("due schedules", err)
		}
		if rn > int64(limit) {
			// The namespace has more due than the limit: come back at once.
			if t := msTime(advance).UTC(); out.Next.IsZero() || t.Before(out.Next) {
				out.Next = t
			}
			continue
		}
		if err := storage.UnmarshalSchedule(rec, &sc); err != nil {
			s.log.Warn("skipping a malformed schedule", "namespace", sc.Namespace, "id", sc.ID, "err", err)
			continue
		}
		sc.CreateTime, sc.UpdateTime = msTime(create).UTC(), msTime(update).UTC()
		out.Schedules = append(out.Schedules, sc)
	}
	if err := rows.Err(); err != nil {
		return storage.DueSchedules{}, classify("due schedules", err)
	}
	var next sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT MIN(advance_ms) FROM delayd_schedules WHERE advance_ms > ?", nowMS).Scan(&next); err != nil {
		return storage.DueSchedules{}, classify("due schedules", err)
	}
	if next.Valid && (out.Next.IsZero() || next.Int64 < out.Next.UnixMilli()) {
		out.Next = msTime(next.Int64).UTC()
	}
	return out, nil
}

// DropSchedules implements authority.Authority (storage.Schedules).
func (s *Store) DropSchedules(ctx context.Context, ns string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	res, err := s.db.ExecContext(ctx, "DELETE FROM delayd_schedules WHERE namespace = ?", ns)
	if err != nil {
		return 0, classify("drop schedules", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, classify("drop schedules", err)
	}
	return n, nil
}
