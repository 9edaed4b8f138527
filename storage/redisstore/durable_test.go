package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// stores returns the real-Redis and the miniredis store, by name.
func stores(t *testing.T) map[string]*Store {
	return map[string]*Store{
		"redis":    New(testRedisClient(t), Options{}),
		"embedded": New(testMiniClient(t), Options{}),
	}
}

// dropNS deletes every key of ns when t ends.
func dropNS(t *testing.T, s *Store, ns string) {
	t.Cleanup(func() {
		k := keysFor(ns, 0)
		s.rdb.Del(context.Background(), allKeys(k)...)
	})
}

// TestRestoreWithoutCreateTime: a task the authority holds without a create
// time (e.g. bulk-loaded rows) is restored with the Redis clock's now, and
// its deliveries can be acked.
func TestRestoreWithoutCreateTime(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "rs")
			dropNS(t, s, ns)
			due := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
			in := []storage.Task{{ID: "bare", Kind: "k", Payload: []byte("p"), State: storage.StateScheduled, Generation: 3, DueTime: due}}
			if n, err := s.Restore(ctx, ns, in, storage.RestoreParams{}); err != nil || n != 1 {
				t.Fatalf("restore = %d, %v", n, err)
			}
			task, err := s.Get(ctx, ns, "bare")
			if err != nil || task.CreateTime.IsZero() || task.UpdateTime.Before(task.CreateTime) || task.Generation != 3 || !task.DueTime.Equal(due) {
				t.Fatalf("restored task = %+v, %v; want a create time, generation 3, due %v", task, err, due)
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
			if err != nil || len(ds) != 1 || ds[0].Token.Delivery == 0 {
				t.Fatalf("pop = %+v, %v; want a token naming its delivery", ds, err)
			}
			if st, err := s.Ack(ctx, ns, []storage.Token{ds[0].Token}); err != nil || st[0] != storage.TokenOK {
				t.Fatalf("ack = %v, %v; want OK", st, err)
			}
		})
	}
}

func TestRestore(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "rs")
			dropNS(t, s, ns)
			base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
			in := []storage.Task{
				{ID: "sched", Kind: "k", Payload: []byte("p1"), State: storage.StateScheduled, DueTime: base.Add(2 * time.Hour),
					Generation: 4, Attempt: 0, CreateTime: base, UpdateTime: base.Add(time.Minute)},
				{ID: "deliv", Payload: []byte("p2"), State: storage.StateDelivered, DueTime: base.Add(-time.Minute),
					LeaseDeadline: base.Add(time.Hour), Generation: 2, Attempt: 3, CreateTime: base, UpdateTime: base, LastError: "boom"},
				{ID: "dead", Payload: []byte("p3"), State: storage.StateDead, DueTime: base.Add(-2 * time.Minute),
					DeadTime: base.Add(time.Second), Generation: 9, Attempt: 10, CreateTime: base, UpdateTime: base.Add(time.Second), LastError: "gave up"},
			}
			n, err := s.Restore(ctx, ns, in, storage.RestoreParams{})
			if err != nil || n != 3 {
				t.Fatalf("restore = %d, %v; want 3", n, err)
			}
			want := []storage.Task{in[0], in[1], in[2]}
			for i := range want {
				want[i].Namespace = ns
			}
			// a delivered task comes back scheduled at its due time
			want[1].State = storage.StateScheduled
			want[1].LeaseDeadline = time.Time{}
			var got []storage.Task
			for _, id := range []string{"sched", "deliv", "dead"} {
				task, err := s.Get(ctx, ns, id)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, task)
			}
			if diff := cmp.Diff(want, got, cmpopts.EquateApproxTime(0)); diff != "" {
				t.Errorf("restored tasks (-want +got):\n%s", diff)
			}

			// the same or an older generation is not written again
			older := in[0]
			older.Generation = 3
			older.Payload = []byte("old")
			if n, err := s.Restore(ctx, ns, []storage.Task{in[0], older, in[2]}, storage.RestoreParams{}); err != nil || n != 0 {
				t.Errorf("restore of known generations = %d, %v; want 0", n, err)
			}
			if task, _ := s.Get(ctx, ns, "sched"); string(task.Payload) != "p1" {
				t.Errorf("older generation overwrote the index: payload %q", task.Payload)
			}

			// Lua reads what Go wrote: the restored delivered task is popped
			// with its attempt counted on, then acked.
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
			if err != nil || len(ds) != 1 || ds[0].Task.ID != "deliv" || ds[0].Task.Attempt != 4 || ds[0].Task.LastError != "boom" || string(ds[0].Task.Payload) != "p2" {
				t.Fatalf("pop after restore = %+v, %v", ds, err)
			}
			// a newer generation replaces an in-flight task and takes it out
			// of flight
			newer := in[1]
			newer.Generation = 3
			newer.Attempt = 0
			newer.State = storage.StateScheduled
			newer.DueTime = base.Add(5 * time.Hour)
			if n, err := s.Restore(ctx, ns, []storage.Task{newer}, storage.RestoreParams{}); err != nil || n != 1 {
				t.Fatalf("restore of a newer generation = %d, %v", n, err)
			}
			if st, _ := s.Ack(ctx, ns, []storage.Token{ds[0].Token}); st[0] != storage.TokenStale {
				t.Errorf("ack after newer restore = %v, want STALE", st)
			}
			if task, _ := s.Get(ctx, ns, "deliv"); task.State != storage.StateScheduled || task.Generation != 3 || !task.DueTime.Equal(newer.DueTime) {
				t.Errorf("after newer restore: %+v", task)
			}
			st, _ := s.Stats(ctx, ns)
			if st.Scheduled != 2 || st.Delivered != 0 || st.Dead != 1 {
				t.Errorf("stats = %+v, want 2 scheduled, 1 dead", st)
			}
		})
	}
}

