package dispatcher

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// namespace is one namespace served by this replica: its streams, the
// deliveries they hold, and the loop that pops and reaps for them. The loop
// goroutine runs from the first stream until the last one leaves (or Stop).
type namespace struct {
	d    *Dispatcher
	name string

	quit   chan struct{} // closed (under d.mu) to end the loop
	exited chan struct{} // closed when the loop has ended
	wake   chan struct{} // re-plan the sleep: an earlier task, a hand-back
	credit chan struct{} // credit came back; heeded only while blocked

	mu        sync.Mutex
	streams   []*stream
	held      map[storage.Token]*stream // every delivery a stream holds
	rr        int                       // round-robin position in streams
	nextPrune time.Time                 // earliest local lease deadline held; zero if none
	pol       storage.Policy
	polAt     time.Time // when pol was read; zero: never
	polStale  bool      // a policy change was announced: re-read pol now
	// ahead is how far the store's clock may be ahead of the local one:
	// the store's time at the last pop minus the local time before it was
	// called (an upper bound, so "the store's lease ran out" is decided
	// early rather than late).
	ahead      time.Duration
	aheadKnown bool // a pop measured ahead

	// Loop-only state.
	lastReap time.Time
	popFull  bool          // the last pop round was filled: a backlog may be waiting
	errWait  time.Duration // backoff after a store error; 0 when healthy
	idleWait time.Duration // backoff when the store says "due" but gives nothing
	lastWarn time.Time
	riding   bool       // the store was told of a pop coming (expectPop)
	asked    []askedPop // pops whose answer was lost, asked again (askagain.go)

	// Late deliveries since the last WARN about them (guarded by lateMu:
	// senders report them).
	lateMu    sync.Mutex
	lateCount int
	lateWorst time.Duration
	lateLog   time.Time
}

// lateLogEvery is how often, at most, a namespace logs its late deliveries.
const lateLogEvery = 10 * time.Second

// late records a delivery sent lateness past its due time (at least
// Config.LateWarn) and logs the late deliveries of the namespace at WARN,
// at most once every lateLogEvery: how many, and the worst.
func (n *namespace) late(lateness time.Duration) {
	now := n.d.cfg.Clock.Now()
	n.lateMu.Lock()
	n.lateCount++
	n.lateWorst = max(n.lateWorst, lateness)
	if now.Sub(n.lateLog) < lateLogEvery {
		n.lateMu.Unlock()
		return
	}
	count, worst, since := n.lateCount, n.lateWorst, n.lateLog
	n.lateCount, n.lateWorst, n.lateLog = 0, 0, now
	n.lateMu.Unlock()
	attrs := []slog.Attr{slog.String("namespace", n.name), slog.Int("deliveries", count),
		slog.Duration("worst", worst), slog.Duration("threshold", n.d.cfg.LateWarn)}
	if !since.IsZero() {
		attrs = append(attrs, slog.Duration("over", now.Sub(since)))
	}
	n.d.log.LogAttrs(context.Background(), slog.LevelWarn,
		"dispatcher: tasks delivered late (most often no subscriber was connected when they fell due; else subscribers short of credit, the store slow, or this process starved)", attrs...)
}

// maxIdleWait bounds the backoff while the store says a task is due but
// neither pop nor reap moves anything (another replica took it first, or
// the task was removed in between). It was the safety poll (1 s), so a
// few such rounds in a row could leave tasks that fell due meanwhile up to
// a second late; now at most this long.
const maxIdleWait = 25 * time.Millisecond

// kindIdleWait bounds the idle backoff instead of maxIdleWait when every
// stream of the namespace takes given kinds only: due tasks of other kinds
// make the store say "due" without a pop ever taking them, and a task of
// a wanted kind that falls due behind them waits at most this long.
const kindIdleWait = 100 * time.Millisecond

// rateWaitMin is the shortest wait for a namespace's dispatch-rate tokens
// (Policy.MaxDispatchRate): at high rates the loop pops every few
// milliseconds in batches rather than once per token.
const rateWaitMin = 5 * time.Millisecond

