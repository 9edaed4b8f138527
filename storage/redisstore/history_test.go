package redisstore

import (
	"slices"
	"strconv"
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
		if n := c.Exists(ctx, k.historyOf(inc), k.historyIDsOf(inc), k.historyFirstOf(inc)).Val(); n != 3 {
			t.Fatalf("%d shards: %d of the live incarnation's stream and indexes exist, want 3", shards, n)
		}
		if _, err := s.DropNamespace(ctx, ns, inc); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctx, k.historyOf(inc), k.historyIDsOf(inc), k.historyFirstOf(inc), k.history).Val(); n != 0 {
			t.Errorf("%d shards: after the drop %d history keys remain, want 0", shards, n)
		}
		rec() // late
		if n := c.Exists(ctx, k.historyOf(inc), k.historyIDsOf(inc), k.historyFirstOf(inc)).Val(); n != 0 {
			t.Errorf("%d shards: an event recorded after the drop left %d keys behind", shards, n)
		}
	}
}

// TestHistoryIndexFollowsTheStream: the indexes of a history hold every
// task with events in the stream, the latest scored no earlier than its
// latest event and the first no later than its first, and lose the tasks
// whose events the stream's cap trimmed (one write late at most), so they
// stay about as large as the stream; a task with an event in every write,
// whose first events were trimmed, still reads every event kept.
func TestHistoryIndexFollowsTheStream(t *testing.T) {
	t.Parallel()
	c := testRedisClient(t)
	ns := "hidx" + testkit.Suffix()
	t.Cleanup(func() { testkit.DeleteNamespaceKeys(t, testkit.RedisURL(), ns) })
	s := New(c, Options{})
	ctx := t.Context()
	const inc, keep, batch = 1_700_000_000_000, 300, 100
	for b := range 20 {
		evs := []storage.Event{{Kind: storage.EventRescheduled, ID: "long", Generation: int64(b + 1)}}
		for i := range batch {
			// Each other task has two events in its write.
			evs = append(evs, storage.Event{Kind: storage.EventUpserted, ID: "t" + strconv.Itoa(b*batch/2+i/2)})
		}
		if err := s.RecordEvents(ctx, ns, storage.RecordParams{Incarnation: inc, Keep: keep, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	k := keysFor(ns, 0)
	entries, err := c.XRange(ctx, k.historyOf(inc), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	earliest, latest := map[string]int64{}, map[string]int64{}
	var long []int64
	for _, m := range entries {
		id, ms := m.Values["i"].(string), entryMS(m.ID)
		if _, ok := earliest[id]; !ok {
			earliest[id] = ms
		}
		latest[id] = ms
		if id == "long" {
			g, _ := strconv.ParseInt(m.Values["g"].(string), 10, 64)
			long = append(long, g)
		}
	}
	scores := func(key string) map[string]float64 {
		zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, z := range zs {
			out[z.Member.(string)] = z.Score
		}
		return out
	}
	last, first := scores(k.historyIDsOf(inc)), scores(k.historyFirstOf(inc))
	for id, ms := range latest {
		if sc, ok := last[id]; !ok || int64(sc) < ms {
			t.Errorf("task %s's latest event is at %d ms; the index has %v (held %v)", id, ms, sc, ok)
		}
		if sc, ok := first[id]; ok && int64(sc) > earliest[id] {
			t.Errorf("task %s's first kept event is at %d ms; the first index says %v", id, earliest[id], sc)
		}
	}
	if most := len(latest) + batch/2; len(last) > most || len(first) > most {
		t.Errorf("the indexes hold %d and %d tasks for %d in the stream; want at most %d (the trim one write late)", len(last), len(first), len(latest), most)
	}
	var got []int64
	p := storage.HistoryParams{Incarnation: inc, ID: "long", Limit: 1000}
	for range 10 {
		evs, next, err := s.TaskHistory(ctx, ns, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			got = append(got, e.Generation)
		}
		if p.Cursor = next; next == "" {
			break
		}
	}
	if !slices.Equal(got, long) || len(long) == 20 {
		t.Errorf("the long task's history reads generations %v; the stream keeps %v (some trimmed)", got, long)
	}
}
