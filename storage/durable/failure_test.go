package durable_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
)

// viaProxy returns dsn with its address replaced by a proxy's.
func viaProxy(t *testing.T, dsn string) (string, *testkit.Proxy) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := testkit.NewProxy(t, cfg.Addr)
	cfg.Addr = p.Addr()
	return cfg.FormatDSN(), p
}

// directDB opens a pool of the test's own on dsn.
func directDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestMySQLDown: with MySQL unreachable, Upsert and Remove answer
// ErrUnavailable and nothing is half written (the index is not touched);
// when MySQL is back, writes work again.
func TestMySQLDown(t *testing.T) {
	t.Parallel()
	dsn := testkit.Database(t, "delayd_test")
	viaDSN, p := viaProxy(t, dsn)
	e := newEnvOn(t, viaDSN, testkit.RedisURL(), func(c *durable.Config) { c.OpTimeout = 3 * time.Second })
	e.db = directDB(t, dsn)
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")

	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "keep", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	p.SetDown(true)

	_, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "new", Delay: time.Hour}, {ID: "keep", Delay: time.Minute}})
	if !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("upsert with mysql down: err = %v, want ErrUnavailable", err)
	}
	if _, err := e.idx.Get(ctx, ns, "new"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("index has the task whose upsert failed: %v", err)
	}
	if got, err := e.idx.Get(ctx, ns, "keep"); err != nil || got.Generation != 1 {
		t.Errorf("index copy of keep changed by a failed upsert: %+v %v", got, err)
	}
	if _, err := e.store.Remove(ctx, ns, "keep", storage.Version{}); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("remove with mysql down: err = %v, want ErrUnavailable", err)
	}
	if _, err := e.idx.Get(ctx, ns, "keep"); err != nil {
		t.Errorf("index lost keep although its remove failed: %v", err)
	}
	if r, ok := e.row(ns, "keep"); !ok || r.Generation != 1 {
		t.Errorf("mysql row of keep after failed writes: %+v %v", r, ok)
	}

	p.SetDown(false)
	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "new", Delay: time.Hour}})
	if err != nil || !res[0].Created {
		t.Fatalf("upsert after mysql is back: %+v %v", res, err)
	}
	if _, err := e.store.Remove(ctx, ns, "keep", storage.Version{}); err != nil {
		t.Fatalf("remove after mysql is back: %v", err)
	}
}

// redisViaProxy returns the test Redis's URL through a proxy of its own,
// which the test can cut.
func redisViaProxy(t *testing.T) (string, *testkit.Proxy) {
	t.Helper()
	opt, err := redis.ParseURL(testkit.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	rp := testkit.NewProxy(t, opt.Addr)
	return fmt.Sprintf("redis://%s/%d", rp.Addr(), opt.DB), rp
}

// TestRedisDownUpsertIsDurable: with the index unreachable an upsert is
// still answered once MySQL has it (Get reads it from MySQL); when Redis is
// back the task is re-indexed and delivered.
func TestRedisDownUpsertIsDurable(t *testing.T) {
	t.Parallel()
	url, rp := redisViaProxy(t)
	e := newEnvOn(t, testkit.Database(t, "delayd_test"), url, func(c *durable.Config) { c.IndexCheckInterval = 50 * time.Millisecond })
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")
	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "first", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}

	rp.SetDown(true)
	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "t", Payload: []byte("durable"), DueTime: time.Now().Add(-time.Second)}})
	if err != nil {
		t.Fatalf("upsert with redis down: %v (MySQL has it: the answer must be OK)", err)
	}
	if res[0].Task.Generation != 1 || !res[0].Created {
		t.Fatalf("result: %+v", res[0])
	}
	if r, ok := e.row(ns, "t"); !ok || r.Generation != 1 {
		t.Fatalf("mysql row: %+v %v", r, ok)
	}
	got, err := e.store.Get(ctx, ns, "t")
	if err != nil || string(got.Payload) != "durable" {
		t.Fatalf("get with redis down (mysql fallback): %+v %v", got, err)
	}

	rp.SetDown(false)
	var ds []storage.Delivery
	poll(t, "the task to be re-indexed and popped", func() bool {
		ds, err = e.store.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
		return err == nil && len(ds) == 1
	})
	if ds[0].Task.ID != "t" || ds[0].Task.Generation != 1 || string(ds[0].Task.Payload) != "durable" {
		t.Fatalf("delivered %+v", ds[0].Task)
	}
	if st, err := e.store.Ack(ctx, ns, []storage.Token{ds[0].Token}); err != nil || st[0] != storage.TokenOK {
		t.Fatalf("ack: %v %v", st, err)
	}
	if _, ok := e.row(ns, "t"); ok {
		t.Fatal("mysql row survived the ack")
	}
}

