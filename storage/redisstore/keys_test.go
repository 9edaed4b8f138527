package redisstore

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"testing"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// redisHashTag returns the part of key Redis Cluster hashes, exactly as
// Redis does (cluster.c keyHashSlot): the text between the first '{' and
// the first '}' after it, if that is not empty; otherwise the whole key.
func redisHashTag(key string) string {
	s := strings.IndexByte(key, '{')
	if s < 0 {
		return key
	}
	e := strings.IndexByte(key[s+1:], '}')
	if e <= 0 {
		return key
	}
	return key[s+1 : s+1+e]
}

func allKeys(k nsKeys) []string {
	return []string{k.due, k.inflight, k.dead, k.meta, k.body, k.acked, k.indexed, k.legacy, k.life, k.hwm, k.history, k.sched, k.schedIDs, k.schedNext}
}

func TestKeys(t *testing.T) {
	k := keysFor("orders", 0)
	want := nsKeys{
		due:      "delayd:{orders#0}:due",
		inflight: "delayd:{orders#0}:inflight",
		dead:     "delayd:{orders#0}:dead",
		meta:     "delayd:{orders#0}:meta",
		body:     "delayd:{orders#0}:body",
		acked:    "delayd:{orders#0}:acked",
		indexed:  "delayd:{orders#0}:indexed",
		legacy:   "delayd:{orders#0}:task",
		life:     "delayd:{orders#0}:life",
		hwm:      "delayd:{orders#0}:hwm",
		rate:     "delayd:{orders#0}:rate",
		wake:     "delayd:{orders#0}:wake",
		trace:    "delayd:{orders#0}:trace:",
		request:  "delayd:{orders#0}:req:",
		history:  "delayd:{orders#0}:history",

		sched:     "delayd:{orders#0}:sched",
		schedIDs:  "delayd:{orders#0}:schedids",
		schedNext: "delayd:{orders#0}:schednext",
	}
	if k != want {
		t.Errorf("keysFor = %+v, want %+v", k, want)
	}
	if got := k.historyOf(1_700_000_000_123); got != "delayd:{orders#0}:history:1700000000123" {
		t.Errorf("historyOf = %q", got)
	}
	if got := redisHashTag(keysFor("a-b_c", 0).historyOf(5)); got != "a-b_c#0" {
		t.Errorf("hash tag of historyOf = %q", got)
	}
	if got := k.traceOf("t1"); got != traceKey("orders", 0, "t1") {
		t.Errorf("traceOf = %q, want traceKey's %q", got, traceKey("orders", 0, "t1"))
	}
	for _, key := range allKeys(keysFor("a-b_c", 3)) {
		if got := redisHashTag(key); got != "a-b_c#3" {
			t.Errorf("hash tag of %s = %q", key, got)
		}
	}
	if ns, ok := namespaceOfKey("delayd:{a-b_c#3}:due"); !ok || ns != "a-b_c" {
		t.Errorf("namespaceOfKey = %q, %v", ns, ok)
	}
	for _, key := range []string{leaderKey("reconciler"), "delayd:{registry}:keys", "other:{x#0}:due", "delayd:{x#0"} {
		if ns, ok := namespaceOfKey(key); ok {
			t.Errorf("namespaceOfKey(%q) = %q, want not a namespace key", key, ns)
		}
	}
}

