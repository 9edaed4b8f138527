package durable_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
	"github.com/delayd/delayd/storage/mysqlstore"
	"github.com/delayd/delayd/storage/redisstore"
)

func TestMain(m *testing.M) {
	// The driver logs killed and dropped connections to stderr; the tests
	// provoke plenty of those on purpose.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	testkit.Main(m)
}

// env is one durable store over a database of its own.
type env struct {
	t     testing.TB
	dsn   string
	rdb   *redis.Client
	idx   *redisstore.Store
	store *durable.Store
	db    *sql.DB // a pool of the test's own on the test database
}

// newEnv builds and starts a durable store. cfg may adjust the Config.
func newEnv(t testing.TB, cfg func(*durable.Config)) *env {
	t.Helper()
	return newEnvOn(t, testkit.Database(t, "delayd_test"), testkit.RedisURL(), cfg)
}

// newEnvOn builds and starts a durable store on the given database and
// Redis.
func newEnvOn(t testing.TB, dsn, url string, cfg func(*durable.Config)) *env {
	t.Helper()
	return newEnvIndex(t, dsn, url, redisstore.Options{}, cfg)
}

// newEnvIndex is newEnvOn with the index's options (Logger is set).
func newEnvIndex(t testing.TB, dsn, url string, opts redisstore.Options, cfg func(*durable.Config)) *env {
	t.Helper()
	e := &env{t: t, dsn: dsn, rdb: testkit.RedisAt(t, url)}
	opts.Logger = testkit.Logger(t)
	e.idx = redisstore.New(e.rdb, opts)
	c := durable.Config{Index: e.idx, Logger: testkit.Logger(t), IndexCheckInterval: 50 * time.Millisecond}
	if cfg != nil {
		cfg(&c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStore(t, dsn, c)
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	e.store = s
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e.db = db
	return e
}

// openStore opens MySQL at dsn (as the daemon does: the settings both
// sides share come from c) and returns a durable store over it, not
// started.
func openStore(t testing.TB, dsn string, c durable.Config) *durable.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := mysqlstore.Open(ctx, mysqlstore.Config{DSN: dsn, Logger: c.Logger, OpTimeout: c.OpTimeout,
		MaxBatchBytes: c.MaxBatchBytes, HistoryRetention: c.HistoryRetention})
	if err != nil {
		t.Fatalf("mysqlstore.Open: %v", err)
	}
	s, err := durable.New(db, c)
	if err != nil {
		t.Fatalf("durable.New: %v", err)
	}
	return s
}

// mysqlRow is a task's row as MySQL holds it.
type mysqlRow struct {
	State      int
	Generation int64
	Attempt    int32
	DueMS      int64
	LastError  string
}

// row reads a task's row from MySQL; ok is false when there is none.
// upsertRetrying upserts specs as a client does: an ErrUnavailable answer
// (a 500-task insert slower than a test's short OpTimeout on a busy
// machine) is retried, for up to a minute. For set-up whose generations do
// not matter: a retried upsert that had been written counts twice.
func (e *env) upsertRetrying(t testing.TB, ns string, specs []storage.UpsertSpec) {
	t.Helper()
	giveUp := time.Now().Add(time.Minute)
	for {
		_, err := e.store.Upsert(context.Background(), ns, specs)
		if err == nil {
			return
		}
		if !errors.Is(err, storage.ErrUnavailable) || time.Now().After(giveUp) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *env) row(ns, id string) (mysqlRow, bool) {
	e.t.Helper()
	var r mysqlRow
	err := e.db.QueryRow("SELECT state, generation, attempt, due_ms, last_error FROM delayd_tasks WHERE namespace = ? AND id = ?", ns, id).
		Scan(&r.State, &r.Generation, &r.Attempt, &r.DueMS, &r.LastError)
	if err == sql.ErrNoRows {
		return r, false
	}
	if err != nil {
		e.t.Fatalf("read row %s/%s: %v", ns, id, err)
	}
	return r, true
}

// count returns the rows MySQL holds for ns.
func (e *env) count(ns string) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow("SELECT COUNT(*) FROM delayd_tasks WHERE namespace = ?", ns).Scan(&n); err != nil {
		e.t.Fatalf("count: %v", err)
	}
	return n
}

// waitReady waits until the store's index is complete.
func (e *env) waitReady() {
	e.t.Helper()
	select {
	case <-e.store.Ready():
	case <-time.After(60 * time.Second):
		e.t.Fatal("store never became ready")
	}
}
