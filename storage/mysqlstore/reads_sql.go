package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// The authority's reads: tasks by id and by page, the versions the
// reconciler compares with the index, what changed since a pass, and which
// namespaces have tasks.

// queryer is *sql.DB or *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryTasks runs q (selecting taskColumns) and calls fn per row.
func queryTasks(ctx context.Context, q queryer, query string, args []any, fn func(storage.Task)) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return err
		}
		fn(t)
	}
	return rows.Err()
}

// Get reads one task; storage.ErrNotFound if MySQL has none.
func (s *Store) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	t, err := scanTask(s.db.QueryRowContext(ctx, "SELECT "+taskColumns+" FROM delayd_tasks WHERE namespace = ? AND id = ?", ns, id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Task{}, fmt.Errorf("get: %w", storage.ErrNotFound)
	}
	if err != nil {
		return storage.Task{}, classify("get", err)
	}
	return t, nil
}

// listColumns are taskColumns with the payload's length in its place: a
// page is cut by bytes before any payload is read.
const listColumns = "namespace, id, kind, LENGTH(payload), due_ms, state, generation, incarnation, attempt, last_error, create_ms, update_ms, dead_ms"

// List pages through MySQL: scheduled tasks in (due time, id) order,
// dead ones in (death time, id) order; any other state lists nothing.
// The cursor is "<ms>:<id>" of the last task of the previous page, as the
// previous page returned it ("" at the start and at the end). The page is
// cut by p.MaxBytes (storage.CutPage's rule) from the rows' sizes before
// the payloads of the tasks it keeps are read, in a second query; with
// p.NoPayload they are never read.
func (s *Store) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	var order string
	switch p.State {
	case storage.StateScheduled:
		order = "due_ms"
	case storage.StateDead:
		order = "dead_ms"
	default:
		return nil, "", nil
	}
	q := "SELECT " + listColumns + " FROM delayd_tasks WHERE namespace = ? AND state = ?"
	args := []any{ns, stateToDB(p.State)}
	if p.Cursor != "" {
		msText, id, ok := strings.Cut(p.Cursor, ":")
		ms, err := strconv.ParseInt(msText, 10, 64)
		if !ok || err != nil {
			return nil, "", fmt.Errorf("list: %w", storage.ErrInvalidCursor)
		}
		q += " AND (" + order + " > ? OR (" + order + " = ? AND id > ?))"
		args = append(args, ms, ms, id)
	}
	q += " ORDER BY " + order + ", id LIMIT ?"
	args = append(args, limit+1)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	out, more, err := s.listPage(ctx, q, args, limit, p)
	if err != nil {
		return nil, "", classify("list", err)
	}
	if !p.NoPayload && len(out) > 0 {
		if err := s.readPayloads(ctx, ns, out); err != nil {
			return nil, "", classify("list", err)
		}
	}
	next := ""
	if more {
		last := out[len(out)-1]
		ms := timeMS(last.DueTime)
		if p.State == storage.StateDead {
			ms = timeMS(last.DeadTime)
		}
		next = strconv.FormatInt(ms, 10) + ":" + last.ID
	}
	return out, next, nil
}

// listPage reads the rows of a List query (listColumns) up to limit and
// the byte budget, and reports whether more follow.
func (s *Store) listPage(ctx context.Context, q string, args []any, limit int, p storage.ListParams) ([]storage.Task, bool, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var (
		out  []storage.Task
		used int
	)
	for rows.Next() {
		var (
			t                         storage.Task
			size                      sql.NullInt64
			due, create, update, dead int64
			state                     int
		)
		if err := rows.Scan(&t.Namespace, &t.ID, &t.Kind, &size, &due, &state, &t.Generation, &t.Incarnation,
			&t.Attempt, &t.LastError, &create, &update, &dead); err != nil {
			return nil, false, err
		}
		if len(out) == limit {
			return out, true, nil
		}
		t.DueTime, t.CreateTime, t.UpdateTime, t.DeadTime = msTime(due), msTime(create), msTime(update), msTime(dead)
		t.State = stateFromDB(state)
		n := storage.TaskWireSize(t)
		if !p.NoPayload {
			n += int(size.Int64)
		}
		if p.MaxBytes > 0 && len(out) > 0 && used+n > p.MaxBytes {
			return out, true, nil
		}
		used += n
		out = append(out, t)
	}
	return out, false, rows.Err()
}

