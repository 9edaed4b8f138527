package dispatcher

import (
	"context"
	"time"

	"github.com/delayd/delayd/storage"
)

// A namespace's streams and the deliveries they hold: credit, handing a
// round's deliveries out (distribute, pick), the senders' queue (next,
// requeueFront), and settling, extending and letting go of what is held.

// add registers a stream.
func (n *namespace) add(st *stream) {
	n.mu.Lock()
	n.streams = append(n.streams, st)
	n.mu.Unlock()
}

func (n *namespace) streamCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.streams)
}

// freeCredit drops deliveries whose local lease estimate has passed (their
// credit comes back; the reaper retries the tasks that were sent) and
// returns what all streams can take now, and the dropped deliveries that
// were never sent, to be handed back.
func (n *namespace) freeCredit(now time.Time) (free int, expired []storage.Token) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.nextPrune.IsZero() && !now.Before(n.nextPrune) {
		n.nextPrune = time.Time{}
		for tok, st := range n.held {
			l := st.held[tok]
			if !now.Before(l.deadline) {
				delete(st.held, tok)
				delete(n.held, tok)
				if !l.sent {
					expired = append(expired, tok)
				}
				continue
			}
			if n.nextPrune.IsZero() || l.deadline.Before(n.nextPrune) {
				n.nextPrune = l.deadline
			}
		}
	}
	for _, st := range n.streams {
		free += st.room()
	}
	return free, expired
}

func (n *namespace) earliestLease() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nextPrune
}

// distribute hands popped deliveries to the streams round robin, each to a
// stream with room. Deliveries no stream
// can take (their streams ended since the pop) are handed back unsent.
// The store set each lease deadline to store-now + p.storeLease, so
// store-now minus the task's start (storage.LateFrom) is how late the task was
// popped; the subscriber is told store-now + p.leaseFor.
func (n *namespace) distribute(dels []storage.Delivery, p distribution) {
	deadline := p.deadline
	var orphans []storage.Token
	n.mu.Lock()
	n.ahead, n.aheadKnown = p.ahead, true
	for _, del := range dels {
		st := n.pick(p.kindKey)
		if st == nil {
			orphans = append(orphans, del.Token)
			continue
		}
		storeDeadline := del.LeaseDeadline
		late := storeDeadline.Add(-p.storeLease).Sub(storage.LateFrom(del.Task))
		del.LeaseDeadline = storeDeadline.Add(p.leaseFor - p.storeLease)
		del.Task.LeaseDeadline = del.LeaseDeadline
		st.held[del.Token] = &lease{deadline: deadline, storeDeadline: storeDeadline, popped: p.popped, late: late}
		n.held[del.Token] = st
		st.push(del)
	}
	if len(orphans) < len(dels) && (n.nextPrune.IsZero() || deadline.Before(n.nextPrune)) {
		n.nextPrune = deadline
	}
	n.mu.Unlock()
	if len(orphans) > 0 {
		ctx, cancel := context.WithTimeout(n.d.base, n.d.cfg.StoreTimeout)
		defer cancel()
		n.d.handBack(ctx, n, nil, orphans)
	}
}

// pick returns the next stream of kindKey with room, round robin; nil if
// none. n.mu is held.
func (n *namespace) pick(kindKey string) *stream {
	for i := 0; i < len(n.streams); i++ {
		st := n.streams[(n.rr+i)%len(n.streams)]
		if st.kindKey == kindKey && st.room() > 0 {
			n.rr = (n.rr + i + 1) % len(n.streams)
			return st
		}
	}
	return nil
}

