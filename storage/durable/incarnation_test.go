package durable_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
)

// snapshot is the DUMP of every Redis key of one namespace: what an old RDB
// file or a lagging replica promoted to primary holds of it.
type snapshot map[string]string

func takeSnapshot(t *testing.T, rdb *redis.Client, ns string) snapshot {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "delayd:{"+ns+"#*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of %s: %v, %v", ns, keys, err)
	}
	s := snapshot{}
	for _, k := range keys {
		v, err := rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("dump %s: %v", k, err)
		}
		s[k] = v
	}
	return s
}

// restore puts the namespace's keys back as the snapshot held them (keys
// made since are deleted).
func (s snapshot) restore(t *testing.T, rdb *redis.Client, ns string) {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "delayd:{"+ns+"#*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range s {
		if err := rdb.RestoreReplace(ctx, k, 0, v).Err(); err != nil {
			t.Fatalf("restore %s: %v", k, err)
		}
	}
}

// popUntil pops ns until a delivery of id arrives or d passes.
func popUntil(t *testing.T, s storage.Deliveries, ns, id string, d time.Duration) (storage.Delivery, bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ds, err := s.Pop(context.Background(), ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
		if err != nil {
			t.Fatalf("pop: %v", err)
		}
		for _, dl := range ds {
			if dl.Task.ID == id {
				return dl, true
			}
			t.Errorf("unexpected delivery %+v", dl.Task)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return storage.Delivery{}, false
}

// TestRecreatedAfterSnapshotRestoreIsDelivered reproduces issue 10 item 1:
// X upserted five times (generation 5), the namespace's Redis keys
// snapshotted, X removed, the snapshot restored (as a failover to a lagging
// replica would), X re-created due in 2 s. MySQL restarts X at generation
// 1; the index held generation 5 and answered "stale", so X was never
// delivered. With incarnations the re-created X is a newer version and is
// delivered on time.
func TestRecreatedAfterSnapshotRestoreIsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "inc")
	var last storage.UpsertResult
	for i := range 5 {
		res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("old"), Delay: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		last = res[0]
		if last.Task.Generation != int64(i+1) {
			t.Fatalf("upsert %d: generation %d", i+1, last.Task.Generation)
		}
	}
	snap := takeSnapshot(t, e.rdb, ns)
	if _, err := e.store.Remove(ctx, ns, "x", storage.Version{}); err != nil {
		t.Fatal(err)
	}
	snap.restore(t, e.rdb, ns)
	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("new"), Delay: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Created || res[0].Task.Generation != 1 || res[0].Task.Incarnation <= last.Task.Incarnation {
		t.Fatalf("re-create = %+v; want created, generation 1, an incarnation above %d", res[0], last.Task.Incarnation)
	}
	d, ok := popUntil(t, e.store, ns, "x", 30*time.Second)
	if !ok {
		g, gerr := e.idx.Get(ctx, ns, "x")
		t.Fatalf("the re-created task was never delivered; the index holds %+v (%v)", g, gerr)
	}
	if string(d.Task.Payload) != "new" || d.Token.Incarnation != res[0].Task.Incarnation {
		t.Errorf("delivered %+v, token %+v; want the re-created task", d.Task, d.Token)
	}
}

// TestStaleIndexAnswerIsRepaired: when the index holds a version MySQL never
// committed (here: a higher incarnation written straight into the index),
// the index answers "stale" to the upsert MySQL just committed; the store
// repairs the task from MySQL at once instead of leaving it hidden.
func TestStaleIndexAnswerIsRepaired(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) { c.ReconcileInterval = time.Hour; c.FullReconcileInterval = time.Hour })
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "inc")
	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("v1"), Delay: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ghost := storage.UpsertSpec{ID: "x", Payload: []byte("ghost"), Delay: time.Hour,
		Incarnation: res[0].Task.Incarnation + 1_000_000, Generation: 9}
	if _, err := e.idx.Upsert(ctx, ns, []storage.UpsertSpec{ghost}); err != nil {
		t.Fatal(err)
	}
	res, err = e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("v2"), Delay: -time.Second}})
	if err != nil || res[0].Task.Generation != 2 {
		t.Fatalf("upsert = %+v, %v", res, err)
	}
	d, ok := popUntil(t, e.store, ns, "x", 30*time.Second)
	if !ok || string(d.Task.Payload) != "v2" || d.Token.Incarnation != res[0].Task.Incarnation || d.Token.Generation != 2 {
		t.Fatalf("delivery = %+v, %v; want MySQL's version 2 repaired into the index", d, ok)
	}
}

