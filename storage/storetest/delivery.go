package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

func testPop(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "at most limit, in due order, not-yet-due tasks stay",
		seeds: []Seed{{ID: "d3", Due: -1 * time.Minute}, {ID: "d1", Due: -3 * time.Minute}, {ID: "d2", Due: -2 * time.Minute}, {ID: "later", Due: time.Hour}},
		run: func(e *env) {
			before := e.now()
			ds := e.pop(2, time.Hour)
			after := e.now()
			var got []string
			for _, d := range ds {
				got = append(got, d.Task.ID)
				if d.Task.State != deliv || d.Task.Attempt != 1 || d.Token.Attempt != 1 || d.Token.Generation != 1 ||
					d.Token.ID != d.Task.ID || d.Token.Namespace != e.ns {
					e.t.Errorf("delivery = %+v", d)
				}
				e.within("lease deadline", d.LeaseDeadline, before.Add(time.Hour), after.Add(time.Hour))
				if !d.Task.LeaseDeadline.Equal(d.LeaseDeadline) || string(d.Task.Payload) != string(payloadOf(d.Task.ID)) {
					e.t.Errorf("delivery task = %+v", d.Task)
				}
				// the stored task is leased, not deleted
				if g := e.get(d.Task.ID); g.State != deliv || !g.LeaseDeadline.Equal(d.LeaseDeadline) || !g.DueTime.Equal(d.Task.DueTime) {
					e.t.Errorf("stored = %+v, want delivered with the delivery's lease", g)
				}
			}
			if diff := cmp.Diff([]string{"d1", "d2"}, got); diff != "" {
				e.t.Errorf("popped (-want +got):\n%s", diff)
			}
			ds = e.pop(10, time.Hour)
			if len(ds) != 1 || ds[0].Task.ID != "d3" {
				e.t.Errorf("second pop = %v, want only d3", ds)
			}
			if ds := e.pop(10, time.Hour); len(ds) != 0 {
				e.t.Errorf("third pop = %d tasks, want none", len(ds))
			}
			if ds := e.pop(0, time.Hour); len(ds) != 0 {
				e.t.Errorf("pop with limit 0 = %d tasks", len(ds))
			}
		},
		want: []Row{row("later", sched, 1, 0, ""), row("d1", deliv, 1, 1, ""), row("d2", deliv, 1, 1, ""), row("d3", deliv, 1, 1, "")},
	}, {
		name:  "a task due in a moment is popped once it is due",
		seeds: []Seed{{ID: "soon", Due: 300 * time.Millisecond}},
		run: func(e *env) {
			due := e.get("soon").DueTime
			var ds []storage.Delivery
			poll(e.t, "the task to fall due", func() bool {
				ds = e.pop(10, time.Hour)
				return len(ds) != 0
			})
			// popped no earlier than due by the store clock
			if now := e.now(); now.Before(due) {
				e.t.Errorf("popped at store time before %v", due)
			}
			if len(ds) != 1 || ds[0].Task.ID != "soon" {
				e.t.Errorf("pop = %v", ds)
			}
		},
		want: []Row{row("soon", deliv, 1, 1, "")},
	}, {
		name: "empty namespace",
		run: func(e *env) {
			if ds := e.pop(10, time.Hour); len(ds) != 0 {
				e.t.Errorf("pop = %v", ds)
			}
		},
	}})
}

