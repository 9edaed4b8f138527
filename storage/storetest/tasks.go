package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

const (
	sched = storage.StateScheduled
	deliv = storage.StateDelivered
	dead  = storage.StateDead
)

func testUpsert(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name: "create",
		run: func(e *env) {
			before := e.now()
			due := before.Add(time.Hour).Truncate(time.Millisecond)
			res := e.upsert(storage.UpsertSpec{ID: "x", Kind: "order.close", Payload: []byte("hello"), DueTime: due})
			after := e.now()
			r := res[0]
			if !r.Created || r.Stale || r.Task.Generation != 1 || r.Task.Attempt != 0 || r.Task.State != sched {
				e.t.Errorf("result = %+v, want created, generation 1, attempt 0, scheduled", r)
			}
			if !r.Task.DueTime.Equal(due) {
				e.t.Errorf("due = %v, want %v", r.Task.DueTime, due)
			}
			e.within("create time", r.Task.CreateTime, before, after)
			got := e.get("x")
			if diff := cmp.Diff(r.Task, got); diff != "" {
				e.t.Errorf("Get differs from the upsert result (-upsert +get):\n%s", diff)
			}
		},
		want: []Row{{ID: "x", State: sched, Generation: 1, Kind: "order.close", Payload: "hello"}},
	}, {
		// Due times are kept in milliseconds: a finer one is rounded UP,
		// never down, so no task is due before the instant it asked for.
		name: "due time rounds up to the millisecond",
		run: func(e *env) {
			base := e.now().Add(time.Hour).Truncate(time.Millisecond)
			cases := map[string]struct {
				due  time.Time
				want time.Time
			}{
				"exact":  {base, base},
				"1ns":    {base.Add(time.Nanosecond), base.Add(time.Millisecond)},
				"999us":  {base.Add(999 * time.Microsecond), base.Add(time.Millisecond)},
				"1ms1ns": {base.Add(time.Millisecond + time.Nanosecond), base.Add(2 * time.Millisecond)},
			}
			for id, c := range cases {
				r := e.upsert(storage.UpsertSpec{ID: id, DueTime: c.due})[0]
				if !r.Task.DueTime.Equal(c.want) {
					e.t.Errorf("%s: due %v stored as %v, want %v", id, c.due, r.Task.DueTime, c.want)
				}
				if got := e.get(id).DueTime; !got.Equal(c.want) {
					e.t.Errorf("%s: Get due %v, want %v", id, got, c.want)
				}
			}
		},
		want: []Row{{ID: "1ms1ns", State: sched, Generation: 1}, {ID: "1ns", State: sched, Generation: 1},
			{ID: "999us", State: sched, Generation: 1}, {ID: "exact", State: sched, Generation: 1}},
	}, {
		// A relative delay is resolved against the store's clock so that
		// the task is never due before now + delay: the store's now has
		// microseconds that a whole-millisecond now would drop, and the
		// delay's sub-millisecond part must not be dropped either.
		name: "relative delay is never resolved early",
		run: func(e *env) {
			const d = 10*time.Millisecond + 999*time.Microsecond
			for i := range 5 {
				id := fmt.Sprintf("d%d", i)
				before := e.now() // whole ms, at or before the store's now at the upsert
				r := e.upsert(storage.UpsertSpec{ID: id, Delay: d})[0]
				// The store's now during the upsert is at least before, and
				// at least the record's update time (its now, whole ms).
				floor := r.Task.UpdateTime
				if before.After(floor) {
					floor = before
				}
				if r.Task.DueTime.Before(floor.Add(d)) {
					e.t.Errorf("%s: due %v is before now (>= %v) + %v", id, r.Task.DueTime, floor, d)
				}
			}
		},
		want: []Row{{ID: "d0", State: sched, Generation: 1}, {ID: "d1", State: sched, Generation: 1},
			{ID: "d2", State: sched, Generation: 1}, {ID: "d3", State: sched, Generation: 1}, {ID: "d4", State: sched, Generation: 1}},
	}, {
		name:  "replace keeps create time and bumps generation",
		seeds: []Seed{{ID: "x"}},
		run: func(e *env) {
			old := e.get("x")
			res := e.upsert(storage.UpsertSpec{ID: "x", Kind: "k2", Payload: []byte("new"), DueTime: old.DueTime.Add(time.Minute)})
			r := res[0]
			if r.Created || r.Task.Generation != 2 {
				e.t.Errorf("result = %+v, want not created, generation 2", r)
			}
			if !r.Task.CreateTime.Equal(old.CreateTime) {
				e.t.Errorf("create time = %v, want kept %v", r.Task.CreateTime, old.CreateTime)
			}
			if got := e.get("x"); !got.DueTime.Equal(old.DueTime.Add(time.Minute)) || got.UpdateTime.Before(old.UpdateTime) {
				e.t.Errorf("after replace: due %v update %v; want due %v, update >= %v", got.DueTime, got.UpdateTime, old.DueTime.Add(time.Minute), old.UpdateTime)
			}
		},
		want: []Row{{ID: "x", State: sched, Generation: 2, Kind: "k2", Payload: "new"}},
	}, {
		name:  "reschedule with a delay resolved by the store clock",
		seeds: []Seed{{ID: "x"}},
		run: func(e *env) {
			before := e.now()
			res := e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: 10 * time.Minute})
			after := e.now()
			// The store's now has microseconds that after (whole ms) drops,
			// and the due time is rounded up: at most 1 ms past after + delay.
			hi := after.Add(10*time.Minute + time.Millisecond)
			e.within("due", res[0].Task.DueTime, before.Add(10*time.Minute), hi)
			e.within("stored due", e.get("x").DueTime, before.Add(10*time.Minute), hi)
		},
		want: []Row{row("x", sched, 2, 0, "")},
	}, {
		name:  "in flight task is rescheduled and its delivery goes stale",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			res := e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour})
			if res[0].Created || res[0].Task.Generation != 2 || res[0].Task.Attempt != 0 {
				e.t.Errorf("result = %+v, want replaced, generation 2, attempt 0", res[0])
			}
			e.wantStatuses("ack of the old delivery", e.ack(e.tok["x"]), statuses(storage.TokenStale))
			st, _ := e.nack(storage.NackOptions{}, e.tok["x"])
			e.wantStatuses("nack of the old delivery", st, statuses(storage.TokenStale))
		},
		want: []Row{row("x", sched, 2, 0, "")},
	}, {
		name:  "dead task comes back with attempts and last error reset",
		seeds: []Seed{{ID: "x", State: dead}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour})
			if got := e.get("x"); !got.DeadTime.IsZero() {
				e.t.Errorf("dead time = %v, want zero", got.DeadTime)
			}
		},
		want: []Row{row("x", sched, 2, 0, "")},
	}, {
		name: "explicit generation is stored; an older one is stale and changes nothing",
		run: func(e *env) {
			r := e.upsert(storage.UpsertSpec{ID: "x", Payload: []byte("g7"), Delay: time.Hour, Generation: 7})[0]
			if !r.Created || r.Stale || r.Task.Generation != 7 {
				e.t.Errorf("first result = %+v, want created generation 7", r)
			}
			r = e.upsert(storage.UpsertSpec{ID: "x", Payload: []byte("g5"), Delay: time.Minute, Generation: 5})[0]
			if !r.Stale || r.Created || r.Task.Generation != 7 || string(r.Task.Payload) != "g7" || r.Task.State != sched {
				e.t.Errorf("older generation result = %+v, want stale with the stored generation 7 task", r)
			}
			// within one batch, as in separate calls
			rs := e.upsert(
				storage.UpsertSpec{ID: "z", Payload: []byte("z9"), Delay: time.Hour, Generation: 9},
				storage.UpsertSpec{ID: "z", Payload: []byte("z8"), Delay: time.Hour, Generation: 8},
			)
			if rs[0].Stale || !rs[1].Stale || rs[1].Task.Generation != 9 || string(rs[1].Task.Payload) != "z9" || rs[1].Task.State != sched {
				e.t.Errorf("batch results = %+v, want the second stale with the first's task", rs)
			}
			r = e.upsert(storage.UpsertSpec{ID: "y", Payload: []byte("y"), Delay: time.Hour, Generation: 3})[0]
			r = e.upsert(storage.UpsertSpec{ID: "y", Payload: []byte("y4"), Delay: time.Hour})[0]
			if r.Task.Generation != 4 {
				e.t.Errorf("bump after explicit generation 3 = %d, want 4", r.Task.Generation)
			}
		},
		want: []Row{
			{ID: "x", State: sched, Generation: 7, Payload: "g7"},
			{ID: "y", State: sched, Generation: 4, Payload: "y4"},
			{ID: "z", State: sched, Generation: 9, Payload: "z9"},
		},
	}, {
		name: "batch answers in order and tells which task became the earliest",
		run: func(e *env) {
			now := e.now()
			res := e.upsert(
				storage.UpsertSpec{ID: "a", Payload: payloadOf("a"), DueTime: now.Add(time.Hour)},
				storage.UpsertSpec{ID: "b", Payload: payloadOf("b"), DueTime: now.Add(2 * time.Hour)},
				storage.UpsertSpec{ID: "c", Payload: payloadOf("c"), DueTime: now.Add(30 * time.Minute)},
				storage.UpsertSpec{ID: "a", Payload: payloadOf("a"), DueTime: now.Add(3 * time.Hour)},
			)
			type got struct {
				ID       string
				Gen      int64
				Created  bool
				Earliest bool
			}
			var g []got
			for _, r := range res {
				g = append(g, got{r.Task.ID, r.Task.Generation, r.Created, r.Earliest})
			}
			want := []got{{"a", 1, true, true}, {"b", 1, true, false}, {"c", 1, true, true}, {"a", 2, false, false}}
			if e.sharded {
				// b may be the earliest of its shard: a wake-up too many is
				// allowed, one too few is not.
				for i := range g {
					if g[i].ID == "b" {
						g[i].Earliest = false
					}
				}
			}
			if diff := cmp.Diff(want, g); diff != "" {
				e.t.Errorf("batch results (-want +got):\n%s", diff)
			}
			r := e.upsert(storage.UpsertSpec{ID: "d", Payload: payloadOf("d"), DueTime: now.Add(time.Minute)})
			if !r[0].Earliest {
				e.t.Errorf("a task due before the head: Earliest = false")
			}
		},
		want: []Row{row("a", sched, 2, 0, ""), row("b", sched, 1, 0, ""), row("c", sched, 1, 0, ""), row("d", sched, 1, 0, "")},
	}})

	t.Run("batch of 1000", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		specs := make([]storage.UpsertSpec, 1000)
		for i, id := range ids(1000, "t") {
			specs[i] = storage.UpsertSpec{ID: id, Payload: payloadOf(id), Delay: time.Duration(i) * time.Second}
		}
		res := e.upsert(specs...)
		for i, r := range res {
			if r.Task.ID != specs[i].ID || !r.Created {
				t.Fatalf("result %d = %s created %v, want %s created", i, r.Task.ID, r.Created, specs[i].ID)
			}
		}
		if st, err := e.s.Stats(e.ctx, e.ns); err != nil || st.Scheduled != 1000 {
			t.Errorf("stats = %+v, %v; want 1000 scheduled", st, err)
		}
	})
}