func TestVersions(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "gen")
			dropNS(t, s, ns)
			res, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a"}, {ID: "b", Generation: 41, Incarnation: 7}, {ID: "a"}})
			if err != nil {
				t.Fatal(err)
			}
			ainc := res[0].Task.Incarnation
			if ainc == 0 || res[2].Task.Incarnation != ainc || res[1].Task.Incarnation != 7 {
				t.Fatalf("incarnations = %d, %d, %d; want a new one kept by the replace, and 7", ainc, res[1].Task.Incarnation, res[2].Task.Incarnation)
			}
			got, marks, err := s.Versions(ctx, ns, []string{"a", "missing", "b"})
			want := []storage.Version{{ID: "a", Incarnation: ainc, Generation: 2}, {ID: "missing"}, {ID: "b", Incarnation: 7, Generation: 41}}
			if err != nil || !slices.Equal(got, want) || len(marks) != 3 || marks[0].Delivery != 0 {
				t.Errorf("versions = %v, %v, %v; want %v and no marks", got, marks, err, want)
			}
			ids := make([]string, 2500)
			for i := range ids {
				ids[i] = "none"
			}
			ids[2499] = "b"
			got, _, err = s.Versions(ctx, ns, ids)
			if err != nil || len(got) != 2500 || got[2499].Generation != 41 || got[0].Generation != 0 {
				t.Errorf("versions of 2500 ids: %d values, last %v, %v", len(got), got[len(got)-1], err)
			}
		})
	}
}

func TestIndexedMarker(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "mark")
			dropNS(t, s, ns)
			if ok, err := s.Indexed(ctx, ns); err != nil || ok {
				t.Fatalf("indexed before marking = %v, %v", ok, err)
			}
			if err := s.MarkIndexed(ctx, ns); err != nil {
				t.Fatal(err)
			}
			if ok, err := s.Indexed(ctx, ns); err != nil || !ok {
				t.Errorf("indexed after marking = %v, %v", ok, err)
			}
			if ok, _ := s.Indexed(ctx, ns+"x"); ok {
				t.Errorf("another namespace is marked")
			}
		})
	}
}

func TestTryLead(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			lease := testkit.Namespace(t, "test")
			t.Cleanup(func() { s.rdb.Del(context.Background(), leaderKey(lease)) })
			try := func(holder string, ttl time.Duration) bool {
				t.Helper()
				ok, err := s.TryLead(ctx, lease, holder, ttl)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			if !try("a", time.Hour) {
				t.Fatal("a could not take a free lease")
			}
			if try("b", time.Hour) {
				t.Fatal("b took a lease a holds")
			}
			if !try("a", time.Hour) {
				t.Fatal("a could not renew its lease")
			}
			if try("b", time.Hour) {
				t.Fatal("b took a renewed lease")
			}
			// A renewal sets the lease's length: once a renews it short
			// and stops, it runs out and b gets it. (The renewal that b is
			// refused after is an hour long, so a starved test cannot see
			// it run out between the two calls.)
			if !try("a", 100*time.Millisecond) {
				t.Fatal("a could not renew its lease")
			}
			deadline := time.Now().Add(20 * time.Second)
			for !try("b", time.Hour) {
				if time.Now().After(deadline) {
					t.Fatal("b never got the expired lease")
				}
				if name == "embedded" {
					time.Sleep(10 * time.Millisecond)
					miniFastForward(t, s, 10*time.Millisecond)
				} else {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if try("a", time.Hour) {
				t.Error("a took b's lease back")
			}
		})
	}
}

