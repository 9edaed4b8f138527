// Package registrytest is the conformance suite every storage.Registry
// implementation passes (redisstore in Redis-only mode, mysqlstore in durable
// mode): namespaces and API keys, created, read, listed, updated under
// concurrency, deleted with their keys.
//
// A registry's own test calls Run with a constructor:
//
//	func TestRegistryConformance(t *testing.T) {
//		registrytest.Run(t, func(t *testing.T) storage.Registry { return newTestRegistry(t) })
//	}
//
// Every subtest runs in parallel with names carrying a random suffix, and
// deletes what it created when it ends, so the suite shares a store with
// other tests safely.
package registrytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delayd/delayd/storage"
)

// Run runs the suite as subtests of t. newRegistry is called once per
// subtest, from that subtest's goroutine.
func Run(t *testing.T, newRegistry func(t *testing.T) storage.Registry) {
	t.Run("CreateGet", func(t *testing.T) { testCreateGet(t, newRegistry(t)) })
	t.Run("List", func(t *testing.T) { testList(t, newRegistry(t)) })
	t.Run("Update", func(t *testing.T) { testUpdate(t, newRegistry(t)) })
	t.Run("ConcurrentUpdates", func(t *testing.T) { testConcurrentUpdates(t, newRegistry(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newRegistry(t)) })
	t.Run("RecreatedIsBornLater", func(t *testing.T) { testRecreatedIsBornLater(t, newRegistry(t)) })
	t.Run("Keys", func(t *testing.T) { testKeys(t, newRegistry(t)) })
	t.Run("GlobalKeys", func(t *testing.T) { testGlobalKeys(t, newRegistry(t)) })
	t.Run("KeyPages", func(t *testing.T) { testKeyPages(t, newRegistry(t)) })
}

func rnd(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newName returns a fresh namespace name and deletes the namespace when the
// test ends.
func newName(t *testing.T, r storage.Registry, prefix string) string {
	t.Helper()
	name := prefix + rnd(6)
	t.Cleanup(func() { _ = r.DeleteNamespace(context.Background(), name) })
	return name
}

func samplePolicy() storage.Policy {
	return storage.Policy{
		AckTimeout:  45 * time.Second,
		MaxAttempts: 7,
		Backoff: storage.Backoff{
			Initial: 250 * time.Millisecond, Max: time.Minute, Multiplier: 1.5, Jitter: 0.1,
		},
		MaxPayloadBytes: 1024,
		MaxPendingTasks: 5000,
		RateLimit:       12.5,
		RateBurst:       20,
		MaxSubscribers:  3,
		MaxDelay:        48 * time.Hour,
		Paused:          true,
		MaxDispatchRate: 2.5,
		Push:            storage.PushTarget{URL: "https://hooks.example.com/delayd", Secret: "0123456789abcdef-secret"},
	}
}

func mustCreate(t *testing.T, r storage.Registry, ns storage.Namespace) storage.Namespace {
	t.Helper()
	got, err := r.CreateNamespace(context.Background(), ns)
	if err != nil {
		t.Fatalf("CreateNamespace(%q): %v", ns.Name, err)
	}
	return got
}

func testCreateGet(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	name := newName(t, r, "rt-create-")
	created := mustCreate(t, r, storage.Namespace{Name: name, Policy: samplePolicy()})
	if created.CreateTime.IsZero() || !created.UpdateTime.Equal(created.CreateTime) {
		t.Errorf("created times = %v / %v; want set and equal", created.CreateTime, created.UpdateTime)
	}
	if diff := cmp.Diff(samplePolicy(), created.Policy); diff != "" {
		t.Errorf("created policy (-want +got):\n%s", diff)
	}
	got, err := r.GetNamespace(ctx, name)
	if err != nil {
		t.Fatalf("GetNamespace: %v", err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("GetNamespace (-created +got):\n%s", diff)
	}
	if _, err := r.CreateNamespace(ctx, storage.Namespace{Name: name}); !errors.Is(err, storage.ErrAlreadyExists) {
		t.Errorf("second CreateNamespace: err = %v, want ErrAlreadyExists", err)
	}
	if _, err := r.GetNamespace(ctx, "rt-missing-"+rnd(6)); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("GetNamespace(missing): err = %v, want ErrNotFound", err)
	}
	// A zero policy (every field the server default) round-trips as zero.
	zero := newName(t, r, "rt-zero-")
	mustCreate(t, r, storage.Namespace{Name: zero})
	got, err = r.GetNamespace(ctx, zero)
	if err != nil || !cmp.Equal(got.Policy, storage.Policy{}) {
		t.Errorf("GetNamespace(zero policy) = %+v, %v; want a zero policy", got.Policy, err)
	}
}

func testList(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	prefix := "rt-list-" + rnd(4) + "-"
	var want []string
	for _, s := range []string{"e", "a", "c", "b", "d"} {
		name := prefix + s
		t.Cleanup(func() { _ = r.DeleteNamespace(context.Background(), name) })
		mustCreate(t, r, storage.Namespace{Name: name})
	}
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		want = append(want, prefix+s)
	}
	// Page through from just before the prefix, two at a time, until the
	// names leave the prefix's range: others' namespaces may follow ours.
	var got []string
	after := prefix[:len(prefix)-1] // sorts before every prefix+"x"
	for pages := 0; pages < 10; pages++ {
		nss, more, err := r.ListNamespaces(ctx, after, 2)
		if err != nil {
			t.Fatalf("ListNamespaces(%q): %v", after, err)
		}
		if len(nss) > 2 {
			t.Fatalf("ListNamespaces(limit 2) returned %d", len(nss))
		}
		done := !more
		for _, n := range nss {
			if len(n.Name) < len(prefix) || n.Name[:len(prefix)] != prefix {
				done = true
				break
			}
			got = append(got, n.Name)
		}
		if done || len(nss) == 0 {
			break
		}
		after = nss[len(nss)-1].Name
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("listed names (-want +got):\n%s", diff)
	}
}

func testUpdate(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	name := newName(t, r, "rt-update-")
	created := mustCreate(t, r, storage.Namespace{Name: name, Policy: samplePolicy()})

	var seen storage.Policy
	updated, err := r.UpdateNamespace(ctx, name, func(p storage.Policy) (storage.Policy, error) {
		seen = p
		p.MaxAttempts = 3
		p.RateLimit = 0
		return p, nil
	})
	if err != nil {
		t.Fatalf("UpdateNamespace: %v", err)
	}
	if diff := cmp.Diff(samplePolicy(), seen); diff != "" {
		t.Errorf("update saw (-stored +seen):\n%s", diff)
	}
	want := samplePolicy()
	want.MaxAttempts, want.RateLimit = 3, 0
	if diff := cmp.Diff(want, updated.Policy); diff != "" {
		t.Errorf("updated policy (-want +got):\n%s", diff)
	}
	if !updated.CreateTime.Equal(created.CreateTime) || updated.UpdateTime.Before(created.UpdateTime) {
		t.Errorf("times after update: create %v (was %v), update %v (was %v)",
			updated.CreateTime, created.CreateTime, updated.UpdateTime, created.UpdateTime)
	}
	got, err := r.GetNamespace(ctx, name)
	if err != nil || !cmp.Equal(want, got.Policy) {
		t.Errorf("GetNamespace after update = %+v, %v; want policy %+v", got.Policy, err, want)
	}

	// An error from update is returned as is, and nothing is written.
	boom := errors.New("boom")
	if _, err := r.UpdateNamespace(ctx, name, func(p storage.Policy) (storage.Policy, error) {
		p.MaxAttempts = 99
		return p, boom
	}); !errors.Is(err, boom) {
		t.Errorf("UpdateNamespace(failing update): err = %v, want boom", err)
	}
	if got, _ := r.GetNamespace(ctx, name); got.Policy.MaxAttempts != 3 {
		t.Errorf("after a failed update MaxAttempts = %d, want 3 (unchanged)", got.Policy.MaxAttempts)
	}
	if _, err := r.UpdateNamespace(ctx, "rt-missing-"+rnd(6), func(p storage.Policy) (storage.Policy, error) { return p, nil }); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("UpdateNamespace(missing): err = %v, want ErrNotFound", err)
	}
}