func testAck(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "OK deletes; a second ack is NOT_FOUND",
		seeds: []Seed{{ID: "x", State: deliv}, {ID: "y", State: deliv}},
		run: func(e *env) {
			e.wantStatuses("ack", e.ack(e.tok["x"]), statuses(storage.TokenOK))
			e.wantNotFound("x")
			e.wantStatuses("second ack", e.ack(e.tok["x"], e.tok["y"]), statuses(storage.TokenNotFound, storage.TokenOK))
		},
	}, {
		name:  "older generation is STALE and changes nothing",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour})
			e.wantStatuses("ack", e.ack(e.tok["x"]), statuses(storage.TokenStale))
		},
		want: []Row{row("x", sched, 2, 0, "")},
	}, {
		name:  "older attempt is STALE after a redelivery",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			st, _ := e.nack(storage.NackOptions{RetryAfter: dur(0)}, e.tok["x"])
			e.wantStatuses("nack", st, statuses(storage.TokenOK))
			ds := e.pop(1, time.Hour)
			if len(ds) != 1 || ds[0].Token.Attempt != 2 {
				e.t.Fatalf("redelivery = %+v", ds)
			}
			e.wantStatuses("ack of attempt 1", e.ack(e.tok["x"]), statuses(storage.TokenStale))
		},
		want: []Row{row("x", deliv, 1, 2, "")},
	}, {
		name:  "a delivery given back is NOT_FOUND",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			e.nack(storage.NackOptions{RetryAfter: dur(time.Hour)}, e.tok["x"])
			e.wantStatuses("ack", e.ack(e.tok["x"]), statuses(storage.TokenNotFound))
		},
		want: []Row{row("x", sched, 1, 1, "")},
	}, {
		name:  "unknown task, newer delivery, other namespace: NOT_FOUND, nothing changes",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			tok := e.tok["x"]
			newer := tok
			newer.Delivery++
			other := tok
			other.Namespace = Namespace(e.t)
			missing := tok
			missing.ID = "missing"
			// A token naming no delivery matches nothing, not even the
			// delivery whose incarnation and generation it names.
			noIncarnation := tok
			noIncarnation.Delivery = 0
			otherIncarnation := tok
			otherIncarnation.Incarnation++
			e.wantStatuses("ack", e.ack(newer, other, missing, noIncarnation, otherIncarnation),
				statuses(storage.TokenNotFound, storage.TokenNotFound, storage.TokenNotFound, storage.TokenNotFound, storage.TokenNotFound))
		},
		want: []Row{row("x", deliv, 1, 1, "")},
	}, {
		// Issue 42 item 7: the attempt is part of the token's fence, as
		// its version and delivery are. A token that names the delivery in
		// flight with another attempt was never issued: it settles nothing
		// (and so records no event with its made-up attempt).
		name:  "a token with another attempt than its delivery's: NOT_FOUND for ack, nack and extend",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			tok := e.tok["x"]
			var forged []storage.Token
			for _, a := range []int32{0, tok.Attempt + 1, 999} {
				f := tok
				f.Attempt = a
				forged = append(forged, f)
			}
			want := statuses(storage.TokenNotFound, storage.TokenNotFound, storage.TokenNotFound)
			e.wantStatuses("ack", e.ack(forged...), want)
			st, mv := e.nack(storage.NackOptions{RetryAfter: dur(0)}, forged...)
			e.wantStatuses("nack", st, want)
			if len(mv) != 0 {
				e.t.Errorf("nack of forged tokens moved %+v", mv)
			}
			res, err := e.s.Extend(e.ctx, e.ns, forged, 2*time.Hour)
			if err != nil || len(res) != 3 || res[0].Status != storage.TokenNotFound || res[1].Status != storage.TokenNotFound || res[2].Status != storage.TokenNotFound {
				e.t.Errorf("extend of forged tokens = %+v, %v; want NOT_FOUND each", res, err)
			}
			e.wantStatuses("ack of the real token", e.ack(tok), statuses(storage.TokenOK))
		},
	}, {
		name:  "a token from before a remove never touches the re-created task",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			old := e.tok["x"]
			if old.Delivery == 0 {
				e.t.Fatalf("popped token names no delivery: %+v", old)
			}
			if _, err := e.s.Remove(e.ctx, e.ns, "x", storage.Version{}); err != nil {
				e.t.Fatalf("remove: %v", err)
			}
			// Re-created at once (within the same millisecond, often): the
			// new incarnation and its deliveries must still be told apart.
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), DueTime: e.now().Add(-time.Hour)})
			ds := e.pop(1, time.Hour)
			if len(ds) != 1 || ds[0].Task.ID != "x" {
				e.t.Fatalf("pop of the re-created task = %+v", ds)
			}
			cur := ds[0].Token
			if cur == old {
				e.t.Fatalf("re-created task's delivery repeats the old token %+v", old)
			}
			if cur.Incarnation <= old.Incarnation {
				e.t.Errorf("re-created task's incarnation %d is not above the old one %d", cur.Incarnation, old.Incarnation)
			}
			if cur.Generation != old.Generation || cur.Attempt != old.Attempt {
				e.t.Logf("re-created delivery is gen %d attempt %d (old gen %d attempt %d)",
					cur.Generation, cur.Attempt, old.Generation, old.Attempt)
			}
			e.wantStatuses("ack of the old token", e.ack(old), statuses(storage.TokenNotFound))
			st, mv := e.nack(storage.NackOptions{RetryAfter: dur(0)}, old)
			e.wantStatuses("nack of the old token", st, statuses(storage.TokenNotFound))
			if len(mv) != 0 {
				e.t.Errorf("nack of the old token moved %+v", mv)
			}
			res, err := e.s.Extend(e.ctx, e.ns, []storage.Token{old}, 2*time.Hour)
			if err != nil || len(res) != 1 || res[0].Status != storage.TokenNotFound {
				e.t.Errorf("extend of the old token = %+v, %v; want NOT_FOUND", res, err)
			}
			if g := e.get("x"); g.State != deliv || g.Attempt != 1 || !g.LeaseDeadline.Equal(ds[0].LeaseDeadline) {
				e.t.Errorf("re-created task after the old token = %+v, want still in flight, attempt 1, lease %v", g, ds[0].LeaseDeadline)
			}
			e.wantStatuses("ack of the new token", e.ack(cur), statuses(storage.TokenOK))
			e.wantNotFound("x")
		},
	}, {
		name:  "the same token twice in one call: OK, then NOT_FOUND",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			e.wantStatuses("ack", e.ack(e.tok["x"], e.tok["x"]), statuses(storage.TokenOK, storage.TokenNotFound))
		},
	}, {
		name: "empty batch",
		run: func(e *env) {
			if st := e.ack(); len(st) != 0 {
				e.t.Errorf("statuses = %v", st)
			}
		},
	}})
}

