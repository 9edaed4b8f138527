package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// This file holds the SQL on delayd_tasks. Every statement is built for
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

// execUpserts runs WriteUpsert ops: one multi-row INSERT ... ON DUPLICATE
// KEY UPDATE per chunk (a new row gets generation 1, an existing one
// generation+1, so concurrent writers on any replica never reuse a
// generation), then reads back the generations while the insert holds the
// rows' locks. Rows are written sorted by (namespace, id), a stable sort,
// so concurrent transactions lock rows in one order and the repeated writes
// of one task keep their order.
func (s *Store) execUpserts(ctx context.Context, tx *sql.Tx, ops []*authority.Write) error {
	if len(ops) == 0 {
		return nil
	}
	var refs []upsertRef
	cond := false
	for _, o := range ops {
		o.Upserts = make([]storage.UpsertResult, len(o.Rows))
		for i, r := range o.Rows {
			refs = append(refs, upsertRef{o, i})
			cond = cond || r.CreateOnly || r.IfGen != 0
		}
	}
	sort.SliceStable(refs, func(a, b int) bool {
		ka, kb := refs[a], refs[b]
		if ka.o.NS != kb.o.NS {
			return ka.o.NS < kb.o.NS
		}
		return ka.o.Rows[ka.i].ID < kb.o.Rows[kb.i].ID
	})
	var expect map[taskKey]storage.Version
	if cond {
		var err error
		if refs, expect, err = decideConditions(ctx, tx, refs); err != nil {
			return err
		}
	}

	readBack := map[taskKey]bool{} // tasks that existed (or repeat) and must be read back
	const head = "INSERT INTO delayd_tasks (namespace, id, kind, payload, due_ms, state, generation, incarnation, attempt, last_error, create_ms, update_ms, dead_ms, traceparent) VALUES "
	const tail = " ON DUPLICATE KEY UPDATE generation = generation + 1, kind = VALUES(kind), payload = VALUES(payload)," +
		" due_ms = VALUES(due_ms), state = 1, attempt = 0, last_error = '', update_ms = VALUES(update_ms), dead_ms = 0, traceparent = VALUES(traceparent)"
	for start := 0; start < len(refs); {
		var b strings.Builder
		b.WriteString(head)
		args := make([]any, 0, 9*min(maxStmtRows, len(refs)-start))
		bytes, end := 0, start
		for end < len(refs) && end-start < maxStmtRows && (end == start || bytes < s.cfg.MaxBatchBytes) {
			rf := refs[end]
			r := rf.o.Rows[rf.i]
			if end > start {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?,1,1,?,0,'',?,?,0,?)")
			args = append(args, rf.o.NS, r.ID, r.Kind, r.Payload, r.DueMS, r.Inc, rf.o.NowMS, rf.o.NowMS, traceParent(r.TraceParent))
			bytes += len(r.Payload)
			end++
		}
		b.WriteString(tail)
		res, err := tx.ExecContext(ctx, b.String(), args...)
		if err != nil {
			return fmt.Errorf("upsert: insert: %w", err)
		}
		// MySQL counts 1 per inserted row and 2 per updated one: when the
		// count is the number of rows, every row was new (generation 1)
		// and need not be read back.
		if n, err := res.RowsAffected(); err != nil || n != int64(end-start) {
			for _, rf := range refs[start:end] {
				readBack[taskKey{rf.o.NS, rf.o.Rows[rf.i].ID}] = true
			}
		}
		start = end
	}

	// Read back the final generation (and the incarnation, which an
	// existing row keeps) of each task that was not new.
	type final struct{ gen, inc, create int64 }
	finals := map[taskKey]final{}
	count := map[taskKey]int{}
	byNS := map[string][]string{}
	var nsOrder []string
	for _, rf := range refs {
		k := taskKey{rf.o.NS, rf.o.Rows[rf.i].ID}
		if count[k] == 0 && !readBack[k] {
			finals[k] = final{gen: 1, inc: rf.o.Rows[rf.i].Inc, create: rf.o.NowMS} // created by this insert
		}
		if count[k] == 0 && readBack[k] {
			if _, ok := byNS[k.ns]; !ok {
				nsOrder = append(nsOrder, k.ns)
			}
			byNS[k.ns] = append(byNS[k.ns], k.id)
		}
		count[k]++
	}
	for _, ns := range nsOrder {
		ids := byNS[ns]
		for start := 0; start < len(ids); start += 1000 {
			chunk := ids[start:min(start+1000, len(ids))]
			args := make([]any, 0, len(chunk)+1)
			args = append(args, ns)
			for _, id := range chunk {
				args = append(args, id)
			}
			// A plain read: the insert holds every row's lock until the
			// commit, so nobody else changed them, and READ COMMITTED sees
			// this transaction's own writes. (A locking read here would only
			// add chances to deadlock with other batches.)
			rows, err := tx.QueryContext(ctx, "SELECT id, generation, incarnation, create_ms FROM delayd_tasks WHERE namespace = ? AND id IN ("+
				placeholders(len(chunk))+")", args...)
			if err != nil {
				return fmt.Errorf("upsert: read generations: %w", err)
			}
			for rows.Next() {
				var id string
				var f final
				if err := rows.Scan(&id, &f.gen, &f.inc, &f.create); err != nil {
					rows.Close()
					return fmt.Errorf("upsert: read generations: %w", err)
				}
				finals[taskKey{ns, id}] = f
			}
			if err := rows.Close(); err != nil {
				return fmt.Errorf("upsert: read generations: %w", err)
			}
			if err := rows.Err(); err != nil {
				return fmt.Errorf("upsert: read generations: %w", err)
			}
		}
	}

	// A conditional write was decided on the rows as read; a task that was
	// missing then may have been created by another transaction since
	// (READ COMMITTED locks no missing row): then run everything again.
	for k, want := range expect {
		if f, ok := finals[k]; ok && (f.gen != want.Generation || f.inc != want.Incarnation) {
			return errConditionRace
		}
	}

	// The k-th of n writes of a task in this statement got generation
	// final-(n-1-k); the first created the row iff final == n (a row that
	// existed had generation >= 1 before).
	seen := map[taskKey]int{}
	for _, rf := range refs {
		r := rf.o.Rows[rf.i]
		k := taskKey{rf.o.NS, r.ID}
		f, ok := finals[k]
		if !ok {
			return fmt.Errorf("upsert: task %s/%s missing after insert", k.ns, k.id)
		}
		n, kth := count[k], seen[k]
		seen[k]++
		payload := r.Payload
		if len(payload) == 0 {
			payload = nil
		}
		rf.o.Upserts[rf.i] = storage.UpsertResult{
			Task: storage.Task{
				Namespace:   rf.o.NS,
				ID:          r.ID,
				Kind:        r.Kind,
				Payload:     payload,
				DueTime:     time.UnixMilli(r.DueMS),
				State:       storage.StateScheduled,
				Generation:  f.gen - int64(n-1-kth),
				Incarnation: f.inc,
				CreateTime:  msTime(f.create),
				UpdateTime:  time.UnixMilli(rf.o.NowMS),
			},
			Created: kth == 0 && f.gen == int64(n),
		}
	}
	return nil
}

