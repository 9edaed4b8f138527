package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

// This file tests conditional writes (create-only, compare-and-set by
// generation) and RemoveTasks.

// wantConflict checks that err is a *storage.ConflictError of kind want
// whose task has generation gen.
func (e *env) wantConflict(what string, err, want error, gen int64) *storage.ConflictError {
	e.t.Helper()
	var ce *storage.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, want) {
		e.t.Errorf("%s: err = %v, want a ConflictError of %v", what, err, want)
		return nil
	}
	if ce.Task.Generation != gen {
		e.t.Errorf("%s: conflict task generation = %d, want %d", what, ce.Task.Generation, gen)
	}
	return ce
}

func testCreateOnly(t *testing.T, newStore func(t *testing.T) storage.Store) {
	var cases []transition
	cases = append(cases, transition{
		name: "creates a missing task",
		run: func(e *env) {
			r := e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour, CreateOnly: true})[0]
			if !r.Created || r.Refused != storage.NotRefused || r.Task.Generation != 1 {
				e.t.Errorf("result = %+v, want created at generation 1", r)
			}
		},
		want: []Row{row("x", sched, 1, 0, "")},
	})
	for _, st := range []storage.State{sched, deliv, dead} {
		cases = append(cases, transition{
			name:  "refused when the task is " + st.String(),
			seeds: []Seed{{ID: "x", State: st}},
			run: func(e *env) {
				before := e.get("x")
				r := e.upsert(storage.UpsertSpec{ID: "x", Kind: "other", Payload: []byte("new"), Delay: time.Minute, CreateOnly: true})[0]
				if r.Refused != storage.RefusedExists || r.Created || r.Stale {
					e.t.Errorf("result = %+v, want RefusedExists", r)
				}
				if r.Task.ID != "x" || r.Task.Generation != 1 || r.Task.State != st || string(r.Task.Payload) != string(payloadOf("x")) {
					e.t.Errorf("refused result task = %+v, want the stored task (generation 1, %v)", r.Task, st)
				}
				if err := r.Conflict(storage.UpsertSpec{ID: "x", CreateOnly: true}); !errors.Is(err, storage.ErrAlreadyExists) {
					e.t.Errorf("Conflict() = %v, want ErrAlreadyExists", err)
				}
				after := e.get("x")
				if !after.DueTime.Equal(before.DueTime) || after.Generation != before.Generation {
					e.t.Errorf("task changed: due %v → %v, generation %d → %d", before.DueTime, after.DueTime, before.Generation, after.Generation)
				}
			},
			want: []Row{{ID: "x", State: st, Generation: 1, Attempt: map[storage.State]int32{sched: 0, deliv: 1, dead: 1}[st],
				Payload: string(payloadOf("x")), LastError: map[bool]string{true: seedReason}[st == dead]}},
		})
	}
	cases = append(cases, transition{
		// A producer whose first upsert timed out (but was applied) sends
		// it again: the retry must not push the due time back by the time
		// that passed.
		name: "a retry after a timeout never moves the due time",
		run: func(e *env) {
			spec := storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour, CreateOnly: true}
			first := e.upsert(spec)[0]
			now := e.now()
			for e.now().Sub(now) < 5*time.Millisecond {
				time.Sleep(time.Millisecond) // the store's clock moves on
			}
			retry := e.upsert(spec)[0]
			if retry.Refused != storage.RefusedExists || !retry.Task.DueTime.Equal(first.Task.DueTime) {
				e.t.Errorf("retry = %+v, want RefusedExists with due %v", retry, first.Task.DueTime)
			}
			if got := e.get("x").DueTime; !got.Equal(first.Task.DueTime) {
				e.t.Errorf("due moved from %v to %v", first.Task.DueTime, got)
			}
		},
		want: []Row{row("x", sched, 1, 0, "")},
	}, transition{
		name: "in one call the second create-only of an id is refused",
		run: func(e *env) {
			res := e.upsert(
				storage.UpsertSpec{ID: "x", Payload: []byte("first"), Delay: time.Hour, CreateOnly: true},
				storage.UpsertSpec{ID: "x", Payload: []byte("second"), Delay: time.Hour, CreateOnly: true},
				storage.UpsertSpec{ID: "y", Payload: payloadOf("y"), Delay: time.Hour},
			)
			if !res[0].Created || res[1].Refused != storage.RefusedExists || string(res[1].Task.Payload) != "first" || !res[2].Created {
				e.t.Errorf("results = %+v, want created, refused (holding the first), created", res)
			}
		},
		want: []Row{{ID: "x", State: sched, Generation: 1, Payload: "first"}, row("y", sched, 1, 0, "")},
	})
	runTable(t, newStore, cases)
	t.Run("concurrent creators: exactly one creates", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		created := race(t, 32, func(i int) bool {
			res, err := e.s.Upsert(e.ctx, e.ns, []storage.UpsertSpec{{ID: "x", Payload: []byte(fmt.Sprint(i)), Delay: time.Hour, CreateOnly: true}})
			if err != nil {
				t.Errorf("upsert: %v", err)
				return false
			}
			if res[0].Refused == storage.NotRefused != res[0].Created {
				t.Errorf("writer %d: result %+v is neither created nor refused", i, res[0])
			}
			return res[0].Created
		})
		if len(created) != 1 {
			t.Fatalf("%d writers created the task, want exactly 1", len(created))
		}
		if got := e.get("x"); got.Generation != 1 || string(got.Payload) != fmt.Sprint(created[0]) {
			t.Errorf("stored task = generation %d payload %q, want generation 1 payload %q", got.Generation, got.Payload, fmt.Sprint(created[0]))
		}
	})
}

