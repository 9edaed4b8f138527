package dispatcher

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
)

// Lease renewal runs apart from the namespace loop (issue 30): a loop
// stuck in a slow pop, or starved on a loaded machine, must not let the
// leases of its live streams run out. Each namespace served here has a
// renewer goroutine beside its loop:
//
//   - every Liveness/3 it sets the store lease of every delivery the
//     streams hold to store-now + Liveness (never past the deadline the
//     subscriber was told), so a renewal may come up to two thirds of
//     Liveness late (4 s by default) before a lease runs out;
//   - a renewal that failed (the store unreachable, or slower than the
//     store timeout) is tried again every renewRetry, so it lands as soon as
//     the store answers again, not a whole interval later.
//
// The store's clock runs on while the store is away (a SIGSTOPped Redis
// keeps its TIME), so a stall longer than the margin leaves leases expired
// that live streams still hold. Reaping therefore waits after any store
// trouble this replica saw — a call that failed, or that took longer than
// slowCall — until a hold (Liveness/2) has passed with none, or, while the
// store answers, only slowly, at most a hold after the trouble began or the
// last failure (reapHold): every replica talks to the same store, so each
// saw the stall, and the renewers of the replicas holding the leases get
// in first. A reap already waiting
// in the store's queue when it stalled still runs when it resumes; that
// window is what remains.

// expiredBy is the store's time now, as far as this replica knows it (the
// local clock plus ahead, an upper bound), for a reap sent now to take
// back only what has expired by then (storage.NackOptions.ExpiredBy): a
// reap that waits out a stall in the store's socket (sent before any call
// failed, so before any hold) runs when the store resumes, and without the
// bound took back every lease that ran out during the stall, before the
// holders' renewals landed (TestFaultRedisStallKeepsLiveStreams, durable,
// under load: 68 redeliveries of live streams). Zero (no bound) until a
// pop has measured ahead.
func (n *namespace) expiredBy() time.Time {
	n.mu.Lock()
	ahead, known := n.ahead, n.aheadKnown
	n.mu.Unlock()
	if !known {
		return time.Time{}
	}
	return n.d.cfg.Clock.Now().Add(ahead)
}

// renewRetry is how soon a failed renewal is tried again.
const renewRetry = 100 * time.Millisecond

// renewLoop renews the store leases of what the namespace's streams hold
// until the loop ends (quit). It does nothing when Liveness is negative.
func (n *namespace) renewLoop() {
	cfg := &n.d.cfg
	if cfg.Liveness <= 0 {
		return
	}
	every := cfg.Liveness / 3
	timer := time.NewTimer(every)
	defer timer.Stop()
	var failingSince time.Time // first failure of the current streak
	for {
		select {
		case <-n.quit:
			return
		case <-timer.C:
		}
		wait := every
		err := n.renewHeld(n.d.base)
		switch {
		case err != nil:
			wait = min(renewRetry, every)
			if failingSince.IsZero() {
				failingSince = cfg.Clock.Now()
				n.d.log.LogAttrs(n.d.base, slog.LevelWarn, "dispatcher: renewing leases failed; retrying until the store answers",
					slog.String("namespace", n.name), slog.String("error", err.Error()))
			}
		case !failingSince.IsZero():
			n.d.log.LogAttrs(n.d.base, slog.LevelInfo, "dispatcher: renewing leases works again",
				slog.String("namespace", n.name), slog.Duration("failed_for", cfg.Clock.Now().Sub(failingSince)))
			failingSince = time.Time{}
		}
		timer.Reset(wait)
	}
}

// renewHeld renews the store leases of every delivery the streams hold
// (see Config.Liveness), and frees the credit of those the store no longer
// leases (acked or nacked through another replica). It returns the first
// store error: some leases may not have been renewed.
func (n *namespace) renewHeld(ctx context.Context) error {
	cfg := &n.d.cfg
	n.mu.Lock()
	held := make([]heldLease, 0, len(n.held))
	for tok, st := range n.held {
		held = append(held, heldLease{tok: tok, deadline: st.held[tok].deadline})
	}
	n.mu.Unlock()
	if len(held) == 0 {
		return nil
	}
	c, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
	gone, err := n.d.renew(c, n, held, false)
	cancel()
	if len(n.settle(gone)) > 0 {
		n.poke(n.credit)
	}
	return err
}

