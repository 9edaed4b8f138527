package tenancy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
	"github.com/delayd/delayd/tenancy"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// newStore returns an in-memory registry (storagefake: the real
// registries' semantics, checked by storage/registrytest). The cache is
// what these tests test; the registries have their own conformance runs.
func newStore(t *testing.T) *storagefake.Registry {
	t.Helper()
	return storagefake.NewRegistry(nil)
}

func newName(t *testing.T, store storage.Registry) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "ten-" + hex.EncodeToString(b)
	t.Cleanup(func() { _ = store.DeleteNamespace(context.Background(), name) })
	return name
}

// clock is a manual clock for cache expiry.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newRegistry(t *testing.T, store storage.Registry, clk *clock, autoCreate bool) *tenancy.Registry {
	t.Helper()
	r, err := tenancy.New(tenancy.Config{Store: store, Clock: clk, AutoCreate: autoCreate, TTL: time.Second, MaxStale: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPolicyDefaultsAndTTL: zero fields take the server defaults, and a
// change made on another replica (straight in the store) is seen once the
// TTL has passed, without a restart; until then the cached answer stands.
func TestPolicyDefaultsAndTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, store, clk, false)
	name := newName(t, store)
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name, Policy: storage.Policy{MaxAttempts: 3, RateLimit: 2.5}}); err != nil {
		t.Fatal(err)
	}
	p, err := r.Policy(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	want := storage.DefaultPolicy()
	want.MaxAttempts, want.RateLimit, want.RateBurst = 3, 2.5, 3
	if p != want {
		t.Errorf("Policy = %+v\nwant %+v", p, want)
	}

	if _, err := store.UpdateNamespace(ctx, name, func(p storage.Policy) (storage.Policy, error) {
		p.MaxAttempts = 5
		return p, nil
	}); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Policy(ctx, name); p.MaxAttempts != 3 {
		t.Errorf("within the TTL MaxAttempts = %d, want the cached 3", p.MaxAttempts)
	}
	clk.Add(time.Second)
	if p, _ := r.Policy(ctx, name); p.MaxAttempts != 5 {
		t.Errorf("after the TTL MaxAttempts = %d, want 5", p.MaxAttempts)
	}

	// A change through this Registry is seen at once.
	if _, err := r.UpdateNamespace(ctx, name, func(p storage.Policy) (storage.Policy, error) {
		p.MaxAttempts = 7
		return p, nil
	}); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Policy(ctx, name); p.MaxAttempts != 7 {
		t.Errorf("after a local update MaxAttempts = %d, want 7 at once", p.MaxAttempts)
	}
}

// TestUnknownNamespace: without auto-create an unknown namespace is
// ErrNotFound (and the answer is cached, but a local create clears it); with
// auto-create, Policy creates it with the default policy while Namespace
// without create never does.
func TestUnknownNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	clk := &clock{now: time.Unix(1_000_000, 0)}

	strict := newRegistry(t, store, clk, false)
	name := newName(t, store)
	if _, err := strict.Policy(ctx, name); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Policy(unknown) err = %v, want ErrNotFound", err)
	}
	if _, err := store.GetNamespace(ctx, name); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a strict registry created %q", name)
	}
	if _, err := strict.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Policy(ctx, name); err != nil {
		t.Errorf("Policy after a local create: %v (the cached not-found must be dropped)", err)
	}

	auto := newRegistry(t, store, clk, true)
	fresh := newName(t, store)
	if _, err := auto.Namespace(ctx, fresh, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Namespace(unknown, create false) err = %v, want ErrNotFound", err)
	}
	p, err := auto.Policy(ctx, fresh)
	if err != nil {
		t.Fatalf("Policy with auto-create: %v", err)
	}
	if p != storage.DefaultPolicy() {
		t.Errorf("auto-created policy = %+v, want the defaults", p)
	}
	n, err := store.GetNamespace(ctx, fresh)
	if err != nil || n.Policy != (storage.Policy{}) {
		t.Errorf("stored auto-created namespace = %+v, %v; want a zero (all-default) policy", n, err)
	}
	if _, err := auto.Namespace(ctx, fresh, false); err != nil {
		t.Errorf("Namespace(create false) after auto-create: %v", err)
	}
	if _, err := auto.Policy(ctx, "Not_Valid"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Policy(invalid name) err = %v, want ErrNotFound (never created)", err)
	}
}