// FuzzKeys shows that no namespace and task id the validators accept yields
// a key whose Redis Cluster hash tag is anything but {ns#k}, and that
// nothing panics. Task ids never become part of a key (they are ZSET
// members and HASH fields); the fuzzer still varies them to show their
// validation rejects every brace.
func FuzzKeys(f *testing.F) {
	for _, seed := range []struct {
		ns, id string
		shard  int
	}{
		{"orders", "order-1", 0},
		{"a", "x", 7},
		{"a{b}", "}{", 1},
		{"ns}", "{ns}", 2},
		{"-x", "a b", 0},
		{"x#1", "id#", 0},
		{"0_-", "..", 99},
		{strings.Repeat("z", 63), strings.Repeat("Z", 128), 1 << 20},
		{"", "", -1},
	} {
		f.Add(seed.ns, seed.id, seed.shard)
	}
	f.Fuzz(func(t *testing.T, ns, id string, shard int) {
		nsOK := storage.ValidateNamespace(ns) == nil
		idOK := storage.ValidateTaskID(id) == nil
		if !nsOK || !idOK || shard < 0 {
			return
		}
		if strings.ContainsAny(ns, "{}#") || strings.ContainsAny(id, "{}") {
			t.Fatalf("validators accepted a brace or '#': ns %q id %q", ns, id)
		}
		wantTag := ns + "#" + strconv.Itoa(shard)
		for _, key := range allKeys(keysFor(ns, shard)) {
			if got := redisHashTag(key); got != wantTag {
				t.Fatalf("key %q hashes on %q, want %q", key, got, wantTag)
			}
			if got, ok := namespaceOfKey(key); !ok || got != ns {
				t.Fatalf("namespaceOfKey(%q) = %q, %v; want %q", key, got, ok, ns)
			}
		}
	})
}

// TestShardOf pins the shard function: it is part of the stored layout (a
// task written under one function is not found under another), so a change
// here must fail a test. Checked against hash/fnv, and for an even spread.
func TestShardOf(t *testing.T) {
	for _, id := range []string{"", "t1", "order-123", "x.y_z-9"} {
		h := fnv.New32a()
		h.Write([]byte(id))
		for _, n := range []int{1, 2, 6, 256} {
			if got, want := ShardOf(id, n), int(h.Sum32()%uint32(n)); got != want {
				t.Errorf("ShardOf(%q, %d) = %d, want %d (FNV-1a mod n)", id, n, got, want)
			}
		}
	}
	seen := map[int]int{}
	for i := range 6000 {
		seen[ShardOf(fmt.Sprintf("task-%d", i), 6)]++
	}
	for sh := range 6 {
		if seen[sh] < 800 || seen[sh] > 1200 {
			t.Errorf("shard %d of 6 got %d of 6000 ids; want about 1000", sh, seen[sh])
		}
	}
}

// TestShardTag: one shard keeps the layout from before sharding ({ns#0});
// several spread evenly over the slot space (shard k in the k-th of n equal
// slices), and Redis's own CLUSTER KEYSLOT agrees with slotOf.
func TestShardTag(t *testing.T) {
	if got := shardTag("orders", 0, 1); got != "orders#0" {
		t.Errorf("shardTag(orders, 0, 1) = %q, want orders#0", got)
	}
	for _, n := range []int{2, 3, 6, 16, 256} {
		for k := range n {
			tag := shardTag("orders", k, n)
			if slot := slotOf(tag); slot < k*clusterSlots/n || slot >= (k+1)*clusterSlots/n {
				t.Errorf("shard %d of %d: tag %q in slot %d, outside its slice", k, n, tag, slot)
			}
			if ns, ok := namespaceOfKey(keysForN("orders", k, n).due); !ok || ns != "orders" {
				t.Errorf("namespaceOfKey(%q) = %q, %v", keysForN("orders", k, n).due, ns, ok)
			}
		}
	}
	if got := slotOf("123456789"); got != 0x31C3 { // CRC16/XMODEM's check value
		t.Errorf("slotOf(123456789) = %#x, want 0x31c3", got)
	}
	c := testkit.SharedCluster(t).Nodes[0].Client()
	defer c.Close()
	for _, tag := range []string{"orders#0", "a", "orders#5~3", "123456789"} {
		want, err := c.ClusterKeySlot(t.Context(), "x{"+tag+"}y").Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		if got := slotOf(tag); int64(got) != want {
			t.Errorf("slotOf(%q) = %d, CLUSTER KEYSLOT says %d", tag, got, want)
		}
	}
}