func testRemove(t *testing.T, newStore func(t *testing.T) storage.Store) {
	var cases []transition
	for _, st := range []storage.State{sched, deliv, dead} {
		cases = append(cases, transition{
			name:  "from " + st.String(),
			seeds: []Seed{{ID: "x", State: st}, {ID: "keep"}},
			run: func(e *env) {
				prev, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{})
				if err != nil || prev != st {
					e.t.Errorf("remove = %v, %v; want %v", prev, err, st)
				}
				e.wantNotFound("x")
				if _, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{}); !errors.Is(err, storage.ErrNotFound) {
					e.t.Errorf("second remove: err = %v, want ErrNotFound", err)
				}
				if st == deliv {
					e.wantStatuses("ack after remove", e.ack(e.tok["x"]), statuses(storage.TokenNotFound))
				}
				if ds := e.pop(10, time.Minute); len(ds) != 0 {
					e.t.Errorf("pop after remove delivered %v", ds[0].Task.ID)
				}
			},
			want: []Row{row("keep", sched, 1, 0, "")},
		})
	}
	cases = append(cases, transition{
		name: "missing task",
		run: func(e *env) {
			if _, err := e.s.Remove(e.ctx, e.ns, "nope", storage.Version{}); !errors.Is(err, storage.ErrNotFound) {
				e.t.Errorf("remove: err = %v, want ErrNotFound", err)
			}
		},
	})
	runTable(t, newStore, cases)
}

