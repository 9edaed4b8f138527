package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// TestShardedWakeupsOnCluster: on a Redis Cluster a shard's wake-ups travel
// on its own channel with SPUBLISH, so the cluster bus carries no PUBLISH
// broadcast for them: N upserts that each publish a wake-up send 0 publish
// messages over the bus (the policy change, still a PUBLISH, is the
// baseline: one per other node each), and at most one sharded publish per
// replica of the shard. A wake on each shard reaches the subscriber; each
// shard subscription, when confirmed, wakes its namespace (its ready); a
// failover of a shard's master and a move of a shard's slot to another
// master are followed by a confirmed subscription at the new owner, whose
// wake-ups reach the subscriber again.
func TestShardedWakeupsOnCluster(t *testing.T) {
	t.Parallel()
	cl := testkit.StartCluster(t, 3, 1)
	ctx := t.Context()
	cc := cl.Client()
	t.Cleanup(func() { cc.Close() })
	const ns, n = "swake", 3
	s := New(cc, Options{Shards: FixedShards(n)})
	if err := s.LoadLibrary(ctx); err != nil {
		t.Fatal(err)
	}
	chans := make([]string, n)
	for k := range n {
		chans[k] = keysForN(ns, k, n).wake
	}

	wakes := make(chan storage.Wakeup, 1000)
	var policies atomic.Int64 // policy-change wake-ups received
	s.ServeWakeups(ns, true)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- s.SubscribeWakeups(sctx, func() {}, func(w storage.Wakeup) {
			switch {
			case w.Namespace != ns:
			case w.PolicyChanged:
				policies.Add(1)
			default:
				wakes <- w
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && err != context.Canceled {
			t.Errorf("SubscribeWakeups returned %v", err)
		}
	})
	wakeOf := func(within time.Duration, what string) {
		t.Helper()
		select {
		case w := <-wakes:
			if w.PolicyChanged || len(w.Settled) > 0 {
				t.Fatalf("%s: got %+v, want a wake-up of %s", what, w, ns)
			}
		case <-time.After(within):
			t.Fatalf("no wake-up of %s within %v: %s", ns, within, what)
		}
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case w := <-wakes:
			t.Fatalf("%s: an unexpected wake-up %+v", what, w)
		default:
		}
	}
	subscribers := func(k int) int64 {
		addr, err := cc.MasterForKey(ctx, chans[k])
		if err != nil {
			return -1
		}
		c := redis.NewClient(&redis.Options{Addr: addr.Options().Addr})
		defer c.Close()
		got, err := c.PubSubShardNumSub(ctx, chans[k]).Result()
		if err != nil {
			return -1
		}
		return got[chans[k]]
	}
	idIn := func(k int, prefix string) string {
		for i := 0; ; i++ {
			if id := prefix + strconv.Itoa(i); ShardOf(id, n) == k {
				return id
			}
		}
	}
	upsert := func(id string, delay time.Duration) error {
		r, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Delay: delay}})
		if err == nil && !r[0].Earliest {
			t.Fatalf("upsert of %s: not the earliest of its shard, so no wake-up", id)
		}
		return err
	}

	// Each shard's subscription, once confirmed, wakes the namespace: n
	// wake-ups with nothing published.
	for k := range n {
		wakeOf(30*time.Second, fmt.Sprintf("confirmation %d of %d shard subscriptions", k+1, n))
	}
	for k := range n {
		if got := subscribers(k); got != 1 {
			t.Fatalf("shard %d channel %s has %d subscribers at its master, want 1", k, chans[k], got)
		}
	}
	quiet("after the confirmations")

	// A wake on shard k reaches the subscriber.
	for k := range n {
		if err := upsert(idIn(k, "a"), time.Hour); err != nil {
			t.Fatal(err)
		}
		wakeOf(10*time.Second, fmt.Sprintf("an upsert on shard %d", k))
	}

	// The bus: N wake-ups by upsert (SPUBLISH in upsert.lua) against N
	// policy changes (PUBLISH).
	const N = 60
	b0 := busStats(t, cl)
	for i := range N {
		// Each sooner than the last, so each is its shard's earliest.
		if err := upsert("c"+strconv.Itoa(i), 10*time.Minute+time.Duration(N-i)*30*time.Second); err != nil {
			t.Fatal(err)
		}
		wakeOf(10*time.Second, "upsert "+strconv.Itoa(i))
	}
	b1 := busStats(t, cl)
	for range N {
		if err := s.PublishPolicyChanged(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the policy changes to reach the subscriber", func() bool {
		return policies.Load() == N
	})
	b2 := busStats(t, cl)
	up, pol := b1.delta(b0), b2.delta(b1)
	t.Logf("cluster bus messages per wake-up, %d nodes: upsert (SPUBLISH): publish sent %.2f received %.2f, publishshard sent %.2f received %.2f; policy change (PUBLISH): publish sent %.2f received %.2f",
		len(cl.Nodes), up.per(up.publishSent, N), up.per(up.publishReceived, N), up.per(up.shardSent, N), up.per(up.shardReceived, N),
		pol.per(pol.publishSent, N), pol.per(pol.publishReceived, N))
	if up.publishSent != 0 || up.publishReceived != 0 {
		t.Errorf("%d upserts sent %d and received %d publish messages over the bus, want 0 (a PUBLISH broadcast)", N, up.publishSent, up.publishReceived)
	}
	if up.shardSent > N {
		t.Errorf("%d upserts sent %d sharded publish messages, want at most %d (one replica per master)", N, up.shardSent, N)
	}
	if pol.publishSent <= N {
		t.Errorf("%d policy changes sent %d publish messages over the bus, want more than one each (the broadcast the upserts no longer make)", N, pol.publishSent)
	}

	// Failover of shard 0's master: the subscription is made again at the
	// promoted replica, confirmed (a wake-up), and carries wake-ups.
	if err := cl.WaitReplicasCaughtUp(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	victim := nodeAt(t, cl, cc, chans[0])
	for len(wakes) > 0 {
		<-wakes
	}
	victim.Kill()
	if err := cl.WaitHealthy(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	wakeOf(60*time.Second, "the shard 0 subscription confirmed again after its master failed over")
	testkit.Eventually(t, 30*time.Second, "shard 0's channel subscribed at the new master", func() bool { return subscribers(0) == 1 })
	try := 0
	testkit.Eventually(t, 30*time.Second, "an upsert on the failed-over shard", func() bool {
		try++ // a new id each time: a try that failed late may have written
		return upsert(idIn(0, "f"+strconv.Itoa(try)+"-"), 0) == nil
	})
	wakeOf(10*time.Second, "an upsert on shard 0 after the failover")

	// Shard 1's slot moved to a new master: Redis ends the subscription at
	// the old owner; it is made again at the new one.
	added, err := cl.AddMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.MoveSlot(ctx, slotOf(shardTag(ns, 1, n)), added); err != nil {
		t.Fatal(err)
	}
	wakeOf(30*time.Second, "the shard 1 subscription confirmed again after its slot moved")
	testkit.Eventually(t, 30*time.Second, "shard 1's channel subscribed at the new master", func() bool {
		return nodeAt(t, cl, cc, chans[1]) == added && subscribers(1) == 1
	})
	if err := upsert(idIn(1, "m"), 0); err != nil {
		t.Fatal(err)
	}
	wakeOf(10*time.Second, "an upsert on shard 1 after its slot moved")
}

// bus is the pub/sub counters of CLUSTER INFO summed over a cluster's
// live nodes.
type bus struct{ publishSent, publishReceived, shardSent, shardReceived int64 }

func (b bus) delta(from bus) bus {
	return bus{b.publishSent - from.publishSent, b.publishReceived - from.publishReceived,
		b.shardSent - from.shardSent, b.shardReceived - from.shardReceived}
}

func (bus) per(v int64, n int) float64 { return float64(v) / float64(n) }

func busStats(t *testing.T, cl *testkit.Cluster) bus {
	t.Helper()
	var b bus
	for _, node := range cl.Nodes {
		if !node.Alive() {
			continue
		}
		c := node.Client()
		info, err := c.ClusterInfo(t.Context()).Result()
		c.Close()
		if err != nil {
			t.Fatalf("CLUSTER INFO of %s: %v", node.Addr, err)
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			x, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "cluster_stats_messages_publish_sent":
				b.publishSent += x
			case "cluster_stats_messages_publish_received":
				b.publishReceived += x
			case "cluster_stats_messages_publishshard_sent":
				b.shardSent += x
			case "cluster_stats_messages_publishshard_received":
				b.shardReceived += x
			}
		}
	}
	return b
}

// nodeAt is the node of cl that is the master of key now.
func nodeAt(t *testing.T, cl *testkit.Cluster, cc *redis.ClusterClient, key string) *testkit.ClusterNode {
	t.Helper()
	cc.ReloadState(t.Context())
	m, err := cc.MasterForKey(t.Context(), key)
	if err != nil {
		return nil
	}
	for _, node := range cl.Nodes {
		if node.Addr == m.Options().Addr {
			return node
		}
	}
	return nil
}