func testNack(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "retry_after: back to scheduled at now + retry_after, reason kept",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			before := e.now()
			st, mv := e.nack(storage.NackOptions{RetryAfter: dur(5 * time.Minute), Reason: "busy", MaxAttempts: 10,
				Backoff: noJitter(time.Hour, time.Hour)}, e.tok["x"])
			after := e.now()
			e.wantStatuses("nack", st, statuses(storage.TokenOK))
			if len(mv) != 1 || mv[0].ID != "x" || mv[0].State != sched || mv[0].Generation != 1 || mv[0].Attempt != 1 || mv[0].LastError != "busy" {
				e.t.Fatalf("moved = %+v", mv)
			}
			e.within("due", mv[0].DueTime, before.Add(5*time.Minute), after.Add(5*time.Minute))
			if g := e.get("x"); !g.DueTime.Equal(mv[0].DueTime) || !g.LeaseDeadline.IsZero() {
				e.t.Errorf("stored = %+v", g)
			}
		},
		want: []Row{row("x", sched, 1, 1, "busy")},
	}, {
		name:  "retry_after zero: due at once",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			e.nack(storage.NackOptions{RetryAfter: dur(0), MaxAttempts: 10}, e.tok["x"])
			if ds := e.pop(1, time.Hour); len(ds) != 1 || ds[0].Task.Attempt != 2 {
				e.t.Errorf("redelivery = %+v", ds)
			}
		},
		want: []Row{row("x", deliv, 1, 2, "")},
	}, {
		name:  "without retry_after: the backoff for the attempt, capped",
		seeds: []Seed{{ID: "x", State: deliv}, {ID: "y", State: deliv}, {ID: "z", State: deliv}},
		run: func(e *env) {
			before := e.now()
			_, mv := e.nack(storage.NackOptions{MaxAttempts: 10, Backoff: noJitter(time.Hour, 3*time.Hour)}, e.tok["y"])
			after := e.now()
			e.within("due after attempt 1", mv[0].DueTime, before.Add(time.Hour), after.Add(time.Hour))
			// x and z: due again at once, redelivered as attempt 2
			e.nack(storage.NackOptions{RetryAfter: dur(0)}, e.tok["x"], e.tok["z"])
			ds := e.pop(10, time.Hour)
			if len(ds) != 2 || ds[0].Task.Attempt != 2 || ds[1].Task.Attempt != 2 {
				e.t.Fatalf("redelivery = %+v", ds)
			}
			tok := map[string]storage.Token{ds[0].Task.ID: ds[0].Token, ds[1].Task.ID: ds[1].Token}
			before = e.now()
			_, mx := e.nack(storage.NackOptions{MaxAttempts: 10, Backoff: noJitter(time.Hour, 90*time.Minute)}, tok["x"])
			_, mz := e.nack(storage.NackOptions{MaxAttempts: 10, Backoff: noJitter(time.Hour, 3*time.Hour)}, tok["z"])
			after = e.now()
			e.within("due after attempt 2 (capped at 90 min)", mx[0].DueTime, before.Add(90*time.Minute), after.Add(90*time.Minute))
			e.within("due after attempt 2 (2 h)", mz[0].DueTime, before.Add(2*time.Hour), after.Add(2*time.Hour))
		},
		want: []Row{row("x", sched, 1, 2, ""), row("y", sched, 1, 1, ""), row("z", sched, 1, 2, "")},
	}, {
		name:  "jitter shortens the backoff by at most its fraction",
		seeds: []Seed{{ID: "a", State: deliv}, {ID: "b", State: deliv}, {ID: "c", State: deliv}, {ID: "d", State: deliv}},
		run: func(e *env) {
			opts := storage.NackOptions{Backoff: storage.Backoff{Initial: time.Hour, Max: time.Hour, Multiplier: 2, Jitter: 0.5}}
			before := e.now()
			_, mv := e.nack(opts, e.tok["a"], e.tok["b"], e.tok["c"], e.tok["d"])
			after := e.now()
			distinct := map[time.Duration]bool{}
			for _, m := range mv {
				e.within("due of "+m.ID, m.DueTime, before.Add(30*time.Minute), after.Add(time.Hour))
				distinct[m.DueTime.Sub(before).Truncate(time.Second)] = true
			}
			if len(distinct) < 2 {
				e.t.Errorf("4 jittered delays are all equal: %v", mv)
			}
		},
		want: []Row{row("a", sched, 1, 1, ""), row("b", sched, 1, 1, ""), row("c", sched, 1, 1, ""), row("d", sched, 1, 1, "")},
	}, {
		name:  "at max attempts: dead",
		seeds: []Seed{{ID: "x", State: deliv}, {ID: "y", State: deliv}},
		run: func(e *env) {
			before := e.now()
			st, mv := e.nack(storage.NackOptions{MaxAttempts: 1, Reason: "bad payload", RetryAfter: dur(0)}, e.tok["x"])
			after := e.now()
			e.wantStatuses("nack", st, statuses(storage.TokenOK))
			if len(mv) != 1 || mv[0].State != dead || mv[0].LastError != "bad payload" || !mv[0].DueTime.IsZero() {
				e.t.Fatalf("moved = %+v", mv)
			}
			e.within("dead time", mv[0].DeadTime, before, after)
			if g := e.get("x"); g.State != dead || !g.DeadTime.Equal(mv[0].DeadTime) {
				e.t.Errorf("stored = %+v", g)
			}
			// below the maximum: retried
			_, mv = e.nack(storage.NackOptions{MaxAttempts: 2, RetryAfter: dur(time.Hour)}, e.tok["y"])
			if len(mv) != 1 || mv[0].State != sched {
				e.t.Errorf("moved = %+v", mv)
			}
		},
		want: []Row{row("y", sched, 1, 1, ""), row("x", dead, 1, 1, "bad payload")},
	}, {
		name:  "the same token twice in one call: OK, then NOT_FOUND",
		seeds: []Seed{{ID: "x", State: deliv}},
		run: func(e *env) {
			st, mv := e.nack(storage.NackOptions{RetryAfter: dur(time.Hour), Reason: "r"}, e.tok["x"], e.tok["x"])
			e.wantStatuses("nack", st, statuses(storage.TokenOK, storage.TokenNotFound))
			if len(mv) != 1 {
				e.t.Errorf("moved = %+v, want one", mv)
			}
		},
		want: []Row{row("x", sched, 1, 1, "r")},
	}, {
		name:  "stale and unknown tokens change nothing",
		seeds: []Seed{{ID: "x", State: deliv}, {ID: "z", State: deliv}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: time.Hour})
			missing := e.tok["z"]
			missing.ID = "missing"
			st, mv := e.nack(storage.NackOptions{RetryAfter: dur(0)}, e.tok["x"], missing, e.tok["z"])
			e.wantStatuses("nack", st, statuses(storage.TokenStale, storage.TokenNotFound, storage.TokenOK))
			if len(mv) != 1 || mv[0].ID != "z" {
				e.t.Errorf("moved = %+v, want only z", mv)
			}
		},
		want: []Row{row("x", sched, 2, 0, ""), row("z", sched, 1, 1, "")},
	}})
}