// TestIndexOrphanIsForgotten: an index entry of a task MySQL does not have
// (a snapshot restored after the task was acked) is removed by the full
// pass and never delivered.
func TestIndexOrphanIsForgotten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) {
		c.ReconcileInterval = 50 * time.Millisecond
		c.FullReconcileInterval = 200 * time.Millisecond
	})
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "inc")
	// The namespace is this deployment's (the server registers it on its
	// first upsert): the reverse pass walks only namespaces MySQL knows.
	if _, err := e.store.Registry().CreateNamespace(ctx, storage.Namespace{Name: ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("p"), Delay: 3 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, e.rdb, ns)
	if _, err := e.store.Remove(ctx, ns, "x", storage.Version{}); err != nil {
		t.Fatal(err)
	}
	snap.restore(t, e.rdb, ns)
	testkit.Eventually(t, 30*time.Second, "the reconciler to forget the orphan", func() bool {
		_, err := e.idx.Get(ctx, ns, "x")
		return errors.Is(err, storage.ErrNotFound)
	})
	if d, ok := popUntil(t, e.store, ns, "x", 4*time.Second); ok {
		t.Fatalf("a removed task came back from a restored snapshot: %+v", d)
	}
}

// TestAckDuringMySQLOutageIsNeverRedelivered reproduces issue 10 item 3: an
// ack whose MySQL delete fails (connection cut) answers Unavailable; before
// the fix its retry answered NOT_FOUND and the reconciler later restored
// the task from MySQL, delivering it again. Now the retry answers OK once
// MySQL is back, and a task whose ack is never retried is not delivered
// again either, however many reconciler passes run.
func TestAckDuringMySQLOutageIsNeverRedelivered(t *testing.T) {
	t.Parallel()
	dsn, proxy := viaProxy(t, testkit.Database(t, "delayd_test"))
	e := newEnvOn(t, dsn, testkit.RedisURL(), func(c *durable.Config) {
		c.OpTimeout = time.Second
		c.ReconcileInterval = 50 * time.Millisecond
		c.FullReconcileInterval = 300 * time.Millisecond
	})
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "ack")
	const n = 20
	specs := make([]storage.UpsertSpec, n)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: string(rune('a' + i)), Payload: []byte("p"), Delay: -time.Second}
	}
	if _, err := e.store.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: n, LeaseFor: time.Minute})
	if err != nil || len(ds) != n {
		t.Fatalf("pop = %d, %v", len(ds), err)
	}
	retried, abandoned := ds[:n/2], ds[n/2:]
	tokens := func(ds []storage.Delivery) []storage.Token {
		out := make([]storage.Token, len(ds))
		for i, d := range ds {
			out[i] = d.Token
		}
		return out
	}

	proxy.Cut()
	for _, set := range [][]storage.Delivery{retried, abandoned} {
		st, err := e.store.Ack(ctx, ns, tokens(set))
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("ack with mysql cut: %v, %v; want ErrUnavailable", st, err)
		}
	}
	// a retry while MySQL is still down: still not durable, still not "gone"
	if st, err := e.store.Ack(ctx, ns, tokens(retried)); !errors.Is(err, storage.ErrUnavailable) || st[0] == storage.TokenNotFound {
		t.Fatalf("ack retried during the outage = %v, %v; want OK with ErrUnavailable", st, err)
	}
	time.Sleep(time.Second) // reconciler passes fail meanwhile
	proxy.Restore()

	// The first calls after the restore may still find the committer's
	// connections dead (ErrUnavailable): a client retries, and so does this.
	var st []storage.TokenStatus
	testkit.Eventually(t, 30*time.Second, "an ack retried after the outage to succeed", func() bool {
		var err error
		st, err = e.store.Ack(ctx, ns, tokens(retried))
		if err != nil && !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("ack retried after the outage: %v", err)
		}
		return err == nil
	})
	for i, s := range st {
		if s != storage.TokenOK {
			t.Errorf("retried ack of %s = %v, want OK", retried[i].Task.ID, s)
		}
	}
	testkit.Eventually(t, 30*time.Second, "mysql to have deleted every acked task", func() bool { return e.count(ns) == 0 })
	// Several full passes later, nothing comes back.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		got, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: n, LeaseFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range got {
			t.Errorf("acked task %s delivered again (attempt %d)", d.Task.ID, d.Task.Attempt)
		}
		time.Sleep(50 * time.Millisecond)
	}
	marks, _, err := e.idx.ScanAcked(ctx, ns, 0, 1000)
	if err != nil || len(marks) != 0 {
		t.Errorf("ack markers left: %v, %v", marks, err)
	}
}

