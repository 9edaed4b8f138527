package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// CoalesceMax is the most specs that coalesced Upsert calls of one namespace
// share in one script call (and the most tokens the Ack and Nack calls a
// script call carries share, settle.go). A call of CoalesceMax items or more
// is not coalesced: it runs on its own, as with Options.NoCoalesce.
const CoalesceMax = 256

// coalescer joins concurrent calls of the same shard (and kind) into one
// script call: "batch what is queued", with no added wait. When no call of
// a key is in flight, a call goes out at once; calls that arrive while one
// is in flight queue up, and when it ends the first of them (the leader)
// sends the queue, up to CoalesceMax items, in one script call and hands
// each caller its results. No goroutine runs in the background: every
// script call is made by one of the callers, so there is nothing to start
// or stop. Upserts coalesce by shard (acks and nacks ride the shard's next
// script call, pops included: settle.go).
//
// Order: the queue is first in, first out, and a script call applies its
// items in order (a repeated upsert id is a sequential write), so items of
// different calls for the same task apply in the order the calls were
// queued, exactly as if each call had run alone in that order.
//
// Contexts: a caller whose context ends while it is queued returns the
// context's error (ErrUnavailable when it was a deadline, as for any Redis
// call) and its items are NOT applied: it leaves the queue. Once its items
// are in a script call, it waits for that call's answer and returns it,
// whatever its context does meanwhile. The script call keeps the leader's
// context values but not its cancellation, so one caller giving up fails no
// other; it is bounded by Options.Timeout and by the latest deadline among
// its callers (none if one of them has none).
type coalescer[T, R any] struct {
	op string
	// joins reports whether a call's items may share a script call with
	// the batch's first call's (nil: always).
	joins func(first, next []T) bool

	mu     sync.Mutex
	queues map[coKey]*coQueue[T, R] // keys with a script call in flight
}

// coKey names what may share a script call: one namespace shard.
type coKey struct {
	ns string
	sh int
}

func newCoalescer[T, R any](op string, joins func(first, next []T) bool) *coalescer[T, R] {
	return &coalescer[T, R]{op: op, joins: joins, queues: make(map[coKey]*coQueue[T, R])}
}

// coQueue holds one key's calls waiting for the script call in flight to
// end.
type coQueue[T, R any] struct {
	waiting []*coCall[T, R]
}

// coCall is one call taking part in coalescing.
type coCall[T, R any] struct {
	ctx   context.Context
	items []T
	lead  chan struct{} // gets a value when the call is made leader
	done  chan struct{} // closed when res and err are set
	// under coalescer.mu:
	leader bool // this call sends the next script call
	taken  bool // the items are in a script call
	// set before done is closed:
	res []R
	err error
}

// do runs items through the coalescer of key; 0 < len(items) < CoalesceMax.
// run is the shard call that takes them (and the items of the calls it
// goes out with) and answers one result per item, in order: every call of
// one key passes the same one (the key names the shard).
func (co *coalescer[T, R]) do(ctx context.Context, key coKey, items []T, run func(context.Context, []T) ([]R, error)) ([]R, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrapErr(co.op, err)
	}
	c := &coCall[T, R]{ctx: ctx, items: items}
	co.mu.Lock()
	q, busy := co.queues[key]
	if !busy {
		// Nothing in flight: go out at once, alone.
		q = &coQueue[T, R]{}
		co.queues[key] = q
		c.leader, c.taken = true, true
		co.mu.Unlock()
		co.send(ctx, key, q, []*coCall[T, R]{c}, run)
		return c.res, c.err
	}
	c.lead = make(chan struct{}, 1)
	c.done = make(chan struct{})
	q.waiting = append(q.waiting, c)
	co.mu.Unlock()

	for {
		select {
		case <-c.done:
			return c.res, c.err
		case <-c.lead:
		case <-ctx.Done():
		}
		co.mu.Lock()
		switch {
		case c.taken:
			co.mu.Unlock()
			<-c.done
			return c.res, c.err
		case ctx.Err() != nil:
			// Given up while queued: leave unapplied, and pass the lead
			// on if it was ours.
			q.waiting = slices.DeleteFunc(q.waiting, func(w *coCall[T, R]) bool { return w == c })
			if c.leader {
				co.promote(key, q)
			}
			co.mu.Unlock()
			return nil, wrapErr(co.op, ctx.Err())
		case c.leader:
			batch := co.take(q)
			co.mu.Unlock()
			co.send(ctx, key, q, batch, run)
			return c.res, c.err
		}
		co.mu.Unlock()
	}
}