// poll calls f until it reports true, failing after a minute.
func poll(t testing.TB, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pollProgress calls f every 20 ms until it reports done, and fails t when
// its progress figure has not changed for a minute: a bound on "stuck",
// not on how fast a loaded machine gets through a large amount of work.
func pollProgress(t testing.TB, what string, f func() (done bool, progress int)) {
	t.Helper()
	last, since := 0, time.Now()
	for {
		done, p := f()
		if done {
			return
		}
		if p != last {
			last, since = p, time.Now()
		} else if time.Since(since) > time.Minute {
			t.Fatalf("gave up waiting for %s: no progress for a minute (at %d)", what, p)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killer KILLs every connection to database db (except its own) every
// period until stop is called; it returns how many it killed.
func killer(t *testing.T, db string, period time.Duration) (stop func() int) {
	t.Helper()
	admin := directDB(t, testkit.MySQLDSN())
	var killed atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			rows, err := admin.Query("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()", db)
			if err != nil {
				continue
			}
			var ids []int64
			for rows.Next() {
				var id int64
				if rows.Scan(&id) == nil {
					ids = append(ids, id)
				}
			}
			rows.Close()
			for _, id := range ids {
				if _, err := admin.Exec(fmt.Sprintf("KILL %d", id)); err == nil {
					killed.Add(1)
				}
			}
		}
	}()
	return func() int {
		close(done)
		wg.Wait()
		return int(killed.Load())
	}
}

// TestConnectionsKilledMidBatch: MySQL connections are KILLed from another
// connection while producers upsert (retrying failed calls, as a client
// does) and consumers pop and ack. Every failure is ErrUnavailable, every
// acknowledged upsert ends in MySQL and the index at the acknowledged
// generation, and every task is delivered: none lost.
func TestConnectionsKilledMidBatch(t *testing.T) {
	t.Parallel()
	dsn := testkit.Database(t, "delayd_test")
	e := newEnvOn(t, dsn, testkit.RedisURL(), func(c *durable.Config) {
		c.OpTimeout = 2 * time.Second
		c.ReconcileInterval = 500 * time.Millisecond
		c.IndexCheckInterval = 50 * time.Millisecond
	})
	cfg, _ := mysql.ParseDSN(dsn)
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")
	const producers, perProducer = 8, 250
	// Counting rows goes through a connection to another database, which
	// the killer leaves alone.
	admin := directDB(t, testkit.MySQLDSN())
	countRows := func() int {
		var n int
		if err := admin.QueryRow("SELECT COUNT(*) FROM "+cfg.DBName+".delayd_tasks WHERE namespace = ?", ns).Scan(&n); err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}

	var errMu sync.Mutex
	errCount := map[string]int{}
	noteErr := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("error is not ErrUnavailable: %v", err)
		}
		msg := err.Error()
		if i := strings.Index(msg, ": "); i > 0 {
			msg = msg[:i]
		}
		errCount[msg]++
	}

	stopKill := killer(t, cfg.DBName, 10*time.Millisecond)
	acked := make([]map[string]int64, producers)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acked[p] = map[string]int64{}
			for i := 0; i < perProducer; i += 5 {
				var specs []storage.UpsertSpec
				for j := i; j < i+5; j++ {
					specs = append(specs, storage.UpsertSpec{ID: fmt.Sprintf("p%d-%d", p, j), Payload: []byte("x"), Delay: -time.Second})
				}
				for {
					res, err := e.store.Upsert(ctx, ns, specs)
					if err != nil {
						noteErr(err)
						continue
					}
					for _, r := range res {
						acked[p][r.Task.ID] = r.Task.Generation
					}
					break
				}
			}
		}()
	}
	wg.Wait()

	want := map[string]int64{}
	for _, m := range acked {
		for id, g := range m {
			want[id] = g
		}
	}
	if len(want) != producers*perProducer {
		t.Fatalf("%d tasks acknowledged, want %d", len(want), producers*perProducer)
	}

	// Deliver everything while the killing goes on.
	delivered := map[string]int{}
	var deliveredMu sync.Mutex
	deadline := time.Now().Add(2 * time.Minute)
	for {
		deliveredMu.Lock()
		n := len(delivered)
		deliveredMu.Unlock()
		if n == len(want) && countRows() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %d of %d delivered, %d rows left in mysql", n, len(want), countRows())
		}
		ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 100, LeaseFor: 5 * time.Second})
		if err != nil {
			t.Fatalf("pop: %v", err)
		}
		if len(ds) == 0 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		toks := make([]storage.Token, len(ds))
		for i, d := range ds {
			toks[i] = d.Token
			if g, ok := want[d.Task.ID]; !ok || d.Task.Generation < g {
				t.Errorf("delivered %s generation %d, acknowledged generation %d", d.Task.ID, d.Task.Generation, g)
			}
			deliveredMu.Lock()
			delivered[d.Task.ID]++
			deliveredMu.Unlock()
		}
		if _, err := e.store.Ack(ctx, ns, toks); err != nil {
			noteErr(err) // the rows stay in MySQL; the reconciler delivers them again
		}
	}
	killed := stopKill()
	dups := 0
	for _, c := range delivered {
		dups += c - 1
	}
	t.Logf("%d connections killed; errors seen: %v; %d tasks delivered, %d duplicates, 0 lost", killed, errCount, len(delivered), dups)
	if killed == 0 {
		t.Error("no connection was killed: the test proved nothing")
	}
}

