// Package testkit is what every package's tests share: the test Redis and
// MySQL, names of a test's own, processes a test starts and stops
// (redis-server, a TCP proxy), a logger and a wait helper. It is imported
// by tests only.
//
// Services. The tests run against a real Redis (TEST_REDIS_URL) and a real
// MySQL (TEST_MYSQL_DSN). When a variable is unset its default is used:
// Redis database 15 of redis://127.0.0.1:6379 — not database 0, the one
// `make run` users point delayd at — and the MySQL database "test" of
// root@tcp(127.0.0.1:3306). A service that does not answer FAILS the test
// (never a skip): `make services` starts them or says how to install them.
//
// Cleanliness. A test works in names of its own and deletes what it
// created: Namespace gives a random namespace whose Redis keys (tasks,
// index marker, registry entry and API keys) are deleted when the test
// ends; Database creates a MySQL database that is dropped when the test
// ends. Nothing flushes a shared database. Tests that must FLUSHALL, kill
// or pause Redis start a redis-server of their own (StartRedis).
package testkit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// DefaultRedisURL is the test Redis when TEST_REDIS_URL is unset: database
// 15, apart from database 0 that `make run` users point delayd at.
const DefaultRedisURL = "redis://127.0.0.1:6379/15"

// DefaultMySQLDSN is the test MySQL when TEST_MYSQL_DSN is unset. Tests
// create databases of their own next to it (Database).
const DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test"

// RedisURL is TEST_REDIS_URL, or DefaultRedisURL.
func RedisURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultRedisURL
}

// MySQLDSN is TEST_MYSQL_DSN, or DefaultMySQLDSN.
func MySQLDSN() string {
	if d := os.Getenv("TEST_MYSQL_DSN"); d != "" {
		return d
	}
	return DefaultMySQLDSN
}

// Redis returns a client of the test Redis, closed when t ends. It fails t
// when the Redis does not answer.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	return RedisAt(t, RedisURL())
}

// RedisAt returns a client of the Redis at url, closed when t ends; it
// fails t when that Redis does not answer within 5 s.
func RedisAt(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redis url %q (TEST_REDIS_URL): %v", url, err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("the test Redis at %s does not answer (run `make services`, or set TEST_REDIS_URL): %v", url, err)
	}
	return c
}

// Suffix returns 12 random lower-case hex digits for names of one test.
// Main deletes, after the package's tests, every namespace whose name ends
// with a suffix Suffix returned in this process.
func Suffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	sfx := hex.EncodeToString(b[:])
	suffixes.Lock()
	suffixes.m[sfx] = true
	suffixes.Unlock()
	return sfx
}

// suffixes are the name suffixes this test process handed out (Main
// sweeps the namespaces that carry one).
var suffixes = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// Namespace returns a fresh namespace name, prefix + "-" + Suffix(), and
// deletes every key of it from the test Redis when t ends: its task keys,
// its registry entry and its API keys. prefix must be a valid namespace
// start ([a-z0-9][a-z0-9_-]*), short enough for the 63-character limit.
func Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns := prefix + "-" + Suffix()
	t.Cleanup(func() { DeleteNamespaceKeys(t, RedisURL(), ns) })
	return ns
}

// DeleteNamespaceKeys deletes from the Redis at url every key delayd keeps
// for namespace ns (see storage/redisstore/keys.go): the per-namespace
// keys, the registry entry and the namespace's API keys. Errors are
// reported, not fatal (it runs in cleanups).
func DeleteNamespaceKeys(t testing.TB, url, ns string) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Errorf("cleanup of namespace %s: %v", ns, err)
		return
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := deleteNamespaceKeys(ctx, c, ns); err != nil {
		t.Logf("cleanup of namespace %s: %v", ns, err)
	}
}

// deleteNamespaceKeys deletes every key delayd keeps for ns.
func deleteNamespaceKeys(ctx context.Context, c *redis.Client, ns string) error {
	var keys []string
	iter := c.Scan(ctx, 0, "delayd:{"+ns+"#*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		c.Del(ctx, k)
	}
	const reg = "delayd:{registry}:"
	ids, _ := c.ZRange(ctx, reg+"nskeys:"+ns, 0, -1).Result()
	if len(ids) > 0 {
		c.HDel(ctx, reg+"keys", ids...)
	}
	c.Del(ctx, reg+"nskeys:"+ns, reg+"ns:"+ns)
	return c.ZRem(ctx, reg+"namespaces", ns).Err()
}

// Database creates a MySQL database of the test's own (prefix + "_" +
// Suffix()) on the test MySQL, drops it when t ends, and returns a DSN for
// it. It fails t when MySQL does not answer.
func Database(t testing.TB, prefix string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("TEST_MYSQL_DSN %q: %v", MySQLDSN(), err)
	}
	name := strings.ReplaceAll(prefix, "-", "_") + "_" + Suffix()
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("the test MySQL at %s cannot create a database (run `make services`, or set TEST_MYSQL_DSN): %v", cfg.Addr, err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer db.Close()
		if _, err := db.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// DB opens a pool on dsn, closed when t ends.
func DB(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Eventually calls cond every 20 ms until it returns true, and fails t if
// it has not after d (a bound on "never happens", not a speed assertion).
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