// send runs one shard call (run) for batch (its calls taken, out of the
// queue), passes the lead to the first queued call (or marks the key
// idle), and hands out the results.
func (co *coalescer[T, R]) send(ctx context.Context, key coKey, q *coQueue[T, R], batch []*coCall[T, R], run func(context.Context, []T) ([]R, error)) {
	all := batch[0].items
	if len(batch) > 1 {
		n := 0
		for _, c := range batch {
			n += len(c.items)
		}
		all = make([]T, 0, n)
		for _, c := range batch {
			all = append(all, c.items...)
		}
	}
	sctx := context.WithoutCancel(ctx)
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		sctx, cancel = context.WithDeadline(sctx, latest)
		defer cancel()
	}
	res, err := run(sctx, all)

	co.mu.Lock()
	co.promote(key, q)
	co.mu.Unlock()

	off := 0
	for _, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res = res[off : off+len(c.items) : off+len(c.items)]
			off += len(c.items)
		}
		if c.done != nil {
			close(c.done)
		}
	}
}

// promote passes the lead of key to its first queued call, or marks key
// idle when none is queued. Called with co.mu held.
func (co *coalescer[T, R]) promote(key coKey, q *coQueue[T, R]) {
	if len(q.waiting) == 0 {
		delete(co.queues, key)
		return
	}
	next := q.waiting[0]
	if next.leader {
		return
	}
	next.leader = true
	next.lead <- struct{}{}
}

// take removes from the queue and marks taken the calls of the next script
// call: the leader (first in the queue) and the calls after it while they
// fit in CoalesceMax items and join the leader's. Calls whose context has
// ended stay queued, to leave unapplied. Called with co.mu held.
func (co *coalescer[T, R]) take(q *coQueue[T, R]) []*coCall[T, R] {
	var batch []*coCall[T, R]
	n, full := 0, false
	q.waiting = slices.DeleteFunc(q.waiting, func(c *coCall[T, R]) bool {
		if len(batch) > 0 {
			// Stop at the first call that does not fit, so no later call
			// overtakes it.
			full = full || n+len(c.items) > CoalesceMax || (co.joins != nil && !co.joins(batch[0].items, c.items))
			if full || c.ctx.Err() != nil {
				return false
			}
		}
		n += len(c.items)
		c.taken = true
		batch = append(batch, c)
		return true
	})
	return batch
}

// idle reports whether no call of any key is in flight or queued.
func (co *coalescer[T, R]) idle() bool {
	co.mu.Lock()
	defer co.mu.Unlock()
	return len(co.queues) == 0
}

// queued is how many calls of key wait (not counting the one in flight).
func (co *coalescer[T, R]) queued(key coKey) int {
	co.mu.Lock()
	defer co.mu.Unlock()
	if q := co.queues[key]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// newUpsertCoalescer coalesces Upsert calls by shard. A call for another
// namespace incarnation goes in a script call of its own (the script checks
// one per call).
func newUpsertCoalescer() *coalescer[storage.UpsertSpec, storage.UpsertResult] {
	return newCoalescer[storage.UpsertSpec, storage.UpsertResult]("upsert",
		func(first, next []storage.UpsertSpec) bool { return nsIncarnation(first) == nsIncarnation(next) })
}
