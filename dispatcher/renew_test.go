package dispatcher_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// renewLiveness is the liveness lease of the renewal tests: renewed every
// second, so a renewal up to 2 s late still keeps it (the margin that
// TestDeadReplicaLeasesComeBackSoon found a loaded -race run needs).
const renewLiveness = 3 * time.Second

// leasedOnce checks that every task of ids is still delivered with attempt
// 1: no replica took its lease back.
func (h *harness) leasedOnce(ids map[string]bool, when string) {
	h.t.Helper()
	for id := range ids {
		task, err := h.get(id)
		if err != nil {
			h.t.Fatal(err)
		}
		if task.State != storage.StateDelivered || task.Attempt != 1 {
			h.t.Errorf("%s %s: state %v attempt %d (%q), want still delivered, attempt 1", id, when, task.State, task.Attempt, task.LastError)
		}
	}
}

// A replica whose namespace loop stalls (here: every pop, reap and
// next-wake call of it takes twice the liveness lease, as a starved
// process or a stuck call would) still renews the leases its live stream
// holds: renewal runs apart from the loop. Nothing is taken back by the
// other replica and nothing is delivered twice (issue 30 item 1). With the
// renewals inside the loop, replica B reaped A's leases one liveness into
// the stall and delivered both tasks again.
func TestStalledLoopKeepsItsLeases(t *testing.T) {
	t.Parallel()
	live := func(c *dispatcher.Config) { c.Liveness = renewLiveness }
	h := newHarness(t, testPolicy(), live)
	fs := storagefake.NewFaulty(h.store)
	var stallUntil atomic.Int64 // unix nanos; 0: no stall
	fs.SetFault(func(op storagefake.Op, _ string) storagefake.Fault {
		if op == storagefake.OpExtend {
			return storagefake.Fault{}
		}
		if left := time.Until(time.Unix(0, stallUntil.Load())); left > 0 {
			return storagefake.Fault{Delay: left}
		}
		return storagefake.Fault{}
	})
	a := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { live(c); c.Store = fs; c.StoreTimeout = 4 * renewLiveness })
	sa := h.subscribe(a, h.ns, 10)
	h.upsert(a, 0, "s1", "s2")
	ids := map[string]bool{}
	for range 2 {
		ids[sa.next(t).Task.ID] = true
	}
	sb := h.subscribe(h.d, h.ns, 10) // replica B: reaps, and would get what it reaps
	stallUntil.Store(time.Now().Add(2 * renewLiveness).UnixNano())
	time.Sleep(2*renewLiveness + renewLiveness/2)
	h.leasedOnce(ids, "after A's loop stalled for twice the liveness lease")
	sb.none(t)
	sa.none(t)
}

// The store is unreachable (every call of both replicas fails, as with a
// SIGSTOPped Redis behind the breaker) for twice the liveness lease: the
// leases run out by the store's clock meanwhile. When it answers again the
// holder renews them before any reaper, of either replica, takes them back:
// nothing is delivered twice (issue 30 item 1). Replica B, which holds
// nothing, gets through first and polls every 100 ms; A, which holds the
// leases, gets through 700 ms later (each replica's Redis breaker lets its
// first call through up to a second after another's). Without the hold on
// reaping after store trouble, B took both leases back.
func TestRenewalAfterOutageBeatsTheReaper(t *testing.T) {
	t.Parallel()
	live := func(c *dispatcher.Config) { c.Liveness = renewLiveness }
	h := newHarness(t, testPolicy(), live)
	var downA, downB atomic.Bool
	faultWhile := func(down *atomic.Bool) func(storagefake.Op, string) storagefake.Fault {
		return func(storagefake.Op, string) storagefake.Fault {
			if down.Load() {
				return storagefake.Fault{Err: storage.ErrUnavailable}
			}
			return storagefake.Fault{}
		}
	}
	fa, fb := storagefake.NewFaulty(h.store), storagefake.NewFaulty(h.store)
	fa.SetFault(faultWhile(&downA))
	fb.SetFault(faultWhile(&downB))
	a := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { live(c); c.Store = fa })
	b := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) {
		live(c)
		c.Store, c.SafetyPoll = fb, 100*time.Millisecond
	})
	sa := h.subscribe(a, h.ns, 10)
	h.upsert(a, 0, "o1", "o2")
	ids := map[string]bool{}
	for range 2 {
		ids[sa.next(t).Task.ID] = true
	}
	sb := h.subscribe(b, h.ns, 10)
	downA.Store(true)
	downB.Store(true)
	time.Sleep(2 * renewLiveness)
	downB.Store(false)
	time.Sleep(700 * time.Millisecond)
	downA.Store(false)
	time.Sleep(renewLiveness)
	h.leasedOnce(ids, "after the store came back")
	sb.none(t)
	sa.none(t)
}

