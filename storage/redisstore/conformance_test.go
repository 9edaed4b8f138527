package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage/storetest"
)

func runConformance(t *testing.T, c redis.UniversalClient) {
	runConformanceOpts(t, c, Options{})
}

func runConformanceOpts(t *testing.T, c redis.UniversalClient, opts Options) {
	storetest.Run(t, func(t *testing.T) storetest.Store { return New(c, opts) })
}

// TestConformance runs the store suite against the real Redis.
func TestConformance(t *testing.T) {
	t.Parallel()
	runConformance(t, testRedisClient(t))
}

// TestConformanceEmbedded runs the same suite against miniredis, the
// embedded mode's store: the same Lua scripts must behave the same.
func TestConformanceEmbedded(t *testing.T) {
	t.Parallel()
	runConformance(t, testMiniClient(t))
}

// TestConformanceCluster runs the suite against a two-master Redis Cluster
// through a ClusterClient: every script's keys must hash to one slot
// (Redis refuses cross-slot scripts), and wake-ups cross nodes.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	runConformance(t, startCluster(t, 2))
}

// TestConformanceSplitScripts runs the suite with a script byte budget so
// small that every upsert, ack, nack and extend call is split into one
// script call per item: splitting by bytes changes no answer.
func TestConformanceSplitScripts(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	storetest.Run(t, func(t *testing.T) storetest.Store { return New(c, Options{MaxScriptBytes: 1}) })
}

func runConformanceSharded(t *testing.T, c redis.UniversalClient, opts Options) {
	storetest.RunSharded(t, func(t *testing.T) storetest.Store { return New(c, opts) })
}

// TestConformanceSharded runs the suite with every namespace in 4 shards
// (so a test's tasks spread over them): batch calls split per shard, Pop
// allocates across shards in due order, List merges, walks and scans cross
// shards, and every answer stays what one shard gives.
func TestConformanceSharded(t *testing.T) {
	t.Parallel()
	runConformanceSharded(t, testRedisClient(t), Options{Shards: FixedShards(4)})
}

// TestConformanceShardedCluster is TestConformanceSharded on a Redis
// Cluster: each shard of a namespace has its own slot.
func TestConformanceShardedCluster(t *testing.T) {
	t.Parallel()
	runConformanceSharded(t, startCluster(t, 2), Options{Shards: FixedShards(4)})
}
