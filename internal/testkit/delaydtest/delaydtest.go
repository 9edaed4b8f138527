// Package delaydtest starts delayd for tests: in-process (Start, on the
// test Redis unless the Config names another) or as a real process of the
// cmd/delayd binary (Build, StartProcess) that a test can SIGKILL. It is
// apart from testkit because it imports the daemon, whose own tests use
// testkit.
package delaydtest

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit"
)

// Start starts delayd in this process with cfg on 127.0.0.1 (any free
// port unless cfg.Listen says otherwise), over the test Redis unless
// cfg.RedisURL is set, without authentication unless cfg.AdminKey is set,
// and stops it when t ends. It fails t when delayd does not start.
func Start(t testing.TB, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.RedisURL == "" {
		cfg.RedisURL = testkit.RedisURL()
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := daemon.Start(ctx, cfg, testkit.Logger(t).With("side", "delayd"))
	if err != nil {
		t.Fatalf("start delayd: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}
