package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// The authority's writes, run inside the group commit's transaction
// (commit.go): upserts with their conditions decided under row locks,
// state moves, acks and removes, and UpsertExact for restores.

// execUpserts runs WriteUpsert ops: one multi-row INSERT ... ON DUPLICATE
// KEY UPDATE per chunk (a new row gets generation 1, an existing one
// generation+1, so concurrent writers on any replica never reuse a
// generation), then reads back the generations while the insert holds the
// rows' locks. Rows are written sorted by (namespace, id), a stable sort,
// so concurrent transactions lock rows in one order and the repeated writes
// of one task keep their order. Its parts, in order: collectUpserts,
// decideConditions (conditional writes only), insertUpserts, planReadBack,
// readFinals, conditionRaced, setUpsertResults.
func (s *Store) execUpserts(ctx context.Context, tx *sql.Tx, ops []*authority.Write) error {
	if len(ops) == 0 {
		return nil
	}
	refs, cond := collectUpserts(ops)
	var expect map[taskKey]storage.Version
	if cond {
		var err error
		if refs, expect, err = decideConditions(ctx, tx, refs); err != nil {
			return err
		}
	}
	readBack, err := s.insertUpserts(ctx, tx, refs)
	if err != nil {
		return err
	}
	p := planReadBack(refs, readBack)
	for _, r := range p.read {
		if err := readFinals(ctx, tx, r, p.finals); err != nil {
			return err
		}
	}
	// A conditional write was decided on the rows as read; a task that was
	// missing then may have been created by another transaction since
	// (READ COMMITTED locks no missing row): then run everything again.
	if conditionRaced(expect, p.finals) {
		return errConditionRace
	}
	return setUpsertResults(refs, p)
}

// collectUpserts returns every row of ops as a ref, sorted by (namespace,
// id) and stably (the repeated writes of a task keep their order), and
// whether any row has a condition (create-only, if-generation). It makes
// each op's Upserts, one result per row.
func collectUpserts(ops []*authority.Write) (refs []upsertRef, cond bool) {
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
	return refs, cond
}

// insertChunks cuts refs into the [start, end) ranges of one INSERT each:
// at most maxStmtRows rows, and a chunk ends once its payload bytes reach
// maxBytes (a row larger than that is a chunk of its own).
func insertChunks(refs []upsertRef, maxBytes int) [][2]int {
	var out [][2]int
	for start := 0; start < len(refs); {
		bytes, end := 0, start
		for end < len(refs) && end-start < maxStmtRows && (end == start || bytes < maxBytes) {
			bytes += len(refs[end].o.Rows[refs[end].i].Payload)
			end++
		}
		out = append(out, [2]int{start, end})
		start = end
	}
	return out
}

// insertUpserts runs one INSERT ... ON DUPLICATE KEY UPDATE per chunk of
// refs (insertChunks) and returns the tasks that must be read back: those
// of a chunk whose count says a row existed (MySQL counts 1 per inserted
// row and 2 per updated one: when the count is the number of rows, every
// row was new, generation 1).
func (s *Store) insertUpserts(ctx context.Context, tx *sql.Tx, refs []upsertRef) (map[taskKey]bool, error) {
	const head = "INSERT INTO delayd_tasks (namespace, id, kind, payload, due_ms, state, generation, incarnation, attempt, last_error, create_ms, update_ms, dead_ms, traceparent) VALUES "
	const tail = " ON DUPLICATE KEY UPDATE generation = generation + 1, kind = VALUES(kind), payload = VALUES(payload)," +
		" due_ms = VALUES(due_ms), state = 1, attempt = 0, last_error = '', update_ms = VALUES(update_ms), dead_ms = 0, traceparent = VALUES(traceparent)"
	readBack := map[taskKey]bool{}
	for _, c := range insertChunks(refs, s.cfg.MaxBatchBytes) {
		var b strings.Builder
		b.WriteString(head)
		args := make([]any, 0, 9*(c[1]-c[0]))
		for j, rf := range refs[c[0]:c[1]] {
			r := rf.o.Rows[rf.i]
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?,1,1,?,0,'',?,?,0,?)")
			args = append(args, rf.o.NS, r.ID, r.Kind, r.Payload, r.DueMS, r.Inc, rf.o.NowMS, rf.o.NowMS, traceParent(r.TraceParent))
		}
		b.WriteString(tail)
		res, err := tx.ExecContext(ctx, b.String(), args...)
		if err != nil {
			return nil, fmt.Errorf("upsert: insert: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(c[1]-c[0]) {
			for _, rf := range refs[c[0]:c[1]] {
				readBack[taskKey{rf.o.NS, rf.o.Rows[rf.i].ID}] = true
			}
		}
	}
	return readBack, nil
}

