package dispatcher

import (
	"time"

	"github.com/delayd/delayd/storage"
)

// stream is one subscriber. Its fields other than id, max, ch and done are
// guarded by its namespace's mu.
type stream struct {
	id  uint64
	max int
	// ch carries deliveries from the namespace loop to the stream's sender.
	// Its capacity is max, and the loop only sends when room() > 0, so a
	// send never blocks.
	ch chan storage.Delivery
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
	// sent is true once the sender took it from ch to send it.
	sent bool
}

func newStream(id uint64, maxInFlight int) *stream {
	return &stream{
		id:   id,
		max:  maxInFlight,
		ch:   make(chan storage.Delivery, maxInFlight),
		done: make(chan struct{}),
		held: make(map[storage.Token]*lease),
	}
}

// room is the stream's free credit: what it may still be given. A delivery
// whose lease estimate passed while it still sat in ch no longer counts as
// held but still takes a slot of ch, hence the second bound.
func (st *stream) room() int {
	if st.closed {
		return 0
	}
	return max(0, min(st.max-len(st.held), cap(st.ch)-len(st.ch)))
}