// upsertRef is one row of one upsert write.
type upsertRef struct {
	o *authority.Write
	i int
}

// decideConditions decides the conditional rows of refs (sorted by
// namespace and id, each task's rows in write order): it reads the tasks
// they name FOR UPDATE and walks each task's rows in order, as if they ran
// one after another. A refused row gets its result (Refused, the task as
// it stands at that point) and is left out of what it returns; the other
// rows are returned in their order. expect holds, per task that has a
// conditional row and is written, the version its last write must end at.
func decideConditions(ctx context.Context, tx *sql.Tx, refs []upsertRef) ([]upsertRef, map[taskKey]storage.Version, error) {
	condTask := map[taskKey]bool{}
	byNS := map[string][]string{}
	var nsOrder []string
	for _, rf := range refs {
		r := rf.o.Rows[rf.i]
		k := taskKey{rf.o.NS, r.ID}
		if (r.CreateOnly || r.IfGen != 0) && !condTask[k] {
			condTask[k] = true
			if _, ok := byNS[k.ns]; !ok {
				nsOrder = append(nsOrder, k.ns)
			}
			byNS[k.ns] = append(byNS[k.ns], k.id)
		}
	}
	held := map[taskKey]storage.Task{}
	for _, ns := range nsOrder {
		ids := byNS[ns]
		for start := 0; start < len(ids); start += 1000 {
			chunk := ids[start:min(start+1000, len(ids))]
			args := []any{ns}
			for _, id := range chunk {
				args = append(args, id)
			}
			q := "SELECT " + taskColumns + " FROM delayd_tasks WHERE namespace = ? AND id IN (" + placeholders(len(chunk)) + ") ORDER BY id FOR UPDATE"
			if err := queryTasks(ctx, tx, q, args, func(t storage.Task) { held[taskKey{ns, t.ID}] = t }); err != nil {
				return nil, nil, fmt.Errorf("upsert: read conditions: %w", err)
			}
		}
	}
	kept := refs[:0:0]
	expect := map[taskKey]storage.Version{}
	for _, rf := range refs {
		r := rf.o.Rows[rf.i]
		k := taskKey{rf.o.NS, r.ID}
		if !condTask[k] {
			kept = append(kept, rf)
			continue
		}
		cur, exists := held[k]
		switch {
		case r.CreateOnly && exists:
			rf.o.Upserts[rf.i] = storage.UpsertResult{Task: cur, Refused: storage.RefusedExists}
			continue
		case r.IfGen != 0 && (!exists || !(storage.Version{Incarnation: r.IfInc, Generation: r.IfGen}).Matches(cur.Incarnation, cur.Generation)):
			rf.o.Upserts[rf.i] = storage.UpsertResult{Task: cur, Refused: storage.RefusedGeneration}
			continue
		}
		next := storage.Task{Namespace: k.ns, ID: r.ID, Kind: r.Kind, Payload: r.Payload, DueTime: time.UnixMilli(r.DueMS),
			State: storage.StateScheduled, Generation: 1, Incarnation: r.Inc, CreateTime: time.UnixMilli(rf.o.NowMS), UpdateTime: time.UnixMilli(rf.o.NowMS)}
		if exists {
			next.Generation, next.Incarnation, next.CreateTime = cur.Generation+1, cur.Incarnation, cur.CreateTime
		}
		if len(next.Payload) == 0 {
			next.Payload = nil
		}
		held[k] = next
		expect[k] = storage.Version{ID: r.ID, Incarnation: next.Incarnation, Generation: next.Generation}
		kept = append(kept, rf)
	}
	return kept, expect, nil
}