func testExtend(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "OK sets the lease to now + by; stale and unknown tokens change nothing",
		seeds: []Seed{{ID: "x", State: deliv}, {ID: "y", State: deliv}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "y", Payload: payloadOf("y"), Delay: time.Hour})
			missing := e.tok["x"]
			missing.ID = "missing"
			before := e.now()
			res, err := e.s.Extend(e.ctx, e.ns, []storage.Token{e.tok["x"], e.tok["y"], missing}, 3*time.Hour)
			after := e.now()
			if err != nil || len(res) != 3 {
				e.t.Fatalf("extend = %v, %v", res, err)
			}
			if res[0].Status != storage.TokenOK || res[1].Status != storage.TokenStale || res[2].Status != storage.TokenNotFound {
				e.t.Errorf("statuses = %+v", res)
			}
			e.within("lease deadline", res[0].LeaseDeadline, before.Add(3*time.Hour), after.Add(3*time.Hour))
			if !res[1].LeaseDeadline.IsZero() {
				e.t.Errorf("stale result has a deadline: %+v", res[1])
			}
			if g := e.get("x"); !g.LeaseDeadline.Equal(res[0].LeaseDeadline) {
				e.t.Errorf("stored lease %v, want %v", g.LeaseDeadline, res[0].LeaseDeadline)
			}
			// the extended delivery can still be acked
			e.wantStatuses("ack", e.ack(e.tok["x"]), statuses(storage.TokenOK))
		},
		want: []Row{row("y", sched, 2, 0, "")},
	}, {
		name:  "the told deadline (TellFor) is kept with the delivery; an extend moves it only past it",
		seeds: []Seed{{ID: "x", Due: -time.Minute}},
		run: func(e *env) {
			// big's payload is stored apart from its header, x's inline
			e.upsert(storage.UpsertSpec{ID: "big", Kind: "k;|", Payload: make([]byte, 300), DueTime: e.now().Add(-time.Minute)})
			before := e.now()
			ds, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{Limit: 5, LeaseFor: 10 * time.Minute, TellFor: time.Hour})
			after := e.now()
			if err != nil || len(ds) != 2 {
				e.t.Fatalf("pop = %v, %v", ds, err)
			}
			told := map[string]time.Time{}
			for _, d := range ds {
				e.within("store lease", d.LeaseDeadline, before.Add(10*time.Minute), after.Add(10*time.Minute))
				e.within("told deadline", d.Task.LeaseDeadline, before.Add(time.Hour), after.Add(time.Hour))
				told[d.Task.ID] = d.Task.LeaseDeadline
				e.tok[d.Task.ID] = d.Token
				if g := e.get(d.Task.ID); !g.LeaseDeadline.Equal(d.Task.LeaseDeadline) || len(g.Payload) != len(d.Task.Payload) || g.Kind != d.Task.Kind {
					e.t.Errorf("get %s = %+v, want the told deadline %v", d.Task.ID, g, d.Task.LeaseDeadline)
				}
			}
			for _, l := range e.listAll(deliv, 10) {
				if !l.LeaseDeadline.Equal(told[l.ID]) {
					e.t.Errorf("list: %s lease %v, want the told %v", l.ID, l.LeaseDeadline, told[l.ID])
				}
			}
			// a renewal short of the told deadline leaves it
			res, err := e.s.Extend(e.ctx, e.ns, []storage.Token{e.tok["x"], e.tok["big"]}, 20*time.Minute)
			if err != nil || len(res) != 2 || res[0].Status != storage.TokenOK || res[1].Status != storage.TokenOK {
				e.t.Fatalf("extend = %+v, %v", res, err)
			}
			if g := e.get("x"); !g.LeaseDeadline.Equal(told["x"]) {
				e.t.Errorf("after a shorter extend: lease %v, want the told %v", g.LeaseDeadline, told["x"])
			}
			// an extension past it is the new told deadline
			res, err = e.s.Extend(e.ctx, e.ns, []storage.Token{e.tok["big"]}, 2*time.Hour)
			if err != nil || len(res) != 1 || res[0].Status != storage.TokenOK {
				e.t.Fatalf("extend = %+v, %v", res, err)
			}
			if g := e.get("big"); !g.LeaseDeadline.Equal(res[0].LeaseDeadline) || len(g.Payload) != 300 || g.Kind != "k;|" {
				e.t.Errorf("after a longer extend: %+v, want lease %v", g, res[0].LeaseDeadline)
			}
			// taken back and popped again without TellFor: the store lease
			e.nack(storage.NackOptions{RetryAfter: dur(0)}, e.tok["x"])
			ds = e.pop(1, 10*time.Minute)
			if len(ds) != 1 || ds[0].Task.ID != "x" {
				e.t.Fatalf("second pop = %v", ds)
			}
			if g := e.get("x"); !g.LeaseDeadline.Equal(ds[0].LeaseDeadline) || !ds[0].Task.LeaseDeadline.Equal(ds[0].LeaseDeadline) {
				e.t.Errorf("popped again: get %v, delivery %v / %v, want the store lease", g.LeaseDeadline, ds[0].Task.LeaseDeadline, ds[0].LeaseDeadline)
			}
			e.wantStatuses("ack", e.ack(ds[0].Token, e.tok["big"]), statuses(storage.TokenOK, storage.TokenOK))
		},
	}, {
		name:  "a task not in flight is NOT_FOUND",
		seeds: []Seed{{ID: "x", State: dead}, {ID: "d", State: deliv}},
		run: func(e *env) {
			e.nack(storage.NackOptions{RetryAfter: dur(time.Hour)}, e.tok["d"])
			// x's last delivery, exact in all but being in flight.
			deadTok := e.tok["x"]
			res, err := e.s.Extend(e.ctx, e.ns, []storage.Token{e.tok["d"], deadTok}, time.Hour)
			if err != nil || len(res) != 2 || res[0].Status != storage.TokenNotFound || res[1].Status != storage.TokenNotFound {
				e.t.Errorf("extend = %+v, %v", res, err)
			}
		},
		want: []Row{row("d", sched, 1, 1, ""), row("x", dead, 1, 1, seedReason)},
	}})
}

// leaseShort is the lease of tests that wait for one to expire.
const leaseShort = 30 * time.Millisecond

func (e *env) reapUntil(want int, limit int, opts storage.NackOptions) []storage.Moved {
	e.t.Helper()
	var got []storage.Moved
	poll(e.t, fmt.Sprintf("%d expired leases", want), func() bool {
		mv, err := e.s.Reap(e.ctx, e.ns, limit, opts)
		if err != nil {
			e.t.Fatalf("reap: %v", err)
		}
		if len(mv) > limit {
			e.t.Fatalf("reap moved %d, limit %d", len(mv), limit)
		}
		got = append(got, mv...)
		return len(got) >= want
	})
	return got
}

