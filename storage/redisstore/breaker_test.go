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
