package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// downRegistry answers GetNamespace with a namespace of 4 shards until down
// is set, then fails as a hung or unreachable MySQL registry does.
type downRegistry struct {
	storage.Registry
	down  atomic.Bool
	calls atomic.Int64
}

func (r *downRegistry) GetNamespace(_ context.Context, name string) (storage.Namespace, error) {
	r.calls.Add(1)
	if r.down.Load() {
		return storage.Namespace{}, fmt.Errorf("get namespace: %w", storage.ErrUnavailable)
	}
	return storage.Namespace{Name: name, Policy: storage.Policy{Shards: 4}}, nil
}

// TestRegistryShardsServeLastCountWhenRegistryDown: once a namespace's
// shard count expired from the cache, a registry that cannot answer (durable
// mode with MySQL hung or cut) does not fail the Redis call that needs the
// count: the last count is used (it is fixed for the namespace's life), and
// the registry is asked again on the next call. Before, every index call of
// the namespace failed once the cache expired during a MySQL outage: acks,
// lease renewals and pops (TestFaultMySQLCutDurable/hold saw its 100 held
// deliveries redelivered).
func TestRegistryShardsServeLastCountWhenRegistryDown(t *testing.T) {
	reg := &downRegistry{}
	rs := NewRegistryShards(reg)
	ctx := context.Background()
	if n, err := rs.Shards(ctx, "orders"); n != 4 || err != nil {
		t.Fatalf("Shards = %d, %v; want 4", n, err)
	}
	rs.cache.Store("orders", shardEntry{n: 4, at: time.Now().Add(-2 * ShardCacheTTL)}) // expired
	reg.down.Store(true)
	before := reg.calls.Load()
	if n, err := rs.Shards(ctx, "orders"); n != 4 || err != nil {
		t.Fatalf("Shards with the registry down and an expired count = %d, %v; want the last count, 4", n, err)
	}
	if reg.calls.Load() == before {
		t.Fatal("the expired count was used without asking the registry")
	}
	// Never counted: no count to fall back on, the error is returned.
	if _, err := rs.Shards(ctx, "never-seen"); err == nil {
		t.Fatal("Shards of a namespace never counted, registry down: no error")
	}
}
