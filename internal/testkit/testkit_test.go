package testkit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m) }

// A namespace from Namespace leaves no key behind: its task keys, registry
// entry and API keys are gone once the test that made it ended.
func TestNamespaceIsDeleted(t *testing.T) {
	ctx := context.Background()
	rdb := Redis(t)
	var ns string
	t.Run("user", func(t *testing.T) {
		ns = Namespace(t, "kit")
		rdb.ZAdd(ctx, "delayd:{"+ns+"#0}:due", redisZ("a"))
		rdb.HSet(ctx, "delayd:{registry}:ns:"+ns, "policy", "{}")
		rdb.ZAdd(ctx, "delayd:{registry}:namespaces", redisZ(ns))
		rdb.ZAdd(ctx, "delayd:{registry}:nskeys:"+ns, redisZ("key-"+ns))
		rdb.HSet(ctx, "delayd:{registry}:keys", "key-"+ns, "{}")
	})
	if n := rdb.Exists(ctx, "delayd:{"+ns+"#0}:due", "delayd:{registry}:ns:"+ns, "delayd:{registry}:nskeys:"+ns).Val(); n != 0 {
		t.Fatalf("%d keys of %s left", n, ns)
	}
	if rdb.ZScore(ctx, "delayd:{registry}:namespaces", ns).Err() == nil || rdb.HExists(ctx, "delayd:{registry}:keys", "key-"+ns).Val() {
		t.Fatalf("registry still names %s or its key", ns)
	}
}

// sweep deletes a namespace named with one of this process's suffixes that
// a test left behind (e.g. auto-created by a server), and nothing else.
func TestSweepDeletesLeftovers(t *testing.T) {
	ctx := context.Background()
	rdb := Redis(t)
	left := "kit-left-" + Suffix()
	other := "kit-other-0123456789ab" // not a suffix of this process
	for _, ns := range []string{left, other} {
		rdb.ZAdd(ctx, "delayd:{"+ns+"#0}:due", redisZ("a"))
	}
	t.Cleanup(func() { rdb.Del(ctx, "delayd:{"+other+"#0}:due") })
	if _, err := sweep(RedisURL()); err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, "delayd:{"+left+"#0}:due").Val() != 0 {
		t.Fatalf("sweep left %s", left)
	}
	if rdb.Exists(ctx, "delayd:{"+other+"#0}:due").Val() != 1 {
		t.Fatalf("sweep deleted %s, which no test of this process named", other)
	}
}

// The proxy holds bytes (a hung server) and cuts connections (a partition).
func TestProxyHoldAndCut(t *testing.T) {
	srv := StartRedis(t)
	p := NewProxy(t, srv.Addr)
	c := RedisAt(t, "redis://"+p.Addr())
	p.Hold()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := c.Ping(ctx).Err()
	cancel()
	if err == nil {
		t.Fatal("PING answered through a held proxy")
	}
	p.Restore()
	Eventually(t, 10*time.Second, "PING through the restored proxy", func() bool { return c.Ping(context.Background()).Err() == nil })
	p.Cut()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING answered through a cut proxy")
	}
}

// A paused redis-server answers nothing; resumed, it answers again.
func TestRedisServerPause(t *testing.T) {
	srv := StartRedis(t)
	c := RedisAt(t, srv.URL)
	srv.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := c.Ping(ctx).Err()
	cancel()
	if err == nil {
		t.Fatal("PING answered by a paused redis-server")
	}
	srv.Resume()
	Eventually(t, 10*time.Second, "PING after SIGCONT", func() bool { return c.Ping(context.Background()).Err() == nil })
}

func redisZ(member string) redis.Z { return redis.Z{Member: member} }

// A replica behind a held proxy lags (its offset stays behind the
// primary's), and a retargeted proxy sends new connections to the other
// server: the two moves of a failover to a lagging replica.
func TestLaggingReplicaAndRetarget(t *testing.T) {
	ctx := context.Background()
	primary, replica := StartRedis(t), StartRedis(t)
	link := NewProxy(t, primary.Addr)
	replica.ReplicaOfAddr(link.Addr())
	pc := primary.Client()
	pc.Set(ctx, "before", "1", 0)
	Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		return replica.ReplOffset() >= primary.ReplOffset() && replica.Client().Get(ctx, "before").Val() == "1"
	})
	link.Hold()
	pc.Set(ctx, "during", "1", 0)
	time.Sleep(300 * time.Millisecond)
	if replica.ReplOffset() >= primary.ReplOffset() {
		t.Fatalf("replica offset %d, primary %d: the held link let the write through", replica.ReplOffset(), primary.ReplOffset())
	}
	front := NewProxy(t, primary.Addr)
	c := redis.NewClient(&redis.Options{Addr: front.Addr(), MaxRetries: 3})
	defer c.Close()
	if c.Get(ctx, "during").Val() != "1" {
		t.Fatal("the proxy does not reach the primary")
	}
	primary.Kill()
	replica.Promote()
	front.Retarget(replica.Addr)
	if v, err := c.Get(ctx, "during").Result(); err != redis.Nil {
		t.Fatalf("after the failover GET during = %q, %v; want nil: the promoted replica never got it", v, err)
	}
	if c.Get(ctx, "before").Val() != "1" {
		t.Fatal("after the failover the promoted replica lacks what it had replicated")
	}
}

// TestSharedCluster: the shared cluster has 3 masters, each with one synced
// replica, answers through a ClusterClient, and a second call returns the
// same cluster.
func TestSharedCluster(t *testing.T) {
	c := SharedCluster(t)
	if SharedCluster(t) != c {
		t.Fatal("SharedCluster started a second cluster")
	}
	ctx := context.Background()
	masters, err := c.MasterNodes(ctx)
	if err != nil || len(masters) != 3 || len(c.Nodes) != 6 {
		t.Fatalf("masters = %d of %d nodes (%v), want 3 of 6", len(masters), len(c.Nodes), err)
	}
	for _, m := range masters {
		cl := m.Client()
		repl, err := cl.Info(ctx, "replication").Result()
		cl.Close()
		if err != nil || infoField(repl, "connected_slaves") != "1" {
			t.Errorf("master %s: connected_slaves = %q (%v), want 1", m.Addr, infoField(repl, "connected_slaves"), err)
		}
	}
	cc := c.Client()
	defer cc.Close()
	for i := range 30 {
		if err := cc.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET through the cluster: %v", err)
		}
	}
	if !strings.HasPrefix(c.URL(), "redis-cluster://127.0.0.1:") {
		t.Errorf("URL = %q", c.URL())
	}
}