// testConcurrentUpdates: read-modify-write updates racing each other are
// all applied (no lost update).
func testConcurrentUpdates(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	name := newName(t, r, "rt-race-")
	mustCreate(t, r, storage.Namespace{Name: name, Policy: storage.Policy{MaxAttempts: 1}})
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.UpdateNamespace(ctx, name, func(p storage.Policy) (storage.Policy, error) {
				p.MaxAttempts++
				return p, nil
			})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("UpdateNamespace: %v", err)
		}
	}
	got, err := r.GetNamespace(ctx, name)
	if err != nil || got.Policy.MaxAttempts != 1+n {
		t.Errorf("after %d concurrent increments MaxAttempts = %d (%v), want %d", n, got.Policy.MaxAttempts, err, 1+n)
	}
}

func newKey(ns string, scopes ...storage.Scope) (storage.Key, string) {
	id := rnd(8)
	secret := "dk_" + id + "_" + rnd(16)
	h := sha256.Sum256([]byte(secret))
	return storage.Key{
		ID:          id,
		Namespace:   ns,
		Scopes:      scopes,
		Description: "test key " + id,
		CreateTime:  time.Now().Truncate(time.Millisecond),
		Hash:        h[:],
	}, secret
}

// testRecreatedIsBornLater: a namespace's create time is its incarnation
// (Subscribe streams and cached policies are tied to it), so a namespace
// deleted and re-created, however fast, is always born later: with equal
// create times a stream of the deleted namespace would keep receiving the
// new owner's tasks. Deleting and re-creating in a tight loop puts many
// rounds in the same millisecond.
func testRecreatedIsBornLater(t *testing.T, r storage.Registry) {
	ctx := context.Background()
	name := newName(t, r, "rt-born-")
	var last time.Time
	for i := range 30 {
		ns, err := r.CreateNamespace(ctx, storage.Namespace{Name: name})
		if err != nil {
			t.Fatalf("round %d: CreateNamespace: %v", i, err)
		}
		if got, err := r.GetNamespace(ctx, name); err != nil || !got.CreateTime.Equal(ns.CreateTime) {
			t.Fatalf("round %d: GetNamespace = %v, %v; want create time %v", i, got.CreateTime, err, ns.CreateTime)
		}
		if !ns.CreateTime.After(last) {
			t.Fatalf("round %d: re-created namespace born %v, not after the deleted one (%v)", i, ns.CreateTime, last)
		}
		last = ns.CreateTime
		if err := r.DeleteNamespace(ctx, name); err != nil {
			t.Fatalf("round %d: DeleteNamespace: %v", i, err)
		}
	}
}