// execMoved writes index transitions (nack, reap, requeue) through: one
// UPDATE per namespace chunk, each row guarded by its generation, so a
// transition of an older generation never touches a newer upsert. Of
// several transitions of one delivery in the batch, the last wins.
func (s *Store) execMoved(ctx context.Context, tx *sql.Tx, ops []*authority.Write) error {
	type gk struct {
		id       string
		inc, gen int64
	}
	byNS := map[string][]storage.Moved{}
	var nsOrder []string
	pos := map[string]map[gk]int{}
	for _, o := range ops {
		if _, ok := byNS[o.NS]; !ok {
			nsOrder = append(nsOrder, o.NS)
			pos[o.NS] = map[gk]int{}
		}
		for _, m := range o.Moved {
			k := gk{m.ID, m.Incarnation, m.Generation}
			if i, ok := pos[o.NS][k]; ok {
				byNS[o.NS][i] = m
				continue
			}
			pos[o.NS][k] = len(byNS[o.NS])
			byNS[o.NS] = append(byNS[o.NS], m)
		}
	}
	nowMS := int64(0)
	for _, o := range ops {
		nowMS = max(nowMS, o.NowMS)
	}
	for _, ns := range nsOrder {
		ms := byNS[ns]
		for start := 0; start < len(ms); start += maxMovedRows {
			chunk := ms[start:min(start+maxMovedRows, len(ms))]
			q, args := movedStatement(ns, chunk, nowMS)
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				return fmt.Errorf("write through %d transitions: %w", len(chunk), err)
			}
		}
	}
	return nil
}

