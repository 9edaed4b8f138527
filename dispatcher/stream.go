package dispatcher

import (
	"slices"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// stream is one subscriber. Its fields other than id, ready and done are
// guarded by its namespace's mu.
type stream struct {
	id uint64
	// max is the stream's max_in_flight; only its sender changes it
	// (Subscriber.Credit), under mu.
	max int
	// kinds are the task kinds the stream takes, sorted, no duplicates;
	// nil: every kind. kindKey names the set: streams with the same key
	// share the pops made for their credit ("" for every kind).
	kinds   []string
	kindKey string
	// queue carries deliveries from the namespace loop to the stream's
	// sender. It grows with what the stream is given, never past max (the
	// loop only appends when room() > 0): a stream's memory follows the
	// credit it uses, not the max_in_flight it asked for.
	queue []storage.Delivery
	// ready (capacity 1) tells the sender that queue has something.
	ready chan struct{}
	// done is closed by Stop: the sender returns ErrStopped.
	done   chan struct{}
	closed bool
	// held is every delivery the stream holds unacked, sent or still in ch.
	held map[storage.Token]*lease
}

// lease is the local view of one held delivery.
type lease struct {
	// deadline is the local estimate of the lease deadline; past it the
	// credit comes back.
	deadline time.Time
	// storeDeadline is when the store's lease of the delivery ends, by the
	// store's clock (the pop's answer, moved by every renewal); a delivery
	// not yet sent is never sent past it (see namespace.next).
	storeDeadline time.Time
	// sent is true once the sender took it from ch to send it.
	sent bool
	// popped is the local time of the pop, and late how far past its due
	// time the task was then by the store's clock: the lateness at send is
	// late plus the local time since popped (a local interval, so the local
	// clock's offset does not matter).
	popped time.Time
	late   time.Duration
}

func newStream(id uint64, maxInFlight int, kinds []string) *stream {
	var key string
	if len(kinds) > 0 {
		kinds = slices.Compact(slices.Sorted(slices.Values(kinds)))
		key = "kinds:" + strings.Join(kinds, "\x00")
	}
	return &stream{
		id:      id,
		max:     maxInFlight,
		kinds:   kinds,
		kindKey: key,
		ready:   make(chan struct{}, 1),
		done:    make(chan struct{}),
		held:    make(map[storage.Token]*lease),
	}
}

// room is the stream's free credit: what it may still be given. A delivery
// whose lease estimate passed while it still sat in queue no longer counts
// as held but still takes a slot of queue, hence the second bound.
func (st *stream) room() int {
	if st.closed {
		return 0
	}
	return max(0, min(st.max-len(st.held), st.max-len(st.queue)))
}

// push queues del for the sender and wakes it. The namespace's mu is held.
func (st *stream) push(del storage.Delivery) {
	st.queue = append(st.queue, del)
	select {
	case st.ready <- struct{}{}:
	default:
	}
}
