// Package exampletest starts what the examples' tests run against: a real
// delayd in-process on the test Redis, and the example program itself.
// Everything it starts is stopped in t.Cleanup. Databases, namespaces and
// waits come from internal/testkit.
package exampletest

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit/delaydtest"
)

// Delayd starts a real delayd on 127.0.0.1 (any free port) over the test
// Redis (see internal/testkit), and returns its address. It is stopped
// when the test ends.
func Delayd(t testing.TB) string {
	t.Helper()
	return delaydtest.Start(t, daemon.Config{}).Addr()
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