// readPayloads fills in the payloads of ts (tasks of ns) from MySQL; a
// task deleted since its row was listed keeps an empty payload.
func (s *Store) readPayloads(ctx context.Context, ns string, ts []storage.Task) error {
	args := make([]any, 0, len(ts)+1)
	args = append(args, ns)
	at := make(map[string]int, len(ts))
	for i, t := range ts {
		args = append(args, t.ID)
		at[t.ID] = i
	}
	rows, err := s.db.QueryContext(ctx,
		"SELECT id, payload FROM delayd_tasks WHERE namespace = ? AND id IN ("+placeholders(len(ts))+")", args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id      string
			payload []byte
		)
		if err := rows.Scan(&id, &payload); err != nil {
			return err
		}
		if i, ok := at[id]; ok && len(payload) > 0 {
			ts[i].Payload = payload
		}
	}
	return rows.Err()
}

// ReadVersions reads up to limit versions (id, incarnation, generation) of
// ns after id, in id order (keyset pagination on the primary key).
func (s *Store) ReadVersions(ctx context.Context, ns, after string, limit int) ([]storage.Version, error) {
	rows, err := s.db.QueryContext(ctx,
		"SELECT id, incarnation, generation FROM delayd_tasks WHERE namespace = ? AND id > ? ORDER BY id LIMIT ?", ns, after, limit)
	if err != nil {
		return nil, classify("reconcile: read", err)
	}
	return scanVersions(rows, limit)
}

// VersionsOf reads the versions of the named tasks of ns (those that
// exist), without their payloads.
func (s *Store) VersionsOf(ctx context.Context, ns string, ids []string) ([]storage.Version, error) {
	var out []storage.Version
	for start := 0; start < len(ids); start += 1000 {
		chunk := ids[start:min(start+1000, len(ids))]
		args := []any{ns}
		for _, id := range chunk {
			args = append(args, id)
		}
		rows, err := s.db.QueryContext(ctx, "SELECT id, incarnation, generation FROM delayd_tasks WHERE namespace = ? AND id IN ("+
			placeholders(len(chunk))+")", args...)
		if err != nil {
			return nil, classify("reconcile: read versions", err)
		}
		vs, err := scanVersions(rows, len(chunk))
		if err != nil {
			return nil, err
		}
		out = append(out, vs...)
	}
	return out, nil
}