func testReap(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "expired leases go back with backoff; live leases stay",
		seeds: []Seed{{ID: "live", State: deliv}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x"), Delay: 0})
			ds := e.pop(1, leaseShort)
			if len(ds) != 1 {
				e.t.Fatalf("pop = %v", ds)
			}
			opts := storage.NackOptions{MaxAttempts: 5, Reason: "lease expired", Backoff: noJitter(time.Hour, time.Hour)}
			mv := e.reapUntil(1, 10, opts)
			after := e.now()
			if len(mv) != 1 || mv[0].ID != "x" || mv[0].State != sched || mv[0].Attempt != 1 || mv[0].Generation != 1 || mv[0].LastError != "lease expired" {
				e.t.Fatalf("moved = %+v", mv)
			}
			e.within("due", mv[0].DueTime, ds[0].LeaseDeadline.Add(time.Hour), after.Add(time.Hour))
			e.wantStatuses("ack of the expired delivery", e.ack(ds[0].Token), statuses(storage.TokenNotFound))
			if mv, _ := e.s.Reap(e.ctx, e.ns, 10, opts); len(mv) != 0 {
				e.t.Errorf("second reap = %+v", mv)
			}
		},
		want: []Row{row("x", sched, 1, 1, "lease expired"), row("live", deliv, 1, 1, "")},
	}, {
		// A reap that waited out a stall in the store (sent before, run
		// after) takes back only what had expired when it was sent.
		name:  "expired by: leases that ran out after it stay",
		seeds: []Seed{{ID: "live", State: deliv}},
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x")})
			ds := e.pop(1, leaseShort)
			if len(ds) != 1 {
				e.t.Fatalf("pop = %v", ds)
			}
			lease := ds[0].LeaseDeadline
			poll(e.t, "the lease to run out", func() bool { return e.now().After(lease) })
			opts := storage.NackOptions{MaxAttempts: 5, RetryAfter: dur(time.Hour), ExpiredBy: lease.Add(-time.Millisecond)}
			if mv, err := e.s.Reap(e.ctx, e.ns, 10, opts); err != nil || len(mv) != 0 {
				e.t.Fatalf("reap expired by a millisecond before the lease's end = %+v, %v; want nothing moved", mv, err)
			}
			opts.ExpiredBy = lease
			if mv, err := e.s.Reap(e.ctx, e.ns, 10, opts); err != nil || len(mv) != 1 || mv[0].ID != "x" {
				e.t.Fatalf("reap expired by the lease's end = %+v, %v; want x moved", mv, err)
			}
		},
		want: []Row{row("x", sched, 1, 1, ""), row("live", deliv, 1, 1, "")},
	}, {
		name: "at max attempts: dead",
		run: func(e *env) {
			e.upsert(storage.UpsertSpec{ID: "x", Payload: payloadOf("x")})
			ds := e.pop(1, leaseShort)
			mv := e.reapUntil(1, 10, storage.NackOptions{MaxAttempts: 1, Reason: "lease expired"})
			if len(mv) != 1 || mv[0].State != dead || mv[0].DeadTime.Before(ds[0].LeaseDeadline) {
				e.t.Errorf("moved = %+v", mv)
			}
		},
		want: []Row{row("x", dead, 1, 1, "lease expired")},
	}, {
		name: "at most limit per call",
		run: func(e *env) {
			var specs []storage.UpsertSpec
			for _, id := range ids(3, "x") {
				specs = append(specs, storage.UpsertSpec{ID: id, Payload: payloadOf(id)})
			}
			e.upsert(specs...)
			if ds := e.pop(3, leaseShort); len(ds) != 3 {
				e.t.Fatalf("pop = %d", len(ds))
			}
			mv := e.reapUntil(3, 2, storage.NackOptions{MaxAttempts: 5, RetryAfter: dur(time.Hour)})
			if len(mv) != 3 {
				e.t.Errorf("moved %d, want 3", len(mv))
			}
		},
		want: []Row{row("x000", sched, 1, 1, ""), row("x001", sched, 1, 1, ""), row("x002", sched, 1, 1, "")},
	}})
}

func testNextWake(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name: "empty",
		run: func(e *env) {
			_, now, ok, err := e.s.NextWake(e.ctx, e.ns)
			if err != nil || ok || now.IsZero() {
				e.t.Errorf("next wake: ok %v now %v err %v; want not ok, store now", ok, now, err)
			}
		},
	}, {
		name:  "earliest of first due and first lease deadline",
		seeds: []Seed{{ID: "s", Due: 2 * time.Hour}, {ID: "d", State: deliv}},
		run: func(e *env) {
			lease := e.get("d").LeaseDeadline // 1 h
			next, _, ok, err := e.s.NextWake(e.ctx, e.ns)
			if err != nil || !ok || !next.Equal(lease) {
				e.t.Errorf("next = %v ok %v err %v; want lease deadline %v", next, ok, err, lease)
			}
			e.upsert(storage.UpsertSpec{ID: "s", Payload: payloadOf("s"), Delay: time.Minute})
			due := e.get("s").DueTime
			next, _, ok, err = e.s.NextWake(e.ctx, e.ns)
			if err != nil || !ok || !next.Equal(due) {
				e.t.Errorf("next = %v ok %v err %v; want due %v", next, ok, err, due)
			}
		},
		want: []Row{row("s", sched, 2, 0, ""), row("d", deliv, 1, 1, "")},
	}})
}

