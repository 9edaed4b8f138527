package dispatcher

import (
	"context"
	"log/slog"
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
	defer n.expectPop(0)  // no more pops: waiting acks go now
	defer n.giveUpAsked() // pops whose answer was lost: hand back or cancel
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