// miniFastForward advances miniredis' TTL clock (miniredis expires keys
// only when told time passed).
func miniFastForward(t *testing.T, s *Store, d time.Duration) {
	t.Helper()
	// DEBUG SLEEP is not in miniredis; the test client reaches the server
	// through the address only, so look it up by address.
	if m, ok := miniByAddr.Load(s.rdb.(*redis.Client).Options().Addr); ok {
		m.(interface{ FastForward(time.Duration) }).FastForward(d)
	}
}

// TestNamespacesSkipsPopRecords: the record of a pop with a request id
// (kept for its window, storage.PopParams.RequestID) outlives the tasks it
// leased, as the life key and the high-water mark do: a namespace whose
// only key left is one is not listed. Before, a namespace dropped right
// after its pops was listed for the records' 30 s, and the sweeper and
// the metrics took it for a live one (TestDeletedNamespaceSeriesLeaveMetrics
// in daemon timed out waiting for its series to leave).
func TestNamespacesSkipsPopRecords(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "nsr")
			dropNS(t, s, ns)
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x"}}); err != nil {
				t.Fatal(err)
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{RequestID: "r1", Limit: 1, LeaseFor: time.Minute})
			if err != nil || len(ds) != 1 {
				t.Fatalf("pop: %v, %v", ds, err)
			}
			t.Cleanup(func() { s.rdb.Del(context.Background(), keysFor(ns, 0).requestKey("r1")) })
			if _, err := s.DropNamespace(ctx, ns, 0); err != nil {
				t.Fatal(err)
			}
			got, err := s.Namespaces(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(got, ns) {
				t.Errorf("namespaces lists %s, whose only key left is a pop's record", ns)
			}
		})
	}
}

func TestNamespaces(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := testkit.Namespace(t, "nsa"), testkit.Namespace(t, "nsb")
		dropNS(t, s, a)
		dropNS(t, s, b)
		if _, err := s.Upsert(ctx, a, []storage.UpsertSpec{{ID: "x"}}); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkIndexed(ctx, b); err != nil {
			t.Fatal(err)
		}
		got, err := s.Namespaces(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(got, a) || !slices.Contains(got, b) || !slices.IsSorted(got) {
			t.Errorf("namespaces = %v, want sorted and holding %s and %s", got, a, b)
		}
		for _, ns := range got {
			if storage.ValidateNamespace(ns) != nil {
				t.Errorf("namespaces lists %q, not a namespace name", ns)
			}
		}
	}
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run(t, s)
		})
	}
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		s := New(sharedClusterClient(t), Options{})
		// enough namespaces that every master holds some
		var names []string
		ctx := context.Background()
		for range 8 {
			ns := testkit.Namespace(t, "nsc")
			names = append(names, ns)
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x"}}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Namespaces(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The cluster is shared with tests running in parallel, so other
		// namespaces may be listed too: every one of ours must be, once,
		// and the whole list sorted.
		for _, ns := range names {
			if !slices.Contains(got, ns) {
				t.Errorf("namespaces = %v, missing %s", got, ns)
			}
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("namespaces = %v, want sorted without repeats", got)
		}
	})
}

func TestListCursorChecks(t *testing.T) {
	t.Parallel()
	s := New(testMiniClient(t), Options{})
	ctx := context.Background()
	if _, err := s.Upsert(ctx, "ns", []storage.UpsertSpec{{ID: "a"}, {ID: "b"}}); err != nil {
		t.Fatal(err)
	}
	_, next, err := s.List(ctx, "ns", storage.ListParams{State: storage.StateScheduled, Limit: 1})
	if err != nil || next == "" {
		t.Fatalf("first page: next %q, %v", next, err)
	}
	for _, c := range []string{"garbage", "1:x:a", "1:12:a{b}", "1:12"} {
		if _, _, err := s.List(ctx, "ns", storage.ListParams{State: storage.StateScheduled, Limit: 1, Cursor: c}); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("cursor %q: err = %v, want ErrInvalidCursor", c, err)
		}
	}
	if _, _, err := s.List(ctx, "ns", storage.ListParams{State: storage.StateDead, Limit: 1, Cursor: next}); !errors.Is(err, ErrInvalidCursor) {
		t.Errorf("a scheduled cursor for dead tasks: err = %v, want ErrInvalidCursor", err)
	}
	page, _, err := s.List(ctx, "ns", storage.ListParams{Limit: 5, Cursor: next})
	if err != nil || len(page) != 1 || page[0].ID != "b" {
		t.Errorf("UNSPECIFIED lists scheduled: %v, %v", page, err)
	}
}