// A reap that waited out a store stall in the store's queue: replica B
// sent it just as the store stopped (before any of its calls had failed,
// so before any hold on reaping), and the store ran it when it resumed,
// twice the liveness lease later, before replica A's renewals, which
// failed all along the stall, got in. It takes back only what had expired
// when it was sent (storage.NackOptions.ExpiredBy): A's leases stay, and
// nothing is delivered twice (issue 30 item 2). Without the bound the
// reap took both leases back (TestFaultRedisStallKeepsLiveStreams, durable,
// under load: 68 redeliveries).
func TestReapQueuedDuringStallTakesOnlyWhatExpiredBefore(t *testing.T) {
	t.Parallel()
	live := func(c *dispatcher.Config) { c.Liveness = renewLiveness }
	h := newHarness(t, testPolicy(), live)
	var downA atomic.Bool
	var stallFrom, stallEnd atomic.Int64 // unix nanos: B's reaps started in [from, from+200 ms] run at end
	var queued atomic.Int32              // B's reaps that waited out the stall
	fa, fb := storagefake.NewFaulty(h.store), storagefake.NewFaulty(h.store)
	fa.SetFault(func(storagefake.Op, string) storagefake.Fault {
		if downA.Load() {
			return storagefake.Fault{Err: storage.ErrUnavailable}
		}
		return storagefake.Fault{}
	})
	fb.SetFault(func(op storagefake.Op, _ string) storagefake.Fault {
		from := time.Unix(0, stallFrom.Load())
		if now := time.Now(); op == storagefake.OpReap && stallFrom.Load() != 0 && !now.Before(from) && now.Before(from.Add(200*time.Millisecond)) {
			queued.Add(1)
			return storagefake.Fault{Delay: time.Until(time.Unix(0, stallEnd.Load()))}
		}
		return storagefake.Fault{}
	})
	a := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { live(c); c.Store = fa })
	b := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) {
		live(c)
		c.Store, c.SafetyPoll, c.StoreTimeout = fb, 100*time.Millisecond, 4*renewLiveness
	})
	sb := h.subscribe(b, h.ns, 1) // B pops one task, holds it: it measures the store's clock, then has no credit
	h.upsert(b, 0, "b0")
	held := sb.next(t)
	sa := h.subscribe(a, h.ns, 10)
	h.upsert(a, 0, "o1", "o2")
	ids := map[string]bool{}
	for range 2 {
		ids[sa.next(t).Task.ID] = true
	}
	time.Sleep(renewLiveness / 2) // A's leases renewed at least once
	now := time.Now()
	stallEnd.Store(now.Add(2 * renewLiveness).UnixNano())
	stallFrom.Store(now.UnixNano())
	downA.Store(true)
	time.Sleep(2 * renewLiveness)
	downA.Store(false)
	time.Sleep(renewLiveness / 2)
	if queued.Load() == 0 {
		t.Fatal("no reap of replica B waited out the stall: the test tested nothing")
	}
	h.leasedOnce(ids, "after a reap that waited out the stall ran")
	sa.none(t)
	h.ack(b, held.Token)
}