// movedStatement builds the generation-guarded UPDATE for one chunk.
func movedStatement(ns string, ms []storage.Moved, nowMS int64) (string, []any) {
	var args []any
	var b strings.Builder
	b.WriteString("UPDATE delayd_tasks SET ")
	column := func(name string, value func(m storage.Moved) (sqlExpr string, arg any, hasArg bool)) {
		b.WriteString(name + " = CASE")
		for _, m := range ms {
			expr, arg, hasArg := value(m)
			b.WriteString(" WHEN id = ? AND incarnation = ? AND generation = ? THEN " + expr)
			args = append(args, m.ID, m.Incarnation, m.Generation)
			if hasArg {
				args = append(args, arg)
			}
		}
		b.WriteString(" ELSE " + name + " END, ")
	}
	column("state", func(m storage.Moved) (string, any, bool) { return "?", stateToDB(m.State), true })
	column("due_ms", func(m storage.Moved) (string, any, bool) {
		if m.State == storage.StateDead || m.DueTime.IsZero() {
			return "due_ms", nil, false
		}
		return "?", m.DueTime.UnixMilli(), true
	})
	column("attempt", func(m storage.Moved) (string, any, bool) { return "?", m.Attempt, true })
	column("last_error", func(m storage.Moved) (string, any, bool) { return "?", truncate(m.LastError, maxLastError), true })
	column("dead_ms", func(m storage.Moved) (string, any, bool) {
		if m.State != storage.StateDead {
			return "0", nil, false
		}
		return "?", timeMS(m.DeadTime), true
	})
	b.WriteString("update_ms = ? WHERE namespace = ? AND (")
	args = append(args, nowMS, ns)
	for i, m := range ms {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(id = ? AND incarnation = ? AND generation = ?)")
		args = append(args, m.ID, m.Incarnation, m.Generation)
	}
	b.WriteString(")")
	return b.String(), args
}

// execAcks deletes acked generations (after copying them to the history
// table when HistoryRetention is set). A row whose generation changed since
// the delivery is left alone.
func (s *Store) execAcks(ctx context.Context, tx *sql.Tx, ops []*authority.Write) error {
	byNS := map[string][]authority.AckRow{}
	var nsOrder []string
	nowMS := int64(0)
	for _, o := range ops {
		if _, ok := byNS[o.NS]; !ok {
			nsOrder = append(nsOrder, o.NS)
		}
		byNS[o.NS] = append(byNS[o.NS], o.Acks...)
		nowMS = max(nowMS, o.NowMS)
	}
	for _, ns := range nsOrder {
		acks := byNS[ns]
		for start := 0; start < len(acks); start += maxStmtRows {
			chunk := acks[start:min(start+maxStmtRows, len(acks))]
			var where strings.Builder
			whereArgs := []any{ns}
			where.WriteString(" WHERE namespace = ? AND (")
			for i, a := range chunk {
				if i > 0 {
					where.WriteString(" OR ")
				}
				where.WriteString("(id = ? AND incarnation = ? AND generation = ?)")
				whereArgs = append(whereArgs, a.ID, a.Inc, a.Gen)
			}
			where.WriteString(")")
			if s.cfg.HistoryRetention > 0 {
				var b strings.Builder
				var args []any
				b.WriteString("INSERT INTO delayd_task_history (namespace, id, kind, payload, due_ms, generation, attempt, create_ms, acked_ms)" +
					" SELECT namespace, id, kind, payload, due_ms, generation, CASE")
				for _, a := range chunk {
					b.WriteString(" WHEN id = ? AND incarnation = ? AND generation = ? THEN ?")
					args = append(args, a.ID, a.Inc, a.Gen, a.Attempt)
				}
				b.WriteString(" ELSE attempt END, create_ms, ? FROM delayd_tasks")
				args = append(args, nowMS)
				b.WriteString(where.String())
				args = append(args, whereArgs...)
				if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
					return fmt.Errorf("ack: copy to history: %w", err)
				}
			}
			if _, err := tx.ExecContext(ctx, "DELETE FROM delayd_tasks"+where.String(), whereArgs...); err != nil {
				return fmt.Errorf("ack: delete: %w", err)
			}
		}
	}
	return nil
}

