package dispatcher

import (
	"time"

	"github.com/delayd/delayd/storage"
)

// This file holds the namespace loop's scheduling rules as pure functions:
// tick (namespace.go) does the store calls and gathers what they answered
// into a round; planNext decides from it alone how long the loop sleeps,
// whether it is blocked on credit and whether the next round reaps.
// plan_internal_test.go checks every rule by a table, with no clock.

// round is what one tick observed, after its reap and pop.
type round struct {
	reaped   bool          // this round reaped
	reapFull bool          // the reap moved a whole ReapBatch: more may have expired
	heldFor  time.Duration // reaping is held this much longer after store trouble; 0: not held
	paused   bool          // the policy is paused: nothing was popped
	free     int           // credit still free after the pop
	popped   bool          // a pop ran (there was free credit)
	popFull  bool          // every pop call came back full: a backlog may be waiting
	progress bool          // the reap or the pop moved something
	// wake is the store's answer of when the namespace has work next (its
	// clock's now, and the earliest due time or lease deadline).
	wake    storage.PopResult
	maxRate float64 // Policy.MaxDispatchRate; 0: no cap
	// onlyKinds: every stream takes given kinds only, so what is due may be
	// of kinds nobody takes.
	onlyKinds     bool
	idleWait      time.Duration // the idle backoff so far
	earliestLease time.Time     // earliest local lease deadline held; zero if none
	now           time.Time     // local clock at the end of the round
}

// needsWake reports whether the round must still ask the store when there
// is work next: nothing popped (the pop answers it in the same call), not
// paused, and no full reap that makes the loop go on at once anyway.
func (r round) needsWake() bool {
	return !r.paused && !r.popped && !r.reapFull
}

// plan is planNext's decision.
type plan struct {
	wait     time.Duration // sleep this long before the next round; 0: go on at once
	blocked  bool          // due tasks wait for credit: returned credit wakes the loop
	reap     bool          // the next round reaps
	idleWait time.Duration // the idle backoff from now on
	healthy  bool          // the store answered the round in full: reset the error backoff
}

// planNext is the loop's scheduling rule: from what a round observed, how
// long to wait, whether blocked, whether to reap next. safetyPoll bounds
// every sleep; precision rounds a wait for a future task up to a multiple
// of it, so tasks due within one step are popped by one wake.
func planNext(r round, safetyPoll, precision time.Duration) plan {
	keep := r.idleWait
	if r.paused {
		// Leases already out are still reaped; the policy is re-read every
		// SafetyPoll (a resume announced on any replica wakes the loop).
		if r.reapFull {
			return plan{reap: true, idleWait: keep}
		}
		return plan{wait: safetyPoll, idleWait: keep}
	}
	if r.reapFull || (r.popFull && r.free > 0) {
		return plan{reap: r.reapFull, idleWait: keep} // More to do right away.
	}
	if !r.wake.HasNext {
		return plan{wait: safetyPoll, healthy: true}
	}
	if until := r.wake.Next.Sub(r.wake.Now); until > 0 {
		return plan{wait: min(roundUp(until, precision), safetyPoll), healthy: true}
	}
	// Something is due, or a lease ran out, right now.
	if r.free > 0 && r.maxRate > 0 && !r.popFull {
		// The pop left due tasks behind with credit free: the rate cap's
		// bucket ran dry (or another replica took them). Wait for tokens
		// instead of polling: one token's time, at least rateWaitMin so a
		// high rate pops in batches (the bucket holds a tenth of a second,
		// so nothing is lost by waiting), expired leases are reaped on the
		// usual cadence.
		wait := time.Duration(float64(time.Second) / r.maxRate)
		return plan{wait: min(max(wait, rateWaitMin), safetyPoll), healthy: true}
	}
	if r.free > 0 && r.progress {
		// More fell due since the pop (a steady flow): pop again, without
		// a reap, which would add a round trip to every delivery.
		return plan{healthy: true}
	}
	if r.heldFor > 0 {
		// It may be a lease that ran out while the store was away: look
		// again when reaping may resume (or on a wake). The hold is about
		// expired leases only: with credit free, a task that falls due
		// meanwhile is popped on time, not when the hold ends (after a
		// Redis stall the tasks due in the next seconds waited for the
		// whole hold, Liveness/2, while a lease of a stream whose renewal
		// had not landed yet headed the store's answer).
		p := plan{wait: r.heldFor, blocked: r.free == 0, reap: true, idleWait: keep, healthy: true}
		if r.free > 0 {
			switch w := r.wake; {
			case w.DueKnown && w.NextDue.IsZero():
				// nothing scheduled: the hold it is
			case w.DueKnown && w.NextDue.After(w.Now):
				p.wait = min(p.wait, roundUp(w.NextDue.Sub(w.Now), precision))
			default:
				// due tasks the pop did not take (kinds nobody here takes),
				// or a store that does not tell: poll with the idle backoff
				p.idleWait = r.nextIdle()
				p.wait = min(p.wait, p.idleWait)
			}
		}
		return p
	}
	if !r.reaped {
		// Nothing moved: it may be an expired lease. Reap and look again.
		return plan{reap: true, idleWait: keep, healthy: true}
	}
	if r.free > 0 {
		// The store says "due" but neither pop nor reap moved anything:
		// retry soon, but never spin.
		idle := min(r.nextIdle(), safetyPoll)
		return plan{wait: idle, reap: true, idleWait: idle, healthy: true}
	}
	// Blocked on credit: wake when credit comes back, when a local lease
	// runs out, when the leases are due for renewal, or after the safety
	// poll (which also reaps).
	wait := safetyPoll
	if !r.earliestLease.IsZero() {
		wait = min(wait, max(r.earliestLease.Sub(r.now), time.Millisecond))
	}
	return plan{wait: wait, blocked: true, idleWait: keep, healthy: true}
}

// nextIdle is the idle backoff after one more round in which the store
// said "due" and nothing moved: doubling from 1 ms up to maxIdleWait, or
// kindIdleWait when every stream takes given kinds (what is due may be of
// kinds nobody takes, and stays so: look again less often; an earlier task
// of any kind still wakes the loop at once).
func (r round) nextIdle() time.Duration {
	longest := maxIdleWait
	if r.onlyKinds {
		longest = kindIdleWait
	}
	return min(max(2*r.idleWait, time.Millisecond), longest)
}

// reapDue reports whether the loop reaps on its next round because the
// last reap is a tenth of the safety poll ago, even when it is woken early
// all the time (credit coming back under load).
func reapDue(now, lastReap time.Time, safetyPoll time.Duration) bool {
	return now.Sub(lastReap) >= safetyPoll/10
}

// rideWithin is how soon, from the end of a round, the loop pops next as
// far as the acks and nacks of its namespace need to know (Store.ExpectPop):
// the planned wait plus one precision step (the round's own time) when the
// next round pops within ride (credit free, not paused, not blocked on
// credit); 0 otherwise, and for ride <= 0. Acks that arrive meanwhile wait
// at most that long for the pop to settle them.
func rideWithin(r round, p plan, ride, precision time.Duration) time.Duration {
	if ride <= 0 || r.paused || p.blocked || r.free <= 0 || p.wait > ride {
		return 0
	}
	return p.wait + max(precision, time.Millisecond)
}