func TestPopLimitCappedAtMaxBatch(t *testing.T) {
	t.Parallel()
	s := New(testMiniClient(t), Options{})
	ctx := context.Background()
	specs := make([]storage.UpsertSpec, MaxBatch+5)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: "t" + strconv.Itoa(i)}
	}
	if _, err := s.Upsert(ctx, "ns", specs); err != nil {
		t.Fatal(err)
	}
	ds, err := s.Pop(ctx, "ns", storage.PopParams{Limit: 5000, LeaseFor: time.Minute})
	if err != nil || len(ds) != MaxBatch {
		t.Errorf("pop of 5000: %d, %v; want %d", len(ds), err, MaxBatch)
	}
	st, _ := s.Stats(ctx, "ns")
	if st.Scheduled != 5 || st.Delivered != MaxBatch {
		t.Errorf("stats = %+v", st)
	}
}

// TestMigrateLegacyRecords: tasks written in the one-value layout of delayd
// before the header/payload split (scheduled, in flight and dead) read the
// same after Migrate, can be delivered and acked, and a second Migrate
// changes nothing. Small payloads become inline, a large one a body entry.
func TestMigrateLegacyRecords(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "mig")
			dropNS(t, s, ns)
			k := keysFor(ns, 0)
			now := time.Now().Truncate(time.Millisecond)
			ms := now.UnixMilli()
			hex := func(n int64) string {
				if n == 0 {
					return ""
				}
				return strconv.FormatInt(n, 16)
			}
			// gen,attempt,created,updated-created,due,kindlen,errlen|kind err payload
			legacy := func(gen, attempt, due int64, kind, lastErr, payload string) string {
				return hex(gen) + "," + hex(attempt) + "," + hex(ms-60_000) + "," + hex(1000) + "," + hex(due) + "," +
					hex(int64(len(kind))) + "," + hex(int64(len(lastErr))) + "|" + kind + lastErr + payload
			}
			big := strings.Repeat("B", inlineMax+1) // kept apart, in body; the others inline
			pipe := s.rdb.TxPipeline()
			pipe.HSet(ctx, k.legacy, "sched", legacy(3, 0, 0, "order.close", "", "p-sched"),
				"due", legacy(1, 2, 0, "", "boom", "p-due"),
				"dead", legacy(2, 5, ms-5000, "k", "gave up", ""),
				"big", legacy(1, 0, 0, "k", "", big))
			pipe.ZAdd(ctx, k.due, redis.Z{Score: float64(ms + 3_600_000), Member: "sched"}, redis.Z{Score: float64(ms - 1000), Member: "due"},
				redis.Z{Score: float64(ms + 3_600_000), Member: "big"})
			pipe.ZAdd(ctx, k.dead, redis.Z{Score: float64(ms - 2000), Member: "dead"})
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			n, err := s.Migrate(ctx)
			if err != nil || n < 4 {
				t.Fatalf("migrate = %d, %v; want at least our 4 tasks", n, err)
			}
			if ids, _ := s.rdb.HKeys(ctx, k.body).Result(); !slices.Equal(ids, []string{"big"}) {
				t.Errorf("body entries after migrate = %q; want only the large payload's", ids)
			}
			if left, _ := s.rdb.Exists(ctx, k.legacy).Result(); left != 0 {
				t.Errorf("the legacy HASH is still there")
			}
			created := time.UnixMilli(ms - 60_000)
			want := map[string]storage.Task{
				"sched": {Namespace: ns, ID: "sched", Kind: "order.close", Payload: []byte("p-sched"), State: storage.StateScheduled,
					DueTime: time.UnixMilli(ms + 3_600_000), Generation: 3, CreateTime: created, UpdateTime: created.Add(time.Second)},
				"due": {Namespace: ns, ID: "due", Payload: []byte("p-due"), State: storage.StateScheduled, DueTime: time.UnixMilli(ms - 1000),
					Generation: 1, Attempt: 2, LastError: "boom", CreateTime: created, UpdateTime: created.Add(time.Second)},
				"dead": {Namespace: ns, ID: "dead", Kind: "k", State: storage.StateDead, DueTime: time.UnixMilli(ms - 5000),
					DeadTime: time.UnixMilli(ms - 2000), Generation: 2, Attempt: 5, LastError: "gave up", CreateTime: created, UpdateTime: created.Add(time.Second)},
				"big": {Namespace: ns, ID: "big", Kind: "k", Payload: []byte(big), State: storage.StateScheduled,
					DueTime: time.UnixMilli(ms + 3_600_000), Generation: 1, CreateTime: created, UpdateTime: created.Add(time.Second)},
			}
			for id, w := range want {
				got, err := s.Get(ctx, ns, id)
				if err != nil {
					t.Fatalf("get %s: %v", id, err)
				}
				if diff := cmp.Diff(w, got, cmpopts.EquateApproxTime(0)); diff != "" {
					t.Errorf("%s after migrate (-want +got):\n%s", id, diff)
				}
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
			if err != nil || len(ds) != 1 || ds[0].Task.ID != "due" || ds[0].Task.Attempt != 3 || string(ds[0].Task.Payload) != "p-due" {
				t.Fatalf("pop after migrate = %+v, %v", ds, err)
			}
			if st, err := s.Ack(ctx, ns, []storage.Token{ds[0].Token}); err != nil || st[0] != storage.TokenOK {
				t.Fatalf("ack after migrate = %v, %v", st, err)
			}
			if n, err := s.migrateNamespace(ctx, ns); err != nil || n != 0 {
				t.Errorf("second migrate = %d, %v; want 0", n, err)
			}
		})
	}
}