// execRemoves deletes tasks in any state, recording the state MySQL held
// (for the first remove of each task in the batch). A remove with IfGen
// deletes only when the row's generation equals it (and its incarnation
// IfInc, when set); otherwise it records the mismatch and the row's version
// and leaves the row alone.
func (s *Store) execRemoves(ctx context.Context, tx *sql.Tx, ops []*authority.Write) error {
	byNS := map[string][]*authority.Write{}
	var nsOrder []string
	for _, o := range ops {
		o.MySQLState, o.Mismatch, o.Current = storage.StateUnspecified, false, storage.Task{}
		if _, ok := byNS[o.NS]; !ok {
			nsOrder = append(nsOrder, o.NS)
		}
		byNS[o.NS] = append(byNS[o.NS], o)
	}
	for _, ns := range nsOrder {
		nsOps := byNS[ns]
		for start := 0; start < len(nsOps); start += maxStmtRows {
			chunk := nsOps[start:min(start+maxStmtRows, len(nsOps))]
			args := []any{ns}
			for _, o := range chunk {
				args = append(args, o.ID)
			}
			where := " WHERE namespace = ? AND id IN (" + placeholders(len(chunk)) + ")"
			rows, err := tx.QueryContext(ctx, "SELECT id, state, generation, incarnation FROM delayd_tasks"+where+" FOR UPDATE", args...)
			if err != nil {
				return fmt.Errorf("remove: read: %w", err)
			}
			held := map[string]storage.Task{}
			for rows.Next() {
				var t storage.Task
				var st int
				if err := rows.Scan(&t.ID, &st, &t.Generation, &t.Incarnation); err != nil {
					rows.Close()
					return fmt.Errorf("remove: read: %w", err)
				}
				t.Namespace, t.State = ns, stateFromDB(st)
				held[t.ID] = t
			}
			if err := rows.Close(); err != nil {
				return fmt.Errorf("remove: read: %w", err)
			}
			if err := rows.Err(); err != nil {
				return fmt.Errorf("remove: read: %w", err)
			}
			// In write order: a remove deletes what an earlier one of the
			// batch left.
			del := []any{ns}
			for _, o := range chunk {
				t, ok := held[o.ID]
				switch {
				case !ok:
				case !(storage.Version{Incarnation: o.IfInc, Generation: o.IfGen}).Matches(t.Incarnation, t.Generation):
					o.Mismatch, o.Current = true, t
				default:
					o.MySQLState = t.State
					delete(held, o.ID)
					del = append(del, o.ID)
				}
			}
			if len(del) > 1 {
				if _, err := tx.ExecContext(ctx, "DELETE FROM delayd_tasks WHERE namespace = ? AND id IN ("+placeholders(len(del)-1)+")", del...); err != nil {
					return fmt.Errorf("remove: delete: %w", err)
				}
			}
		}
	}
	return nil
}