// TestPurgeSparesARequeuedTask (issue 10 item 6): purging a dead letter by
// id deletes exactly the version the index purged; a task the index has
// already requeued (while MySQL still records it dead, its write-through
// lagging) keeps its MySQL row.
func TestPurgeSparesARequeuedTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) { c.ReconcileInterval = time.Hour; c.FullReconcileInterval = time.Hour })
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "pg")
	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Delay: -time.Second}, {ID: "y", Delay: -time.Second}}); err != nil {
		t.Fatal(err)
	}
	ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 2, LeaseFor: time.Minute})
	if err != nil || len(ds) != 2 {
		t.Fatalf("pop = %v, %v", ds, err)
	}
	st, _, err := e.store.Nack(ctx, ns, []storage.Token{ds[0].Token, ds[1].Token}, storage.NackOptions{MaxAttempts: 1, Reason: "boom"})
	if err != nil || st[0] != storage.TokenOK || st[1] != storage.TokenOK {
		t.Fatalf("nack = %v, %v", st, err)
	}
	for _, id := range []string{"x", "y"} {
		if r, ok := e.row(ns, id); !ok || r.State != int(storage.StateDead) {
			t.Fatalf("mysql row of %s = %+v, %v; want dead", id, r, ok)
		}
	}
	// x is requeued in the index only: MySQL has not heard of it yet.
	if mv, err := e.idx.Requeue(ctx, ns, storage.RequeueParams{IDs: []string{"x"}, Delay: time.Hour}); err != nil || len(mv) != 1 {
		t.Fatalf("index requeue = %v, %v", mv, err)
	}
	purged, err := e.store.Purge(ctx, ns, storage.PurgeParams{IDs: []string{"x", "y"}})
	if err != nil || len(purged) != 1 || purged[0] != "y" {
		t.Fatalf("purge = %v, %v; want only y", purged, err)
	}
	if _, ok := e.row(ns, "x"); !ok {
		t.Fatal("purge deleted the MySQL row of a task the index had requeued")
	}
	if _, ok := e.row(ns, "y"); ok {
		t.Fatal("the purged dead task is still in MySQL")
	}
	if g, err := e.store.Get(ctx, ns, "x"); err != nil || g.State != storage.StateScheduled {
		t.Fatalf("x after the purge = %+v, %v; want scheduled", g, err)
	}
}