func testGet(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name: "fields round-trip, whatever bytes they hold",
		run: func(e *env) {
			payload := []byte("a|b,c\x00\xff\n|,,|")
			kind := "kind|with,odd chars"
			due := e.now().Add(time.Hour).Truncate(time.Millisecond)
			e.upsert(storage.UpsertSpec{ID: "A-b.c_9", Kind: kind, Payload: payload, DueTime: due})
			got := e.get("A-b.c_9")
			if got.Kind != kind || string(got.Payload) != string(payload) || !got.DueTime.Equal(due) || got.Namespace != e.ns {
				e.t.Errorf("get = %+v", got)
			}
			if !got.LeaseDeadline.IsZero() || !got.DeadTime.IsZero() || got.CreateTime.IsZero() || got.UpdateTime.IsZero() {
				e.t.Errorf("times = %+v", got)
			}
			e.wantNotFound("missing")
		},
		want: []Row{{ID: "A-b.c_9", State: sched, Generation: 1, Kind: "kind|with,odd chars", Payload: "a|b,c\x00\xff\n|,,|"}},
	}, {
		name:  "each state shows its times",
		seeds: []Seed{{ID: "s"}, {ID: "d", State: deliv}, {ID: "x", State: dead}},
		run: func(e *env) {
			if got := e.get("d"); got.State != deliv || got.LeaseDeadline.IsZero() || got.DueTime.IsZero() {
				e.t.Errorf("delivered = %+v, want lease deadline and due time", got)
			}
			if got := e.get("x"); got.State != dead || got.DeadTime.IsZero() || got.LastError != seedReason {
				e.t.Errorf("dead = %+v, want dead time and last error", got)
			}
			if got := e.get("s"); got.State != sched || got.DueTime.IsZero() || !got.LeaseDeadline.IsZero() {
				e.t.Errorf("scheduled = %+v", got)
			}
		},
		want: []Row{row("s", sched, 1, 0, ""), row("d", deliv, 1, 1, ""), row("x", dead, 1, 1, seedReason)},
	}})
}

