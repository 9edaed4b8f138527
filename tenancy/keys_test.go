package tenancy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/tenancy"
)

// newKey creates a key of ns straight in store (as another replica would)
// and returns it.
func newKey(t *testing.T, store storage.Registry, ns string, i int) storage.Key {
	t.Helper()
	k := storage.Key{ID: fmt.Sprintf("%016x", 0xa0000+i), Namespace: ns, Scopes: []storage.Scope{storage.ScopeProduce},
		CreateTime: time.Now(), Hash: []byte("h")}
	if err := store.CreateKey(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.RevokeKey(context.Background(), k.ID) })
	return k
}

// TestMissBudgetIsPerCaller (issue 42 item 2): a caller that spends its
// miss budget on made-up ids is refused ErrTooManyKeyMisses, while another
// caller's lookups of ids the cache does not hold (a made-up one, a key
// created on another replica) still reach the store.
func TestMissBudgetIsPerCaller(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r, err := tenancy.New(tenancy.Config{Store: store, Clock: clk, MaxKeyMisses: 1000, MaxKeyMissesPerCaller: 5})
	if err != nil {
		t.Fatal(err)
	}
	flooder := tenancy.WithCaller(ctx, "127.0.0.2/32")
	limited := 0
	for i := range 1000 {
		if _, err := r.Key(flooder, fmt.Sprintf("%016x", 0xbad0000+i)); errors.Is(err, tenancy.ErrTooManyKeyMisses) {
			limited++
		}
	}
	if limited != 1000-50 { // the per-caller burst is ten times the rate
		t.Errorf("%d of the flooder's 1,000 made-up ids were limited; want all but its burst of 50", limited)
	}
	name := newName(t, store)
	if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
		t.Fatal(err)
	}
	k := newKey(t, store, name, 1)
	other := tenancy.WithCaller(ctx, "127.0.0.3/32")
	if _, err := r.Key(other, "00000000deadbeef"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("another caller's made-up id during the flood: %v; want ErrNotFound (looked up)", err)
	}
	if got, err := r.Key(other, k.ID); err != nil || got.ID != k.ID {
		t.Errorf("another caller's new key during the flood: %v, %v; want it", got, err)
	}
}

// TestWarmKeysCachesEveryKey (issue 42 item 2): WarmKeys reads every key
// of the registry, global and per namespace over pages, and the lookups
// that follow cost no store read and no miss budget.
func TestWarmKeysCachesEveryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	c := &countingKeys{Registry: store}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	var keys []storage.Key
	for n := range 3 {
		name := newName(t, store)
		if _, err := store.CreateNamespace(ctx, storage.Namespace{Name: name}); err != nil {
			t.Fatal(err)
		}
		for i := range 300 { // past one page of WarmKeys
			keys = append(keys, newKey(t, store, name, n*1000+i))
		}
	}
	keys = append(keys, newKey(t, store, storage.GlobalNamespace, 9999))
	r, err := tenancy.New(tenancy.Config{Store: c, Clock: clk, MaxKeyMisses: 1, MaxKeyMissesPerCaller: 1})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.WarmKeys(ctx)
	if err != nil || n < len(keys) {
		t.Fatalf("WarmKeys = %d, %v; want at least the %d keys made", n, err, len(keys))
	}
	flooder := tenancy.WithCaller(ctx, "127.0.0.2/32")
	for i := range 100 { // spend both budgets
		_, _ = r.Key(flooder, fmt.Sprintf("%016x", 0xbad0000+i))
	}
	before := c.reads.Load()
	for _, k := range keys {
		if got, err := r.Key(flooder, k.ID); err != nil || got.Namespace != k.Namespace {
			t.Fatalf("warmed key %s: %v, %v", k.ID, got, err)
		}
	}
	if reads := c.reads.Load() - before; reads != 0 {
		t.Errorf("%d warmed keys cost %d store reads; want none", len(keys), reads)
	}
}

// TestCreatedKeyIsCached: a key created through the Registry is in its
// cache at once: its first use costs no lookup, whatever the budgets say.
func TestCreatedKeyIsCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t)
	c := &countingKeys{Registry: store}
	clk := &clock{now: time.Unix(1_000_000, 0)}
	r, err := tenancy.New(tenancy.Config{Store: c, Clock: clk, MaxKeyMisses: 1, MaxKeyMissesPerCaller: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 { // spend both budgets
		_, _ = r.Key(ctx, fmt.Sprintf("%016x", 0xbad0000+i))
	}
	k := storage.Key{ID: "00000000000000cc", Namespace: storage.GlobalNamespace, Scopes: []storage.Scope{storage.ScopeAdmin},
		CreateTime: time.Now(), Hash: []byte("h")}
	if err := r.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.RevokeKey(context.Background(), k.ID) })
	before := c.reads.Load()
	if got, err := r.Key(ctx, k.ID); err != nil || got.ID != k.ID {
		t.Errorf("the created key: %v, %v; want it from the cache", got, err)
	}
	if reads := c.reads.Load() - before; reads != 0 {
		t.Errorf("the created key's first use cost %d store reads; want none", reads)
	}
}
