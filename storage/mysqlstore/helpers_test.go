package mysqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/delayd/delayd/storage/mysqlstore"
	"github.com/delayd/delayd/storage/redisstore"
)

func TestMain(m *testing.M) {
	// The driver logs killed and dropped connections to stderr; the tests
	// provoke plenty of those on purpose.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m)
}

func mysqlDSN() string {
	if v := os.Getenv("TEST_MYSQL_DSN"); v != "" {
		return v
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

func redisURL() string {
	if v := os.Getenv("TEST_REDIS_URL"); v != "" {
		return v
	}
	return "redis://127.0.0.1:6379"
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// testNamespace returns a fresh namespace name.
func testNamespace() string { return "ms" + randHex(8) }

// newDB creates a database of its own for one test, dropped when the test
// ends, and returns its DSN.
func newDB(t testing.TB) string {
	t.Helper()
	base, err := mysql.ParseDSN(mysqlDSN())
	if err != nil {
		t.Fatalf("TEST_MYSQL_DSN: %v", err)
	}
	admin, err := sql.Open("mysql", mysqlDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := "delayd_test_" + randHex(6)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Skipf("mysql at %s not usable (run `make services`): %v", base.Addr, err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE " + name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	base.DBName = name
	return base.FormatDSN()
}

// newRedis returns a client of the shared test Redis.
func newRedis(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redis url %q: %v", url, err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Skipf("redis at %s not usable (run `make services`): %v", url, err)
	}
	return rdb
}

// startRedis starts a redis-server of the test's own on a free loopback
// port (no persistence), stopped when the test ends, and returns its URL.
// Tests that FLUSHALL use it, never the shared Redis.
func startRedis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	url := fmt.Sprintf("redis://127.0.0.1:%d", port)
	opt, _ := redis.ParseURL(url)
	probe := redis.NewClient(opt)
	defer probe.Close()
	for i := 0; ; i++ {
		if probe.Ping(context.Background()).Err() == nil {
			return url
		}
		if i > 200 {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLogger logs to the test at level (Warn unless DELAYD_TEST_LOG=debug).
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("DELAYD_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// env is one durable store over a database of its own.
type env struct {
	t     testing.TB
	dsn   string
	rdb   *redis.Client
	idx   *redisstore.Store
	store *mysqlstore.Store
	db    *sql.DB // a pool of the test's own on the test database
}

// newEnv builds and starts a durable store. cfg may adjust the Config.
func newEnv(t testing.TB, cfg func(*mysqlstore.Config)) *env {
	t.Helper()
	return newEnvOn(t, newDB(t), redisURL(), cfg)
}

// newEnvOn builds and starts a durable store on the given database and
// Redis.
func newEnvOn(t testing.TB, dsn, url string, cfg func(*mysqlstore.Config)) *env {
	t.Helper()
	e := &env{t: t, dsn: dsn, rdb: newRedis(t, url)}
	e.idx = redisstore.New(e.rdb, redisstore.Options{Logger: testLogger(t)})
	c := mysqlstore.Config{DSN: dsn, Index: e.idx, Logger: testLogger(t), IndexCheckInterval: 50 * time.Millisecond}
	if cfg != nil {
		cfg(&c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mysqlstore.New(ctx, c)
	if err != nil {
		t.Fatalf("mysqlstore.New: %v", err)
	}
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

// mysqlRow is a task's row as MySQL holds it.
type mysqlRow struct {
	State      int
	Generation int64
	Attempt    int32
	DueMS      int64
	LastError  string
}

// row reads a task's row from MySQL; ok is false when there is none.
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