// next takes the stream's next delivery that it still holds and records
// that the sender is about to send it, with how late past its due time the
// task is now (by the store's clock); ok is false when the queue is empty
// (deliveries handed back, settled or whose lease ran out are skipped).
//
// A delivery whose store lease has run out — by the store's clock as this
// replica knows it (the local clock plus ahead) — is not sent: the store
// may have given the task to another subscriber meanwhile, and its token
// would be stale. It is let go and returned in expired, for the caller to
// hand back (without costing an attempt; the store ignores the hand-back
// of a lease it already took back).
func (n *namespace) next(st *stream) (del storage.Delivery, lateness time.Duration, ok bool, expired []storage.Token) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for len(st.queue) > 0 && !st.closed {
		del = st.queue[0]
		st.queue[0] = storage.Delivery{}
		st.queue = st.queue[1:]
		if len(st.queue) == 0 {
			st.queue = nil // let the backing array go
		}
		l := st.held[del.Token]
		if l == nil {
			continue
		}
		now := n.d.cfg.Clock.Now()
		if !l.storeDeadline.IsZero() && !now.Add(n.ahead).Before(l.storeDeadline) {
			delete(st.held, del.Token)
			delete(n.held, del.Token)
			expired = append(expired, del.Token)
			continue
		}
		l.sent = true
		return del, l.late + now.Sub(l.popped), true, expired
	}
	return storage.Delivery{}, 0, false, expired
}

// requeueFront puts del, which next just took (and marked sent), back at
// the head of the stream's queue, unsent.
func (n *namespace) requeueFront(st *stream, del storage.Delivery) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := st.held[del.Token]
	if l == nil || st.closed {
		return // let go meanwhile: nothing to send
	}
	l.sent = false
	st.queue = append([]storage.Delivery{del}, st.queue...)
}

// setMax changes a stream's max_in_flight; it reports whether the stream
// has room now.
func (n *namespace) setMax(st *stream, m int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	st.max = m
	return st.room() > 0
}

// renewed records the store lease deadlines a renewal set (by the store's
// clock).
func (n *namespace) renewed(tokens []storage.Token, deadlines []time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, tok := range tokens {
		if st := n.held[tok]; st != nil && !deadlines[i].IsZero() {
			if l := st.held[tok]; l != nil && deadlines[i].After(l.storeDeadline) {
				l.storeDeadline = deadlines[i]
			}
		}
	}
}

// unmarkSent records that sending tok failed: the subscriber never got it.
func (n *namespace) unmarkSent(st *stream, tok storage.Token) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l := st.held[tok]; l != nil {
		l.sent = false
	}
}

// settle frees the credit of the tokens held here; it returns those that
// were (nil when none).
func (n *namespace) settle(tokens []storage.Token) map[storage.Token]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	var freed map[storage.Token]bool
	for _, tok := range tokens {
		if st := n.held[tok]; st != nil {
			delete(st.held, tok)
			delete(n.held, tok)
			if freed == nil {
				freed = map[storage.Token]bool{}
			}
			freed[tok] = true
		}
	}
	return freed
}

// extend moves the local lease estimate of the tokens held here.
func (n *namespace) extend(tokens []storage.Token, deadline time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, tok := range tokens {
		if st := n.held[tok]; st != nil {
			st.held[tok].deadline = deadline
		}
	}
}

// remove unregisters a stream and returns what it held (split into sent
// and never sent) and whether no stream is left. d.mu is held.
func (n *namespace) remove(st *stream) (sent []heldLease, unsent []storage.Token, empty bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !st.closed {
		st.closed = true
		for i, s := range n.streams {
			if s == st {
				n.streams = append(n.streams[:i], n.streams[i+1:]...)
				break
			}
		}
		sent, unsent = n.takeHeld(st)
	}
	return sent, unsent, len(n.streams) == 0
}

// closeAll ends every stream (their Serve returns ErrStopped) and returns
// what they held.
func (n *namespace) closeAll() (sent []heldLease, unsent []storage.Token) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, st := range n.streams {
		st.closed = true
		close(st.done)
		s, u := n.takeHeld(st)
		sent = append(sent, s...)
		unsent = append(unsent, u...)
	}
	n.streams = nil
	return sent, unsent
}

func (n *namespace) takeHeld(st *stream) (sent []heldLease, unsent []storage.Token) {
	for tok, l := range st.held {
		if l.sent {
			sent = append(sent, heldLease{tok: tok, deadline: l.deadline})
		} else {
			unsent = append(unsent, tok)
		}
		delete(n.held, tok)
	}
	st.held = make(map[storage.Token]*lease)
	st.queue = nil
	return sent, unsent
}
