package dispatcher

import (
	"context"
	"log/slog"
	"time"

	"github.com/delayd/delayd/storage"
)

// What wakes the namespace loops besides their own plan: wake-ups
// published by any replica (an earlier due task, a policy change), the
// sweeper that finds namespaces no wake-up named, and the policy cache.

func (d *Dispatcher) runWakeups(ctx context.Context) {
	defer d.bg.Done()
	backoff := 50 * time.Millisecond
	for {
		start := d.cfg.Clock.Now()
		// Each time the subscription is made, look again at every
		// namespace: a wake-up published before it was lost.
		err := d.cfg.Wakeups.SubscribeWakeups(ctx, func() { d.wakeAll("") }, d.wakeup)
		if ctx.Err() != nil {
			return
		}
		if d.cfg.Clock.Now().Sub(start) > time.Minute {
			backoff = 50 * time.Millisecond
		}
		d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: wake-up subscription ended; resubscribing",
			slog.Duration("after", backoff), slog.Any("error", err))
		// Whatever was announced meanwhile was missed: re-plan everything.
		d.wakeAll("")
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, d.cfg.SafetyPoll)
	}
}

// wakeup handles one notice from the wake-up channel: an earlier task at
// the head of a namespace, or a changed policy (the cached one is dropped
// and the namespace's loop re-reads it at once).
func (d *Dispatcher) wakeup(w storage.Wakeup) {
	if len(w.Settled) > 0 {
		d.settledElsewhere(w.Namespace, w.Settled)
		return
	}
	if w.PolicyChanged {
		d.policyChanged(w.Namespace)
		return
	}
	d.wakeAll(w.Namespace)
}

// PolicyChanged tells the dispatcher that ns's policy was changed on this
// replica: its loop re-reads the policy at once (a pause stops popping, a
// resume pops again), and the other replicas are told over the wake-up
// channel to do the same (best effort: one that misses it re-reads the
// policy within Config.PolicyRefresh, or within Config.SafetyPoll while
// the namespace is paused). The caller has already dropped this replica's
// cached policy. It blocks for at most StoreTimeout.
func (d *Dispatcher) PolicyChanged(ctx context.Context, ns string) {
	d.policyChanged(ns)
	if d.cfg.Wakeups == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
	defer cancel()
	if err := d.cfg.Wakeups.PublishPolicyChanged(ctx, ns); err != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: telling the other replicas of a policy change failed; they apply it at their next policy refresh",
			slog.String("namespace", ns), slog.String("error", err.Error()))
	}
}

// policyChanged drops the cached policy of ns and makes its loop, if this
// replica runs one, re-read it now.
func (d *Dispatcher) policyChanged(ns string) {
	if d.cfg.Policies != nil {
		d.cfg.Policies.Invalidate(ns)
	}
	d.mu.Lock()
	n := d.nss[ns]
	d.mu.Unlock()
	if n != nil {
		n.expirePolicy()
		n.poke(n.wake)
	}
	if d.push != nil {
		d.push.hint(ns, true) // push set, changed or removed
	}
}

// wakeAll wakes ns, or every namespace loop when ns is "".
func (d *Dispatcher) wakeAll(ns string) {
	if ns != "" {
		d.Notify(ns)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.nss {
		n.poke(n.wake)
	}
}

func (d *Dispatcher) runSweeper(ctx context.Context) {
	defer d.bg.Done()
	t := time.NewTicker(d.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.sweep(ctx)
		}
	}
}

// sweep reaps the namespaces this replica has no loop for (not while
// reaping waits after store trouble: the next sweep does).
func (d *Dispatcher) sweep(ctx context.Context) {
	if d.reapHeldFor() > 0 {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
	names, err := d.cfg.Namespaces.Namespaces(lctx)
	cancel()
	if err != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: sweep: listing namespaces failed", slog.String("error", err.Error()))
		return
	}
	for _, ns := range names {
		if ctx.Err() != nil {
			return
		}
		d.mu.Lock()
		_, served := d.nss[ns]
		d.mu.Unlock()
		if served {
			continue
		}
		pol := d.policyOf(ctx, ns, storage.DefaultPolicy())
		opts := storage.NackOptions{Reason: ReasonLeaseExpired, MaxAttempts: pol.MaxAttempts, Backoff: pol.Backoff}
		for i := 0; i < 100; i++ { // bounded: the next sweep goes on
			rctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
			moved, err := d.cfg.Store.Reap(rctx, ns, d.cfg.ReapBatch, opts)
			cancel()
			if err != nil {
				d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: sweep: reaping failed", slog.String("namespace", ns), slog.String("error", err.Error()))
				break
			}
			if len(moved) < d.cfg.ReapBatch {
				break
			}
		}
	}
}

// policyOf reads ns's policy, or returns fallback (logging why) when it
// cannot.
func (d *Dispatcher) policyOf(ctx context.Context, ns string, fallback storage.Policy) storage.Policy {
	if d.cfg.Policies == nil {
		return storage.DefaultPolicy()
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
	defer cancel()
	p, err := d.cfg.Policies.Policy(ctx, ns)
	if err != nil {
		d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: reading policy failed; keeping the previous one",
			slog.String("namespace", ns), slog.String("error", err.Error()))
		return fallback
	}
	return p
}