// testPopWake checks that PopWake pops as Pop does and answers, in the same
// call, what NextWake would answer right after it: the dispatcher plans its
// next wake from it and makes no second call.
func testPopWake(t *testing.T, newStore func(t *testing.T) storage.Store) {
	popWake := func(e *env, limit int) storage.PopResult {
		e.t.Helper()
		before := e.now()
		r, err := e.s.PopWake(e.ctx, e.ns, storage.PopParams{Limit: limit, LeaseFor: 2 * time.Hour})
		if err != nil {
			e.t.Fatalf("pop wake: %v", err)
		}
		e.within("pop wake now", r.Now, before.Add(-time.Millisecond), e.now().Add(time.Millisecond))
		return r
	}
	runTable(t, newStore, []transition{{
		name: "empty",
		run: func(e *env) {
			if r := popWake(e, 5); r.HasNext || len(r.Deliveries) != 0 || !r.NextDue.IsZero() {
				e.t.Errorf("pop wake = %d deliveries, has next %v, next due %v; want none, no next", len(r.Deliveries), r.HasNext, r.NextDue)
			}
		},
	}, {
		name:  "pops the due ones and answers the next due time",
		seeds: []Seed{{ID: "a", Due: -2 * time.Minute}, {ID: "b", Due: -time.Minute}, {ID: "c", Due: time.Minute}},
		run: func(e *env) {
			due := e.get("c").DueTime
			r := popWake(e, 5)
			if len(r.Deliveries) != 2 || r.Deliveries[0].Task.ID != "a" || r.Deliveries[1].Task.ID != "b" {
				e.t.Fatalf("pop wake = %v; want a, b", r.Deliveries)
			}
			if !r.HasNext || !r.Next.Equal(due) {
				e.t.Errorf("next = %v (has %v); want c's due time %v", r.Next, r.HasNext, due)
			}
		},
		want: []Row{row("c", sched, 1, 0, ""), row("a", deliv, 1, 1, ""), row("b", deliv, 1, 1, "")},
	}, {
		name:  "a limit that leaves due tasks behind answers a next wake now or earlier",
		seeds: []Seed{{ID: "a", Due: -2 * time.Minute}, {ID: "b", Due: -time.Minute}},
		run: func(e *env) {
			r := popWake(e, 1)
			if len(r.Deliveries) != 1 || !r.HasNext || r.Next.After(r.Now) {
				e.t.Errorf("pop wake = %d deliveries, next %v (has %v), now %v; want 1, next <= now", len(r.Deliveries), r.Next, r.HasNext, r.Now)
			}
		},
		want: []Row{row("b", sched, 1, 0, ""), row("a", deliv, 1, 1, "")},
	}, {
		name:  "the first lease deadline when it comes first",
		seeds: []Seed{{ID: "d", State: deliv}, {ID: "s", Due: 3 * time.Hour}},
		run: func(e *env) {
			lease := e.get("d").LeaseDeadline // 1 h
			due := e.get("s").DueTime
			r := popWake(e, 5)
			if len(r.Deliveries) != 0 || !r.HasNext || !r.Next.Equal(lease) {
				e.t.Errorf("pop wake = %d deliveries, next %v (has %v); want none, lease deadline %v", len(r.Deliveries), r.Next, r.HasNext, lease)
			}
			// A store that tells the due head apart says when s is due
			// (the dispatcher wakes for it while reaping is held).
			if r.DueKnown && !r.NextDue.Equal(due) {
				e.t.Errorf("next due = %v; want s's due time %v", r.NextDue, due)
			}
		},
		want: []Row{row("s", sched, 1, 0, ""), row("d", deliv, 1, 1, "")},
	}, {
		name:  "limit 0 pops nothing and still answers",
		seeds: []Seed{{ID: "a", Due: -time.Minute}},
		run: func(e *env) {
			due := e.get("a").DueTime
			r := popWake(e, 0)
			if len(r.Deliveries) != 0 || !r.HasNext || !r.Next.Equal(due) {
				e.t.Errorf("pop wake = %d deliveries, next %v (has %v); want none, a's due time %v", len(r.Deliveries), r.Next, r.HasNext, due)
			}
		},
		want: []Row{row("a", sched, 1, 0, "")},
	}, {
		// Issue 37 item 3: a store told of a pop coming may hold acks and
		// nacks for it (the Redis index settles them in that pop's
		// script call), but every caller is still answered, fenced as
		// ever, by the pop or, once no pop is coming, on its own.
		name:  "acks and nacks while a pop is coming: settled and answered by it, or once none comes",
		seeds: []Seed{{ID: "x", State: deliv}, {ID: "y", State: deliv}, {ID: "z", State: deliv}},
		run: func(e *env) {
			e.s.ExpectPop(e.ns, time.Minute)
			type answer struct {
				st []storage.TokenStatus
				mv []storage.Moved
			}
			acked, nacked := make(chan answer, 1), make(chan answer, 1)
			go func() {
				st, err := e.s.Ack(e.ctx, e.ns, []storage.Token{e.tok["x"], e.tok["x"]})
				if err != nil {
					e.t.Errorf("ack: %v", err)
				}
				acked <- answer{st: st}
			}()
			go func() {
				st, mv, err := e.s.Nack(e.ctx, e.ns, []storage.Token{e.tok["y"]}, storage.NackOptions{RetryAfter: dur(time.Hour), Reason: "later"})
				if err != nil {
					e.t.Errorf("nack: %v", err)
				}
				nacked <- answer{st: st, mv: mv}
			}()
			r := popWake(e, 5)
			if len(r.Deliveries) != 0 {
				e.t.Errorf("pop wake delivered %v; nothing is due", r.Deliveries)
			}
			e.s.ExpectPop(e.ns, 0) // whatever still waits goes now
			a, n := <-acked, <-nacked
			e.wantStatuses("ack", a.st, statuses(storage.TokenOK, storage.TokenNotFound))
			e.wantStatuses("nack", n.st, statuses(storage.TokenOK))
			if len(n.mv) != 1 || n.mv[0].ID != "y" || n.mv[0].State != sched {
				e.t.Errorf("nack moved %+v; want y to scheduled", n.mv)
			}
		},
		want: []Row{row("y", sched, 1, 1, "later"), row("z", deliv, 1, 1, "")},
	}})
}

func testWakeups(t *testing.T, newStore func(t *testing.T) WakeupStore) {
	t.Parallel()
	var w storage.Wakeups
	e := newEnv(t, func(t *testing.T) storage.Store { s := newStore(t); w = s; return s })
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan string, 100)
	policy := make(chan string, 100)
	settled := make(chan []storage.Token, 100)
	done := make(chan error, 1)
	ready := make(chan struct{}, 10)
	// Served before the subscription: a store with a channel per
	// namespace shard (Redis Cluster) subscribes to e.ns's, and says so
	// with a wake-up of e.ns once each is confirmed (ServeWakeups).
	w.ServeWakeups(e.ns, true)
	t.Cleanup(func() { w.ServeWakeups(e.ns, false) })
	go func() {
		done <- w.SubscribeWakeups(ctx, func() { ready <- struct{}{} }, func(wu storage.Wakeup) {
			if wu.Namespace != e.ns {
				return
			}
			if len(wu.Settled) > 0 {
				select {
				case settled <- wu.Settled:
				default:
				}
				return
			}
			ch := got
			if wu.PolicyChanged {
				ch = policy
			}
			select {
			case ch <- wu.Namespace:
			default:
			}
		})
	}()
	// Once the subscription says it is made, a wake-up published reaches
	// it: one upsert that makes a task the earliest is enough.
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("SubscribeWakeups never called ready")
	}
	if r := e.upsert(storage.UpsertSpec{ID: "x", Delay: time.Hour}); !r[0].Earliest {
		t.Fatalf("upsert into an empty namespace: Earliest = false")
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Errorf("no wake-up for %s within 10 s of an upsert made after the subscription was ready", e.ns)
	}
	// A policy change reaches the subscription as such, never as an
	// earliest-task wake-up.
	if err := w.PublishPolicyChanged(e.ctx, e.ns); err != nil {
		t.Fatalf("PublishPolicyChanged: %v", err)
	}
	select {
	case <-policy:
	case <-time.After(10 * time.Second):
		t.Errorf("no policy-change wake-up for %s within 10 s of PublishPolicyChanged", e.ns)
	}
	// Settled deliveries reach the subscription with their tokens intact.
	toks := []storage.Token{
		{Namespace: e.ns, ID: "x", Incarnation: 1_700_000_000_000_123, Generation: 2, Attempt: 3, Delivery: 1_700_000_000_000_456},
		{Namespace: e.ns, ID: "y/é", Incarnation: 1, Generation: 1, Attempt: 1, Delivery: 1},
	}
	if err := w.PublishSettled(e.ctx, e.ns, toks); err != nil {
		t.Fatalf("PublishSettled: %v", err)
	}
	select {
	case got := <-settled:
		if !slices.Equal(got, toks) {
			t.Errorf("settled wake-up carried %+v, want %+v", got, toks)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("no settled wake-up for %s within 10 s of PublishSettled", e.ns)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("SubscribeWakeups returned %v, want nil or context.Canceled", err)
	}
}

