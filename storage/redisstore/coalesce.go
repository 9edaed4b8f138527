package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// CoalesceMax is the most specs that coalesced Upsert calls of one namespace
// share in one script call. A call of CoalesceMax specs or more is not
// coalesced: it runs on its own, as with Options.NoCoalesce.
const CoalesceMax = 256

// coalescer joins concurrent Upsert calls of the same namespace into one
// upsert script call: "batch what is queued", with no added wait. When no
// upsert of a namespace is in flight, a call goes out at once; calls that
// arrive while one is in flight queue up, and when it ends the first of them
// (the leader) sends the queue, up to CoalesceMax specs, in one script call
// and hands each caller its results. No goroutine runs in the background:
// every script call is made by one of the callers, so there is nothing to
// start or stop.
//
// Order: the queue is first in, first out, and a script call applies its
// specs in order (a repeated id is a sequential write), so specs of
// different calls for the same id apply in the order the calls were queued,
// exactly as if each call had run alone in that order.
//
// Contexts: a caller whose context ends while it is queued returns the
// context's error (ErrUnavailable when it was a deadline, as for any Redis
// call) and its specs are NOT written: it leaves the queue. Once its specs
// are in a script call, it waits for that call's answer and returns it,
// whatever its context does meanwhile. The script call keeps the leader's
// context values but not its cancellation, so one caller giving up fails no
// other; it is bounded by Options.Timeout and by the latest deadline among
// its callers (none if one of them has none).
type coalescer struct {
	mu     sync.Mutex
	queues map[string]*upsertQueue // shards (hashTag) with a script call in flight
}

// upsertQueue holds one namespace's calls waiting for the script call in
// flight to end.
type upsertQueue struct {
	waiting []*upsertCall
}

// upsertCall is one Upsert call taking part in coalescing.
type upsertCall struct {
	ctx   context.Context
	specs []storage.UpsertSpec
	lead  chan struct{} // gets a value when the call is made leader
	done  chan struct{} // closed when res and err are set
	// under coalescer.mu:
	leader bool // this call sends the next script call
	taken  bool // the specs are in a script call
	// set before done is closed:
	res []storage.UpsertResult
	err error
}

// upsertCoalesced is Upsert through the coalescer; 0 < len(specs) <
// CoalesceMax.
func (s *Store) upsertCoalesced(ctx context.Context, ns string, sh int, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrapErr("upsert", err)
	}
	c := &upsertCall{ctx: ctx, specs: specs}
	co := &s.co
	key := hashTag(ns, sh)
	co.mu.Lock()
	q, busy := co.queues[key]
	if !busy {
		// Nothing in flight: go out at once, alone.
		q = &upsertQueue{}
		co.queues[key] = q
		c.leader, c.taken = true, true
		co.mu.Unlock()
		s.send(ctx, ns, sh, q, []*upsertCall{c})
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
			// Given up while queued: leave unwritten, and pass the lead
			// on if it was ours.
			q.waiting = slices.DeleteFunc(q.waiting, func(w *upsertCall) bool { return w == c })
			if c.leader {
				co.promote(key, q)
			}
			co.mu.Unlock()
			return nil, wrapErr("upsert", ctx.Err())
		case c.leader:
			batch := q.take()
			co.mu.Unlock()
			s.send(ctx, ns, sh, q, batch)
			return c.res, c.err
		}
		co.mu.Unlock()
	}
}

// send runs one script call for batch (its calls taken, out of the queue),
// passes the lead to the first queued call (or marks ns idle), and hands
// out the results.
func (s *Store) send(ctx context.Context, ns string, sh int, q *upsertQueue, batch []*upsertCall) {
	all := batch[0].specs
	if len(batch) > 1 {
		n := 0
		for _, c := range batch {
			n += len(c.specs)
		}
		all = make([]storage.UpsertSpec, 0, n)
		for _, c := range batch {
			all = append(all, c.specs...)
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
	res, err := s.upsertScript(sctx, ns, sh, all)

	s.co.mu.Lock()
	s.co.promote(hashTag(ns, sh), q)
	s.co.mu.Unlock()

	off := 0
	for _, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res = res[off : off+len(c.specs) : off+len(c.specs)]
			off += len(c.specs)
		}
		if c.done != nil {
			close(c.done)
		}
	}
}

// promote passes the lead of ns to its first queued call, or marks ns idle
// when none is queued. Called with co.mu held.
func (co *coalescer) promote(key string, q *upsertQueue) {
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
// fit in CoalesceMax specs. Calls whose context has ended stay queued, to
// leave unwritten. Called with co.mu held.
func (q *upsertQueue) take() []*upsertCall {
	var batch []*upsertCall
	n, full := 0, false
	q.waiting = slices.DeleteFunc(q.waiting, func(c *upsertCall) bool {
		if len(batch) > 0 {
			// Stop at the first call that does not fit, so no later call
			// overtakes it.
			// A call for another namespace incarnation goes in a script
			// call of its own (the script checks one per call).
			full = full || n+len(c.specs) > CoalesceMax || nsIncarnation(c.specs) != nsIncarnation(batch[0].specs)
			if full || c.ctx.Err() != nil {
				return false
			}
		}
		n += len(c.specs)
		c.taken = true
		batch = append(batch, c)
		return true
	})
	return batch
}
