package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// Acks and nacks ride the next script call of their namespace shard (issue
// 37 item 3). Every Ack, AckMarked and Nack call of fewer than CoalesceMax
// tokens goes through the shard's settle queue:
//
//   - nothing of the shard in flight and no pop expected: it goes out at
//     once, alone (with whatever else waits), as one settle.lua call: a
//     lone ack is never held back;
//   - a script call of the shard in flight (a settle or a pop): it waits for
//     that call to end and settles in the next one;
//   - the dispatcher of this replica said it pops the namespace soon
//     (ExpectPop): it waits for that pop, which settles it in the same
//     script call before popping (pop.lua), at most until the time the
//     dispatcher gave; then it goes out alone.
//
// So a wake of a steady flow makes one script call for its acks and its
// pop, and a burst of acks one call per call in flight, with no fixed wait.
// Each caller is answered with its own tokens' statuses (and, for a nack,
// where each applied token's task went), exactly as its own call would.
//
// Contexts, order and the lead are the coalescer's (coalesce.go): a caller
// whose context ends while it waits leaves unapplied; once its tokens are
// in a script call it waits for that call's answer. A script call carries
// at most CoalesceMax tokens of waiting calls, taken first in, first out.

// settleKey is one namespace shard's queue.
type settleKey struct {
	ns string
	sh int
}

// settleCall is one Ack, AckMarked or Nack call of one shard.
type settleCall struct {
	ctx    context.Context
	tokens []storage.Token
	nack   bool
	marks  bool                // an ack with durable mode's ack markers
	opts   storage.NackOptions // a nack's
	lead   chan struct{}       // gets a value when the call is made leader
	done   chan struct{}       // closed when the answers (or err) are set
	// under settler.mu:
	leader bool // this call sends the next settle call
	taken  bool // the tokens are in a script call
	// set before done is closed:
	statuses []storage.TokenStatus
	moved    []storage.Moved // a nack's: where each applied token's task went, in token order
	err      error
}

// settleQueue is one shard's waiting calls and its script calls in flight.
type settleQueue struct {
	waiting  []*settleCall
	inflight int         // settle and pop script calls of the shard in flight
	timer    *time.Timer // sends what waits when a ride or a linger ends
	timerAt  time.Time
}

// settler holds every shard's settle queue of one Store.
type settler struct {
	linger time.Duration // Options.AckLinger

	mu     sync.Mutex
	queues map[settleKey]*settleQueue // shards with calls waiting or in flight
	rides  map[string]time.Time       // namespace -> until when its pop is expected
}

func newSettler(linger time.Duration) *settler {
	return &settler{linger: linger, queues: map[settleKey]*settleQueue{}, rides: map[string]time.Time{}}
}

// queue is key's queue, made if none. Called with st.mu held.
func (st *settler) queue(key settleKey) *settleQueue {
	q := st.queues[key]
	if q == nil {
		q = &settleQueue{}
		st.queues[key] = q
	}
	return q
}

// rideEnd is until when a pop of ns is expected, or zero when none is.
// Called with st.mu held.
func (st *settler) rideEnd(ns string, now time.Time) time.Time {
	if until, ok := st.rides[ns]; ok && until.After(now) {
		return until
	}
	return time.Time{}
}

// do settles c through the queue of shard sh (see the file comment); send
// is the shard's settle call. It returns c.err; c's answers are set.
func (st *settler) do(ctx context.Context, sh shard, c *settleCall) error {
	if err := ctx.Err(); err != nil {
		return wrapErr(c.op(), err)
	}
	key := settleKey{sh.ns, sh.i}
	now := time.Now() // wall clock: a bound on a wait, as a timeout is
	st.mu.Lock()
	q := st.queue(key)
	wait := st.rideEnd(key.ns, now)
	if wait.IsZero() && st.linger > 0 {
		wait = now.Add(st.linger)
	}
	if q.inflight == 0 && wait.IsZero() {
		// Nothing in flight, nothing coming: go out at once, with what waits.
		c.leader, c.taken = true, true
		q.inflight++
		batch := append([]*settleCall{c}, st.take(q, len(c.tokens))...)
		st.mu.Unlock()
		st.send(ctx, sh, key, q, batch)
		return c.err
	}
	c.lead = make(chan struct{}, 1)
	c.done = make(chan struct{})
	q.waiting = append(q.waiting, c)
	if q.inflight == 0 {
		st.arm(key, q, wait)
	}
	st.mu.Unlock()

	for {
		select {
		case <-c.done:
			return c.err
		case <-c.lead:
		case <-ctx.Done():
		}
		st.mu.Lock()
		switch {
		case c.taken:
			st.mu.Unlock()
			<-c.done
			return c.err
		case ctx.Err() != nil:
			// Given up while waiting: leave unapplied, and pass the lead
			// on if it was ours.
			q.waiting = slices.DeleteFunc(q.waiting, func(w *settleCall) bool { return w == c })
			if c.leader {
				st.promote(key, q)
			}
			st.drop(key, q)
			st.mu.Unlock()
			return wrapErr(c.op(), ctx.Err())
		case c.leader:
			batch := st.take(q, 0)
			q.inflight++
			st.mu.Unlock()
			st.send(ctx, sh, key, q, batch)
			return c.err
		}
		st.mu.Unlock()
	}
}

// send runs one settle call for batch (its calls taken), ends it as a call
// in flight and hands out the answers.
func (st *settler) send(ctx context.Context, sh shard, key settleKey, q *settleQueue, batch []*settleCall) {
	sctx, cancel := batchContext(ctx, batch)
	err := sh.settle(sctx, batch)
	cancel()
	st.end(key, q, batch, err)
}