// health records when this replica last saw the store in trouble, so
// reaping can wait for the lease holders' renewals after it (see above),
// and calls recovered when a call succeeds after one failed: the namespace
// loops, backing off after their own failures, pop at once instead of at
// their next try (issue 30 item 2: after a Redis stall, tasks due right
// after SIGCONT waited up to two seconds for the loops' backoff).
type health struct {
	slowCall  time.Duration
	hold      time.Duration
	recovered func()

	failing atomic.Bool // s.failing, read without the lock on every call
	mu      sync.Mutex
	s       holdState
}

// holdState is what the reap hold is decided from (reapHold).
type holdState struct {
	trouble  time.Time // the last failed or slow call; zero: never
	streak   time.Time // the first trouble since a whole hold passed without any
	failedAt time.Time // the last failed call; zero: never
	failing  bool      // the last call that answered or failed, failed
}

// newHealth returns the tracker for a replica whose liveness lease is
// liveness (no renewals when not positive: nothing to wait for).
func newHealth(liveness time.Duration, recovered func()) *health {
	if liveness <= 0 {
		return &health{recovered: recovered}
	}
	// A renewal may be two thirds of Liveness late; a call that took a
	// sixth of it, or failed, means renewals may have missed their turn.
	// The hold leaves the renewers, retrying every renewRetry, half of
	// Liveness after the store answers again (the breaker of each replica
	// lets its first call through up to a second after another's).
	return &health{slowCall: liveness / 6, hold: liveness / 2, recovered: recovered}
}

// observe records a store call that started at start, returned at now,
// and answered err.
func (h *health) observe(start, now time.Time, err error) {
	failed := errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
	slow := h.hold > 0 && now.Sub(start) >= h.slowCall
	if !failed && !slow && !h.failing.Load() {
		return // the common case: nothing to record
	}
	h.mu.Lock()
	if h.hold > 0 && (failed || slow) {
		if h.s.trouble.IsZero() || now.Sub(h.s.trouble) >= h.hold {
			h.s.streak = now
		}
		if now.After(h.s.trouble) {
			h.s.trouble = now
		}
	}
	wasFailing := h.s.failing
	switch {
	case failed:
		h.s.failing = true
		if now.After(h.s.failedAt) {
			h.s.failedAt = now
		}
	case err == nil:
		h.s.failing = false
	}
	h.failing.Store(h.s.failing)
	recovered := wasFailing && !h.s.failing
	h.mu.Unlock()
	if recovered && h.recovered != nil {
		h.recovered()
	}
}

// heldFor returns how long reaping must still wait at now after the last
// store trouble; 0: reap. It only reads: every caller (each namespace
// loop, whether its tick reaps or not, and the sweeper) gets the same
// answer.
func (h *health) heldFor(now time.Time) time.Duration {
	if h.hold <= 0 {
		return 0
	}
	h.mu.Lock()
	s := h.s
	h.mu.Unlock()
	return reapHold(s, now, h.hold)
}

// reapHold decides how long reaping must still wait at now (0: reap)
// after the store trouble s records, for a hold of hold:
//
//   - no trouble for a whole hold: reap;
//   - the last call failed (a stall): wait until a hold has passed since
//     the last trouble — a reap sent into a stalled store would run when
//     it resumes, before the renewals;
//   - the store answers, only slowly (a loaded machine, where a call
//     taking a sixth of Liveness is common): wait at most a hold after the
//     later of the streak's start and the last failure, then reap even
//     while slow calls go on. Slow calls keep renewals landing; without
//     this bound a replica that died would keep its deliveries for as
//     long as the survivors stay busy.
//
// The answer depends on s and now only: once a slow streak has been held
// for a hold, it stays released for every reader. (Before, the first
// reader after the bound took the release and re-armed the hold for the
// next one; a loop tick that did not reap, or the sweeper, could take it
// round after round, and TestFaultReplicaSIGKILLMidStream left a dead
// replica's delivery unreaped for 25 s.)
func reapHold(s holdState, now time.Time, hold time.Duration) time.Duration {
	if hold <= 0 || s.trouble.IsZero() {
		return 0
	}
	left := s.trouble.Add(hold).Sub(now)
	if left <= 0 {
		return 0
	}
	if s.failing {
		return left
	}
	since := s.streak
	if s.failedAt.After(since) {
		since = s.failedAt
	}
	return max(min(left, since.Add(hold).Sub(now)), 0)
}