// race runs n writers at once (released together) and returns the
// indexes of those for which write returned true.
func race(t *testing.T, n int, write func(i int) bool) []int {
	t.Helper()
	var (
		mu   sync.Mutex
		won  []int
		wg   sync.WaitGroup
		gate = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			if write(i) {
				mu.Lock()
				won = append(won, i)
				mu.Unlock()
			}
		}()
	}
	close(gate)
	wg.Wait()
	return won
}

func testIfGeneration(t *testing.T, newStore func(t *testing.T) storage.Store) {
	var cases []transition
	cases = append(cases, transition{
		name:  "upsert applies at the stored generation",
		seeds: []Seed{{ID: "x"}},
		run: func(e *env) {
			r := e.upsert(storage.UpsertSpec{ID: "x", Payload: []byte("v2"), Delay: time.Hour, IfGeneration: 1})[0]
			if r.Refused != storage.NotRefused || r.Task.Generation != 2 || r.Created {
				e.t.Errorf("result = %+v, want applied at generation 2", r)
			}
		},
		want: []Row{{ID: "x", State: sched, Generation: 2, Payload: "v2"}},
	}, transition{
		name:  "upsert refused at another generation",
		seeds: []Seed{{ID: "x"}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour}) // generation 2
			r := e.upsert(storage.UpsertSpec{ID: "x", Payload: []byte("late"), Delay: time.Minute, IfGeneration: 1})[0]
			if r.Refused != storage.RefusedGeneration || r.Task.Generation != 2 || string(r.Task.Payload) != string(payloadOf("x")) {
				e.t.Errorf("result = %+v, want RefusedGeneration holding generation 2", r)
			}
			e.wantConflict("Conflict()", r.Conflict(storage.UpsertSpec{ID: "x", IfGeneration: 1}), storage.ErrGenerationMismatch, 2)
		},
		want: []Row{row("x", sched, 2, 0, "")},
	}, transition{
		name: "upsert refused when there is no task",
		run: func(e *env) {
			r := e.upsert(storage.UpsertSpec{ID: "x", Delay: time.Hour, IfGeneration: 1})[0]
			if r.Refused != storage.RefusedGeneration || r.Task.ID != "" || r.Task.Generation != 0 {
				e.t.Errorf("result = %+v, want RefusedGeneration with no task", r)
			}
		},
	})
	for _, st := range []storage.State{sched, deliv, dead} {
		cases = append(cases, transition{
			name:  "remove applies at the stored generation when " + st.String(),
			seeds: []Seed{{ID: "x", State: st}, {ID: "keep"}},
			run: func(e *env) {
				prev, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{Generation: 1})
				if err != nil || prev != st {
					e.t.Errorf("remove = %v, %v; want %v", prev, err, st)
				}
			},
			want: []Row{row("keep", sched, 1, 0, "")},
		}, transition{
			name:  "remove refused at another generation when " + st.String(),
			seeds: []Seed{{ID: "x", State: st}},
			run: func(e *env) {
				_, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{Generation: 2})
				if ce := e.wantConflict("remove", err, storage.ErrGenerationMismatch, 1); ce != nil {
					if ce.Task.ID != "x" || ce.Expected.Generation != 2 {
						e.t.Errorf("conflict = %+v, want task x, expected 2", ce)
					}
				}
			},
			want: []Row{{ID: "x", State: st, Generation: 1, Attempt: map[storage.State]int32{sched: 0, deliv: 1, dead: 1}[st],
				Payload: string(payloadOf("x")), LastError: map[bool]string{true: seedReason}[st == dead]}},
		})
	}
	cases = append(cases, transition{
		name: "remove of a missing task is not found",
		run: func(e *env) {
			if _, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{Generation: 3}); !errors.Is(err, storage.ErrNotFound) {
				e.t.Errorf("remove: err = %v, want ErrNotFound", err)
			}
		},
	}, transition{
		// An id removed and created again starts over at generation 1:
		// the generation alone matches the new life, the incarnation
		// read with it does not.
		name:  "the incarnation tells a later life of the id apart",
		seeds: []Seed{{ID: "x"}},
		run: func(e *env) {
			old := e.get("x")
			if _, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{}); err != nil {
				e.t.Fatal(err)
			}
			again := e.upsert(storage.UpsertSpec{ID: "x", Payload: []byte("second life"), Delay: time.Hour})[0].Task
			if again.Generation != 1 || again.Incarnation <= old.Incarnation {
				e.t.Fatalf("re-created task = generation %d incarnation %d; want 1 and above %d", again.Generation, again.Incarnation, old.Incarnation)
			}
			r := e.upsert(storage.UpsertSpec{ID: "x", Delay: time.Minute, IfGeneration: 1, IfIncarnation: old.Incarnation})[0]
			if r.Refused != storage.RefusedGeneration || r.Task.Incarnation != again.Incarnation {
				e.t.Errorf("upsert at the old incarnation = %+v, want RefusedGeneration holding the new life", r)
			}
			_, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{Generation: 1, Incarnation: old.Incarnation})
			if ce := e.wantConflict("remove at the old incarnation", err, storage.ErrGenerationMismatch, 1); ce != nil &&
				(ce.Task.Incarnation != again.Incarnation || ce.Expected.Incarnation != old.Incarnation) {
				e.t.Errorf("conflict = %+v, want the new life and the old incarnation expected", ce)
			}
			r = e.upsert(storage.UpsertSpec{ID: "x", Payload: []byte("renewed"), Delay: time.Hour, IfGeneration: 1, IfIncarnation: again.Incarnation})[0]
			if r.Refused != storage.NotRefused || r.Task.Generation != 2 {
				e.t.Errorf("upsert at the new incarnation = %+v, want applied at generation 2", r)
			}
		},
		want: []Row{{ID: "x", State: sched, Generation: 2, Payload: "renewed"}},
	}, transition{
		name: "in one call a compare-and-set sees the write before it",
		run: func(e *env) {
			res := e.upsert(
				storage.UpsertSpec{ID: "x", Payload: []byte("a"), Delay: time.Hour},
				storage.UpsertSpec{ID: "x", Payload: []byte("b"), Delay: time.Hour, IfGeneration: 1},
				storage.UpsertSpec{ID: "x", Payload: []byte("c"), Delay: time.Hour, IfGeneration: 1},
			)
			if res[1].Refused != storage.NotRefused || res[1].Task.Generation != 2 ||
				res[2].Refused != storage.RefusedGeneration || res[2].Task.Generation != 2 {
				e.t.Errorf("results = %+v, want the second applied (generation 2), the third refused", res)
			}
		},
		want: []Row{{ID: "x", State: sched, Generation: 2, Payload: "b"}},
	})
	runTable(t, newStore, cases)

	// Many writers read generation 1 and write back at once: exactly one
	// wins, whichever it is, and the task holds its write.
	t.Run("racing upserts: exactly one compare-and-set wins", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		e.seed(Seed{ID: "x"})
		won := race(t, 32, func(i int) bool {
			res, err := e.s.Upsert(e.ctx, e.ns, []storage.UpsertSpec{{ID: "x", Payload: []byte(fmt.Sprint(i)), Delay: time.Hour, IfGeneration: 1}})
			if err != nil {
				t.Errorf("upsert: %v", err)
				return false
			}
			if res[0].Refused == storage.NotRefused {
				return true
			}
			if res[0].Refused != storage.RefusedGeneration || res[0].Task.Generation != 2 {
				t.Errorf("writer %d: loser result %+v, want RefusedGeneration at generation 2", i, res[0])
			}
			return false
		})
		if len(won) != 1 {
			t.Fatalf("%d writers won, want exactly 1", len(won))
		}
		if got := e.get("x"); got.Generation != 2 || string(got.Payload) != fmt.Sprint(won[0]) {
			t.Errorf("task = generation %d payload %q, want generation 2 payload %q", got.Generation, got.Payload, fmt.Sprint(won[0]))
		}
	})
	// The loan race: renewals (upsert) and returns (remove) of the same
	// loan, all based on generation 1. Exactly one of them applies.
	t.Run("racing renew and return: exactly one applies", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, newStore)
		e.seed(Seed{ID: "loan"})
		won := race(t, 32, func(i int) bool {
			if i%2 == 0 {
				_, err := e.s.Remove(e.ctx, e.ns, "loan", storage.Version{Generation: 1})
				if err != nil && !errors.Is(err, storage.ErrGenerationMismatch) && !errors.Is(err, storage.ErrNotFound) {
					t.Errorf("return: %v", err)
				}
				return err == nil
			}
			res, err := e.s.Upsert(e.ctx, e.ns, []storage.UpsertSpec{{ID: "loan", Payload: []byte("renewed"), Delay: 2 * time.Hour, IfGeneration: 1}})
			if err != nil {
				t.Errorf("renew: %v", err)
				return false
			}
			return res[0].Refused == storage.NotRefused
		})
		if len(won) != 1 {
			t.Fatalf("%d writers applied, want exactly 1", len(won))
		}
		task, err := e.s.Get(e.ctx, e.ns, "loan")
		switch {
		case won[0]%2 == 0 && !errors.Is(err, storage.ErrNotFound):
			t.Errorf("the return won but Get = %+v, %v", task, err)
		case won[0]%2 == 1 && (err != nil || task.Generation != 2):
			t.Errorf("a renewal won but Get = %+v, %v", task, err)
		}
	})
}

