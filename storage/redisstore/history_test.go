package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// TestLateHistoryOfEndedIncarnationIsRemoved: events recorded for a
// namespace incarnation after DropNamespace ended it (a call that changed
// a task just before a forced delete records after it) leave no stream
// behind, in one shard or several: the writer reads life after its XADDs
// and removes what it wrote, so a deleted namespace's late events neither
// linger in Redis nor reach anyone. The drop also removes the stream of
// delayd before histories were kept per incarnation.
func TestLateHistoryOfEndedIncarnationIsRemoved(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	for _, shards := range []int{1, 4} {
		ns := "lateh" + testkit.Suffix()
		t.Cleanup(func() { testkit.DeleteNamespaceKeys(t, testkit.RedisURL(), ns) })
		s := New(c, Options{Shards: FixedShards(shards)})
		ctx := t.Context()
		const inc = 1_700_000_000_000
		k := keysForN(ns, 0, shards)
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: k.history, Values: []any{"k", "1", "i", "a"}}).Err(); err != nil {
			t.Fatal(err)
		}
		rec := func() {
			t.Helper()
			if err := s.RecordEvents(ctx, ns, storage.RecordParams{Incarnation: inc, Keep: 100,
				Events: []storage.Event{{Kind: storage.EventUpserted, ID: "a", KeyID: "old-key"}}}); err != nil {
				t.Fatal(err)
			}
		}
		rec()
		if n := c.Exists(ctx, k.historyOf(inc)).Val(); n != 1 {
			t.Fatalf("%d shards: the live incarnation's stream exists %d times, want 1", shards, n)
		}
		if _, err := s.DropNamespace(ctx, ns, inc); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctx, k.historyOf(inc), k.history).Val(); n != 0 {
			t.Errorf("%d shards: after the drop %d history streams remain, want 0", shards, n)
		}
		rec() // late
		if n := c.Exists(ctx, k.historyOf(inc)).Val(); n != 0 {
			t.Errorf("%d shards: an event recorded after the drop left its stream behind", shards)
		}
	}
}
