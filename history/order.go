package history

import (
	"context"
	"sync"

	"github.com/delayd/delayd/storage"
)

// sequencer orders the history writes of one namespace on this replica.
// A call takes a slot before its store call (begin) and hands its events
// in after it (finish); the events are written in slot order, the filled
// slots at the head of the queue in one write. So a call that began after
// another's store call had changed a task — any call that saw that change,
// through a read, a delivery or a wake — has its events written after
// that call's, though the two store calls overlap freely. finish returns
// once the slot's events are written (a call's events are in the history
// when it returns), which is also when every earlier slot's are.
//
// A slot's owner waits in finish until its slot is written, so the queue
// always has a live owner to hand the writing on to: the owner of a filled
// head slot writes the filled prefix; while an earlier call is still in
// its store call, later ones wait for it (bounded by the store's own
// timeouts).
type sequencer struct {
	// due orders pops against the calls that make tasks due (upsert, nack,
	// reap, requeue): a pop holds it exclusively, they share it, each from
	// before it takes its slot until its store call returned (not across
	// the history write). Slots alone do not order those: a pop that took
	// its slot, then waited, could pop a task a requeue with a later slot
	// had just made due, and its delivered event would be written before
	// the requeued one (TestHistoryLifecycleRedisOnly, fresh-clone CI).
	// With it, the one whose store call ran first took the earlier slot.
	due     sync.RWMutex
	mu      sync.Mutex
	queue   []*slot // begun, not yet written, in begin order
	writing bool    // an owner is writing a prefix of queue
}

// slot is one call's place in a sequencer.
type slot struct {
	events  []storage.Event
	life    life
	filled  bool          // finish handed the events in
	written bool          // the events are written (or failed: err)
	err     error         // the write's error
	wake    chan struct{} // one pending signal: written, or the head is filled
}

// begin takes the next slot.
func (q *sequencer) begin() *slot {
	s := &slot{wake: make(chan struct{}, 1)}
	q.mu.Lock()
	q.queue = append(q.queue, s)
	q.mu.Unlock()
	return s
}

// signal wakes s's owner (once; a pending signal is enough).
func (s *slot) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// finish hands in s's events (none is fine: the slot still keeps its
// place) and returns once they and every earlier slot's are written, with
// the error of the write that carried them. write keeps a batch of events
// of one incarnation of the namespace, keep being the largest of the
// batch's slots (writeRuns).
func (q *sequencer) finish(s *slot, l life, events []storage.Event, write func(l life, events []storage.Event) error) error {
	q.mu.Lock()
	s.events, s.life, s.filled = events, l, true
	for !s.written {
		if q.writing || !q.queue[0].filled {
			// Another owner writes, or an earlier call is still in its
			// store call: it hands the writing on when it is done.
			q.mu.Unlock()
			<-s.wake
			q.mu.Lock()
			continue
		}
		n := 0
		for n < len(q.queue) && q.queue[n].filled {
			n++
		}
		batch := q.queue[:n:n]
		q.queue = q.queue[n:]
		q.writing = true
		q.mu.Unlock()

		err := writeRuns(batch, write)

		q.mu.Lock()
		q.writing = false
		for _, b := range batch {
			b.written, b.err, b.events = true, err, nil
			if b != s {
				b.signal()
			}
		}
		if len(q.queue) == 0 {
			q.queue = nil // let the array go
		} else if q.queue[0].filled && !q.queue[0].written {
			q.queue[0].signal() // hand the writing on
		}
	}
	err := s.err
	q.mu.Unlock()
	return err
}

// writeRuns writes the events of batch, in order, one write per run of
// slots of the same incarnation (a cached namespace refreshed between two
// calls: the next incarnation's events must not join the previous one's
// history), and returns the first error.
func writeRuns(batch []*slot, write func(l life, events []storage.Event) error) error {
	var first error
	for i := 0; i < len(batch); {
		run := life{inc: batch[i].life.inc}
		var all []storage.Event
		j := i
		for ; j < len(batch) && batch[j].life.inc == run.inc; j++ {
			all = append(all, batch[j].events...)
			run.keep = max(run.keep, batch[j].life.keep)
		}
		if len(all) > 0 {
			if err := write(run, all); err != nil && first == nil {
				first = err
			}
		}
		i = j
	}
	return first
}

// orderKind says how a call is ordered against pops (sequencer.due).
type orderKind int

const (
	orderOther    orderKind = iota // ack, remove, purge: slots alone
	orderMakesDue                  // upsert, nack, reap, requeue: share due
	orderPop                       // pop: holds due alone
)

// recordInOrder takes a slot of ns's sequencer (when ns keeps history);
// call the returned func after the store call with the call's events
// (defer it: a slot must always be finished, or ns's history writes stop).
func (r *Recorder) recordInOrder(ctx context.Context, ns string, l life, kind orderKind) func(*[]storage.Event) {
	if l.keep <= 0 {
		return func(*[]storage.Event) {}
	}
	v, ok := r.order.Load(ns)
	if !ok {
		v, _ = r.order.LoadOrStore(ns, &sequencer{})
	}
	q := v.(*sequencer)
	unlock := func() {}
	switch kind {
	case orderPop:
		q.due.Lock()
		unlock = q.due.Unlock
	case orderMakesDue:
		q.due.RLock()
		unlock = q.due.RUnlock
	}
	s := q.begin()
	return func(events *[]storage.Event) {
		unlock()
		_ = q.finish(s, l, *events, func(l life, all []storage.Event) error {
			r.write(ctx, ns, l, all)
			return nil
		})
	}
}