func testDelete(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	name := newName(t, r, "rt-delete-")
	other := newName(t, r, "rt-keep-")
	mustCreate(t, r, storage.Namespace{Name: name})
	mustCreate(t, r, storage.Namespace{Name: other})
	k1, _ := newKey(name, storage.ScopeProduce)
	k2, _ := newKey(other, storage.ScopeConsume)
	for _, k := range []storage.Key{k1, k2} {
		if err := r.CreateKey(ctx, k); err != nil {
			t.Fatalf("CreateKey: %v", err)
		}
	}
	if err := r.DeleteNamespace(ctx, name); err != nil {
		t.Fatalf("DeleteNamespace: %v", err)
	}
	if _, err := r.GetNamespace(ctx, name); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("GetNamespace after delete: err = %v, want ErrNotFound", err)
	}
	if _, err := r.GetKey(ctx, k1.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("GetKey of the deleted namespace's key: err = %v, want ErrNotFound (keys go with their namespace)", err)
	}
	if keys, err := allKeys(ctx, r, name); err != nil || len(keys) != 0 {
		t.Errorf("ListKeys(deleted) = %d keys, %v; want none", len(keys), err)
	}
	if _, err := r.GetKey(ctx, k2.ID); err != nil {
		t.Errorf("GetKey of another namespace's key: %v (must survive)", err)
	}
	if err := r.DeleteNamespace(ctx, name); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("second DeleteNamespace: err = %v, want ErrNotFound", err)
	}
	// A namespace created again under the same name starts with no keys.
	mustCreate(t, r, storage.Namespace{Name: name})
	if keys, err := allKeys(ctx, r, name); err != nil || len(keys) != 0 {
		t.Errorf("ListKeys(recreated) = %d keys, %v; want none", len(keys), err)
	}
}

func testKeys(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	name := newName(t, r, "rt-keys-")
	mustCreate(t, r, storage.Namespace{Name: name})

	var keys []storage.Key
	for i, scopes := range [][]storage.Scope{
		{storage.ScopeProduce},
		{storage.ScopeConsume, storage.ScopeProduce},
		{storage.ScopeAdmin},
	} {
		k, _ := newKey(name, scopes...)
		k.CreateTime = k.CreateTime.Add(time.Duration(i) * time.Millisecond) // distinct, increasing
		if err := r.CreateKey(ctx, k); err != nil {
			t.Fatalf("CreateKey: %v", err)
		}
		keys = append(keys, k)
	}
	got, err := r.GetKey(ctx, keys[1].ID)
	if err != nil {
		t.Fatalf("GetKey: %v", err)
	}
	if diff := cmp.Diff(keys[1], got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("GetKey (-created +got):\n%s", diff)
	}
	if !bytes.Equal(got.Hash, keys[1].Hash) {
		t.Errorf("hash does not round-trip")
	}
	if err := r.CreateKey(ctx, keys[0]); !errors.Is(err, storage.ErrAlreadyExists) {
		t.Errorf("CreateKey(same id): err = %v, want ErrAlreadyExists", err)
	}
	orphan, _ := newKey("rt-missing-"+rnd(6), storage.ScopeProduce)
	if err := r.CreateKey(ctx, orphan); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("CreateKey(namespace missing): err = %v, want ErrNotFound", err)
	}

	list, err := allKeys(ctx, r, name)
	if err != nil {
		t.Fatalf("ListKeys: %v", err)
	}
	want := []storage.Key{keys[2], keys[1], keys[0]} // newest first
	if diff := cmp.Diff(want, list, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("ListKeys (-want +got):\n%s", diff)
	}

	if err := r.RevokeKey(ctx, keys[1].ID); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	if _, err := r.GetKey(ctx, keys[1].ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("GetKey(revoked): err = %v, want ErrNotFound", err)
	}
	if err := r.RevokeKey(ctx, keys[1].ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("RevokeKey(again): err = %v, want ErrNotFound", err)
	}
	list, _ = allKeys(ctx, r, name)
	if len(list) != 2 {
		t.Errorf("ListKeys after revoke: %d keys, want 2", len(list))
	}
	if _, err := r.GetKey(ctx, rnd(8)); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("GetKey(unknown): err = %v, want ErrNotFound", err)
	}
}