func testList(t *testing.T, newStore func(t *testing.T) storage.Store) {
	idsOf := func(tasks []storage.Task) []string {
		var out []string
		for _, task := range tasks {
			out = append(out, task.ID)
		}
		return out
	}
	t.Run("scheduled in due order across pages", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		now := e.now()
		var specs []storage.UpsertSpec
		var want []string
		// ids sort opposite to due times, so order by id would fail
		for i := 24; i >= 0; i-- {
			id := ids(25, "t")[i]
			specs = append(specs, storage.UpsertSpec{ID: id, Payload: payloadOf(id), DueTime: now.Add(time.Duration(25-i) * time.Minute)})
			want = append(want, id)
		}
		e.upsert(specs...)
		for _, size := range []int{1, 7, 25, 100} {
			if diff := cmp.Diff(want, idsOf(e.listAll(sched, size))); diff != "" {
				t.Errorf("page size %d (-want +got):\n%s", size, diff)
			}
		}
		if got := e.listAll(deliv, 10); len(got) != 0 {
			t.Errorf("delivered list = %v, want empty", idsOf(got))
		}
	})
	t.Run("tasks due in the same millisecond page stably", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		due := e.now().Add(time.Hour)
		want := ids(30, "s")
		var specs []storage.UpsertSpec
		for _, id := range want {
			specs = append(specs, storage.UpsertSpec{ID: id, Payload: payloadOf(id), DueTime: due})
		}
		e.upsert(specs...)
		if diff := cmp.Diff(want, idsOf(e.listAll(sched, 4))); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("pages are cut by bytes and list every task once", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		due := e.now().Add(time.Hour)
		all := ids(30, "b")
		payload := make([]byte, 10<<10)
		var specs []storage.UpsertSpec
		for _, id := range all {
			specs = append(specs, storage.UpsertSpec{ID: id, Payload: payload, DueTime: due})
		}
		e.upsert(specs...)
		const budget = 64 << 10 // room for 6 tasks of 10 KiB
		var got []string
		pages, cursor := 0, ""
		for {
			page, next, err := e.s.List(e.ctx, e.ns, storage.ListParams{State: sched, Limit: 1000, Cursor: cursor, MaxBytes: budget})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(page) == 0 {
				t.Fatalf("page %d is empty (next %q)", pages, next)
			}
			sum := 0
			for _, task := range page {
				if len(task.Payload) != len(payload) {
					t.Fatalf("task %s: payload of %d bytes, want %d", task.ID, len(task.Payload), len(payload))
				}
				sum += storage.TaskWireSize(task)
			}
			if sum > budget {
				t.Fatalf("page %d: %d tasks of %d bytes, budget %d", pages, len(page), sum, budget)
			}
			got = append(got, idsOf(page)...)
			if next == "" {
				break
			}
			cursor = next
		}
		if diff := cmp.Diff(all, got); diff != "" {
			t.Errorf("every task once, in order (-want +got):\n%s", diff)
		}
		if pages < 5 {
			t.Errorf("%d pages; want at least 5 for 30 tasks of 10 KiB under %d bytes", pages, budget)
		}
		// Without payloads the same budget holds every task in one page.
		page, next, err := e.s.List(e.ctx, e.ns, storage.ListParams{State: sched, Limit: 1000, MaxBytes: budget, NoPayload: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) != len(all) || next != "" {
			t.Fatalf("no payloads: %d tasks, next %q; want %d, last page", len(page), next, len(all))
		}
		for _, task := range page {
			if len(task.Payload) != 0 {
				t.Fatalf("task %s: payload of %d bytes, want none", task.ID, len(task.Payload))
			}
		}
		// A single task larger than the budget is still listed, alone.
		page, next, err = e.s.List(e.ctx, e.ns, storage.ListParams{State: sched, Limit: 1000, MaxBytes: 1})
		if err != nil || len(page) != 1 || next == "" {
			t.Fatalf("budget below one task: %d tasks, next %q, %v; want 1 and a next page", len(page), next, err)
		}
	})
	t.Run("a change between pages loses no other task", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		due := e.now().Add(time.Hour)
		all := ids(10, "s")
		var specs []storage.UpsertSpec
		for _, id := range all {
			specs = append(specs, storage.UpsertSpec{ID: id, Payload: payloadOf(id), DueTime: due})
		}
		e.upsert(specs...)
		page, next, err := e.s.List(e.ctx, e.ns, storage.ListParams{State: sched, Limit: 4})
		if err != nil || len(page) != 4 || next == "" {
			t.Fatalf("first page: %d tasks, next %q, %v", len(page), next, err)
		}
		// the last task of the page (the cursor) is removed meanwhile
		if _, err := e.s.Remove(e.ctx, e.ns, page[3].ID, storage.Version{}); err != nil {
			t.Fatal(err)
		}
		got := idsOf(page)
		for next != "" {
			page, next, err = e.s.List(e.ctx, e.ns, storage.ListParams{State: sched, Limit: 4, Cursor: next})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, idsOf(page)...)
		}
		if diff := cmp.Diff(all, got); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("delivered by lease deadline, dead by death time", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		now := e.now()
		e.upsert(
			storage.UpsertSpec{ID: "a", DueTime: now.Add(-3 * time.Minute)},
			storage.UpsertSpec{ID: "b", DueTime: now.Add(-2 * time.Minute)},
			storage.UpsertSpec{ID: "c", DueTime: now.Add(-1 * time.Minute)},
		)
		// a gets the longest lease, c the shortest
		var toks []storage.Token
		for i, lease := range []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour} {
			ds := e.pop(1, lease)
			if len(ds) != 1 || ds[0].Task.ID != []string{"a", "b", "c"}[i] {
				t.Fatalf("pop %d = %v", i, ds)
			}
			toks = append(toks, ds[0].Token)
		}
		if diff := cmp.Diff([]string{"c", "b", "a"}, idsOf(e.listAll(deliv, 2))); diff != "" {
			t.Errorf("delivered (-want +got):\n%s", diff)
		}
		for _, i := range []int{1, 0} {
			e.nack(storage.NackOptions{MaxAttempts: 1}, toks[i])
			time.Sleep(2 * time.Millisecond) // distinct death times
		}
		if diff := cmp.Diff([]string{"b", "a"}, idsOf(e.listAll(dead, 1))); diff != "" {
			t.Errorf("dead (-want +got):\n%s", diff)
		}
	})
}
