package redisstore

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

// testRedisClient returns a client of the shared test Redis (see
// internal/testkit), closed when t ends.
func testRedisClient(t testing.TB) *redis.Client { return testkit.Redis(t) }

// testMiniClient returns a client of a fresh in-process miniredis (the
// embedded mode's store), closed when t ends.
func testMiniClient(t testing.TB) *redis.Client {
	t.Helper()
	m := miniredis.RunT(t)
	miniByAddr.Store(m.Addr(), m)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() {
		c.Close()
		miniByAddr.Delete(m.Addr())
	})
	return c
}

// startCluster starts a Redis Cluster of n masters (no replicas) on private
// redis-servers, slots split evenly, and returns a ClusterClient of it.
func startCluster(t testing.TB, n int) *redis.ClusterClient {
	t.Helper()
	var nodes []*testkit.RedisServer
	for range n {
		nodes = append(nodes, testkit.StartRedis(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "5000"))
	}
	ctx := context.Background()
	for i, node := range nodes {
		c := redis.NewClient(&redis.Options{Addr: node.Addr})
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("cluster addslots: %v", err)
		}
		if i > 0 {
			host, port, _ := net.SplitHostPort(nodes[0].Addr)
			if err := c.Do(ctx, "CLUSTER", "MEET", host, port).Err(); err != nil {
				t.Fatalf("cluster meet: %v", err)
			}
		}
		c.Close()
	}
	// wait until every node sees all slots covered
	deadline := time.Now().Add(30 * time.Second)
	for _, node := range nodes {
		c := redis.NewClient(&redis.Options{Addr: node.Addr})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster did not come up: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	var addrs []string
	for _, node := range nodes {
		addrs = append(addrs, node.Addr)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	return cc
}

var fmtSscanf = fmt.Sscanf

// miniByAddr finds the miniredis of a test client by its address.
var miniByAddr sync.Map