func scanVersions(rows *sql.Rows, capacity int) ([]storage.Version, error) {
	defer rows.Close()
	out := make([]storage.Version, 0, capacity)
	for rows.Next() {
		var v storage.Version
		if err := rows.Scan(&v.ID, &v.Incarnation, &v.Generation); err != nil {
			return nil, classify("reconcile: read", err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("reconcile: read", err)
	}
	return out, nil
}

// MatchVersions reads the versions of up to limit tasks of ns that f
// selects, with ids after `after`, in id order (keyset pagination on the
// primary key; the id prefix is a range of it). A filter of StateDelivered
// selects none: MySQL does not know which tasks are in flight (they are
// stored as scheduled).
func (s *Store) MatchVersions(ctx context.Context, ns string, f storage.TaskFilter, after string, limit int) ([]storage.Version, error) {
	if f.State == storage.StateDelivered {
		return nil, nil
	}
	q := "SELECT id, incarnation, generation FROM delayd_tasks WHERE namespace = ? AND id > ?"
	args := []any{ns, after}
	if f.IDPrefix != "" {
		// Task ids are [A-Za-z0-9._-]: no LIKE wildcard but '_', escaped.
		q += " AND id LIKE ? ESCAPE '!'"
		args = append(args, strings.NewReplacer("!", "!!", "_", "!_", "%", "!%").Replace(f.IDPrefix)+"%")
	}
	if f.Kind != "" {
		q += " AND kind = ?"
		args = append(args, f.Kind)
	}
	if f.State != storage.StateUnspecified {
		q += " AND state = ?"
		args = append(args, int(f.State))
	}
	q += " ORDER BY id LIMIT ?"
	args = append(args, limit)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, classify("remove tasks: match", err)
	}
	return scanVersions(rows, limit)
}

// ReadChanged reads up to limit task versions whose update time is at or
// after sinceMS, in update time order, from the delayd_tasks_updated index
// alone. Pages continue from the last row's update time (rows at that
// millisecond are read again; callers tolerate repeats).
func (s *Store) ReadChanged(ctx context.Context, sinceMS int64, limit int) ([]authority.Changed, error) {
	rows, err := s.db.QueryContext(ctx,
		"SELECT namespace, id, incarnation, generation, update_ms FROM delayd_tasks WHERE update_ms >= ? ORDER BY update_ms LIMIT ?", sinceMS, limit)
	if err != nil {
		return nil, classify("reconcile: read changed", err)
	}
	defer rows.Close()
	out := make([]authority.Changed, 0, limit)
	for rows.Next() {
		var c authority.Changed
		if err := rows.Scan(&c.NS, &c.Version.ID, &c.Version.Incarnation, &c.Version.Generation, &c.UpdateMS); err != nil {
			return nil, classify("reconcile: read changed", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("reconcile: read changed", err)
	}
	return out, nil
}

// ReadChangedAt reads every task version whose update time is exactly ms
// (for a millisecond with more changes than one ReadChanged page).
func (s *Store) ReadChangedAt(ctx context.Context, ms int64) ([]authority.Changed, error) {
	rows, err := s.db.QueryContext(ctx,
		"SELECT namespace, id, incarnation, generation, update_ms FROM delayd_tasks WHERE update_ms = ?", ms)
	if err != nil {
		return nil, classify("reconcile: read changed", err)
	}
	defer rows.Close()
	var out []authority.Changed
	for rows.Next() {
		var c authority.Changed
		if err := rows.Scan(&c.NS, &c.Version.ID, &c.Version.Incarnation, &c.Version.Generation, &c.UpdateMS); err != nil {
			return nil, classify("reconcile: read changed", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("reconcile: read changed", err)
	}
	return out, nil
}

// ReadTasks reads the named tasks of ns (those that exist).
func (s *Store) ReadTasks(ctx context.Context, ns string, ids []string) ([]storage.Task, error) {
	var out []storage.Task
	for start := 0; start < len(ids); start += 1000 {
		chunk := ids[start:min(start+1000, len(ids))]
		args := []any{ns}
		for _, id := range chunk {
			args = append(args, id)
		}
		q := "SELECT " + taskColumns + " FROM delayd_tasks WHERE namespace = ? AND id IN (" + placeholders(len(chunk)) + ")"
		if err := queryTasks(ctx, s.db, q, args, func(t storage.Task) { out = append(out, t) }); err != nil {
			return nil, classify("reconcile: read tasks", err)
		}
	}
	return out, nil
}

// TaskNamespaces lists the namespaces MySQL holds tasks of (a loose index
// scan of the primary key).
func (s *Store) TaskNamespaces(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT DISTINCT namespace FROM delayd_tasks")
	if err != nil {
		return nil, classify("list namespaces", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var ns string
		if err := rows.Scan(&ns); err != nil {
			return nil, classify("list namespaces", err)
		}
		out = append(out, ns)
	}
	if err := rows.Err(); err != nil {
		return nil, classify("list namespaces", err)
	}
	return out, nil
}

// HasTasks reports whether MySQL holds any task of ns.
func (s *Store) HasTasks(ctx context.Context, ns string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	var one int
	err := s.db.QueryRowContext(ctx, "SELECT 1 FROM delayd_tasks WHERE namespace = ? LIMIT 1", ns).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, classify("has tasks", err)
	}
	return true, nil
}
