// Package exampletest starts what the examples' tests run against: a real
// delayd in-process on the test Redis, and a MySQL database of their own.
// Everything it starts is stopped, and every database dropped, in
// t.Cleanup.
package exampletest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
)

// RedisURL is TEST_REDIS_URL, or the local default.
func RedisURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379"
}

// MySQLDSN is TEST_MYSQL_DSN, or the local default.
func MySQLDSN() string {
	if d := os.Getenv("TEST_MYSQL_DSN"); d != "" {
		return d
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// Logger logs to the test log under -v, and nowhere otherwise.
func Logger(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// Delayd starts a real delayd on 127.0.0.1 (any free port) over the test
// Redis, and returns its address. It is stopped when the test ends.
func Delayd(t testing.TB) string {
	t.Helper()
	d, err := daemon.Start(context.Background(), daemon.Config{
		Listen:          "127.0.0.1:0",
		RedisURL:        RedisURL(),
		ShutdownTimeout: 5 * time.Second,
	}, Logger(t).With("side", "delayd"))
	if err != nil {
		t.Fatalf("start delayd: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d.Addr()
}

// Suffix returns a random lower-case hex string for names of one test.
func Suffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Database creates a database of its own for the test (prefix + random
// suffix) on the test MySQL, drops it when the test ends, and returns a DSN
// for it.
func Database(t testing.TB, prefix string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("TEST_MYSQL_DSN: %v", err)
	}
	name := prefix + "_" + Suffix()
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP DATABASE IF EXISTS `" + name + "`")
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// Eventually calls cond every 20 ms until it returns true, and fails the
// test if it has not after d (a hang guard, not a speed assertion).
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

// Serve runs an example program's serve loop in the background until the
// test ends, and returns its HTTP base URL ("http://host:port") once the
// program says it listens. serve gets a context that is cancelled at
// cleanup and a ready callback for the listen address; closeFn (may be nil)
// runs after serve returned. A program that stops at start fails the test.
func Serve(t testing.TB, serve func(ctx context.Context, ready func(net.Addr)) error, closeFn func()) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, func(a net.Addr) { ready <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("program returned %v", err)
		}
		if closeFn != nil {
			closeFn()
		}
	})
	select {
	case addr := <-ready:
		return "http://" + addr.String()
	case err := <-done:
		t.Fatalf("program stopped at start: %v", err)
		return ""
	}
}

// OwnNamespace fails t unless ns, an example's default namespace, is one
// of the examples' own ("example-" + name): the README's grpcurl tour and
// the client guide use "orders" and "demo" with other payload formats, so an
// example sharing them would drop the tour's leftover tasks as malformed.
func OwnNamespace(t testing.TB, ns string) {
	t.Helper()
	if !strings.HasPrefix(ns, "example-") {
		t.Errorf("default namespace %q: an example uses a namespace of its own, example-<name>", ns)
	}
}

// QuietOnBadPayload runs the handler that newHandler builds around a
// logger on a delivery whose payload no example can parse (100 KB with a
// marker inside) and fails t unless the handler acks it (returns nil) and
// logs neither the payload nor any part of it: payloads can be large or
// private, so an example logs their size only.
func QuietOnBadPayload(t testing.TB, newHandler func(*slog.Logger) client.Handler) {
	t.Helper()
	const marker = "PAYLOAD-MARKER"
	payload := []byte("{" + marker + strings.Repeat("x", 100_000))
	var logs bytes.Buffer
	h := newHandler(slog.New(slog.NewTextHandler(&logs, nil)))
	d := &client.Delivery{Task: client.Task{Namespace: "example-test", ID: "bad-1", Payload: payload, Attempt: 1}}
	if err := h(context.Background(), d); err != nil {
		t.Errorf("handler returned %v for a payload that can never parse; want nil (ack)", err)
	}
	if l := logs.String(); strings.Contains(l, marker) || len(l) > 1000 {
		t.Errorf("the log has the payload in it (%d bytes): %.300q", len(l), l)
	}
	if !strings.Contains(logs.String(), "payload_bytes=") {
		t.Errorf("the log %q does not say how big the bad payload was", logs.String())
	}
}