// TestGenerationRaces: concurrent upserts of the same tasks leave the
// newest generation (and its payload) in both stores, and an ack of an old
// generation never deletes the newer row.
func TestGenerationRaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")
	ids := []string{"a", "b", "c", "d"}
	const writers, rounds = 16, 25

	type win struct {
		gen     int64
		payload string
	}
	var mu sync.Mutex
	best := map[string]win{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				var specs []storage.UpsertSpec
				for _, id := range ids {
					specs = append(specs, storage.UpsertSpec{ID: id, Payload: fmt.Appendf(nil, "%d-%d", w, r), Delay: time.Hour})
				}
				res, err := e.store.Upsert(ctx, ns, specs)
				if err != nil {
					t.Errorf("upsert: %v", err)
					return
				}
				mu.Lock()
				for _, x := range res {
					if x.Task.Generation > best[x.Task.ID].gen {
						best[x.Task.ID] = win{x.Task.Generation, string(x.Task.Payload)}
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		b := best[id]
		if b.gen != writers*rounds {
			t.Errorf("%s: highest generation answered %d, want %d (one per upsert)", id, b.gen, writers*rounds)
		}
		if r, _ := e.row(ns, id); r.Generation != b.gen {
			t.Errorf("%s: mysql generation %d, want %d", id, r.Generation, b.gen)
		}
		got, err := e.idx.Get(ctx, ns, id)
		if err != nil || got.Generation != b.gen || string(got.Payload) != b.payload {
			t.Errorf("%s: index holds generation %d payload %q (%v), want %d %q", id, got.Generation, got.Payload, err, b.gen, b.payload)
		}
	}

	// An ack of an old delivery never deletes the newer generation.
	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Delay: -time.Second}}); err != nil {
		t.Fatal(err)
	}
	ds, err := e.store.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
	if err != nil || len(ds) != 1 {
		t.Fatalf("pop: %v %v", ds, err)
	}
	res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x", Delay: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.store.Ack(ctx, ns, []storage.Token{ds[0].Token})
	if err != nil || st[0] != storage.TokenStale {
		t.Fatalf("ack of the old generation: %v %v, want STALE", st, err)
	}
	if r, ok := e.row(ns, "x"); !ok || r.Generation != res[0].Task.Generation {
		t.Fatalf("mysql row after a stale ack: %+v %v, want generation %d", r, ok, res[0].Task.Generation)
	}

	// Even when the old ack's write-through races the new upsert (the
	// index said OK before the upsert landed), the delete is guarded by
	// the generation: upsert and ack of the same task, many times at once.
	for i := range 50 {
		id := fmt.Sprintf("r%d", i)
		if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Delay: -time.Second}}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err = e.store.Pop(ctx, ns, storage.PopParams{Limit: 50, LeaseFor: time.Minute})
	if err != nil || len(ds) != 50 {
		t.Fatalf("pop 50: %d %v", len(ds), err)
	}
	newGen := make([]int64, len(ds))
	for i, d := range ds {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := e.store.Ack(ctx, ns, []storage.Token{d.Token}); err != nil {
				t.Errorf("ack: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			res, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: d.Task.ID, Delay: time.Hour}})
			if err != nil {
				t.Errorf("upsert: %v", err)
				return
			}
			newGen[i] = res[0].Task.Generation
		}()
	}
	wg.Wait()
	for i, d := range ds {
		// The upsert happened after or before the ack; either way its
		// generation 2 must survive in both stores.
		if newGen[i] != 2 && newGen[i] != 1 {
			t.Errorf("%s: upsert answered generation %d", d.Task.ID, newGen[i])
		}
		r, ok := e.row(ns, d.Task.ID)
		got, err := e.idx.Get(ctx, ns, d.Task.ID)
		if !ok || err != nil || r.Generation != newGen[i] || got.Generation != newGen[i] {
			t.Errorf("%s: upsert answered generation %d; mysql %+v (%v), index %d (%v)", d.Task.ID, newGen[i], r, ok, got.Generation, err)
		}
	}
}