// forPop takes the calls waiting on shard key for the pop about to run to
// carry (at most CoalesceMax tokens), and counts the pop as a call in flight
// of the shard, so calls that arrive meanwhile wait for the next call. The
// pop answers each call it carries (and calls end with its error) by done,
// which must be called once.
func (st *settler) forPop(key settleKey) (batch []*settleCall, done func(err error)) {
	st.mu.Lock()
	q := st.queue(key)
	batch = st.take(q, 0)
	q.inflight++
	st.mu.Unlock()
	return batch, func(err error) { st.end(key, q, batch, err) }
}

// end ends a script call of q that carried batch: the call is no longer in
// flight, the next waiting call leads (or waits for the expected pop), and
// every call of batch is answered (err, or the answers already set).
func (st *settler) end(key settleKey, q *settleQueue, batch []*settleCall, err error) {
	st.mu.Lock()
	q.inflight--
	if q.inflight == 0 && len(q.waiting) > 0 {
		if until := st.rideEnd(key.ns, time.Now()); !until.IsZero() {
			st.arm(key, q, until)
		} else {
			st.promote(key, q)
		}
	}
	st.drop(key, q)
	st.mu.Unlock()
	for _, c := range batch {
		if err != nil {
			c.err = err
		}
		if c.done != nil {
			close(c.done)
		}
	}
}

// expect records that this replica pops ns within the given time (0 or
// less: it does not, soon): the calls that arrive until then wait for that
// pop. Without a pop coming, what waits for one goes out now.
func (st *settler) expect(ns string, within time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if within > 0 {
		until := time.Now().Add(within)
		st.rides[ns] = until
		// The calls waiting for the ride wait for its new end: their
		// timer moves there now, rather than firing at the old end only
		// to be set again (a wake of the timer goroutine per pop of a
		// steady flow, issue 37 item 4).
		for key, q := range st.queues {
			if key.ns == ns && q.timer != nil && q.timerAt.Before(until) {
				q.timerAt = until
				q.timer.Reset(time.Until(until))
			}
		}
		return
	}
	if _, ok := st.rides[ns]; !ok {
		return
	}
	delete(st.rides, ns)
	for key, q := range st.queues {
		if key.ns == ns && q.inflight == 0 && len(q.waiting) > 0 {
			st.promote(key, q)
		}
	}
}

// arm makes q's timer fire at at (or earlier, if it is set earlier
// already). Called with st.mu held.
func (st *settler) arm(key settleKey, q *settleQueue, at time.Time) {
	if q.timer != nil && !q.timerAt.After(at) {
		return
	}
	q.timerAt = at
	if q.timer != nil {
		q.timer.Reset(time.Until(at))
		return
	}
	q.timer = time.AfterFunc(time.Until(at), func() { st.fire(key, q) })
}

// fire is q's timer: a ride or a linger ended. What still waits with
// nothing in flight goes out (unless a later pop is expected meanwhile).
func (st *settler) fire(key settleKey, q *settleQueue) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.queues[key] != q || time.Now().Before(q.timerAt) {
		return // forgotten, or moved later while firing: it fires again then
	}
	q.timer = nil
	if q.inflight > 0 || len(q.waiting) == 0 {
		return // the call in flight hands the lead on when it ends
	}
	if until := st.rideEnd(key.ns, time.Now()); !until.IsZero() {
		st.arm(key, q, until)
		return
	}
	st.promote(key, q)
}

// promote makes q's first waiting call the leader. Called with st.mu held.
func (st *settler) promote(_ settleKey, q *settleQueue) {
	if len(q.waiting) == 0 {
		return
	}
	next := q.waiting[0]
	if next.leader {
		return
	}
	next.leader = true
	next.lead <- struct{}{}
}

// drop forgets q once nothing waits and nothing is in flight. Called with
// st.mu held.
func (st *settler) drop(key settleKey, q *settleQueue) {
	if q.inflight == 0 && len(q.waiting) == 0 && st.queues[key] == q {
		if q.timer != nil {
			q.timer.Stop()
		}
		delete(st.queues, key)
	}
}

// take removes from q and marks taken the calls of the next script call:
// the first waiting ones while they fit in CoalesceMax tokens with have
// tokens already in it. Calls whose context has ended stay, to leave
// unapplied. Called with st.mu held.
func (st *settler) take(q *settleQueue, have int) []*settleCall {
	var batch []*settleCall
	n, full := have, false
	q.waiting = slices.DeleteFunc(q.waiting, func(c *settleCall) bool {
		// Stop at the first call that does not fit, so no later call
		// overtakes it (the first one always fits: it is under
		// CoalesceMax).
		full = full || (n+len(c.tokens) > CoalesceMax && n > 0)
		if full || c.ctx.Err() != nil {
			return false
		}
		n += len(c.tokens)
		c.taken = true
		batch = append(batch, c)
		return true
	})
	return batch
}

// queued is how many calls wait on key (not counting those in flight).
func (st *settler) queued(key settleKey) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	if q := st.queues[key]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// idle reports whether no call of any shard waits or is in flight.
func (st *settler) idle() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.queues) == 0
}

// op names the call in errors.
func (c *settleCall) op() string {
	if c.nack {
		return "nack"
	}
	return "ack"
}

// batchContext is the context of a script call made for batch: ctx's
// values without its cancellation (one caller giving up fails no other),
// bounded by the latest deadline among the batch's callers (none if one of
// them has none). cancel must be called.
func batchContext(ctx context.Context, batch []*settleCall) (context.Context, context.CancelFunc) {
	sctx := context.WithoutCancel(ctx)
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			return sctx, func() {}
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if latest.IsZero() {
		return sctx, func() {}
	}
	return context.WithDeadline(sctx, latest)
}