// TestMalformedHeaderNeverVanishes (issue 10 item 6): pop and reap check
// every header before they write anything; a task whose header is
// malformed goes to dead (kept, purgeable) instead of vanishing, and the
// other tasks of the call are delivered or reaped as usual.
func TestMalformedHeaderNeverVanishes(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "bad")
			dropNS(t, s, ns)
			k := keysFor(ns, 0)
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Delay: -time.Second}, {ID: "b", Delay: -time.Second},
				{ID: "c", Delay: -time.Second}}); err != nil {
				t.Fatal(err)
			}
			if err := s.rdb.HSet(ctx, k.meta, "b", "garbage").Err(); err != nil {
				t.Fatal(err)
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: 30 * time.Millisecond})
			if err != nil || len(ds) != 2 || ds[0].Task.ID != "a" || ds[1].Task.ID != "c" {
				t.Fatalf("pop = %+v, %v; want a and c", ds, err)
			}
			if sc, err := s.rdb.ZScore(ctx, k.dead, "b").Result(); err != nil || sc == 0 {
				t.Fatalf("the malformed task is not in dead: %v, %v", sc, err)
			}
			// reap: c's header goes bad while it is in flight
			if err := s.rdb.HSet(ctx, k.meta, "c", "1,2").Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			mv, err := s.Reap(ctx, ns, 10, storage.NackOptions{RetryAfter: new(time.Duration)})
			if err != nil || len(mv) != 1 || mv[0].ID != "a" {
				t.Fatalf("reap = %+v, %v; want a only", mv, err)
			}
			st, err := s.Stats(ctx, ns)
			if err != nil || st.Scheduled != 1 || st.Delivered != 0 || st.Dead != 2 {
				t.Errorf("stats = %+v, %v; want a scheduled, b and c dead", st, err)
			}
			if got, err := s.Purge(ctx, ns, storage.PurgeParams{All: true, Limit: 10}); err != nil || len(got) != 2 {
				t.Errorf("purge of the malformed tasks = %v, %v", got, err)
			}
		})
	}
}

