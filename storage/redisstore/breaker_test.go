package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// A Redis that hangs (SIGSTOP: connections open, no answer) costs the
// first call the store timeout; once Redis is known down the next calls
// fail at once with ErrUnavailable instead of each waiting the whole
// timeout; when Redis answers again, calls work again (issue 10 item 5).
func TestHungRedisFailsFast(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{Timeout: 2 * time.Second})
	ctx := context.Background()
	ns := testkit.Namespace(t, "hang")
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	start := time.Now()
	_, err := s.Get(ctx, ns, "a")
	first := time.Since(start)
	if !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("Get from a hung Redis: %v, want ErrUnavailable", err)
	}
	var slowest time.Duration
	for range 10 {
		start := time.Now()
		_, err := s.Get(ctx, ns, "a")
		slowest = max(slowest, time.Since(start))
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("Get while Redis is known down: %v, want ErrUnavailable", err)
		}
	}
	t.Logf("first call %v, slowest of the next 10 %v", first.Round(time.Millisecond), slowest.Round(time.Millisecond))
	if slowest*4 > first {
		t.Fatalf("calls while Redis is known down took up to %v, the first (which found it down) %v: want them to fail fast", slowest, first)
	}
	srv.Resume()
	resumed = true
	testkit.Eventually(t, 15*time.Second, "Get to work again after SIGCONT", func() bool {
		_, err := s.Get(ctx, ns, "a")
		if err != nil {
			t.Logf("after SIGCONT: %v", err)
			time.Sleep(200 * time.Millisecond)
		}
		return err == nil
	})
}

// TestHungRedisHonoursCallerDeadline (issue 10 item 5, Redis-only mode):
// callers whose deadline (1.5 s) is shorter than the store timeout (5 s)
// are not held past it by a hung Redis: the first call ends at its
// caller's deadline (not the store's 5 s), and since it waited longer than
// the breaker's evidence threshold (1 s), the calls after it answer
// ErrUnavailable at once instead of each running out its deadline.
func TestHungRedisHonoursCallerDeadline(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{Timeout: 5 * time.Second})
	ctx := context.Background()
	ns := testkit.Namespace(t, "hangdl")
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	const deadline = 1500 * time.Millisecond
	call := func() (time.Duration, error) {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		_, err := s.Get(cctx, ns, "a")
		return time.Since(start), err
	}
	first, err := call()
	if err == nil || first > deadline+time.Second {
		t.Fatalf("first Get from a hung Redis took %v (%v); want it to end by the caller's %v deadline, not the 5 s store timeout", first, err, deadline)
	}
	var slowest time.Duration
	for range 10 {
		d, err := call()
		slowest = max(slowest, d)
		if !errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get with Redis known down: %v; want ErrUnavailable before the caller's deadline", err)
		}
	}
	t.Logf("first call %v (%v); slowest of the next 10 %v", first.Round(time.Millisecond), err, slowest.Round(time.Millisecond))
	if slowest > deadline/4 {
		t.Fatalf("calls with Redis known down took up to %v; want them to fail fast", slowest)
	}
}