func newNamespace(d *Dispatcher, name string) *namespace {
	return &namespace{
		d:      d,
		name:   name,
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
		wake:   make(chan struct{}, 1),
		credit: make(chan struct{}, 1),
		held:   make(map[storage.Token]*stream),
	}
}

// poke signals ch without blocking; signals coalesce.
func (n *namespace) poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run is the namespace loop. It ends when quit is closed; a store call in
// progress completes first (each is bounded by StoreTimeout).
func (n *namespace) run() {
	defer n.d.loops.Done()
	defer close(n.exited)
	defer n.expectPop(0) // no more pops: waiting acks go now
	renewer := make(chan struct{})
	go func() {
		defer close(renewer)
		n.renewLoop()
	}()
	defer func() { <-renewer }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	reap := true
	for {
		select {
		case <-n.quit:
			return
		default:
		}
		started := n.d.cfg.Clock.Now()
		wait, blocked, reapNext := n.tick(reap)
		reap = reapNext
		if wait <= 0 {
			continue
		}
		timer.Reset(wait)
		var credit chan struct{}
		if blocked {
			credit = n.credit
		}
		signaled := false
		select {
		case <-n.quit:
			return
		case <-n.wake:
			signaled = true
		case <-credit:
			signaled = true
		case <-timer.C:
			// A planned wake is nearly always a due task: under a steady
			// flow it comes every few milliseconds, and reaping on each
			// would add a store round trip to every delivery. An expired
			// lease is reaped when the pop's answer reports it (tick),
			// and every tenth of the safety poll in any case (below).
		}
		timer.Stop()
		if signaled && !n.settleSignals(started, credit) {
			return
		}
		// Reap at least every tenth of the safety poll even when woken early
		// all the time (credit coming back under load).
		reap = reap || reapDue(n.d.cfg.Clock.Now(), n.lastReap, n.d.cfg.SafetyPoll)
	}
}

// settleSignals joins the wake signals that arrive within WakePrecision of
// the last tick's start (a burst of upserts of earlier tasks, acks coming
// back one by one) into one wake at the end of that step: it waits out the
// rest of the step, then drops the signals that came meanwhile, which the
// next tick answers anyway. credit is the credit channel when the loop
// heeds it, else nil. It returns false when the loop is to quit.
func (n *namespace) settleSignals(started time.Time, credit chan struct{}) bool {
	p := n.d.cfg.WakePrecision
	if p <= 0 {
		return true
	}
	if rest := p - n.d.cfg.Clock.Now().Sub(started); rest > 0 {
		t := time.NewTimer(rest)
		select {
		case <-n.quit:
			t.Stop()
			return false
		case <-t.C:
		}
	}
	select {
	case <-n.wake:
	default:
	}
	if credit != nil {
		select {
		case <-credit:
		default:
		}
	}
	return true
}