// TestReversePassLeavesForeignNamespaces: a namespace this deployment's
// MySQL does not know (a Redis-only delayd sharing the Redis, as the whole
// test suite does) is never walked by the reverse pass, so its tasks are not
// taken for orphans. Reproduced: the reverse pass deleted other packages'
// tasks and API-key namespaces while their tests ran.
func TestReversePassLeavesForeignNamespaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) {
		c.ReconcileInterval = 50 * time.Millisecond
		c.FullReconcileInterval = 200 * time.Millisecond
	})
	e.waitReady()
	ctx := context.Background()
	own, foreign := testkit.Namespace(t, "own"), testkit.Namespace(t, "foreign")
	if _, err := e.store.Registry().CreateNamespace(ctx, storage.Namespace{Name: own}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.idx.Upsert(ctx, foreign, []storage.UpsertSpec{{ID: "theirs", Payload: []byte("p"), Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	// Two orphans of our own namespace, the second made after the first is
	// gone: the pass that forgets the second began after a whole pass (which
	// walked every namespace it would walk) had ended.
	for _, id := range []string{"orphan-1", "orphan-2"} {
		if _, err := e.idx.Upsert(ctx, own, []storage.UpsertSpec{{ID: id, Payload: []byte("p"), Delay: time.Hour}}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, "the reconciler to forget "+id, func() bool {
			_, err := e.idx.Get(ctx, own, id)
			return errors.Is(err, storage.ErrNotFound)
		})
	}
	if _, err := e.idx.Get(ctx, foreign, "theirs"); err != nil {
		t.Fatalf("a task of a namespace MySQL does not know was touched by the reverse pass: %v", err)
	}
}

// slowRestore is the real index with every Restore started late, so a
// restore's read of MySQL and its index write are far apart and removes
// land in between.
type slowRestore struct {
	durable.Index
	delay time.Duration
}

func (s slowRestore) Restore(ctx context.Context, ns string, tasks []storage.Task, p storage.RestoreParams) (int, error) {
	time.Sleep(s.delay)
	return s.Index.Restore(ctx, ns, tasks, p)
}

// TestRemoveDuringRestoreNeverDelivered (issue 10 item 6): the index has
// lost tasks MySQL holds, the reconciler (a pass every few milliseconds) is
// restoring them, and meanwhile every one of them is removed. Once Remove
// has returned, the task is in neither store and is never delivered: a
// restore reads the row under its lock and writes the index before
// releasing it, so a restore either precedes the remove's MySQL delete
// (and the remove's index write then deletes what it restored) or sees no
// row. Several rounds, each racing a pass over a fresh batch; every
// restore waits 20 ms between its read and its write (slowRestore), so
// without the row locks removes would land in that window (and did, when
// the locks were taken out to check this test).
func TestRemoveDuringRestoreNeverDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) {
		c.Index = slowRestore{Index: c.Index, delay: 20 * time.Millisecond}
		c.IndexCheckInterval = 2 * time.Millisecond
		c.ReconcileInterval = 2 * time.Millisecond
		c.ReconcileBatch = 10 // a pass restores a round in 20 steps of 20 ms
	})
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "rmr")
	if _, err := e.store.Registry().CreateNamespace(ctx, storage.Namespace{Name: ns}); err != nil {
		t.Fatal(err)
	}
	const rounds, n = 5, 200
	restoredBefore := 0
	for r := range rounds {
		specs := make([]storage.UpsertSpec, n)
		for i := range specs {
			specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("r%d-%03d", r, i), Payload: []byte("p"), Delay: -time.Second}
		}
		// In chunks of 10, a few ms apart: the incremental pass pages by
		// update time, so it restores the round in 20 steps.
		var res []storage.UpsertResult
		for lo := 0; lo < n; lo += 10 {
			rs, err := e.store.Upsert(ctx, ns, specs[lo:lo+10])
			if err != nil {
				t.Fatal(err)
			}
			res = append(res, rs...)
			time.Sleep(3 * time.Millisecond)
		}
		vs := make([]storage.Version, n)
		for i, rr := range res {
			vs[i] = storage.Version{ID: rr.Task.ID, Incarnation: rr.Task.Incarnation, Generation: rr.Task.Generation}
		}
		// The index loses them; the reconciler starts restoring them.
		if _, err := e.idx.Forget(ctx, ns, vs); err != nil {
			t.Fatal(err)
		}
		// Remove once the reconciler is restoring the round.
		testkit.Eventually(t, 30*time.Second, "the reconciler to restore some of the round", func() bool {
			st, err := e.idx.Stats(ctx, ns)
			if err == nil && st.Scheduled > 0 {
				restoredBefore += int(st.Scheduled)
				return true
			}
			return false
		})
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				// spread over the pass's 20 restore steps of 20 ms
				time.Sleep(time.Duration(mrand.IntN(400)) * time.Millisecond)
				for {
					_, err := e.store.Remove(ctx, ns, specs[i].ID, storage.Version{})
					switch {
					case err == nil, errors.Is(err, storage.ErrNotFound):
						// At once: a later reverse pass would hide a
						// restore that came after the remove.
						if _, gerr := e.idx.Get(ctx, ns, specs[i].ID); gerr == nil {
							errs <- fmt.Errorf("%s is in the index right after its Remove returned", specs[i].ID)
						}
						return
					case errors.Is(err, storage.ErrUnavailable):
						continue // the index removal was pending: retry, as the API says
					default:
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", r, err)
		}
		if t.Failed() {
			return
		}
		for _, v := range vs {
			if _, err := e.idx.Get(ctx, ns, v.ID); err == nil {
				t.Fatalf("round %d: %s is in the index after its Remove returned", r, v.ID)
			}
		}
		// Nothing of the round is deliverable, now or after more passes.
		for range 5 {
			ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 1000, LeaseFor: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				t.Errorf("round %d: removed task %s delivered (attempt %d)", r, d.Task.ID, d.Token.Attempt)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d of %d tasks were back in the index when their removes started (the rest were restored during them, or not at all)", restoredBefore, rounds*n)
	if n := e.count(ns); n != 0 {
		t.Fatalf("mysql still holds %d rows of removed tasks", n)
	}
}

// TestOldIncarnationWriteThroughSparesNewRow (issue 10 item 1): the index
// holds an old incarnation of a task (a snapshot restored after the task was
// removed and re-created: a failover to a lagging replica) while MySQL holds
// the new one. A delivery of the old incarnation can still be popped from
// the index, and its ack, its nack to dead letters and its nack with a retry
// are written through to MySQL: each write names the old (incarnation,
// generation) and must leave the new incarnation's row as it was (before
// incarnations, MySQL restarted a re-created id at generation 1, so the old
// version's guard could match the new row, or the write went by id alone).
func TestOldIncarnationWriteThroughSparesNewRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) { c.ReconcileInterval = time.Hour; c.FullReconcileInterval = time.Hour })
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "owt")
	ids := []string{"acked", "dead", "retried"}
	var specs []storage.UpsertSpec
	for _, id := range ids {
		specs = append(specs, storage.UpsertSpec{ID: id, Payload: []byte("old"), Delay: -time.Second})
	}
	old, err := e.store.Upsert(ctx, ns, specs)
	if err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, e.rdb, ns)
	for _, id := range ids {
		if _, err := e.store.Remove(ctx, ns, id, storage.Version{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range specs {
		specs[i].Payload, specs[i].Delay = []byte("new"), time.Hour
	}
	fresh, err := e.store.Upsert(ctx, ns, specs)
	if err != nil {
		t.Fatal(err)
	}
	type version struct{ inc, gen int64 }
	want := map[string]version{}
	for i, r := range fresh {
		if !r.Created || r.Task.Incarnation <= old[i].Task.Incarnation {
			t.Fatalf("re-create of %s = %+v; want a new incarnation above %d", r.Task.ID, r, old[i].Task.Incarnation)
		}
		want[r.Task.ID] = version{r.Task.Incarnation, r.Task.Generation}
	}
	rowOf := func(id string) (mysqlRow, version) {
		t.Helper()
		var r mysqlRow
		var v version
		err := e.db.QueryRow("SELECT state, generation, attempt, due_ms, last_error, incarnation FROM delayd_tasks WHERE namespace = ? AND id = ?", ns, id).
			Scan(&r.State, &r.Generation, &r.Attempt, &r.DueMS, &r.LastError, &v.inc)
		if err != nil {
			t.Fatalf("mysql row of %s: %v (the old incarnation's write-through deleted the new row?)", id, err)
		}
		v.gen = r.Generation
		return r, v
	}
	before := map[string]mysqlRow{}
	for _, id := range ids {
		before[id], _ = rowOf(id)
	}

	snap.restore(t, e.rdb, ns) // the index is back at the old incarnations, due now
	ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
	if err != nil || len(ds) != len(ids) {
		t.Fatalf("pop of the restored old incarnations = %+v, %v", ds, err)
	}
	tok := map[string]storage.Token{}
	for _, d := range ds {
		if d.Token.Incarnation == want[d.Task.ID].inc {
			t.Fatalf("popped %s at the new incarnation; the restore did not take", d.Task.ID)
		}
		tok[d.Task.ID] = d.Token
	}
	if st, err := e.store.Ack(ctx, ns, []storage.Token{tok["acked"]}); err != nil || st[0] != storage.TokenOK {
		t.Fatalf("ack of the old incarnation = %v, %v (the index holds it)", st, err)
	}
	if st, _, err := e.store.Nack(ctx, ns, []storage.Token{tok["dead"]}, storage.NackOptions{MaxAttempts: 1, Reason: "boom"}); err != nil || st[0] != storage.TokenOK {
		t.Fatalf("nack to dead of the old incarnation = %v, %v", st, err)
	}
	zero := time.Duration(0)
	if st, _, err := e.store.Nack(ctx, ns, []storage.Token{tok["retried"]}, storage.NackOptions{RetryAfter: &zero, Reason: "again", MaxAttempts: 5}); err != nil || st[0] != storage.TokenOK {
		t.Fatalf("nack with retry of the old incarnation = %v, %v", st, err)
	}
	for _, id := range ids {
		r, v := rowOf(id)
		if v != want[id] || r != before[id] {
			t.Errorf("mysql row of %s after the old incarnation's write-through = %+v at %+v; want it untouched: %+v at %+v", id, r, v, before[id], want[id])
		}
	}
}

// TestTokenFromBeforeIndexLossNeverAcksLaterDelivery (issue 10 item 2):
// a rebuild from MySQL and a restored snapshot both roll a task's stored
// delivery back (MySQL does not record pops; a snapshot predates them), so
// the delivery after it has the same incarnation, generation and attempt
// as the one before. Its token must still differ: the holder of the old
// delivery acking late must not finish the new one.
func TestTokenFromBeforeIndexLossNeverAcksLaterDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) { c.ReconcileInterval = time.Hour; c.FullReconcileInterval = time.Hour })
	e.waitReady()
	ctx := context.Background()
	for _, loss := range []string{"rebuild", "snapshot"} {
		ns := testkit.Namespace(t, loss)
		if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("p"), Delay: -time.Second}}); err != nil {
			t.Fatal(err)
		}
		snap := takeSnapshot(t, e.rdb, ns)
		before, ok := popUntil(t, e.store, ns, "x", 10*time.Second)
		if !ok {
			t.Fatalf("%s: x never delivered", loss)
		}
		if loss == "rebuild" {
			testkit.DeleteNamespaceKeys(t, testkit.RedisURL(), ns) // the index loses the namespace: rebuilt from MySQL
		} else {
			snap.restore(t, e.rdb, ns)
		}
		after, ok := popUntil(t, e.store, ns, "x", 30*time.Second)
		if !ok {
			t.Fatalf("%s: x never delivered again", loss)
		}
		b, a := before.Token, after.Token
		if a.Incarnation != b.Incarnation || a.Generation != b.Generation || a.Attempt != b.Attempt {
			t.Logf("%s: the later delivery differs in more than its sequence: %+v, %+v", loss, b, a)
		}
		if a == b {
			t.Fatalf("%s: the delivery after the loss repeats the token of the one before: %+v", loss, b)
		}
		if st, err := e.store.Ack(ctx, ns, []storage.Token{b}); err != nil || st[0] == storage.TokenOK {
			t.Fatalf("%s: ack with the token from before = %v, %v; want it refused", loss, st, err)
		}
		if g, err := e.store.Get(ctx, ns, "x"); err != nil || g.State != storage.StateDelivered {
			t.Fatalf("%s: after the old token's ack x = %+v, %v; want still delivered", loss, g, err)
		}
		if st, err := e.store.Ack(ctx, ns, []storage.Token{a}); err != nil || st[0] != storage.TokenOK {
			t.Fatalf("%s: ack with the current token = %v, %v", loss, st, err)
		}
	}
}