// TestKeyCacheAndRevoke: a key is cached for the TTL; a revocation through
// this Registry takes effect at once, one made elsewhere within the TTL.
func TestKeyCacheAndRevoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, store, clk, false)
	name := newName(t, store)
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	newKey := func() storage.Key {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		k := storage.Key{ID: hex.EncodeToString(b), Namespace: name, Scopes: []storage.Scope{storage.ScopeProduce}, CreateTime: time.Now(), Hash: []byte("h")}
		if err := store.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	k1, k2 := newKey(), newKey()
	for _, k := range []storage.Key{k1, k2} {
		if got, err := r.Key(ctx, k.ID); err != nil || got.Namespace != name {
			t.Fatalf("Key(%s) = %+v, %v", k.ID, got, err)
		}
	}
	// Revoked elsewhere: still answered from the cache until the TTL passes.
	if err := store.RevokeKey(ctx, k1.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Key(ctx, k1.ID); err != nil {
		t.Errorf("Key within the TTL after a remote revoke: %v, want the cached key", err)
	}
	clk.Add(time.Second)
	if _, err := r.Key(ctx, k1.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Key after the TTL: err = %v, want ErrNotFound", err)
	}
	// Revoked here: gone at once.
	if err := r.RevokeKey(ctx, k2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Key(ctx, k2.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Key right after a local revoke: err = %v, want ErrNotFound", err)
	}
}

// flaky wraps a real registry and fails every read with ErrUnavailable
// while down is set (a registry outage), counting reads.
type flaky struct {
	storage.Registry
	down  atomic.Bool
	reads atomic.Int64
	gate  chan struct{} // if non-nil, reads wait for it
}

func (f *flaky) GetNamespace(ctx context.Context, name string) (storage.Namespace, error) {
	f.reads.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	if f.down.Load() {
		return storage.Namespace{}, fmt.Errorf("get namespace: %w", storage.ErrUnavailable)
	}
	return f.Registry.GetNamespace(ctx, name)
}

// TestServeStaleDuringOutage: while the registry is unreachable an expired
// answer keeps being served for MaxStale, then the error comes through.
func TestServeStaleDuringOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	f := &flaky{Registry: store}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, f, clk, false)
	name := newName(t, store)
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name, Policy: storage.Policy{MaxAttempts: 4}}); err != nil {
		t.Fatal(err)
	}
	if p, err := r.Policy(ctx, name); err != nil || p.MaxAttempts != 4 {
		t.Fatalf("Policy = %+v, %v", p, err)
	}
	f.down.Store(true)
	clk.Add(30 * time.Second)
	if p, err := r.Policy(ctx, name); err != nil || p.MaxAttempts != 4 {
		t.Errorf("during an outage within MaxStale: Policy = %+v, %v; want the stale policy", p, err)
	}
	clk.Add(time.Minute)
	if _, err := r.Policy(ctx, name); !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("past MaxStale: err = %v, want ErrUnavailable", err)
	}
	f.down.Store(false)
	if p, err := r.Policy(ctx, name); err != nil || p.MaxAttempts != 4 {
		t.Errorf("after the outage: Policy = %+v, %v", p, err)
	}
}

// TestConcurrentMissesShareOneRead: many requests for an uncached namespace
// cost one registry read.
func TestConcurrentMissesShareOneRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	f := &flaky{Registry: store, gate: make(chan struct{})}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, f, clk, false)
	name := newName(t, store)
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	const n = 32
	var started, done sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			_, err := r.Policy(ctx, name)
			errs <- err
		}()
	}
	started.Wait()
	close(f.gate)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Policy: %v", err)
		}
	}
	if got := f.reads.Load(); got != 1 {
		t.Errorf("registry reads = %d, want 1", got)
	}
}

// countingKeys wraps a real registry and counts key reads.
type countingKeys struct {
	storage.Registry
	reads atomic.Int64
}

func (c *countingKeys) GetKey(ctx context.Context, id string) (storage.Key, error) {
	c.reads.Add(1)
	return c.Registry.GetKey(ctx, id)
}