// final is a task's row after the inserts: its generation, incarnation
// and create time.
type final struct{ gen, inc, create int64 }

// nsIDs are the ids of tasks of one namespace to read back.
type nsIDs struct {
	ns  string
	ids []string
}

// readBackPlan is what planReadBack decided.
type readBackPlan struct {
	finals map[taskKey]final // known without reading: the rows the inserts created
	count  map[taskKey]int   // how many rows of refs write each task
	read   []nsIDs           // the tasks to read back, by namespace in refs' order
}

// planReadBack decides, from refs and the tasks readBack names, what the
// inserts left: a task not read back was created by its first write
// (generation 1, the row's incarnation, created now); the others are read.
func planReadBack(refs []upsertRef, readBack map[taskKey]bool) readBackPlan {
	p := readBackPlan{finals: map[taskKey]final{}, count: map[taskKey]int{}}
	at := map[string]int{} // namespace -> its index in p.read
	for _, rf := range refs {
		k := taskKey{rf.o.NS, rf.o.Rows[rf.i].ID}
		if p.count[k] == 0 {
			if !readBack[k] {
				p.finals[k] = final{gen: 1, inc: rf.o.Rows[rf.i].Inc, create: rf.o.NowMS} // created by this insert
			} else {
				i, ok := at[k.ns]
				if !ok {
					i = len(p.read)
					at[k.ns] = i
					p.read = append(p.read, nsIDs{ns: k.ns})
				}
				p.read[i].ids = append(p.read[i].ids, k.id)
			}
		}
		p.count[k]++
	}
	return p
}

// readFinals reads the generation, incarnation and create time of r's
// tasks into finals, 1,000 ids a query. A plain read: the insert holds
// every row's lock until the commit, so nobody else changed them, and READ
// COMMITTED sees this transaction's own writes. (A locking read here would
// only add chances to deadlock with other batches.)
func readFinals(ctx context.Context, tx *sql.Tx, r nsIDs, finals map[taskKey]final) error {
	for start := 0; start < len(r.ids); start += 1000 {
		chunk := r.ids[start:min(start+1000, len(r.ids))]
		args := make([]any, 0, len(chunk)+1)
		args = append(args, r.ns)
		for _, id := range chunk {
			args = append(args, id)
		}
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
			finals[taskKey{r.ns, id}] = f
		}
		if err := rows.Close(); err != nil {
			return fmt.Errorf("upsert: read generations: %w", err)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("upsert: read generations: %w", err)
		}
	}
	return nil
}

// conditionRaced reports whether a task a conditional write was decided on
// (expect: the version decideConditions read) ended at another version
// than the one the writes made of it.
func conditionRaced(expect map[taskKey]storage.Version, finals map[taskKey]final) bool {
	for k, want := range expect {
		if f, ok := finals[k]; ok && (f.gen != want.Generation || f.inc != want.Incarnation) {
			return true
		}
	}
	return false
}

// setUpsertResults sets each row's result: the k-th of n writes of a task
// in this statement got generation final-(n-1-k); the first created the
// row iff final == n (a row that existed had generation >= 1 before).
func setUpsertResults(refs []upsertRef, p readBackPlan) error {
	seen := map[taskKey]int{}
	for _, rf := range refs {
		r := rf.o.Rows[rf.i]
		k := taskKey{rf.o.NS, r.ID}
		f, ok := p.finals[k]
		if !ok {
			return fmt.Errorf("upsert: task %s/%s missing after insert", k.ns, k.id)
		}
		n, kth := p.count[k], seen[k]
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
