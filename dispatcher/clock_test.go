package dispatcher_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// The hold on reaping after store trouble is read through the configured
// clock (issue 38 item 4): a test that moves the clock past the hold sees
// the expired lease reaped and delivered at once, with no sleep. Before,
// the hold was measured by the wall clock (renew.go called time.Now), and
// a half-hour hold held whatever the clock said.
func TestReapHoldFollowsTheClock(t *testing.T) {
	t.Parallel()
	const liveness = time.Hour // the hold is half of it
	clock := &offsetClock{}
	h := newHarness(t, testPolicy(), nil)
	fs := storagefake.NewFaulty(h.store)
	var down atomic.Bool
	down.Store(true)
	fs.SetFault(func(op storagefake.Op, _ string) storagefake.Fault {
		if down.Load() {
			return storagefake.Fault{Err: storage.ErrUnavailable}
		}
		return storagefake.Fault{}
	})
	// A delivery whose lease ran out in the store: the loop reaps it once
	// it may.
	h.upsert(nil, 0, "held")
	if ds, err := h.store.Pop(context.Background(), h.ns, storage.PopParams{Limit: 1, LeaseFor: time.Millisecond}); err != nil || len(ds) != 1 {
		t.Fatalf("pop: %v, %v", ds, err)
	}
	d := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) {
		c.Store, c.Clock, c.Liveness = fs, clock, liveness
	})
	s := h.subscribe(d, h.ns, 10)
	// The store fails, then answers: reaping is held for half the
	// liveness after the trouble.
	testkit.Eventually(t, wait, "a store call to fail", func() bool {
		return fs.Calls(storagefake.OpReap)+fs.Calls(storagefake.OpPop)+fs.Calls(storagefake.OpNextWake) > 0
	})
	down.Store(false)
	s.none(t)
	clock.advance(liveness/2 + time.Second)
	d.Notify(h.ns)
	del := s.next(t)
	if del.Task.ID != "held" || del.Token.Attempt != 2 {
		t.Errorf("delivered %s attempt %d, want held on attempt 2 (reaped)", del.Task.ID, del.Token.Attempt)
	}
}