// TestUnknownKeysAreBounded: a flood of made-up key ids costs a bounded
// number of store reads (MaxKeyMisses per second, with its burst) and
// cannot push known keys out of the cache.
func TestUnknownKeysAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	c := &countingKeys{Registry: store}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r, err := tenancy.New(tenancy.Config{Store: c, Clock: clk, MaxEntries: 100, MaxKeyMisses: 10, MaxUnknownKeys: 50})
	if err != nil {
		t.Fatal(err)
	}
	name := newName(t, store)
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	known := storage.Key{ID: "00000000000000aa", Namespace: name, Scopes: []storage.Scope{storage.ScopeConsume}, CreateTime: time.Now(), Hash: []byte("h")}
	if err := store.CreateKey(ctx, known); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.RevokeKey(context.Background(), known.ID) })
	if _, err := r.Key(ctx, known.ID); err != nil {
		t.Fatal(err)
	}
	before := c.reads.Load()
	limited := 0
	for i := range 10_000 {
		_, err := r.Key(ctx, fmt.Sprintf("%016x", 0xbad0000+i))
		switch {
		case errors.Is(err, tenancy.ErrTooManyKeyMisses):
			limited++
		case !errors.Is(err, storage.ErrNotFound):
			t.Fatalf("unknown key %d: %v", i, err)
		}
	}
	if reads := c.reads.Load() - before; reads > 100 {
		t.Errorf("10,000 made-up keys cost %d store reads; want at most the burst (100)", reads)
	}
	if limited == 0 {
		t.Errorf("no lookup was limited")
	}
	// The known key is still answered, from the cache, within its TTL; and
	// refreshed from the store after it, whatever the miss budget says.
	before = c.reads.Load()
	if _, err := r.Key(ctx, known.ID); err != nil {
		t.Errorf("known key after the flood: %v", err)
	}
	if c.reads.Load() != before {
		t.Errorf("the known key was pushed out of the cache by the flood")
	}
	clk.Add(2 * time.Second)
	if err := store.RevokeKey(ctx, known.ID); err != nil {
		t.Fatal(err)
	}
	for i := range 100 { // use the miss budget up again
		_, _ = r.Key(ctx, fmt.Sprintf("%016x", 0xcad0000+i))
	}
	if _, err := r.Key(ctx, known.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a revoked known key after the TTL with the miss budget spent: %v, want ErrNotFound", err)
	}
}

// TestRecreatedNamespaceDropsItsCachedKeys: when a refresh finds a cached
// namespace deleted and re-created elsewhere (another create time, its
// incarnation), the cached keys of that name go too, even those whose own
// TTL has not passed: a key deleted with the old namespace must not be
// served for the new one. ForgetNamespace drops both at once.
func TestRecreatedNamespaceDropsItsCachedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, store, clk, false)
	name := newName(t, store)
	k := createWithKey(t, store, name)
	if _, err := r.Namespace(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	clk.Add(600 * time.Millisecond)
	if _, err := r.Key(ctx, k.ID); err != nil { // cached until 1.6 s
		t.Fatal(err)
	}
	// Deleted (with its keys) and re-created on another replica.
	if err := store.DeleteNamespace(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	clk.Add(600 * time.Millisecond) // the namespace's entry expired, the key's not
	if _, err := r.Key(ctx, k.ID); err != nil {
		t.Fatalf("Key within its TTL: %v, want the cached key (nothing told this replica yet)", err)
	}
	if _, err := r.Namespace(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Key(ctx, k.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Key after the refresh saw the namespace re-created: err = %v, want ErrNotFound", err)
	}

	// ForgetNamespace: the namespace and its keys at once.
	k2 := storage.Key{ID: "fedcba9876543210", Namespace: name, Scopes: []storage.Scope{storage.ScopeProduce}, CreateTime: time.Now(), Hash: []byte("h")}
	if err := store.CreateKey(ctx, k2); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Key(ctx, k2.ID); err != nil {
		t.Fatal(err)
	}
	if err := store.RevokeKey(ctx, k2.ID); err != nil {
		t.Fatal(err)
	}
	r.ForgetNamespace(name)
	if _, err := r.Key(ctx, k2.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Key after ForgetNamespace: err = %v, want ErrNotFound", err)
	}
}

// heldKeys reads a key from the store, then, while armed, waits for the
// test before answering: a key lookup that read the store before a change
// and finishes after it.
type heldKeys struct {
	storage.Registry
	armed   atomic.Bool
	read    chan struct{} // closed once the armed read has read the store
	release chan struct{}
}

func (h *heldKeys) GetKey(ctx context.Context, id string) (storage.Key, error) {
	k, err := h.Registry.GetKey(ctx, id)
	if h.armed.CompareAndSwap(true, false) {
		close(h.read)
		<-h.release
	}
	return k, err
}

// TestKeyReadBeforeDeleteIsNotCached: a key lookup in flight when its
// namespace is deleted through this replica (it read the key before the
// delete) answers its own caller, but its answer is not cached: the next
// lookup reads the store and finds the key gone. Before, the first load of
// an entry was not touched by the delete's forgetIf (it held no value
// yet), and the deleted key was served for a whole TTL after — through
// which a write reached the namespace re-created under the name
// (TestRecycledNamespaceServesNothingOfItsPredecessor, durable mode).
func TestKeyReadBeforeDeleteIsNotCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	h := &heldKeys{Registry: store, read: make(chan struct{}), release: make(chan struct{})}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, h, clk, false)
	name := newName(t, store)
	k := createWithKey(t, store, name)
	h.armed.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := r.Key(ctx, k.ID)
		first <- err
	}()
	<-h.read
	if err := r.DeleteNamespace(ctx, name); err != nil {
		t.Fatal(err)
	}
	close(h.release)
	if err := <-first; err != nil {
		t.Fatalf("the lookup in flight: %v (it read the key before the delete)", err)
	}
	if _, err := r.Key(ctx, k.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Key after its namespace was deleted here: err = %v, want ErrNotFound (the in-flight answer was cached)", err)
	}
}

