package redisstore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/registrytest"
)

// registryTestStore returns a Store on the shared test Redis.
func registryTestStore(t *testing.T) *Store {
	return New(testkit.Redis(t), Options{})
}

func TestRegistryConformance(t *testing.T) {
	t.Parallel()
	registrytest.Run(t, func(t *testing.T) storage.Registry { return registryTestStore(t) })
}

// TestRegistryConformanceEmbedded runs the suite on miniredis, the embedded
// mode's store.
func TestRegistryConformanceEmbedded(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	registrytest.Run(t, func(t *testing.T) storage.Registry {
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return New(c, Options{})
	})
}

func TestDropNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := registryTestStore(t)
	ns := "drop-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	keep := ns + "-keep"
	t.Cleanup(func() {
		_, _ = s.DropNamespace(context.Background(), ns)
		_, _ = s.DropNamespace(context.Background(), keep)
	})
	specs := make([]storage.UpsertSpec, 25)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: "t" + strconv.Itoa(i), Delay: time.Duration(i) * time.Millisecond}
	}
	for _, n := range []string{ns, keep} {
		if _, err := s.Upsert(ctx, n, specs); err != nil {
			t.Fatalf("Upsert: %v", err)
		}
	}
	// One in flight, so every state set is covered.
	if _, err := s.Pop(ctx, ns, 1, time.Minute); err != nil {
		t.Fatalf("Pop: %v", err)
	}
	if err := s.MarkIndexed(ctx, ns); err != nil {
		t.Fatalf("MarkIndexed: %v", err)
	}
	n, err := s.DropNamespace(ctx, ns)
	if err != nil || n != 25 {
		t.Fatalf("DropNamespace = %d, %v; want 25", n, err)
	}
	st, err := s.Stats(ctx, ns)
	if err != nil || st.Scheduled+st.Delivered+st.Dead != 0 {
		t.Errorf("Stats after drop = %+v, %v; want empty", st, err)
	}
	if _, err := s.Get(ctx, ns, "t3"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Get after drop: err = %v, want ErrNotFound", err)
	}
	// A re-created namespace must start unindexed, or durable mode would
	// never rebuild it from MySQL.
	if ok, err := s.Indexed(ctx, ns); err != nil || ok {
		t.Errorf("Indexed after drop = %v, %v; want false", ok, err)
	}
	if st, _ := s.Stats(ctx, keep); st.Scheduled+st.Delivered != 25 {
		t.Errorf("the other namespace lost tasks: %+v", st)
	}
	if n, err := s.DropNamespace(ctx, ns); err != nil || n != 0 {
		t.Errorf("second DropNamespace = %d, %v; want 0", n, err)
	}
}

// TestRegistryUnavailableOnTimeout: every registry call against a Redis
// that never answers fails with ErrUnavailable after the per-call timeout.
func TestRegistryUnavailableOnTimeout(t *testing.T) {
	t.Parallel()
	addr := fakeRedis(t, func(string) string { return "" }) // never answers
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{Timeout: 100 * time.Millisecond})
	ctx := context.Background()
	errs := map[string]error{}
	_, errs["create namespace"] = s.CreateNamespace(ctx, storage.Namespace{Name: "slow"})
	_, errs["get namespace"] = s.GetNamespace(ctx, "slow")
	_, _, errs["list namespaces"] = s.ListNamespaces(ctx, "", 10)
	_, errs["update namespace"] = s.UpdateNamespace(ctx, "slow", func(p storage.Policy) (storage.Policy, error) { return p, nil })
	errs["delete namespace"] = s.DeleteNamespace(ctx, "slow")
	errs["create key"] = s.CreateKey(ctx, storage.Key{ID: "0123456789abcdef", Namespace: "slow"})
	_, errs["get key"] = s.GetKey(ctx, "0123456789abcdef")
	_, _, errs["list keys"] = s.ListKeys(ctx, "slow", storage.KeyCursor{}, 10)
	errs["revoke key"] = s.RevokeKey(ctx, "0123456789abcdef")
	_, errs["drop namespace"] = s.DropNamespace(ctx, "slow")
	wantUnavailable(t, errs)
}