// tick reaps (if asked), pops for the free credit, and plans the next wake:
// it returns how long to sleep (0: go on at once), whether the loop is
// blocked on credit (due tasks wait, no stream can take them), and whether
// the next tick should reap.
func (n *namespace) tick(reap bool) (wait time.Duration, blocked, reapNext bool) {
	cfg := &n.d.cfg
	ctx := n.d.base
	pol := n.refreshPolicy(ctx)

	progress, reapFull := false, false
	// After the store failed or stalled, reaping waits until the replicas
	// that hold leases had time to renew them (Dispatcher.reapHeldFor):
	// leases that ran out only because renewals could not reach the store
	// are not taken from live streams.
	heldFor := n.d.reapHeldFor()
	if heldFor > 0 {
		reap = false
	}
	if reap {
		n.lastReap = cfg.Clock.Now()
		c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		moved, err := cfg.Store.Reap(c, n.name, cfg.ReapBatch,
			storage.NackOptions{Reason: ReasonLeaseExpired, MaxAttempts: pol.MaxAttempts, Backoff: pol.Backoff, ExpiredBy: n.expiredBy()})
		cancel()
		if err != nil {
			return n.failed("reap", err), false, true
		}
		progress = len(moved) > 0
		reapFull = len(moved) >= cfg.ReapBatch
	}

	if len(n.asked) > 0 {
		// What a pop whose answer was lost leased goes out before anything
		// else is popped (askagain.go).
		if err := n.askAgain(ctx); err != nil {
			return n.failed("pop", err), false, true
		}
	}
	free, expired := n.freeCredit(cfg.Clock.Now())
	if len(expired) > 0 {
		// The hand-back is this loop's own call: it must not wait for the
		// pop this loop announced (it would until the announcement ends).
		n.expectPop(0)
		c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		n.d.handBack(c, n, nil, expired)
		cancel()
	}
	r := round{reaped: reap, reapFull: reapFull, heldFor: heldFor, paused: pol.Paused, free: free,
		progress: progress, maxRate: pol.MaxDispatchRate}
	if pol.Paused {
		// Paused: pop nothing. Leases already out are still renewed and
		// reaped above; a resume announced on any replica wakes the loop
		// (PolicyChanged), else the policy is re-read every SafetyPoll.
		n.popFull = false
	} else if free > 0 {
		got, full, w, err := n.pop(ctx, free, pol)
		if got > 0 {
			r.progress = true
			r.free -= got
		}
		if err != nil {
			return n.failed("pop", err), false, true
		}
		n.popFull = full
		r.popped, r.popFull, r.wake = true, full, w
	}
	if r.needsWake() {
		// No pop this round (no free credit): ask when there is work
		// next. With credit, the pop answered it in the same call.
		c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		next, storeNow, ok, err := cfg.Store.NextWake(c, n.name)
		cancel()
		if err != nil {
			return n.failed("next wake", err), false, true
		}
		r.wake = storage.PopResult{Now: storeNow, Next: next, HasNext: ok}
	}
	r.idleWait, r.onlyKinds, r.earliestLease = n.idleWait, n.onlyKinds(), n.earliestLease()
	r.now = cfg.Clock.Now()
	p := planNext(r, cfg.SafetyPoll, cfg.WakePrecision)
	n.expectPop(rideWithin(r, p, cfg.AckRide, cfg.WakePrecision))
	cfg.signals.planned(n.name, pol, p)
	if p.healthy {
		n.errWait = 0
	}
	n.idleWait = p.idleWait
	return p.wait, p.blocked, p.reap
}

// pop pops for free credit: one Pop of at most PopBatch, or, when free
// exceeds PopBatch and the last round came back full, up to PopConcurrency
// Pops at once whose limits add up to at most free (the credit is reserved before the calls; what they do
// not fill stays free). Every popped delivery is distributed, even when
// another of the calls failed. It returns how many were popped, whether
// every call was filled (more may be due), and the first error.
//
// wake is the store's answer of when the namespace has work next, from
// the pop that ran last in the store (each PopWake answers it after its own
// move); when no pop ran (no group had credit), a PopWake of limit 0 asks
// it, so the caller never needs a second call.
func (n *namespace) pop(ctx context.Context, free int, pol storage.Policy) (got int, full bool, wake storage.PopResult, err error) {
	groups := n.creditGroups()
	if len(groups) == 1 && groups[0].key == "" {
		return n.popGroup(ctx, creditGroup{free: free}, pol)
	}
	full = false
	asked := false
	for _, g := range groups {
		if g.free <= 0 {
			continue
		}
		gg, gf, gw, ge := n.popGroup(ctx, g, pol)
		got += gg
		full = full || gf
		if ge == nil {
			wake, asked = gw, true // later groups ran later: their answer is the latest
		}
		if err == nil {
			err = ge
		}
	}
	if !asked && err == nil {
		c, cancel := context.WithTimeout(ctx, n.d.cfg.StoreTimeout)
		wake, err = n.d.cfg.Store.PopWake(c, n.name, storage.PopParams{})
		cancel()
	}
	return got, full, wake, err
}

// roundUp rounds d up to a multiple of precision (precision <= 0: d), so
// tasks due within one precision step are popped by one wake, never before
// they are due.
func roundUp(d, precision time.Duration) time.Duration {
	if precision <= 0 {
		return d
	}
	return (d + precision - 1) / precision * precision
}