func testRemoveTasks(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "ids in any state; missing ones skipped",
		seeds: []Seed{{ID: "a"}, {ID: "b", State: deliv}, {ID: "c", State: dead}, {ID: "keep"}},
		run: func(e *env) {
			res, err := e.s.RemoveTasks(e.ctx, e.ns, storage.RemoveTasksParams{IDs: []string{"c", "missing", "a", "b", "a"}})
			if err != nil || res.Removed != 3 || res.Next != "" {
				e.t.Errorf("remove tasks = %+v, %v; want 3 removed, no next", res, err)
			}
			// each id answered in request order; a repeat was removed once
			wantStates := []storage.State{dead, storage.StateUnspecified, sched, deliv, storage.StateUnspecified}
			if diff := cmp.Diff(wantStates, res.States); diff != "" {
				e.t.Errorf("remove tasks States (-want +got):\n%s", diff)
			}
			if ds := e.pop(10, time.Minute); len(ds) != 0 {
				e.t.Errorf("pop after remove delivered %v", ds[0].Task.ID)
			}
			e.wantStatuses("ack of the removed delivery", e.ack(e.tok["b"]), statuses(storage.TokenNotFound))
		},
		want: []Row{row("keep", sched, 1, 0, "")},
	}, {
		name:  "filter by state and id prefix",
		seeds: []Seed{{ID: "o-1", State: dead}, {ID: "o-2", State: dead}, {ID: "p-1", State: dead}, {ID: "o-3"}, {ID: "o-4", State: deliv}},
		run: func(e *env) {
			n := e.removeAll(storage.TaskFilter{State: dead, IDPrefix: "o-"}, 0)
			if n != 2 {
				e.t.Errorf("removed %d, want 2", n)
			}
		},
		want: []Row{row("o-3", sched, 1, 0, ""), row("o-4", deliv, 1, 1, ""), row("p-1", dead, 1, 1, seedReason)},
	}, {
		name:  "filter by kind, across states, in small pages",
		seeds: []Seed{{ID: "d1", State: deliv}, {ID: "d2", State: dead}},
		run: func(e *env) {
			var specs []storage.UpsertSpec
			for i := range 25 {
				kind := "order.close"
				if i%3 == 0 {
					kind = "order.remind"
				}
				specs = append(specs, storage.UpsertSpec{ID: fmt.Sprintf("t%02d", i), Kind: kind, Delay: time.Duration(i) * time.Minute})
			}
			e.upsert(specs...)
			if n := e.removeAll(storage.TaskFilter{Kind: "order.close"}, 4); n != 16 {
				e.t.Errorf("removed %d, want 16", n)
			}
		},
		want: func() []Row {
			rows := []Row{}
			for i := 0; i < 25; i += 3 {
				rows = append(rows, Row{ID: fmt.Sprintf("t%02d", i), State: sched, Generation: 1, Kind: "order.remind"})
			}
			return append(rows, row("d1", deliv, 1, 1, ""), row("d2", dead, 1, 1, seedReason))
		}(),
	}, {
		// Hundreds of tasks due in the same millisecond, most of which do
		// not match: the walk must go on after the last member it examined
		// even though that member was deleted.
		name: "filter walks past many tasks due at the same time",
		run: func(e *env) {
			due := e.now().Add(time.Hour)
			var specs []storage.UpsertSpec
			for i := range 300 {
				id := fmt.Sprintf("k%03d", i)
				if i%10 == 0 {
					id = fmt.Sprintf("x%03d", i)
				}
				specs = append(specs, storage.UpsertSpec{ID: id, DueTime: due})
			}
			e.upsert(specs...)
			if n := e.removeAll(storage.TaskFilter{IDPrefix: "k"}, 7); n != 270 {
				e.t.Errorf("removed %d, want 270", n)
			}
		},
		want: func() []Row {
			var rows []Row
			for i := 0; i < 300; i += 10 {
				rows = append(rows, Row{ID: fmt.Sprintf("x%03d", i), State: sched, Generation: 1})
			}
			return rows
		}(),
	}, {
		name:  "a cursor of another filter state is refused",
		seeds: []Seed{{ID: "a"}},
		run: func(e *env) {
			_, err := e.s.RemoveTasks(e.ctx, e.ns, storage.RemoveTasksParams{Filter: storage.TaskFilter{State: dead}, Cursor: "w1:5:a"})
			if !errors.Is(err, storage.ErrInvalidCursor) {
				e.t.Errorf("err = %v, want ErrInvalidCursor", err)
			}
			_, err = e.s.RemoveTasks(e.ctx, e.ns, storage.RemoveTasksParams{Filter: storage.TaskFilter{Kind: "k"}, Cursor: "garbage"})
			if !errors.Is(err, storage.ErrInvalidCursor) {
				e.t.Errorf("err = %v, want ErrInvalidCursor", err)
			}
		},
		want: []Row{row("a", sched, 1, 0, "")},
	}})
}

// removeAll walks filter to its end in pages of limit and returns how many
// tasks it removed. It fails the test when a page removes more than limit
// tasks or the walk does not end.
func (e *env) removeAll(filter storage.TaskFilter, limit int) int64 {
	e.t.Helper()
	var total int64
	cursor := ""
	for range 10000 {
		res, err := e.s.RemoveTasks(e.ctx, e.ns, storage.RemoveTasksParams{Filter: filter, Cursor: cursor, Limit: limit})
		if err != nil {
			e.t.Fatalf("remove tasks: %v", err)
		}
		if limit > 0 && res.Removed > int64(limit) {
			e.t.Errorf("a page of limit %d removed %d", limit, res.Removed)
		}
		total += res.Removed
		if res.Next == "" {
			return total
		}
		cursor = res.Next
	}
	e.t.Fatal("remove tasks: the walk does not end")
	return 0
}