// TestHungIndexWritesAnswerByDeadline (issue 10 item 5): with the Redis
// index hung (a private redis-server SIGSTOPped), writes whose callers
// have a 3 s deadline — shorter than the index's own 5 s call timeout, so
// a write that waited for the hung index would miss it, and long enough
// for a loaded machine's MySQL commit — are answered before it: an upsert
// OK (MySQL has it),
// a remove Unavailable (MySQL deleted it; its index removal is queued, so
// it must not claim the task is gone from delivery yet). After SIGCONT the
// queued and repaired index writes land: the removed task leaves the
// index, the upserted one enters it.
func TestHungIndexWritesAnswerByDeadline(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	e := newEnvOn(t, testkit.Database(t, "delayd_test"), rs.URL, func(c *durable.Config) {
		c.OpTimeout = 2 * time.Second
		c.IndexWait = 300 * time.Millisecond
	})
	ctx := context.Background()
	ns := testkit.Namespace(t, "hung")
	if _, err := e.store.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "gone", Delay: time.Hour}, {ID: "keep", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	for i := range 3 {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := e.store.Upsert(dctx, ns, []storage.UpsertSpec{{ID: fmt.Sprintf("new-%d", i), Payload: []byte("p"), Delay: -time.Second}})
		cancel()
		if err != nil {
			t.Fatalf("upsert %d with the index hung and a 3 s deadline: %v; want OK (MySQL committed it)", i, err)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := e.store.Remove(dctx, ns, "gone", storage.Version{})
	cancel()
	if !errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("remove with the index hung and a 3 s deadline: %v; want ErrUnavailable before the deadline", err)
	}
	if _, ok := e.row(ns, "gone"); ok {
		t.Fatal("mysql still holds the removed task")
	}
	for i := range 3 {
		if _, ok := e.row(ns, fmt.Sprintf("new-%d", i)); !ok {
			t.Fatalf("mysql lacks new-%d, whose upsert was answered OK", i)
		}
	}
	rs.Resume()
	paused = false
	testkit.Eventually(t, 60*time.Second, "the index to catch up after SIGCONT", func() bool {
		if _, err := e.idx.Get(ctx, ns, "gone"); !errors.Is(err, storage.ErrNotFound) {
			return false
		}
		for i := range 3 {
			if _, err := e.idx.Get(ctx, ns, fmt.Sprintf("new-%d", i)); err != nil {
				return false
			}
		}
		_, err := e.idx.Get(ctx, ns, "keep")
		return err == nil
	})
}
