package dispatcher

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

// TestPlanNext is the namespace loop's scheduling rule, one row per case:
// what a round observed → how long the loop sleeps, whether it is blocked
// on credit, whether the next round reaps, the idle backoff kept, and
// whether the error backoff is reset. No clock, no store, no sleep.
func TestPlanNext(t *testing.T) {
	const poll, precision = time.Second, 10 * time.Millisecond
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	due := storage.PopResult{Now: t0, Next: t0, HasNext: true} // something is due now
	later := func(d time.Duration) storage.PopResult {
		return storage.PopResult{Now: t0, Next: t0.Add(d), HasNext: true}
	}
	// heldLease: an expired lease heads the answer (Next is now); the first
	// scheduled task is due in d (0: nothing is scheduled).
	heldLease := func(d time.Duration) storage.PopResult {
		r := storage.PopResult{Now: t0, Next: t0, HasNext: true, DueKnown: true}
		if d != 0 {
			r.NextDue = t0.Add(d)
		}
		return r
	}
	tests := []struct {
		name string
		r    round
		want plan
	}{
		{"paused: re-read the policy after the safety poll, backoffs kept",
			round{paused: true, reaped: true, idleWait: 4 * time.Millisecond},
			plan{wait: poll, idleWait: 4 * time.Millisecond}},
		{"paused with a full reap: reap again at once",
			round{paused: true, reaped: true, reapFull: true},
			plan{reap: true}},
		{"a full reap: go on at once and reap again",
			round{reaped: true, reapFull: true, popped: true, free: 3, wake: due, idleWait: 2 * time.Millisecond},
			plan{reap: true, idleWait: 2 * time.Millisecond}},
		{"a full pop with credit left: a backlog, pop again at once without a reap",
			round{popped: true, popFull: true, free: 5, progress: true, wake: due},
			plan{}},
		{"a full pop that used all credit is not a backlog to pop now: blocked",
			round{reaped: true, popped: true, popFull: true, free: 0, progress: true, wake: due},
			plan{wait: poll, blocked: true, healthy: true}},
		{"nothing stored: sleep the safety poll, idle backoff reset",
			round{popped: true, free: 5, wake: storage.PopResult{Now: t0}, idleWait: 8 * time.Millisecond},
			plan{wait: poll, healthy: true}},
		{"the next task in 123 ms: wake at 130 ms (rounded up to the precision)",
			round{popped: true, free: 5, wake: later(123 * time.Millisecond)},
			plan{wait: 130 * time.Millisecond, healthy: true}},
		{"the next task in an hour: wake after the safety poll",
			round{popped: true, free: 5, wake: later(time.Hour)},
			plan{wait: poll, healthy: true}},
		{"rate cap ran dry at 10/s: wait one token (100 ms)",
			round{popped: true, free: 5, progress: true, maxRate: 10, wake: due},
			plan{wait: 100 * time.Millisecond, healthy: true}},
		{"rate cap at 10000/s: wait at least rateWaitMin, to pop in batches",
			round{popped: true, free: 5, maxRate: 10000, wake: due},
			plan{wait: rateWaitMin, healthy: true}},
		{"rate cap at 0.1/s: never longer than the safety poll",
			round{popped: true, free: 5, maxRate: 0.1, wake: due},
			plan{wait: poll, healthy: true}},
		{"a steady flow: more fell due since the pop, pop again without a reap",
			round{popped: true, free: 5, progress: true, wake: due, idleWait: 2 * time.Millisecond},
			plan{healthy: true}},
		{"reaping held after store trouble, credit free, nothing scheduled: look again when the hold ends",
			round{popped: true, free: 5, heldFor: 300 * time.Millisecond, wake: heldLease(0), idleWait: 2 * time.Millisecond},
			plan{wait: 300 * time.Millisecond, reap: true, idleWait: 2 * time.Millisecond, healthy: true}},
		{"reaping held, credit free, a task due in 123 ms behind an expired lease: wake for the task, not the hold",
			round{popped: true, free: 5, heldFor: 3 * time.Second, wake: heldLease(123 * time.Millisecond)},
			plan{wait: 130 * time.Millisecond, reap: true, healthy: true}},
		{"reaping held, credit free, the task due after the hold: wake when the hold ends",
			round{popped: true, free: 5, heldFor: 300 * time.Millisecond, wake: heldLease(time.Second)},
			plan{wait: 300 * time.Millisecond, reap: true, healthy: true}},
		{"reaping held, credit free, due tasks the pop did not take (kinds): poll with the idle backoff",
			round{popped: true, free: 5, heldFor: 3 * time.Second, wake: heldLease(-time.Second), idleWait: 2 * time.Millisecond, onlyKinds: true},
			plan{wait: 4 * time.Millisecond, reap: true, idleWait: 4 * time.Millisecond, healthy: true}},
		{"reaping held, credit free, a store that does not tell the due head: poll with the idle backoff",
			round{popped: true, free: 5, heldFor: 3 * time.Second, wake: due, idleWait: 16 * time.Millisecond},
			plan{wait: maxIdleWait, reap: true, idleWait: maxIdleWait, healthy: true}},
		{"reaping held, no credit free: blocked until the hold ends",
			round{heldFor: 300 * time.Millisecond, wake: due},
			plan{wait: 300 * time.Millisecond, blocked: true, reap: true, healthy: true}},
		{"due but nothing moved and no reap this round: reap at once",
			round{popped: true, free: 5, wake: due, idleWait: 2 * time.Millisecond},
			plan{reap: true, idleWait: 2 * time.Millisecond, healthy: true}},
		{"due, reaped, nothing moved: first idle backoff 1 ms",
			round{reaped: true, popped: true, free: 5, wake: due},
			plan{wait: time.Millisecond, reap: true, idleWait: time.Millisecond, healthy: true}},
		{"due, reaped, nothing moved again: the backoff doubles",
			round{reaped: true, popped: true, free: 5, wake: due, idleWait: 8 * time.Millisecond},
			plan{wait: 16 * time.Millisecond, reap: true, idleWait: 16 * time.Millisecond, healthy: true}},
		{"the idle backoff stops at maxIdleWait",
			round{reaped: true, popped: true, free: 5, wake: due, idleWait: maxIdleWait},
			plan{wait: maxIdleWait, reap: true, idleWait: maxIdleWait, healthy: true}},
		{"streams of given kinds only: the idle backoff goes up to kindIdleWait",
			round{reaped: true, popped: true, free: 5, wake: due, idleWait: maxIdleWait, onlyKinds: true},
			plan{wait: 2 * maxIdleWait, reap: true, idleWait: 2 * maxIdleWait, healthy: true}},
		{"blocked on credit, no lease held: wake after the safety poll (or on credit)",
			round{reaped: true, wake: due, idleWait: 2 * time.Millisecond, now: t0},
			plan{wait: poll, blocked: true, idleWait: 2 * time.Millisecond, healthy: true}},
		{"blocked on credit: wake when the earliest local lease runs out",
			round{reaped: true, wake: due, earliestLease: t0.Add(250 * time.Millisecond), now: t0},
			plan{wait: 250 * time.Millisecond, blocked: true, healthy: true}},
		{"blocked on credit, a lease already past: wake in 1 ms, never spin",
			round{reaped: true, wake: due, earliestLease: t0.Add(-time.Second), now: t0},
			plan{wait: time.Millisecond, blocked: true, healthy: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := planNext(tc.r, poll, precision)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(plan{})); diff != "" {
				t.Errorf("planNext (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRoundNeedsWake: the store is asked separately when work is next only
// when no pop answered it and the loop does not go on at once anyway.
func TestRoundNeedsWake(t *testing.T) {
	tests := []struct {
		r    round
		want bool
	}{
		{round{}, true},                // no credit, no pop: ask
		{round{popped: true}, false},   // the pop answered it
		{round{paused: true}, false},   // paused: the safety poll re-reads the policy
		{round{reapFull: true}, false}, // a full reap: go on at once
		{round{reaped: true}, true},    // reaped a part: ask
		{round{heldFor: time.Second}, true},
	}
	for _, tc := range tests {
		if got := tc.r.needsWake(); got != tc.want {
			t.Errorf("%+v.needsWake() = %v, want %v", tc.r, got, tc.want)
		}
	}
}

// TestReapDue: the loop reaps at least every tenth of the safety poll.
func TestReapDue(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		since time.Duration
		want  bool
	}{{0, false}, {99 * time.Millisecond, false}, {100 * time.Millisecond, true}, {time.Hour, true}}
	for _, tc := range tests {
		if got := reapDue(t0.Add(tc.since), t0, time.Second); got != tc.want {
			t.Errorf("reapDue %v after the last reap (safety poll 1 s) = %v, want %v", tc.since, got, tc.want)
		}
	}
}

// TestRideWithin: the loop tells the store of its next pop (so acks ride
// it) only when that pop comes within the ride and the round will pop:
// credit free, not paused, not blocked; the time told covers the round's
// own step.
func TestRideWithin(t *testing.T) {
	const ride, precision = 3 * time.Millisecond, time.Millisecond
	tests := []struct {
		name string
		r    round
		p    plan
		want time.Duration
	}{
		{"a steady flow: the next task in 2 ms", round{free: 5}, plan{wait: 2 * time.Millisecond}, 3 * time.Millisecond},
		{"more due at once", round{free: 5}, plan{wait: 0}, time.Millisecond},
		{"exactly the ride away", round{free: 5}, plan{wait: ride}, ride + precision},
		{"further than the ride: acks go on their own", round{free: 5}, plan{wait: 4 * time.Millisecond}, 0},
		{"no credit free: the next round pops nothing", round{free: 0}, plan{wait: time.Millisecond}, 0},
		{"blocked on credit", round{free: 1}, plan{wait: time.Millisecond, blocked: true}, 0},
		{"paused", round{free: 5, paused: true}, plan{wait: time.Millisecond}, 0},
	}
	for _, tt := range tests {
		if got := rideWithin(tt.r, tt.p, ride, precision); got != tt.want {
			t.Errorf("%s: rideWithin = %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := rideWithin(round{free: 5}, plan{wait: time.Millisecond}, -1, precision); got != 0 {
		t.Errorf("ride off: rideWithin = %v, want 0", got)
	}
}