// TestSplitRecordsStillWork: records of the split form, as delayd wrote
// every task before small payloads went inline (a header in meta, the
// payload in body, whatever its size), are read, listed, delivered, given
// back and acked as they are, with no migration; a later upsert picks the
// form by the new payload's size, and no body entry is left behind.
func TestSplitRecordsStillWork(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "split")
			dropNS(t, s, ns)
			k := keysFor(ns, 0)
			ms := time.Now().UnixMilli()
			inc := (ms - 60_000) * 1000
			hdr := func(gen int64, kind string) string { // the split form, fresh
				return strconv.FormatInt(inc, 16) + "," + strconv.FormatInt(gen, 16) + ",,,,,," +
					strconv.FormatInt(int64(len(kind)), 16) + "|" + kind
			}
			big := strings.Repeat("B", inlineMax+1)
			pipe := s.rdb.TxPipeline()
			pipe.HSet(ctx, k.meta, "small", hdr(2, "k"), "big", hdr(1, ""), "none", hdr(1, "k"))
			pipe.HSet(ctx, k.body, "small", "p-small", "big", big)
			pipe.ZAdd(ctx, k.due, redis.Z{Score: float64(ms - 3000), Member: "small"}, redis.Z{Score: float64(ms - 2000), Member: "big"},
				redis.Z{Score: float64(ms - 1000), Member: "none"})
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"small": "p-small", "big": big, "none": ""}
			for id, p := range want {
				got, err := s.Get(ctx, ns, id)
				if err != nil || string(got.Payload) != p || got.Incarnation != inc {
					t.Fatalf("get %s = %+v, %v; want payload %.10q", id, got, err, p)
				}
			}
			page, _, err := s.List(ctx, ns, storage.ListParams{Limit: 10})
			if err != nil || len(page) != 3 || string(page[0].Payload) != "p-small" || string(page[1].Payload) != big {
				t.Fatalf("list = %+v, %v", page, err)
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
			if err != nil || len(ds) != 3 {
				t.Fatalf("pop = %+v, %v", ds, err)
			}
			for _, d := range ds {
				if string(d.Task.Payload) != want[d.Task.ID] || d.Task.Attempt != 1 {
					t.Errorf("popped %s: payload %.10q, attempt %d", d.Task.ID, d.Task.Payload, d.Task.Attempt)
				}
			}
			// give "small" and "big" back with a reason, deliver them again
			if st, _, err := s.Nack(ctx, ns, []storage.Token{ds[0].Token, ds[1].Token}, storage.NackOptions{RetryAfter: new(time.Duration), Reason: "boom"}); err != nil || len(st) != 2 {
				t.Fatalf("nack = %+v, %v", st, err)
			}
			again, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
			if err != nil || len(again) != 2 {
				t.Fatalf("second pop = %+v, %v", again, err)
			}
			for _, d := range again {
				if string(d.Task.Payload) != want[d.Task.ID] || d.Task.LastError != "boom" || d.Task.Attempt != 2 {
					t.Errorf("popped again %s: payload %.10q, last error %q, attempt %d", d.Task.ID, d.Task.Payload, d.Task.LastError, d.Task.Attempt)
				}
			}
			if st, err := s.Ack(ctx, ns, []storage.Token{again[0].Token, ds[2].Token}); err != nil || st[0] != storage.TokenOK || st[1] != storage.TokenOK {
				t.Fatalf("ack = %v, %v", st, err)
			}
			if n, _ := s.rdb.HExists(ctx, k.body, again[0].Task.ID).Result(); n {
				t.Errorf("ack left %s's body entry", again[0].Task.ID)
			}
			// "big" (split, in flight) gets a small payload: inline, its body
			// entry goes; then a large one again: split.
			left := again[1].Task.ID
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: left, Payload: []byte("tiny")}}); err != nil {
				t.Fatal(err)
			}
			if n, _ := s.rdb.Exists(ctx, k.body).Result(); n != 0 {
				t.Errorf("a body entry is left after the small upsert")
			}
			if got, err := s.Get(ctx, ns, left); err != nil || string(got.Payload) != "tiny" || got.LastError != "" {
				t.Errorf("get after the small upsert = %+v, %v", got, err)
			}
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: left, Payload: []byte(big)}}); err != nil {
				t.Fatal(err)
			}
			if b, _ := s.rdb.HGet(ctx, k.body, left).Result(); b != big {
				t.Errorf("body after the large upsert = %.10q", b)
			}
			if got, err := s.Get(ctx, ns, left); err != nil || string(got.Payload) != big {
				t.Errorf("get after the large upsert = %.10q, %v", got.Payload, err)
			}
		})
	}
}

