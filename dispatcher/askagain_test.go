package dispatcher_test

import (
	"sync/atomic"
	"testing"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// A pop whose answer is lost after the store leased its tasks (a store
// timeout while Redis ran the call late) is asked again by its request id:
// the same deliveries reach the stream, on attempt 1, at once — not, after
// the lease ran out, as attempt 2 (issue 38 item 1). Without asking again
// the tasks stayed leased to nobody for the whole lease (an hour here).
func TestLostPopAnswerIsAskedAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), nil)
	h.upsert(nil, 0, "l1", "l2")
	fs := storagefake.NewFaulty(h.store)
	var lost atomic.Int32
	fs.SetFault(func(op storagefake.Op, _ string) storagefake.Fault {
		// the first pop reaches the store; its answer is lost
		return storagefake.Fault{Lose: op == storagefake.OpPop && lost.Add(1) == 1}
	})
	a := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { c.Store = fs })
	s := h.subscribe(a, h.ns, 10)
	got := map[string]int32{}
	for range 2 {
		d := s.next(t)
		got[d.Task.ID] = d.Token.Attempt
		if st := h.ack(a, d.Token); st[0] != storage.TokenOK {
			t.Errorf("ack of %s = %v, want OK", d.Task.ID, st[0])
		}
	}
	if got["l1"] != 1 || got["l2"] != 1 {
		t.Errorf("delivered attempts = %v, want l1 and l2 on attempt 1", got)
	}
	if lost.Load() < 2 {
		t.Errorf("%d pops, want the lost one and the one that asked again", lost.Load())
	}
	s.none(t)
}
