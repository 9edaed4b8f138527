package ctl_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/ctl"
	"github.com/delayd/delayd/daemon"
)

// TestReadyProbesTheOpsListener: delayctl ready is the health check of the
// scratch image and the compose file, so it must exit 0 only on a 200 from
// /readyz and say delayd's reason otherwise.
func TestReadyProbesTheOpsListener(t *testing.T) {
	d, err := daemon.Start(t.Context(), daemon.Config{Listen: "127.0.0.1:0", OpsListen: "127.0.0.1:0", AdminKey: adminKey}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("daemon.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("daemon Stop: %v", err)
		}
	})
	ctx := t.Context()

	out, code := run(ctx, d.Addr(), "", "ready", "--ops-addr", d.OpsAddr())
	if code != ctl.ExitOK || !strings.Contains(out, "ready") {
		t.Errorf("ready against a serving delayd:\n%s", out)
	}

	// Without --ops-addr: the port of DELAYD_OPS_LISTEN on loopback, as in
	// the image's HEALTHCHECK, which runs with delayd's environment.
	_, port, _ := net.SplitHostPort(d.OpsAddr())
	var stdout, stderr strings.Builder
	env := map[string]string{"DELAYD_OPS_LISTEN": ":" + port}
	if code := ctl.Main(ctx, []string{"ready"}, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr); code != ctl.ExitOK {
		t.Errorf("ready with DELAYD_OPS_LISTEN=:%s: exit %d, %s", port, code, stderr.String())
	}

	// An ops listener answering 503 (what delayd's /readyz does while its
	// store cannot answer) fails the check with the reason.
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "redis: connection refused", http.StatusServiceUnavailable)
	}))
	defer notReady.Close()
	out, code = run(ctx, d.Addr(), "", "ready", "--ops-addr", strings.TrimPrefix(notReady.URL, "http://"))
	if code != ctl.ExitError || !strings.Contains(out, "not ready (503 Service Unavailable): redis: connection refused") {
		t.Errorf("ready against a 503:\n%s", out)
	}

	// Nothing listening: a failure naming the address.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	out, code = run(ctx, d.Addr(), "", "ready", "--ops-addr", closed)
	if code != ctl.ExitError || !strings.Contains(out, "ops listener "+closed) {
		t.Errorf("ready against a closed port:\n%s", out)
	}

	// --wait asks again until the listener answers 200: here one that
	// says 503 twice first, as delayd does until its stores answer.
	var asked atomic.Int32
	soon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if asked.Add(1) <= 2 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	}))
	defer soon.Close()
	out, code = run(ctx, d.Addr(), "", "ready", "--wait", "30s", "--ops-addr", strings.TrimPrefix(soon.URL, "http://"))
	if code != ctl.ExitOK || asked.Load() != 3 {
		t.Errorf("ready --wait against a listener ready at the third ask: asked %d times\n%s", asked.Load(), out)
	}
	// A --wait that runs out fails with the last answer.
	out, code = run(ctx, d.Addr(), "", "ready", "--wait", "1s", "--ops-addr", strings.TrimPrefix(notReady.URL, "http://"))
	if code != ctl.ExitError || !strings.Contains(out, "redis: connection refused") {
		t.Errorf("ready --wait 1s against a 503:\n%s", out)
	}

	out, code = run(ctx, d.Addr(), "", "ready", "--ops-addr", "http://127.0.0.1:9070/readyz")
	if code != ctl.ExitUsage || !strings.Contains(out, "want host:port") {
		t.Errorf("ready with a URL for --ops-addr:\n%s", out)
	}
}
