package redisstore

import (
	"context"
	"errors"
	"slices"
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
		_, _ = s.DropNamespace(context.Background(), ns, 0)
		_, _ = s.DropNamespace(context.Background(), keep, 0)
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
	if _, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute}); err != nil {
		t.Fatalf("Pop: %v", err)
	}
	if err := s.MarkIndexed(ctx, ns); err != nil {
		t.Fatalf("MarkIndexed: %v", err)
	}
	n, err := s.DropNamespace(ctx, ns, 0)
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
	if n, err := s.DropNamespace(ctx, ns, 0); err != nil || n != 0 {
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
	_, errs["drop namespace"] = s.DropNamespace(ctx, "slow", 0)
	wantUnavailable(t, errs)
}

// TestNamespaceIncarnation: upserts name the namespace incarnation they
// write for; DropNamespace with an incarnation ends it, so writes for it
// (or an earlier one), unchecked writes and Restore write nothing until a
// later incarnation claims the namespace; an incarnation that never ended
// writes even when a later one has.
func TestNamespaceIncarnation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := registryTestStore(t)
	ns := "life-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		_, _ = s.DropNamespace(context.Background(), ns, 0)
		_ = s.rdb.Del(context.Background(), keysFor(ns, 0).life).Err()
	})
	up := func(inc int64, id string) error {
		_, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Delay: time.Hour, NamespaceIncarnation: inc}})
		return err
	}
	ended := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, storage.ErrNamespaceEnded) {
			t.Errorf("%s: err = %v, want ErrNamespaceEnded", what, err)
		}
	}
	if err := up(100, "a"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DropNamespace(ctx, ns, 100); err != nil || n != 1 {
		t.Fatalf("DropNamespace(100) = %d, %v; want 1", n, err)
	}
	ended("the deleted incarnation's upsert", up(100, "stale"))
	ended("an earlier incarnation's upsert", up(50, "stale"))
	ended("an unchecked upsert into the deleted namespace", up(0, "stale"))
	ended("a claim of the deleted incarnation", s.ClaimIncarnation(ctx, ns, 100))
	if n, err := s.Restore(ctx, ns, []storage.Task{{ID: "stale", Incarnation: 1, Generation: 1, State: storage.StateScheduled, DueTime: time.Now().Add(time.Hour)}}, storage.RestoreParams{}); err != nil || n != 0 {
		t.Errorf("Restore into the deleted namespace = %d, %v; want 0", n, err)
	}
	if st, _ := s.Stats(ctx, ns); st.Scheduled != 0 {
		t.Fatalf("the deleted namespace holds %d tasks", st.Scheduled)
	}
	if nss, err := s.Namespaces(ctx); err != nil || slices.Contains(nss, ns) {
		t.Errorf("Namespaces lists %q, which only has its incarnation key (%v)", ns, err)
	}
	// Re-created: a later incarnation writes, and unchecked writes are
	// allowed again.
	if err := s.ClaimIncarnation(ctx, ns, 200); err != nil {
		t.Fatal(err)
	}
	if err := up(200, "new"); err != nil {
		t.Fatal(err)
	}
	if err := up(0, "unchecked"); err != nil {
		t.Fatal(err)
	}
	// An incarnation before the live one that never ended may write (a
	// registry switched back to an older copy of the namespace records).
	if err := up(150, "older-copy"); err != nil {
		t.Errorf("an older, never ended incarnation: %v", err)
	}
	ended("the deleted incarnation, after a later one wrote", up(100, "stale"))
	if st, _ := s.Stats(ctx, ns); st.Scheduled != 3 {
		t.Errorf("the new incarnation holds %d tasks, want 3", st.Scheduled)
	}
}