// creditGroup is the free credit of the streams that take the same kinds.
type creditGroup struct {
	key   string   // stream.kindKey; "" for every kind
	kinds []string // nil for every kind
	free  int
}

// creditGroups returns the free credit per set of kinds, the groups with
// kinds first (in key order), every kind last, so a stream of given kinds
// gets the tasks of those kinds before one that takes anything.
func (n *namespace) creditGroups() []creditGroup {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []creditGroup
	for _, st := range n.streams {
		i := slices.IndexFunc(out, func(g creditGroup) bool { return g.key == st.kindKey })
		if i < 0 {
			out = append(out, creditGroup{key: st.kindKey, kinds: st.kinds})
			i = len(out) - 1
		}
		out[i].free += st.room()
	}
	slices.SortFunc(out, func(a, b creditGroup) int {
		if (a.key == "") != (b.key == "") {
			if a.key == "" {
				return 1
			}
			return -1
		}
		return strings.Compare(a.key, b.key)
	})
	return out
}

// onlyKinds reports whether every stream takes given kinds only (so due
// tasks may be of kinds nobody takes).
func (n *namespace) onlyKinds() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, st := range n.streams {
		if st.kindKey == "" {
			return false
		}
	}
	return len(n.streams) > 0
}

// popGroup pops for the free credit of one group of streams (see pop) and
// hands what it popped to those streams.
func (n *namespace) popGroup(ctx context.Context, g creditGroup, pol storage.Policy) (got int, full bool, wake storage.PopResult, err error) {
	cfg := &n.d.cfg
	free := g.free
	leaseFor := pol.AckTimeout
	// The store lease is the short liveness lease, renewed while this
	// replica holds the delivery; the subscriber is told the ack timeout.
	storeLease := leaseFor
	if cfg.Liveness > 0 && cfg.Liveness < leaseFor {
		storeLease = cfg.Liveness
	}
	// Fan out only while a backlog drains (the last round came back
	// full): under a steady flow one Pop finds the few tasks that just fell
	// due, and more calls would only cost Redis and this loop.
	calls := 1
	if n.popFull {
		calls = min(cfg.PopConcurrency, (free+cfg.PopBatch-1)/cfg.PopBatch)
	}
	limits := make([]int, calls)
	for i, left := 0, free; i < calls; i++ {
		limits[i] = min(left, cfg.PopBatch)
		left -= limits[i]
	}
	results := make([][]storage.Delivery, calls)
	wakes := make([]storage.PopResult, calls)
	errs := make([]error, calls)
	ids := make([]string, calls)
	for i := range ids {
		ids[i] = n.d.popID()
	}
	before := cfg.Clock.Now()
	popOne := func(i int) {
		c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		defer cancel()
		wakes[i], errs[i] = cfg.Store.PopWake(c, n.name, storage.PopParams{Limit: limits[i], LeaseFor: storeLease, TellFor: leaseFor,
			MaxRate: pol.MaxDispatchRate, Burst: storage.DispatchBurst(pol.MaxDispatchRate), Kinds: g.kinds,
			RequestID: ids[i], RequestWindow: cfg.popRecordWindow()})
		results[i] = wakes[i].Deliveries
		wakes[i].Deliveries = nil
	}
	if calls > 1 {
		var wg sync.WaitGroup
		for i := 1; i < calls; i++ {
			wg.Go(func() { popOne(i) })
		}
		popOne(0)
		wg.Wait()
	} else {
		popOne(0)
	}
	// The store's deadline is store-now + the lease; reading the local
	// clock after the calls errs on the late side, so credit is never freed
	// before the store's lease really ended.
	popped := cfg.Clock.Now()
	deadline := popped.Add(leaseFor)
	full = true
	all := results[0]
	for i, dels := range results {
		if i > 0 {
			all = append(all, dels...)
		}
		if err == nil && errs[i] != nil {
			err = errs[i]
		}
		if len(dels) < limits[i] {
			full = false
		}
		// The call that ran last in the store saw the others' moves: its
		// answer of the next wake is the one to plan by.
		if errs[i] == nil && !wakes[i].Now.Before(wake.Now) {
			wake = wakes[i]
		}
	}
	if calls > 1 {
		// Each call's batch is in due order, but the calls ran in Redis in
		// any order: merge them, so every stream receives its share of the
		// round in due order.
		slices.SortStableFunc(all, func(a, b storage.Delivery) int { return a.Task.DueTime.Compare(b.Task.DueTime) })
	}
	dist := distribution{deadline: deadline, popped: popped, leaseFor: leaseFor, storeLease: storeLease, kindKey: g.key}
	if err != nil {
		n.lost(ids, errs, results, before, dist)
	}
	if len(all) > 0 {
		// The store answered each lease deadline as its time of the pop
		// plus storeLease: that time minus the local time before the calls
		// is how far the store's clock may be ahead of the local one.
		ahead := all[0].LeaseDeadline.Add(-storeLease).Sub(before)
		for _, del := range all[1:] {
			ahead = max(ahead, del.LeaseDeadline.Add(-storeLease).Sub(before))
		}
		dist.ahead = ahead
		n.distribute(all, dist)
		got = len(all)
	}
	return got, full, wake, err
}