func testGlobalKeys(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	k, _ := newKey(storage.GlobalNamespace, storage.ScopeAdmin, storage.ScopeProduce)
	if err := r.CreateKey(ctx, k); err != nil {
		t.Fatalf("CreateKey(global): %v", err)
	}
	t.Cleanup(func() { _ = r.RevokeKey(context.Background(), k.ID) })
	got, err := r.GetKey(ctx, k.ID)
	if err != nil || got.Namespace != storage.GlobalNamespace {
		t.Fatalf("GetKey(global) = %+v, %v", got, err)
	}
	list, err := allKeys(ctx, r, storage.GlobalNamespace)
	if err != nil {
		t.Fatalf("ListKeys(*): %v", err)
	}
	found := false
	for _, l := range list {
		found = found || l.ID == k.ID
	}
	if !found {
		t.Errorf("ListKeys(*) lacks the global key %s", k.ID)
	}
	if err := r.RevokeKey(ctx, k.ID); err != nil {
		t.Errorf("RevokeKey(global): %v", err)
	}
}

// allKeys pages through the keys of ns, two at a time.
func allKeys(ctx context.Context, r storage.Registry, ns string) ([]storage.Key, error) {
	var (
		out   []storage.Key
		after storage.KeyCursor
	)
	for range 100000 {
		page, more, err := r.ListKeys(ctx, ns, after, 2)
		if err != nil {
			return nil, err
		}
		if len(page) > 2 {
			return nil, fmt.Errorf("a page of %d keys for limit 2", len(page))
		}
		out = append(out, page...)
		if !more || len(page) == 0 {
			return out, nil
		}
		after = storage.CursorOf(page[len(page)-1])
	}
	return nil, errors.New("ListKeys: no last page")
}

// testKeyPages: ListKeys pages newest first, keys created in the same
// millisecond by id (descending), and a page goes on after its cursor's key
// was revoked.
func testKeyPages(t *testing.T, r storage.Registry) {
	t.Parallel()
	ctx := context.Background()
	name := newName(t, r, "rt-kpages-")
	mustCreate(t, r, storage.Namespace{Name: name})
	var keys []storage.Key
	base := time.Now().Truncate(time.Millisecond)
	for i := range 7 {
		k, _ := newKey(name, storage.ScopeProduce)
		k.CreateTime = base.Add(time.Duration(i/3) * time.Millisecond) // three share each millisecond
		if err := r.CreateKey(ctx, k); err != nil {
			t.Fatalf("CreateKey: %v", err)
		}
		keys = append(keys, k)
	}
	want := slices.Clone(keys)
	slices.SortFunc(want, func(a, b storage.Key) int {
		if c := b.CreateTime.Compare(a.CreateTime); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	ids := func(ks []storage.Key) []string {
		var out []string
		for _, k := range ks {
			out = append(out, k.ID)
		}
		return out
	}
	got, err := allKeys(ctx, r, name)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ids(want), ids(got)); diff != "" {
		t.Errorf("ListKeys pages (-want +got):\n%s", diff)
	}
	page, more, err := r.ListKeys(ctx, name, storage.KeyCursor{}, 4)
	if err != nil || len(page) != 4 || !more {
		t.Fatalf("first page: %d keys, more %v, %v; want 4 and more", len(page), more, err)
	}
	// The cursor's key is revoked before the next page is read.
	if err := r.RevokeKey(ctx, page[3].ID); err != nil {
		t.Fatal(err)
	}
	rest, more, err := r.ListKeys(ctx, name, storage.CursorOf(page[3]), 10)
	if err != nil || more {
		t.Fatalf("second page: more %v, %v", more, err)
	}
	if diff := cmp.Diff(ids(want[4:]), ids(rest)); diff != "" {
		t.Errorf("page after a revoked cursor (-want +got):\n%s", diff)
	}
}
