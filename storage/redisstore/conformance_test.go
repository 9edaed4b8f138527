package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage/storetest"
)

func runConformance(t *testing.T, c redis.UniversalClient) {
	storetest.Run(t, func(t *testing.T) storetest.Store { return New(c, Options{}) })
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
