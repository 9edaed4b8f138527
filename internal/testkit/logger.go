package testkit

import (
	"log/slog"
	"os"
	"testing"
)

// Logger logs to the test's log at Warn (at Debug with
// DELAYD_TEST_LOG=debug, at Info under -v), so a failing test shows what
// its components said.
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	if os.Getenv("DELAYD_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

// testWriter writes each log line to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	n := len(p)
	if n > 0 && p[n-1] == '\n' {
		p = p[:n-1]
	}
	w.t.Log(string(p))
	return n, nil
}