// TestInvalidatedNamespaceRecreatedDropsItsCachedKeys: a replica that
// dropped its cached namespace on a policy-change notice (Invalidate, as
// the dispatcher does when another replica announces one, e.g. a
// re-created namespace with push) and then reads the name re-created
// (another incarnation) drops the cached keys of the name: the old
// incarnation's keys were deleted with it. Before, only a refresh of a
// held entry compared incarnations, and the invalidated entry's next load
// was not one.
func TestInvalidatedNamespaceRecreatedDropsItsCachedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, store, clk, false)
	name := newName(t, store)
	k := createWithKey(t, store, name)
	if _, err := r.Namespace(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Key(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	// Deleted (with its keys) and re-created on another replica, which
	// announces the new namespace's policy.
	if err := store.DeleteNamespace(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	r.Invalidate(name)
	if _, err := r.Namespace(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Key(ctx, k.ID); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Key after this replica read the name re-created: err = %v, want ErrNotFound", err)
	}
}

// heldNamespaces reads a namespace from the store, then, while armed,
// waits for the test before answering.
type heldNamespaces struct {
	storage.Registry
	armed   atomic.Bool
	read    chan struct{}
	release chan struct{}
}

func (h *heldNamespaces) arm() {
	h.read, h.release = make(chan struct{}), make(chan struct{})
	h.armed.Store(true)
}

func (h *heldNamespaces) GetNamespace(ctx context.Context, name string) (storage.Namespace, error) {
	n, err := h.Registry.GetNamespace(ctx, name)
	if h.armed.CompareAndSwap(true, false) {
		close(h.read)
		<-h.release
	}
	return n, err
}

// TestAnswerReadBeforeCreateIsNeverServedStale: a "not found" read before
// the namespace was created through this replica (its load was in flight
// then) answers its own caller, and is never served again — not while
// the next load is in flight either (the cache serves a held answer to
// callers who come while another refreshes it). Before, a re-created
// namespace's own key was answered NotFound for its namespace
// (TestRecycledNamespaceServesNothingOfItsPredecessor, durable mode).
func TestAnswerReadBeforeCreateIsNeverServedStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	h := &heldNamespaces{Registry: store}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r := newRegistry(t, h, clk, false)
	name := newName(t, store)
	h.arm()
	first := make(chan error, 1)
	go func() {
		_, err := r.Namespace(ctx, name, false)
		first <- err
	}()
	<-h.read
	if _, err := r.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	close(h.release)
	if err := <-first; !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the lookup in flight: %v, want its own NotFound", err)
	}
	// The next load hangs; a caller meanwhile must wait for it, not be
	// handed the NotFound read before the create.
	h.arm()
	second := make(chan error, 1)
	go func() {
		_, err := r.Namespace(ctx, name, false)
		second <- err
	}()
	<-h.read
	wait, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := r.Namespace(wait, name, false); errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a lookup while the namespace's load is in flight: %v; the NotFound read before the create was served", err)
	}
	close(h.release)
	if err := <-second; err != nil {
		t.Errorf("the load after the create: %v", err)
	}
}

// createWithKey creates namespace name in store with a produce key of its
// own, and returns the key.
func createWithKey(t *testing.T, store storage.Registry, name string) storage.Key {
	t.Helper()
	ctx := context.Background()
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	k := storage.Key{ID: "0123456789abcdef", Namespace: name, Scopes: []storage.Scope{storage.ScopeProduce}, CreateTime: time.Now(), Hash: []byte("h")}
	if err := store.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	return k
}