// TestInlineRecords: a small payload is kept in the header (no body
// entry) through every script that rewrites headers (pop, nack with a
// reason, reap, requeue), and List leaves it out when asked to.
func TestInlineRecords(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "inl")
			dropNS(t, s, ns)
			k := keysFor(ns, 0)
			p := strings.Repeat("x", inlineMax)
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Kind: "k|,", Payload: []byte(p), Delay: -time.Second}}); err != nil {
				t.Fatal(err)
			}
			if n, _ := s.rdb.Exists(ctx, k.body).Result(); n != 0 {
				t.Fatalf("a %d-byte payload went to the body HASH", inlineMax)
			}
			check := func(step string, task storage.Task, lastErr string) {
				t.Helper()
				if string(task.Payload) != p || task.Kind != "k|," || task.LastError != lastErr {
					t.Errorf("%s: payload %.10q (%d bytes), kind %q, last error %q; want last error %q", step, task.Payload, len(task.Payload), task.Kind, task.LastError, lastErr)
				}
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
			if err != nil || len(ds) != 1 {
				t.Fatalf("pop = %+v, %v", ds, err)
			}
			check("pop", ds[0].Task, "")
			if _, _, err := s.Nack(ctx, ns, []storage.Token{ds[0].Token}, storage.NackOptions{RetryAfter: new(time.Duration), Reason: "first, | failure"}); err != nil {
				t.Fatal(err)
			}
			ds, err = s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: 20 * time.Millisecond})
			if err != nil || len(ds) != 1 {
				t.Fatalf("second pop = %+v, %v", ds, err)
			}
			check("pop after nack", ds[0].Task, "first, | failure")
			time.Sleep(40 * time.Millisecond)
			if mv, err := s.Reap(ctx, ns, 10, storage.NackOptions{MaxAttempts: 2, Reason: "lease expired"}); err != nil || len(mv) != 1 || mv[0].State != storage.StateDead {
				t.Fatalf("reap = %+v, %v; want a dead", mv, err)
			}
			got, err := s.Get(ctx, ns, "a")
			if err != nil {
				t.Fatal(err)
			}
			check("dead", got, "lease expired")
			if _, err := s.Requeue(ctx, ns, storage.RequeueParams{IDs: []string{"a"}}); err != nil {
				t.Fatal(err)
			}
			got, err = s.Get(ctx, ns, "a")
			if err != nil || got.State != storage.StateScheduled || got.Attempt != 0 {
				t.Fatalf("get after requeue = %+v, %v", got, err)
			}
			check("requeued", got, "lease expired")
			page, _, err := s.List(ctx, ns, storage.ListParams{Limit: 10, NoPayload: true})
			if err != nil || len(page) != 1 || page[0].Payload != nil || page[0].Kind != "k|," {
				t.Errorf("list without payloads = %+v, %v", page, err)
			}
		})
	}
}

// TestAckMarkerCarriesAttempt: an ack marker names the acked delivery and
// its attempt (the reconciler settles acks with it); a retried ack and
// ClearAcked match on the delivery alone, including markers written before
// the attempt was added ("inc,gen,dseq").
func TestAckMarkerCarriesAttempt(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "mark")
			dropNS(t, s, ns)
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a", Delay: -time.Second}, {ID: "b", Delay: -time.Second}}); err != nil {
				t.Fatal(err)
			}
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 2, LeaseFor: time.Minute})
			if err != nil || len(ds) != 2 {
				t.Fatalf("pop: %v %v", ds, err)
			}
			toks := []storage.Token{ds[0].Token, ds[1].Token}
			if st, err := s.AckMarked(ctx, ns, toks); err != nil || !slices.Equal(st, []storage.TokenStatus{storage.TokenOK, storage.TokenOK}) {
				t.Fatalf("ack: %v %v", st, err)
			}
			_, marks, err := s.Versions(ctx, ns, []string{toks[0].ID, toks[1].ID})
			if err != nil {
				t.Fatal(err)
			}
			for i, m := range marks {
				if m.Delivery != toks[i].Delivery || m.Attempt != 1 {
					t.Errorf("marker of %s = %+v, want delivery %d attempt 1", toks[i].ID, m, toks[i].Delivery)
				}
			}
			// b's marker as an older delayd wrote it.
			old := markOf(toks[1])
			if err := s.rdb.HSet(ctx, keysFor(ns, 0).acked, toks[1].ID, old).Err(); err != nil {
				t.Fatal(err)
			}
			if st, err := s.AckMarked(ctx, ns, toks); err != nil || !slices.Equal(st, []storage.TokenStatus{storage.TokenOK, storage.TokenOK}) {
				t.Fatalf("retried ack: %v %v, want OK for both", st, err)
			}
			if n, err := s.ClearAcked(ctx, ns, toks); err != nil || n != 2 {
				t.Fatalf("clear acked dropped %d (%v), want 2", n, err)
			}
		})
	}
}

