package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

func testRequeue(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "named dead tasks go back with attempts reset; others are skipped",
		seeds: []Seed{{ID: "a", State: dead}, {ID: "s"}, {ID: "d", State: deliv}},
		run: func(e *env) {
			before := e.now()
			mv, err := e.s.Requeue(e.ctx, e.ns, storage.RequeueParams{IDs: []string{"a", "s", "d", "missing"}, Delay: time.Minute})
			after := e.now()
			if err != nil || len(mv) != 1 || mv[0].ID != "a" || mv[0].State != sched || mv[0].Generation != 1 || mv[0].Attempt != 0 {
				e.t.Fatalf("requeue = %+v, %v; want only a, scheduled, attempt 0", mv, err)
			}
			e.within("due", mv[0].DueTime, before.Add(time.Minute), after.Add(time.Minute))
			if g := e.get("a"); !g.DueTime.Equal(mv[0].DueTime) || !g.DeadTime.IsZero() {
				e.t.Errorf("stored = %+v", g)
			}
		},
		// the last error is kept: it says why the task died
		want: []Row{row("a", sched, 1, 0, seedReason), row("s", sched, 1, 0, ""), row("d", deliv, 1, 1, "")},
	}, {
		name:  "all: the oldest up to limit",
		seeds: []Seed{{ID: "a", State: dead}, {ID: "b", State: dead}, {ID: "c", State: dead}},
		run: func(e *env) {
			mv, err := e.s.Requeue(e.ctx, e.ns, storage.RequeueParams{All: true, Limit: 2})
			if err != nil || len(mv) != 2 {
				e.t.Fatalf("requeue = %+v, %v; want 2", mv, err)
			}
			mv, err = e.s.Requeue(e.ctx, e.ns, storage.RequeueParams{All: true, Limit: 2})
			if err != nil || len(mv) != 1 {
				e.t.Fatalf("second requeue = %+v, %v; want 1", mv, err)
			}
			// requeued with no delay: due now, deliverable again
			if ds := e.pop(10, time.Hour); len(ds) != 3 || ds[0].Task.Attempt != 1 {
				e.t.Errorf("pop after requeue = %+v", ds)
			}
		},
		want: []Row{row("a", deliv, 1, 1, seedReason), row("b", deliv, 1, 1, seedReason), row("c", deliv, 1, 1, seedReason)},
	}, {
		// Issue 10 item 2: with max attempts 1, the delivery that killed the
		// task and the first delivery after the requeue are both attempt 1 of
		// generation 1; a late ack from the first holder must not finish the
		// second delivery.
		name:  "a token from before a requeue never acks the delivery after it",
		seeds: []Seed{{ID: "x"}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), DueTime: e.now().Add(-time.Hour)})
			first := e.pop(1, time.Hour)
			if len(first) != 1 {
				e.t.Fatalf("pop = %+v", first)
			}
			st, _ := e.nack(storage.NackOptions{MaxAttempts: 1, Reason: "boom"}, first[0].Token)
			e.wantStatuses("nack to dead", st, statuses(storage.TokenOK))
			if mv, err := e.s.Requeue(e.ctx, e.ns, storage.RequeueParams{IDs: []string{"x"}}); err != nil || len(mv) != 1 {
				e.t.Fatalf("requeue = %+v, %v", mv, err)
			}
			second := e.pop(1, time.Hour)
			if len(second) != 1 || second[0].Task.Attempt != 1 {
				e.t.Fatalf("pop after requeue = %+v", second)
			}
			if second[0].Token == first[0].Token {
				e.t.Errorf("the delivery after the requeue repeats the token of the one before: %+v", first[0].Token)
			}
			// an older delivery of the same version: STALE, nothing changes
			e.wantStatuses("ack with the pre-requeue token", e.ack(first[0].Token), statuses(storage.TokenStale))
			if g := e.get("x"); g.State != deliv {
				e.t.Fatalf("after the stale ack the task is %v, want still delivered", g.State)
			}
			e.wantStatuses("ack with the current token", e.ack(second[0].Token), statuses(storage.TokenOK))
		},
	}})
}

func testPurge(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "named dead tasks are deleted; others are skipped",
		seeds: []Seed{{ID: "a", State: dead}, {ID: "b", State: dead}, {ID: "s"}, {ID: "d", State: deliv}},
		run: func(e *env) {
			got, err := e.s.Purge(e.ctx, e.ns, storage.PurgeParams{IDs: []string{"a", "s", "d", "missing"}})
			if err != nil || !cmp.Equal(got, []string{"a"}) {
				e.t.Errorf("purge = %v, %v; want [a]", got, err)
			}
			e.wantNotFound("a")
		},
		want: []Row{row("s", sched, 1, 0, ""), row("d", deliv, 1, 1, ""), row("b", dead, 1, 1, seedReason)},
	}, {
		name:  "all: the oldest up to limit",
		seeds: []Seed{{ID: "a", State: dead}, {ID: "b", State: dead}, {ID: "c", State: dead}, {ID: "s"}},
		run: func(e *env) {
			got, err := e.s.Purge(e.ctx, e.ns, storage.PurgeParams{All: true, Limit: 2})
			if err != nil || len(got) != 2 {
				e.t.Errorf("purge = %v, %v; want 2 ids", got, err)
			}
			got2, err := e.s.Purge(e.ctx, e.ns, storage.PurgeParams{All: true, Limit: 2})
			if err != nil || len(got2) != 1 {
				e.t.Errorf("second purge = %v, %v; want 1 id", got2, err)
			}
			if all := append(got, got2...); !cmp.Equal(len(all), 3) {
				e.t.Errorf("purged %v", all)
			}
		},
		want: []Row{row("s", sched, 1, 0, "")},
	}})
}

func testStats(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name: "empty",
		run: func(e *env) {
			st, err := e.s.Stats(e.ctx, e.ns)
			if err != nil || st.Now.IsZero() || (st != storage.Stats{Now: st.Now}) {
				e.t.Errorf("stats = %+v, %v", st, err)
			}
		},
	}, {
		name: "counts per state, due now, oldest due",
		seeds: []Seed{
			{ID: "due1", Due: -2 * time.Minute}, {ID: "due2", Due: -time.Minute}, {ID: "later", Due: time.Hour},
			{ID: "d", State: deliv}, {ID: "x", State: dead},
		},
		run: func(e *env) {
			oldest := e.get("due1").DueTime
			st, err := e.s.Stats(e.ctx, e.ns)
			if err != nil {
				e.t.Fatal(err)
			}
			want := storage.Stats{Scheduled: 3, Delivered: 1, Dead: 1, DueNow: 2, OldestDue: oldest, Now: st.Now}
			if diff := cmp.Diff(want, st); diff != "" {
				e.t.Errorf("stats (-want +got):\n%s", diff)
			}
		},
		want: []Row{
			row("due1", sched, 1, 0, ""), row("due2", sched, 1, 0, ""), row("later", sched, 1, 0, ""),
			row("d", deliv, 1, 1, ""), row("x", dead, 1, 1, seedReason),
		},
	}})
}
