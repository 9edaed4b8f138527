package client_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

func redisURL() string { return testkit.RedisURL() }

// testLogger writes to the test log when -v is given, else nowhere.
func testLogger(t *testing.T) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

var _ io.Writer = tWriter{}

// delayd is a real delayd started in-process on the shared test Redis.
type delayd struct {
	t *testing.T
	d *daemon.Daemon
}

// startDelayd starts delayd on listen ("127.0.0.1:0" for any port) and stops
// it at the end of the test unless the test stopped it.
func startDelayd(t *testing.T, listen string) *delayd {
	t.Helper()
	return startDelaydWith(t, daemon.Config{Listen: listen})
}

// startDelaydWith starts delayd with cfg, on the test Redis.
func startDelaydWith(t *testing.T, cfg daemon.Config) *delayd {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	cfg.RedisURL = redisURL()
	cfg.ShutdownTimeout = 5 * time.Second
	d, err := daemon.Start(t.Context(), cfg, testLogger(t).With("side", "server"))
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

// namespace returns a fresh namespace for one test and removes whatever
// tasks are left in it at the end.
func namespace(t *testing.T, c *client.Client) string {
	t.Helper()
	ns := "ct-" + testkit.Suffix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, st := range []client.State{client.StateScheduled, client.StateDelivered, client.StateDead} {
			for task, err := range c.List(ctx, ns, client.ListOptions{State: st, PageSize: 1000}) {
				if err != nil {
					break
				}
				_, _ = c.Remove(ctx, ns, task.ID)
			}
		}
	})
	return ns
}

// setPolicy gives ns a policy through the admin API (tests that need a
// short ack timeout, for lease extension). Every delayd serves
// NamespaceService, so a failure here fails the test.
func setPolicy(t *testing.T, c *client.Client, ns string, p *delaydv1.NamespacePolicy) {
	t.Helper()
	admin := delaydv1.NewNamespaceServiceClient(c.Conn())
	_, err := admin.CreateNamespace(t.Context(), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: ns, Policy: p},
	})
	if status.Code(err) == codes.AlreadyExists {
		_, err = admin.UpdateNamespace(t.Context(), &delaydv1.UpdateNamespaceRequest{
			Namespace:  &delaydv1.Namespace{Name: ns, Policy: p},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
		})
	}
	if err != nil {
		t.Fatalf("set policy of %s: %v", ns, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = admin.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true})
	})
}

// within waits for ch or fails the test after d (a hang guard, not a speed
// assertion).
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
		panic("unreachable")
	}
}