// TestRecreatedOverDeadGhostIsDelivered (issue 10 item 1): as
// TestRecreatedAfterSnapshotRestoreIsDelivered, with the restored old
// version a dead letter: the ghost in DEAD state must not hide the
// re-created task until someone purges it.
func TestRecreatedOverDeadGhostIsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *durable.Config) { c.ReconcileInterval = time.Hour; c.FullReconcileInterval = time.Hour })
	e.waitReady()
	ctx := context.Background()
	ns := testkit.Namespace(t, "ghost")
	for range 3 {
		if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("old"), Delay: -time.Second}}); err != nil {
			t.Fatal(err)
		}
	}
	d, ok := popUntil(t, e.store, ns, "x", 10*time.Second)
	if !ok {
		t.Fatal("x never delivered")
	}
	if st, _, err := e.store.Nack(ctx, ns, []storage.Token{d.Token}, storage.NackOptions{MaxAttempts: 1, Reason: "boom"}); err != nil || st[0] != storage.TokenOK {
		t.Fatalf("nack to dead = %v, %v", st, err)
	}
	snap := takeSnapshot(t, e.rdb, ns)
	if _, err := e.store.Remove(ctx, ns, "x", storage.Version{}); err != nil {
		t.Fatal(err)
	}
	snap.restore(t, e.rdb, ns) // the index holds x dead again
	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Payload: []byte("new"), Delay: time.Second}})
	if err != nil || !res[0].Created || res[0].Task.Incarnation <= d.Token.Incarnation {
		t.Fatalf("re-create = %+v, %v; want created with an incarnation above %d", res, err, d.Token.Incarnation)
	}
	got, ok := popUntil(t, e.store, ns, "x", 30*time.Second)
	if !ok {
		g, gerr := e.idx.Get(ctx, ns, "x")
		t.Fatalf("the re-created task was never delivered; the index holds %+v (%v)", g, gerr)
	}
	if string(got.Task.Payload) != "new" || got.Token.Incarnation != res[0].Task.Incarnation {
		t.Fatalf("delivered %+v; want the re-created task", got.Task)
	}
}