func testConcurrentPop(t *testing.T, newStore func(t *testing.T) storage.Store) {
	t.Parallel()
	e := newEnv(t, newStore)
	const tasks, workers = 600, 8
	var specs []storage.UpsertSpec
	for _, id := range ids(tasks, "c") {
		specs = append(specs, storage.UpsertSpec{ID: id, Payload: payloadOf(id)})
	}
	e.upsert(specs...)
	type key struct {
		id      string
		attempt int32
	}
	var (
		mu   sync.Mutex
		seen = map[key]int{}
		wg   sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				ds, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{Limit: 7, LeaseFor: time.Hour})
				if err != nil {
					t.Errorf("worker %d: pop: %v", w, err)
					return
				}
				if len(ds) == 0 {
					return
				}
				var toks []storage.Token
				mu.Lock()
				for _, d := range ds {
					seen[key{d.Task.ID, d.Task.Attempt}]++
					toks = append(toks, d.Token)
				}
				mu.Unlock()
				// give every third batch back, so tasks are popped again
				if n%3 == 0 && w%2 == 0 {
					st, _, err := e.s.Nack(e.ctx, e.ns, toks, storage.NackOptions{RetryAfter: dur(0), MaxAttempts: 3})
					if err != nil {
						t.Errorf("nack: %v", err)
						return
					}
					for i, s := range st {
						if s != storage.TokenOK {
							t.Errorf("nack of a fresh delivery %+v: %v", toks[i], s)
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	firsts := 0
	for k, n := range seen {
		if n != 1 {
			t.Errorf("task %s attempt %d delivered %d times", k.id, k.attempt, n)
		}
		if k.attempt == 1 {
			firsts++
		}
	}
	if firsts != tasks {
		t.Errorf("%d tasks delivered at least once, want %d", firsts, tasks)
	}
	st, err := e.s.Stats(e.ctx, e.ns)
	if err != nil || st.Scheduled+st.Delivered+st.Dead != tasks || st.Scheduled != 0 {
		t.Errorf("stats = %+v, %v; want %d tasks, none scheduled", st, err, tasks)
	}
}

// testPopRate: with PopParams.MaxRate, Pop takes at most the whole tokens
// of the namespace's bucket (Burst when it is new or idle), spends one per
// task, refills at MaxRate per second, and a Pop without MaxRate neither
// waits for nor spends tokens.
func testPopRate(t *testing.T, newStore func(t *testing.T) storage.Store) {
	t.Parallel()
	e := newEnv(t, newStore)
	var specs []storage.UpsertSpec
	for _, id := range ids(30, "r") {
		specs = append(specs, storage.UpsertSpec{ID: id, Payload: payloadOf(id)})
	}
	e.upsert(specs...)
	pop := func(p storage.PopParams) int {
		t.Helper()
		p.LeaseFor = time.Hour
		ds, err := e.s.Pop(e.ctx, e.ns, p)
		if err != nil {
			t.Fatalf("pop %+v: %v", p, err)
		}
		return len(ds)
	}
	// One token per 100 s: nothing refills during the test.
	slow := storage.PopParams{Limit: 20, MaxRate: 0.01, Burst: 3}
	if n := pop(slow); n != 3 {
		t.Fatalf("first capped pop took %d, want the burst, 3", n)
	}
	if n := pop(slow); n != 0 {
		t.Fatalf("capped pop with an empty bucket took %d, want 0", n)
	}
	if n := pop(storage.PopParams{Limit: 2}); n != 2 {
		t.Fatalf("uncapped pop took %d, want 2 (no cap: the bucket does not apply)", n)
	}
	if n := pop(slow); n != 0 {
		t.Fatalf("capped pop after an uncapped one took %d, want 0 (the bucket is still empty)", n)
	}
	// 50 per second, burst 2: the bucket refills.
	fast := storage.PopParams{Limit: 20, MaxRate: 50, Burst: 2}
	total := 0
	poll(t, "the bucket to refill", func() bool {
		n := pop(fast)
		if n > 2 {
			t.Fatalf("pop at 50/s with burst 2 took %d, want at most 2", n)
		}
		total += n
		return total >= 4
	})
}

// testPopKinds: a Pop with Kinds takes only tasks of those kinds, in due
// order, and leaves the others scheduled in place; it looks at the first
// KindScanWindow due tasks only.
func testPopKinds(t *testing.T, newStore func(t *testing.T) storage.Store) {
	t.Parallel()
	e := newEnv(t, newStore)
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	var specs []storage.UpsertSpec
	for i, id := range []string{"a1", "b1", "n1", "a2", "b2", "a3", "b3"} {
		kind := map[byte]string{'a': "kind.a", 'b': "kind.b", 'n': ""}[id[0]]
		specs = append(specs, storage.UpsertSpec{ID: id, Kind: kind, Payload: payloadOf(id), DueTime: base.Add(time.Duration(i) * time.Second)})
	}
	e.upsert(specs...)
	pop := func(limit int, kinds ...string) []string {
		t.Helper()
		ds, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{Limit: limit, LeaseFor: time.Hour, Kinds: kinds})
		if err != nil {
			t.Fatalf("pop %v: %v", kinds, err)
		}
		var got []string
		for _, d := range ds {
			got = append(got, d.Task.ID)
		}
		return got
	}
	if got := pop(2, "kind.b"); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Fatalf("pop 2 of kind.b = %v, want [b1 b2] (due order, other kinds skipped)", got)
	}
	if got := pop(10, "kind.a", ""); !slices.Equal(got, []string{"a1", "n1", "a2", "a3"}) {
		t.Fatalf("pop of kind.a and no kind = %v, want [a1 n1 a2 a3]", got)
	}
	if got := pop(10, "kind.c"); len(got) != 0 {
		t.Fatalf("pop of a kind no task has = %v, want nothing", got)
	}
	if task := e.get("b3"); task.State != storage.StateScheduled || task.Attempt != 0 {
		t.Fatalf("b3 after pops of other kinds: %v attempt %d, want scheduled, 0", task.State, task.Attempt)
	}
	if got := pop(10); !slices.Equal(got, []string{"b3"}) {
		t.Fatalf("pop of any kind = %v, want [b3]", got)
	}

	// The scan window: KindScanWindow due tasks of another kind ahead hide
	// a task of the wanted kind (per shard in a sharded store).
	if e.sharded {
		return
	}
	var filler []storage.UpsertSpec
	for i := range storage.KindScanWindow {
		filler = append(filler, storage.UpsertSpec{ID: fmt.Sprintf("f%d", i), Kind: "kind.f", DueTime: base})
	}
	for lo := 0; lo < len(filler); lo += 500 {
		e.upsert(filler[lo:min(lo+500, len(filler))]...)
	}
	e.upsert(storage.UpsertSpec{ID: "late", Kind: "kind.l", DueTime: base.Add(time.Minute)})
	if got := pop(10, "kind.l"); len(got) != 0 {
		t.Fatalf("pop of kind.l behind %d due tasks of another kind = %v, want nothing (beyond the scan window)", storage.KindScanWindow, got)
	}
	if got := pop(1); len(got) != 1 || got[0] == "late" {
		t.Fatalf("pop of any kind = %v, want one filler task", got)
	}
	if got := pop(10, "kind.l"); !slices.Equal(got, []string{"late"}) {
		t.Fatalf("pop of kind.l once it is within the window = %v, want [late]", got)
	}
}

// testDueKinds: DueKinds counts only due, scheduled tasks, per kind, and
// says when more were due than its window.
func testDueKinds(t *testing.T, newStore func(t *testing.T) storage.Store) {
	t.Parallel()
	e := newEnv(t, newStore)
	past := time.Now().Add(-time.Minute)
	e.upsert(
		storage.UpsertSpec{ID: "a1", Kind: "kind.a", DueTime: past},
		storage.UpsertSpec{ID: "a2", Kind: "kind.a", DueTime: past},
		storage.UpsertSpec{ID: "n1", DueTime: past},
		storage.UpsertSpec{ID: "b1", Kind: "kind.b", DueTime: past},
		storage.UpsertSpec{ID: "later", Kind: "kind.c", Delay: time.Hour},
	)
	if _, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{Limit: 1, LeaseFor: time.Hour, Kinds: []string{"kind.b"}}); err != nil {
		t.Fatal(err)
	}
	dk, err := e.s.DueKinds(e.ctx, e.ns)
	if err != nil {
		t.Fatalf("DueKinds: %v", err)
	}
	if diff := cmp.Diff(storage.DueKinds{Counts: map[string]int64{"kind.a": 2, "": 1}}, dk); diff != "" {
		t.Fatalf("DueKinds (-want +got):\n%s", diff)
	}
	if e.sharded {
		return // the window is per shard
	}
	var filler []storage.UpsertSpec
	for i := range storage.KindScanWindow {
		filler = append(filler, storage.UpsertSpec{ID: fmt.Sprintf("f%d", i), Kind: "kind.f", DueTime: past})
	}
	for lo := 0; lo < len(filler); lo += 500 {
		e.upsert(filler[lo:min(lo+500, len(filler))]...)
	}
	if dk, err = e.s.DueKinds(e.ctx, e.ns); err != nil || !dk.Partial {
		t.Fatalf("DueKinds with %d due: partial %v, %v; want true", storage.KindScanWindow+3, dk.Partial, err)
	}
}