// UpsertExact applies rows that name their generation (and any others of
// the same call, which get the next generation) in one transaction of
// their own. A row older than what MySQL holds is Stale and changes
// nothing. It returns a result per row and the indexes of the rows it
// applied, in order. Such rows come from tools and tests, never from the
// server's hot path, so they bypass group commit.
func (s *Store) UpsertExact(ctx context.Context, ns string, rows []authority.UpsertRow, nowMS int64) ([]storage.UpsertResult, []int, error) {
	res := make([]storage.UpsertResult, len(rows))
	var applied []int
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		applied = applied[:0]
		held := map[string]storage.Task{}
		ids := make([]string, 0, len(rows))
		seen := map[string]bool{}
		for _, r := range rows {
			if !seen[r.ID] {
				seen[r.ID] = true
				ids = append(ids, r.ID)
			}
		}
		sort.Strings(ids)
		for start := 0; start < len(ids); start += 1000 {
			chunk := ids[start:min(start+1000, len(ids))]
			args := []any{ns}
			for _, id := range chunk {
				args = append(args, id)
			}
			q := "SELECT " + taskColumns + " FROM delayd_tasks WHERE namespace = ? AND id IN (" + placeholders(len(chunk)) + ") FOR UPDATE"
			if err := queryTasks(ctx, tx, q, args, func(t storage.Task) { held[t.ID] = t }); err != nil {
				return fmt.Errorf("upsert: read: %w", err)
			}
		}
		dirty := map[string]bool{}
		for i, r := range rows {
			old, exists := held[r.ID]
			gen, inc := r.Gen, r.Inc
			if gen == 0 {
				gen = old.Generation + 1
			}
			if exists && !r.ExactInc {
				inc = old.Incarnation
			}
			want := storage.Version{Incarnation: inc, Generation: gen}
			have := storage.Version{Incarnation: old.Incarnation, Generation: old.Generation}
			if exists && have.Newer(want) {
				res[i] = storage.UpsertResult{Task: old, Stale: true}
				continue
			}
			if exists && have == want {
				res[i] = storage.UpsertResult{Task: old} // that very version: nothing to do
				continue
			}
			t := storage.Task{
				Namespace: ns, ID: r.ID, Kind: r.Kind, Payload: r.Payload,
				DueTime: time.UnixMilli(r.DueMS), State: storage.StateScheduled,
				Generation: gen, Incarnation: inc, CreateTime: time.UnixMilli(nowMS), UpdateTime: time.UnixMilli(nowMS),
				TraceParent: traceParent(r.TraceParent),
			}
			if exists && inc == old.Incarnation {
				t.CreateTime = old.CreateTime
			}
			if len(t.Payload) == 0 {
				t.Payload = nil
			}
			held[r.ID] = t
			dirty[r.ID] = true
			res[i] = storage.UpsertResult{Task: t, Created: !exists || inc != old.Incarnation}
			applied = append(applied, i)
		}
		var b strings.Builder
		var args []any
		n := 0
		for _, id := range ids {
			if !dirty[id] {
				continue
			}
			t := held[id]
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?,1,?,?,0,'',?,?,0,?)")
			payload := t.Payload
			if payload == nil {
				payload = []byte{}
			}
			args = append(args, ns, id, t.Kind, payload, t.DueTime.UnixMilli(), t.Generation, t.Incarnation, timeMS(t.CreateTime), nowMS, t.TraceParent)
			n++
		}
		if n == 0 {
			return nil
		}
		q := "INSERT INTO delayd_tasks (namespace, id, kind, payload, due_ms, state, generation, incarnation, attempt, last_error, create_ms, update_ms, dead_ms, traceparent) VALUES " +
			b.String() + " ON DUPLICATE KEY UPDATE kind = VALUES(kind), payload = VALUES(payload), due_ms = VALUES(due_ms), state = 1," +
			" generation = VALUES(generation), incarnation = VALUES(incarnation), create_ms = VALUES(create_ms), attempt = 0, last_error = '', update_ms = VALUES(update_ms), dead_ms = 0," +
			" traceparent = VALUES(traceparent)"
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("upsert: write: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, classify("upsert", err)
	}
	return res, applied, nil
}

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