// distribution is what distribute needs to know about one pop round.
type distribution struct {
	deadline   time.Time     // local estimate of the deadline the subscriber is told
	popped     time.Time     // local time after the pop
	leaseFor   time.Duration // the ack timeout the subscriber is told
	storeLease time.Duration // the lease the pop asked the store for
	ahead      time.Duration // see namespace.ahead
	kindKey    string        // the streams the round was popped for (stream.kindKey)
}

// failed logs a store error (at most every 10 s while it persists) and
// returns the backoff before the next try: 50 ms doubling to SafetyPoll.
func (n *namespace) failed(op string, err error) time.Duration {
	if now := n.d.cfg.Clock.Now(); n.errWait == 0 || now.Sub(n.lastWarn) >= 10*time.Second {
		n.lastWarn = now
		n.d.log.LogAttrs(context.Background(), slog.LevelWarn, "dispatcher: store call failed; retrying",
			slog.String("namespace", n.name), slog.String("op", op), slog.String("error", err.Error()))
	}
	n.errWait = min(max(2*n.errWait, 50*time.Millisecond), n.d.cfg.SafetyPoll)
	return n.errWait
}

// refreshPolicy re-reads the policy every PolicyRefresh (every SafetyPoll
// while the namespace is paused, so a resume whose announcement was lost
// still applies soon) and returns it.
func (n *namespace) refreshPolicy(ctx context.Context) storage.Policy {
	now := n.d.cfg.Clock.Now()
	n.mu.Lock()
	pol, at, stale := n.pol, n.polAt, n.polStale
	n.mu.Unlock()
	every := n.d.cfg.PolicyRefresh
	if pol.Paused {
		every = min(every, n.d.cfg.SafetyPoll)
	}
	if !at.IsZero() && !stale && now.Sub(at) < every {
		return pol
	}
	if at.IsZero() {
		pol = storage.DefaultPolicy()
	}
	n.mu.Lock()
	n.polStale = false // a change announced from here on is read again
	n.mu.Unlock()
	pol = n.d.policyOf(ctx, n.name, pol)
	n.mu.Lock()
	n.pol, n.polAt = pol, now
	n.mu.Unlock()
	return pol
}

// expirePolicy makes the loop re-read the policy on its next round.
func (n *namespace) expirePolicy() {
	n.mu.Lock()
	n.polStale = true
	n.mu.Unlock()
}

// policy returns the policy the loop last read, reading it if it never did.
func (n *namespace) policy(ctx context.Context) storage.Policy {
	n.mu.Lock()
	pol, at := n.pol, n.polAt
	n.mu.Unlock()
	if !at.IsZero() {
		return pol
	}
	return n.d.policyOf(ctx, n.name, storage.DefaultPolicy())
}

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