// maxHold is how long reaping may be held in a row while the store answers.
func (h *health) maxHold() time.Duration { return h.hold }

func (d *Dispatcher) reapHeldFor() time.Duration { return d.health.heldFor(d.cfg.Clock.Now()) }

// observedStore times every delivery call of the dispatcher for health, by
// the dispatcher's clock: the times it records are the ones heldFor
// compares with that clock's now.
type observedStore struct {
	Store
	h     *health
	clock storage.Clock
}

func (o observedStore) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	start := o.clock.Now()
	dels, err := o.Store.Pop(ctx, ns, p)
	o.h.observe(start, o.clock.Now(), err)
	return dels, err
}

func (o observedStore) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	start := o.clock.Now()
	r, err := o.Store.PopWake(ctx, ns, p)
	o.h.observe(start, o.clock.Now(), err)
	return r, err
}

func (o observedStore) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	start := o.clock.Now()
	res, err := o.Store.Extend(ctx, ns, tokens, by)
	o.h.observe(start, o.clock.Now(), err)
	return res, err
}

func (o observedStore) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	start := o.clock.Now()
	moved, err := o.Store.Reap(ctx, ns, limit, opts)
	o.h.observe(start, o.clock.Now(), err)
	return moved, err
}

func (o observedStore) NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error) {
	start := o.clock.Now()
	next, now, ok, err := o.Store.NextWake(ctx, ns)
	o.h.observe(start, o.clock.Now(), err)
	return next, now, ok, err
}

func (o observedStore) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	start := o.clock.Now()
	st, moved, err := o.Store.Nack(ctx, ns, tokens, opts)
	o.h.observe(start, o.clock.Now(), err)
	return st, moved, err
}

// heldLease is a delivery this replica holds and the lease deadline its
// subscriber was told.
type heldLease struct {
	tok      storage.Token
	deadline time.Time
}

// renew sets the store lease of each held delivery to the earlier of now +
// Liveness and the deadline its subscriber was told; with final, to that
// deadline (the replica lets go of it). Tokens the store no longer leases
// (acked, nacked or reaped anywhere) are returned.
func (d *Dispatcher) renew(ctx context.Context, n *namespace, held []heldLease, final bool) (gone []storage.Token, err error) {
	now := d.cfg.Clock.Now()
	groups := map[time.Duration][]storage.Token{}
	for _, h := range held {
		left := h.deadline.Sub(now)
		if left <= 0 {
			continue
		}
		by := left
		if !final && by > d.cfg.Liveness {
			by = d.cfg.Liveness
		}
		by = by.Round(100 * time.Millisecond)
		if by <= 0 {
			continue
		}
		groups[by] = append(groups[by], h.tok)
	}
	for by, toks := range groups {
		for start := 0; start < len(toks); start += d.cfg.PopBatch {
			end := min(start+d.cfg.PopBatch, len(toks))
			res, xerr := d.cfg.Store.Extend(ctx, n.name, toks[start:end], by)
			if xerr != nil {
				if final {
					d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: leaving leases to their ack deadline failed; they are taken back when the short lease runs out",
						slog.String("namespace", n.name), slog.Int("deliveries", end-start), slog.String("error", xerr.Error()))
				}
				if err == nil {
					err = xerr // the renewer logs and retries
				}
				continue
			}
			var okToks []storage.Token
			var deadlines []time.Time
			for i, r := range res {
				if start+i >= end {
					break
				}
				if r.Status != storage.TokenOK {
					gone = append(gone, toks[start+i])
				} else if !final {
					okToks = append(okToks, toks[start+i])
					deadlines = append(deadlines, r.LeaseDeadline)
				}
			}
			if len(okToks) > 0 {
				n.renewed(okToks, deadlines)
			}
		}
	}
	return gone, err
}