func testSharedLimits(t *testing.T, newStore func(t *testing.T) storage.Store) {
	t.Parallel()
	e := newEnv(t, newStore)
	l, ok := e.s.(storage.SharedLimits)
	if !ok {
		t.Fatalf("%T does not implement storage.SharedLimits: every store delayd runs on shares its limits", e.s)
	}
	// The request bucket: burst 3, refilled far too slowly to matter.
	for i := range 3 {
		if took, err := l.TakeRequestToken(e.ctx, e.ns, 0.001, 3); err != nil || !took {
			t.Fatalf("token %d of a full bucket of 3: %v %v", i+1, took, err)
		}
	}
	if took, err := l.TakeRequestToken(e.ctx, e.ns, 0.001, 3); err != nil || took {
		t.Fatalf("a 4th token from a bucket of 3: %v %v", took, err)
	}
	// A fast bucket refills.
	poll(t, "a refilled token", func() bool {
		took, err := l.TakeRequestToken(e.ctx, e.ns+"-fast", 100, 1)
		if err != nil {
			t.Fatal(err)
		}
		return took
	})

	// Streams: at most 2; one already held may be acquired again; a
	// released one frees its place.
	const lease = time.Minute
	for _, id := range []string{"a", "b", "a"} {
		if ok, _, err := l.AcquireSubscriber(e.ctx, e.ns, id, 2, lease); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", id, ok, err)
		}
	}
	if ok, held, err := l.AcquireSubscriber(e.ctx, e.ns, "c", 2, lease); err != nil || ok || held != 2 {
		t.Fatalf("a third stream under a limit of 2: ok %v, held %d, %v; want refused, 2", ok, held, err)
	}
	if err := l.ReleaseSubscriber(e.ctx, e.ns, "a"); err != nil {
		t.Fatal(err)
	}
	if ok, held, err := l.AcquireSubscriber(e.ctx, e.ns, "c", 2, lease); err != nil || !ok || held != 2 {
		t.Fatalf("after a release: ok %v, held %d, %v; want taken, 2", ok, held, err)
	}
	// A stream whose lease is renewed keeps its place; one whose lease
	// lapsed (its replica died) loses it.
	// The lease is 2 s and renewed every 100 ms, held over several
	// renewals: a test starved of CPU for most of the lease (a busy
	// machine) still renews in time, while a renewal that did not extend
	// the lease would lose it within the loop.
	other := e.ns + "-lease"
	short := 2 * time.Second
	if ok, _, err := l.AcquireSubscriber(e.ctx, other, "kept", 1, short); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	for range 25 {
		time.Sleep(100 * time.Millisecond)
		if err := l.RenewSubscribers(e.ctx, other, []string{"kept"}, short); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _, err := l.AcquireSubscriber(e.ctx, other, "new", 1, short); err != nil || ok {
		t.Fatalf("a renewed stream lost its place: %v %v", ok, err)
	}
	poll(t, "a lapsed lease to free its place", func() bool {
		ok, _, err := l.AcquireSubscriber(e.ctx, other, "new", 1, short)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
}