// TestRestoreRepair: a rebuild (RestoreParams{}) never writes over a newer
// version the index holds; a repair (Repair) writes the authority's version
// over any other, older or newer, and leaves that very version alone.
func TestRestoreRepair(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := testkit.Namespace(t, "rr")
			dropNS(t, s, ns)
			due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
			uncommitted := storage.Task{ID: "t", Payload: []byte("never committed"), State: storage.StateScheduled,
				Incarnation: 1, Generation: 5, DueTime: due}
			if n, err := s.Restore(ctx, ns, []storage.Task{uncommitted}, storage.RestoreParams{}); err != nil || n != 1 {
				t.Fatalf("restore of generation 5 = %d, %v; want 1", n, err)
			}
			authority := uncommitted
			authority.Generation, authority.Payload = 4, []byte("committed")
			if n, err := s.Restore(ctx, ns, []storage.Task{authority}, storage.RestoreParams{}); err != nil || n != 0 {
				t.Fatalf("rebuild over a newer version = %d, %v; want 0 written", n, err)
			}
			if task, _ := s.Get(ctx, ns, "t"); task.Generation != 5 {
				t.Fatalf("after the rebuild the index holds generation %d, want 5 (kept)", task.Generation)
			}
			if n, err := s.Restore(ctx, ns, []storage.Task{authority}, storage.RestoreParams{Repair: true}); err != nil || n != 1 {
				t.Fatalf("repair over a newer version = %d, %v; want 1 written", n, err)
			}
			if task, _ := s.Get(ctx, ns, "t"); task.Generation != 4 || string(task.Payload) != "committed" {
				t.Fatalf("after the repair the index holds generation %d payload %q, want the authority's 4 %q", task.Generation, task.Payload, "committed")
			}
			if n, err := s.Restore(ctx, ns, []storage.Task{authority}, storage.RestoreParams{Repair: true}); err != nil || n != 0 {
				t.Fatalf("repair of the version the index holds = %d, %v; want 0 written", n, err)
			}
		})
	}
}

// TestNamespacesAreTheOnesHoldingTasks: Namespaces lists a namespace by the
// keys that hold its tasks (or durable mode's indexed marker), never by
// the keys that outlive them or expire on their own — a trace key lives a
// day past its task's due time, a rate bucket until it would be full, a
// subscriber set and a history stream until DropNamespace — so a deleted
// namespace is not listed, and the dispatcher and the metrics do not take
// it for a live one, because such a key is left.
func TestNamespacesAreTheOnesHoldingTasks(t *testing.T) {
	t.Parallel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			k := func(ns string) nsKeys { return keysFor(ns, 0) }
			leftovers := map[string]func(ns string) string{
				"trace":   func(ns string) string { return k(ns).traceOf("t-1") },
				"rate":    func(ns string) string { return k(ns).rate },
				"request": func(ns string) string { return k(ns).requestKey("r-1") },
				"history": func(ns string) string { return k(ns).historyOf(1) },
				"sched":   func(ns string) string { return k(ns).sched },
				"life":    func(ns string) string { return k(ns).life },
				"hwm":     func(ns string) string { return k(ns).hwm },
				"subs":    func(ns string) string { return keyPrefix + hashTag(ns, 0) + ":subs" },
			}
			holders := map[string]func(ns string) string{
				"due": func(ns string) string { return k(ns).due }, "inflight": func(ns string) string { return k(ns).inflight },
				"dead": func(ns string) string { return k(ns).dead }, "meta": func(ns string) string { return k(ns).meta },
				"indexed": func(ns string) string { return k(ns).indexed },
			}
			want := map[string]bool{}
			for kind, key := range leftovers {
				ns := testkit.Namespace(t, "nsl")
				want[ns] = false
				set(t, s, key(ns), kind)
			}
			for kind, key := range holders {
				ns := testkit.Namespace(t, "nsh")
				want[ns] = true
				set(t, s, key(ns), kind)
			}
			got, err := s.Namespaces(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for ns, listed := range want {
				if slices.Contains(got, ns) != listed {
					t.Errorf("namespace %s listed = %t, want %t", ns, !listed, listed)
				}
			}
		})
	}
}

// set writes key as a plain string (its type does not matter to
// Namespaces, which reads names only) and deletes it when t ends.
func set(t *testing.T, s *Store, key, value string) {
	t.Helper()
	if err := s.rdb.Set(context.Background(), key, value, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.rdb.Del(context.Background(), key) })
}
