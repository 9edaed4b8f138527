package mysqlstore

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delayd/delayd/storage"
)

// tasks_sql.go and the *_sql.go files beside it (writes, reads,
// maintenance) hold the SQL on delayd_tasks; this one the columns and the
// conversions they share. Every statement is built for
// MySQL 8 and MariaDB 10.11 alike: VALUES() in ON DUPLICATE KEY UPDATE (no
// row alias), plain CASE expressions, and predicates of the form
// `namespace = ? AND id IN (...)` / `(id = ? AND incarnation = ? AND
// generation = ?) OR ...`
// that both optimizers turn into primary-key ranges. The schema is in
// migrations/0001_init.up.sql.

// The state column's codes: the schema's own, fixed forever, converted to
// and from storage.State by name (stateToDB, stateFromDB), never by a cast
// that relies on the numbers matching. DELIVERED is never stored (MySQL
// holds a delivered task as scheduled; the lease lives in the index).
const (
	dbScheduled = 1
	dbDead      = 3
)

// stateToDB is the state column's code for s; scheduled for anything that
// is not dead.
func stateToDB(s storage.State) int {
	if s == storage.StateDead {
		return dbDead
	}
	return dbScheduled
}

// stateFromDB is the storage.State of a state column code.
func stateFromDB(code int) storage.State {
	switch code {
	case dbScheduled:
		return storage.StateScheduled
	case dbDead:
		return storage.StateDead
	default:
		return storage.StateUnspecified
	}
}

// taskColumns is the column list scanTask reads, in its order.
const taskColumns = "namespace, id, kind, payload, due_ms, state, generation, incarnation, attempt, last_error, create_ms, update_ms, dead_ms, traceparent"

// Statement size bounds: rows per multi-row statement. Payload bytes are
// bounded by Config.MaxBatchBytes.
const (
	maxStmtRows  = 500
	maxMovedRows = 200
	maxLastError = 1024 // characters, as the column
)

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// msTime converts Unix milliseconds to a time; 0 is the zero time.
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// timeMS converts a time to Unix milliseconds; the zero time is 0.
func timeMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// scanTask reads one row of taskColumns.
func scanTask(r rowScanner) (storage.Task, error) {
	var (
		t                         storage.Task
		due, create, update, dead int64
		state                     int
	)
	if err := r.Scan(&t.Namespace, &t.ID, &t.Kind, &t.Payload, &due, &state, &t.Generation, &t.Incarnation,
		&t.Attempt, &t.LastError, &create, &update, &dead, &t.TraceParent); err != nil {
		return storage.Task{}, err
	}
	t.DueTime, t.CreateTime, t.UpdateTime, t.DeadTime = msTime(due), msTime(create), msTime(update), msTime(dead)
	t.State = stateFromDB(state)
	if len(t.Payload) == 0 {
		t.Payload = nil
	}
	return t, nil
}

// maxTraceParent is the traceparent column's width. A W3C traceparent is
// 55 characters; anything longer is not kept (the index still delivers it).
const maxTraceParent = 64

// traceParent is tp as the traceparent column keeps it: empty when it does
// not fit or is not printable ASCII (it is never a reason to fail a write).
func traceParent(tp string) string {
	if len(tp) > maxTraceParent {
		return ""
	}
	for i := 0; i < len(tp); i++ {
		if tp[i] < ' ' || tp[i] > '~' {
			return ""
		}
	}
	return tp
}

// truncate cuts s to at most n characters.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for k := range s {
		if i == n {
			return s[:k]
		}
		i++
	}
	return s
}

// placeholders returns "?,?,...,?" with n marks.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}
