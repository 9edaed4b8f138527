package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storetest"
)

// runConformance runs the suites on c, the schedule suite on sc (see
// ownRedisClient).
func runConformance(t *testing.T, c, sc redis.UniversalClient) {
	runConformanceOpts(t, c, sc, Options{})
}

func runConformanceOpts(t *testing.T, c, sc redis.UniversalClient, opts Options) {
	storetest.Run(t, func(t *testing.T) storage.Store { return New(c, opts) })
	storetest.RunWakeups(t, func(t *testing.T) storetest.WakeupStore { return New(c, opts) })
	storetest.RunHistory(t, func(t *testing.T) storetest.HistoryStore { return New(c, opts) })
	storetest.RunSchedules(t, 1, func(t *testing.T) storetest.ScheduleStore { return New(sc, opts) })
}

// ownRedisClient is a client of a redis-server of t's own, for the
// schedule suite beside a suite on the shared test Redis: every delayd
// that other packages' tests (and other checkouts' make test) run on the
// shared Redis steps the due schedules of every namespace there, its own
// loop's Advance moving the suite's schedules while ScheduleDue reads
// them ("limit 1: 0 schedules of the namespace").
func ownRedisClient(t *testing.T) *redis.Client {
	return testkit.RedisAt(t, testkit.StartRedis(t).URL)
}

// TestConformance runs the store suite against the real Redis.
func TestConformance(t *testing.T) {
	t.Parallel()
	runConformance(t, testRedisClient(t), ownRedisClient(t))
}

// TestConformanceEmbedded runs the same suite against miniredis, the
// embedded mode's store: the same Lua scripts must behave the same.
func TestConformanceEmbedded(t *testing.T) {
	t.Parallel()
	c := testMiniClient(t)
	runConformance(t, c, c)
}

// TestConformanceCluster runs the suite against the shared 3-master,
// 3-replica Redis Cluster (testkit.SharedCluster) through a ClusterClient:
// every script's keys must hash to one slot (Redis refuses cross-slot
// scripts), and wake-ups cross nodes.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	c := sharedClusterClient(t) // no loop runs on it: it is this process's
	runConformance(t, c, c)
}

// sharedClusterClient is a ClusterClient of testkit.SharedCluster, closed
// when t ends.
func sharedClusterClient(t *testing.T) *redis.ClusterClient {
	cc := testkit.SharedCluster(t).Client()
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestConformanceSplitScripts runs the suite with a script byte budget so
// small that every upsert, ack, nack and extend call is split into one
// script call per item: splitting by bytes changes no answer.
func TestConformanceSplitScripts(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	storetest.Run(t, func(t *testing.T) storage.Store { return New(c, Options{MaxScriptBytes: 1}) })
}

func runConformanceSharded(t *testing.T, c, sc redis.UniversalClient, opts Options) {
	storetest.RunSharded(t, func(t *testing.T) storage.Store { return New(c, opts) })
	storetest.RunWakeups(t, func(t *testing.T) storetest.WakeupStore { return New(c, opts) })
	storetest.RunHistory(t, func(t *testing.T) storetest.HistoryStore { return New(c, opts) })
	n, _ := opts.Shards.Shards(context.Background(), "")
	storetest.RunSchedules(t, n, func(t *testing.T) storetest.ScheduleStore { return New(sc, opts) })
}

// TestConformanceSharded runs the suite with every namespace in 4 shards
// (so a test's tasks spread over them): batch calls split per shard, Pop
// allocates across shards in due order, List merges, walks and scans cross
// shards, and every answer stays what one shard gives.
func TestConformanceSharded(t *testing.T) {
	t.Parallel()
	runConformanceSharded(t, testRedisClient(t), ownRedisClient(t), Options{Shards: FixedShards(4)})
}

// TestConformanceShardedCluster is TestConformanceSharded on the shared
// 3-master, 3-replica cluster: each shard of a namespace has its own slot.
func TestConformanceShardedCluster(t *testing.T) {
	t.Parallel()
	c := sharedClusterClient(t)
	runConformanceSharded(t, c, c, Options{Shards: FixedShards(6)})
}

// TestShardsOnEveryMaster: a namespace of 6 shards on a 3-master cluster
// has keys on every master, 2 shards each (shardTag spreads the shards over
// the slot space), and its tasks spread over all 6 shards.
func TestShardsOnEveryMaster(t *testing.T) {
	t.Parallel()
	cl := testkit.SharedCluster(t)
	s := New(sharedClusterClient(t), Options{Shards: FixedShards(6)})
	ns := storetest.Namespace(t)
	ctx := t.Context()
	var specs []storage.UpsertSpec
	for i := range 600 {
		specs = append(specs, storage.UpsertSpec{ID: fmt.Sprintf("task-%d", i), Delay: time.Hour})
	}
	if _, err := s.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.DropNamespace(context.Background(), ns, 0) })
	masters, err := cl.MasterNodes(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters: %d, %v", len(masters), err)
	}
	tags := map[string]bool{}
	for _, m := range masters {
		c := m.Client()
		keys, err := c.Keys(ctx, "delayd:{"+ns+"#*}:due").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 2 {
			t.Errorf("master %s holds the due sets %v; want 2 of the 6 shards", m.Addr, keys)
		}
		for _, k := range keys {
			tags[k] = true
		}
	}
	if len(tags) != 6 {
		t.Errorf("due sets of %d shards, want 6", len(tags))
	}
	st, err := s.Stats(ctx, ns)
	if err != nil || st.Scheduled != 600 {
		t.Fatalf("Stats = %+v, %v; want 600 scheduled summed over the shards", st, err)
	}
	// DropNamespace takes every shard's tasks (and keeps only the life keys
	// and high-water marks, so a re-created namespace repeats no
	// incarnation).
	if n, err := s.DropNamespace(ctx, ns, 0); err != nil || n != 600 {
		t.Fatalf("DropNamespace = %d, %v; want 600", n, err)
	}
	for _, m := range masters {
		c := m.Client()
		keys, err := c.Keys(ctx, "delayd:{"+ns+"#*}:*").Result()
		c.Close()
		for _, k := range keys {
			if !strings.HasSuffix(k, ":life") && !strings.HasSuffix(k, ":hwm") {
				t.Errorf("after DropNamespace, master %s still holds %s (%v)", m.Addr, k, err)
			}
		}
	}
}

// TestConformanceShardedEmbedded is TestConformanceSharded on miniredis,
// the embedded mode's store (a namespace may have shards there too).
func TestConformanceShardedEmbedded(t *testing.T) {
	t.Parallel()
	c := testMiniClient(t)
	runConformanceSharded(t, c, c, Options{Shards: FixedShards(4)})
}
