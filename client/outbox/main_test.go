package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/client/outbox"
	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

// defaultPostgresDSN is the test PostgreSQL when TEST_POSTGRES_DSN is
// unset: trust authentication, database "test".
const defaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func postgresDSN() string {
	if d := os.Getenv("TEST_POSTGRES_DSN"); d != "" {
		return d
	}
	return defaultPostgresDSN
}

var dialects = []outbox.Dialect{outbox.MySQL, outbox.Postgres}

func driver(d outbox.Dialect) string {
	if d == outbox.Postgres {
		return "pgx"
	}
	return "mysql"
}

// database creates a database of the test's own on the test MySQL or
// PostgreSQL, dropped when t ends, and returns its DSN. A server that does
// not answer fails t.
func database(t testing.TB, d outbox.Dialect) string {
	t.Helper()
	if d == outbox.MySQL {
		return testkit.Database(t, "outbox")
	}
	name := "outbox_" + testkit.Suffix()
	admin, err := sql.Open("pgx", postgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		t.Fatalf("the test PostgreSQL (%s, TEST_POSTGRES_DSN) cannot create a database: %v", postgresDSN(), err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("pgx", postgresDSN())
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec(`DROP DATABASE IF EXISTS "` + name + `" WITH (FORCE)`); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(postgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// env is one test's world: its own database (with the outbox and two
// business tables: orders and effects), its own namespace, a delayd.
type env struct {
	t       testing.TB
	dialect outbox.Dialect
	dsn     string
	db      *sql.DB
	ns      string
	delayd  *delayd
	c       *client.Client
}

func newEnv(t testing.TB, d outbox.Dialect) *env {
	t.Helper()
	e := &env{t: t, dialect: d, dsn: database(t, d)}
	e.db = e.open()
	ob := e.outbox(nil)
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	serial := "BIGINT AUTO_INCREMENT PRIMARY KEY"
	if d == outbox.Postgres {
		serial = "BIGSERIAL PRIMARY KEY"
	}
	for _, s := range []string{
		"CREATE TABLE orders (id VARCHAR(128) PRIMARY KEY, status VARCHAR(16) NOT NULL)",
		"CREATE TABLE effects (n " + serial + ", task_id VARCHAR(128) NOT NULL)",
	} {
		if _, err := e.db.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	e.delayd = startDelayd(t, "127.0.0.1:0")
	e.c = e.newClient()
	e.ns = "ob-" + testkit.Suffix()
	t.Cleanup(func() { testkit.DeleteNamespaceKeys(t, testkit.RedisURL(), e.ns) })
	return e
}

// open opens a pool of its own on the test's database.
func (e *env) open() *sql.DB {
	db, err := sql.Open(driver(e.dialect), e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { db.Close() })
	return db
}

func (e *env) newClient() *client.Client {
	c, err := client.New(e.delayd.addr(), client.WithLogger(testkit.Logger(e.t).With("side", "client")),
		client.WithReconnectMaxDelay(500*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// outbox returns an Outbox on a pool of its own, with fast polls.
func (e *env) outbox(c *client.Client) *outbox.Outbox { return e.outboxBatch(c, 0) }

// outboxBatch is outbox with a BatchSize (0: the default).
func (e *env) outboxBatch(c *client.Client, batch int) *outbox.Outbox {
	ob, err := outbox.New(e.open(), outbox.Config{Dialect: e.dialect, Client: c, PollInterval: 20 * time.Millisecond, BatchSize: batch,
		MaxBackoff: 500 * time.Millisecond, Logger: testkit.Logger(e.t).With("side", "relay")})
	if err != nil {
		e.t.Fatal(err)
	}
	return ob
}

// startRelay starts a relay of its own, stopped when t ends.
func (e *env) startRelay() *outbox.Outbox {
	ob := e.outbox(e.c)
	if err := ob.Start(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ob.Stop(ctx)
	})
	return ob
}

// q rewrites "?" placeholders for the test's dialect.
func (e *env) q(s string) string {
	if e.dialect != outbox.Postgres {
		return s
	}
	var b strings.Builder
	n := 0
	for _, r := range s {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// order is one business commit: an order row and its close task, due
// at due, in one transaction; commit false rolls it back instead.
func (e *env) order(ob *outbox.Outbox, id string, due time.Time, commit bool) {
	e.t.Helper()
	if err := e.tryOrder(ob, id, due, commit); err != nil {
		e.t.Fatal(err)
	}
}

// tryOrder is order for goroutines other than the test's.
func (e *env) tryOrder(ob *outbox.Outbox, id string, due time.Time, commit bool) error {
	ctx := e.t.Context()
	tx, err := ob.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, e.q("INSERT INTO orders (id, status) VALUES (?, 'WAIT_PAY')"), id); err != nil {
		return err
	}
	if err := ob.Upsert(ctx, tx, e.ns, outbox.Task{ID: id, Kind: "order.close", Payload: []byte(id), DueAt: due}); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback()
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	ob.Wake()
	return nil
}

// effect is the business handler of the tests: one effects row per run,
// inside the Once transaction (no unique key: a second run shows).
func (e *env) effect(ctx context.Context, tx *sql.Tx, d *client.Delivery) error {
	_, err := tx.ExecContext(ctx, e.q("INSERT INTO effects (task_id) VALUES (?)"), d.ID)
	return err
}

// consume runs an Once consumer until t ends; ran, if not nil, is called
// for every run of the handler.
func (e *env) consume(ob *outbox.Outbox, ran func(id string)) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(e.t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.c.Consume(ctx, e.ns, ob.Once(func(ctx context.Context, tx *sql.Tx, d *client.Delivery) error {
			if ran != nil {
				ran(d.ID)
			}
			return e.effect(ctx, tx, d)
		}), client.ConsumeOptions{Concurrency: 8})
	}()
	e.t.Cleanup(func() { cancel(); <-done })
}

// effects counts the effects rows per task id.
func (e *env) effects() map[string]int {
	rows, err := e.db.Query("SELECT task_id, COUNT(*) FROM effects GROUP BY task_id")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		m[id] = n
	}
	return m
}

// settle waits until the outbox is empty, delayd holds no task of the
// namespace due within dueWithin (none scheduled soon, none delivered)
// and every id in want has an effect: after that, no further effect can
// come. It fails t after limit (a hang guard).
func (e *env) settle(ob *outbox.Outbox, want []string, limit time.Duration) map[string]int {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		pending, err := ob.Pending(e.t.Context())
		if err != nil {
			e.t.Fatal(err)
		}
		live := e.liveTasks()
		eff := e.effects()
		missing := 0
		for _, id := range want {
			if eff[id] == 0 {
				missing++
			}
		}
		if pending == 0 && live == 0 && missing == 0 {
			return eff
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("not settled after %v: %d rows pending, %d tasks live in delayd, %d of %d effects missing", limit, pending, live, missing, len(want))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// liveTasks counts the namespace's tasks that are delivered or scheduled
// within the next hour (the tests' far-future tasks are not counted).
func (e *env) liveTasks() int {
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	n := 0
	for _, st := range []client.State{client.StateScheduled, client.StateDelivered} {
		for task, err := range e.c.List(ctx, e.ns, client.ListOptions{State: st, PageSize: 1000, NoPayload: true}) {
			if err != nil {
				return -1 // delayd unreachable for now: not settled
			}
			if st == client.StateDelivered || time.Until(task.DueTime) < time.Hour {
				n++
			}
		}
	}
	return n
}

// report logs accepted / lost / duplicate effects of want and fails t
// unless each id has exactly one effect and no other id has any.
func report(t *testing.T, want []string, eff map[string]int) {
	t.Helper()
	wanted := map[string]bool{}
	accepted, lost, dup, stray := 0, 0, 0, 0
	for _, id := range want {
		wanted[id] = true
		switch n := eff[id]; {
		case n == 0:
			lost++
		case n > 1:
			dup += n - 1
			accepted++
		default:
			accepted++
		}
	}
	for id, n := range eff {
		if !wanted[id] {
			stray += n
		}
	}
	t.Logf("effects: %d accepted, %d lost, %d duplicate, %d of tasks never committed", accepted, lost, dup, stray)
	if lost != 0 || dup != 0 || stray != 0 {
		t.Errorf("want every committed task's effect exactly once: %d lost, %d duplicate, %d stray", lost, dup, stray)
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// delayd is a real delayd in this process on the test Redis.
type delayd struct {
	t testing.TB
	d *daemon.Daemon
}

// startDelayd starts delayd on listen ("127.0.0.1:0" for any port); it is
// stopped when t ends unless stopped before.
func startDelayd(t testing.TB, listen string) *delayd {
	t.Helper()
	d, err := daemon.Start(t.Context(), daemon.Config{Listen: listen, RedisURL: testkit.RedisURL(), ShutdownTimeout: 5 * time.Second},
		testkit.Logger(t).With("side", "delayd"))
	if err != nil {
		t.Fatalf("start delayd: %v", err)
	}
	s := &delayd{t: t, d: d}
	t.Cleanup(s.stop)
	return s
}

func (s *delayd) addr() string { return s.d.Addr() }

func (s *delayd) stop() {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.t.Context()), 10*time.Second)
	defer cancel()
	_ = s.d.Stop(ctx)
}

// counter counts calls per id, safely from many goroutines.
type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[id]++
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.m {
		n += v
	}
	return n
}
