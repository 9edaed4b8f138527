package dispatcher

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
)

// # Push
//
// A namespace whose policy sets Push (an HTTP target) is served on every
// replica by a pusher: an internal subscriber of the namespace, registered
// through Serve like a Subscribe stream, with max_in_flight
// Config.PushConcurrency. So it pops with the same leases, renewals,
// credit, pause, dispatch-rate cap and hand-back as any stream, and the
// replicas share the namespace's due tasks as streams do (each task is
// leased to one of them at a time; duplicates only after a fault). Its
// Send starts a goroutine for the delivery once one of PushConcurrency
// slots is free (no idle workers per namespace); it POSTs the delivery
// (Config.Pusher, within the ack timeout) and acks it on a 2xx or nacks
// it with the namespace's backoff otherwise (dead letter after max
// attempts), then frees its slot and its credit (Settle). Credit already
// bounds the deliveries in flight to PushConcurrency, so Send finds a free
// slot at once but for the moment a lease estimate ran out under a request
// still at it; then it waits, like a stream's Send under flow control.
//
// Which namespaces get a pusher: those whose policy has Push, learnt
// when a policy change is announced (PolicyChanged, on any replica), when
// an upsert or a wake-up names a namespace this replica does not serve
// (at most once per PolicyRefresh per namespace), and by a scan of every
// namespace (Config.Namespaces) at Start and every SweepInterval. A
// pusher ends when its namespace's policy loses Push (checked every
// PolicyRefresh) or at Stop. At Stop, requests in flight get up to half
// of what is left of Stop's context to finish (then they are canceled
// and handed back without costing an attempt).

// Pusher sends one delivery to an HTTP push target (package push's Client
// implements it).
type Pusher interface {
	// Push POSTs del to target and says how it ended, returning within
	// timeout (or when ctx ends). The error, nil for storage.PushOK, is
	// kept as the task's last error: it must be fit for the tenant.
	Push(ctx context.Context, target storage.PushTarget, del storage.Delivery, maxAttempts int32, timeout time.Duration) (storage.PushOutcome, error)
}

// PushMetrics receives the result of every push request (package metrics
// implements it). It is called once per request and must not block.
type PushMetrics interface {
	// Pushed reports one push request of ns: how it ended and how long it
	// took.
	Pushed(ns string, outcome storage.PushOutcome, took time.Duration)
}

type noPushMetrics struct{}

func (noPushMetrics) Pushed(string, storage.PushOutcome, time.Duration) {}

// DefaultPushConcurrency is Config.PushConcurrency's default.
const DefaultPushConcurrency = 16

// pushLeaseMargin is added to the ack timeout when a push request starts:
// the delivery stays leased for the whole request (which may only start a
// moment after the pop), so its ack or nack is not stale.
const pushLeaseMargin = 2 * time.Second

// Reasons a pusher hands a delivery back without costing an attempt.
const (
	// ReasonPushStopping: the replica stopped before the request was made,
	// or cut it when its drain time was up.
	ReasonPushStopping = "push interrupted: delayd stopping"
	// ReasonPushOff: the namespace's push target was removed before the
	// request was made.
	ReasonPushOff = "push target removed"
)

// pushManager runs the pushers of this replica.
type pushManager struct {
	d    *Dispatcher
	kick chan struct{}

	mu      sync.Mutex
	ctx     context.Context // run's; nil before run
	pushers map[string]*pusher
	checked map[string]time.Time // namespaces without a pusher: last look at their policy
	pending map[string]bool      // namespaces to look at; true: even if looked at lately
	closing bool                 // drain began: no new pushers
}

func newPushManager(d *Dispatcher) *pushManager {
	return &pushManager{
		d:       d,
		kick:    make(chan struct{}, 1),
		pushers: make(map[string]*pusher),
		checked: make(map[string]time.Time),
		pending: make(map[string]bool),
	}
}

// hint asks for a look at ns's policy (an upsert or wake-up named it and
// this replica does not serve it): at most once per PolicyRefresh per
// namespace unless force. It never blocks.
func (m *pushManager) hint(ns string, force bool) {
	now := m.d.cfg.Clock.Now()
	m.mu.Lock()
	if !force {
		if _, ok := m.pushers[ns]; ok {
			m.mu.Unlock()
			return
		}
		if at, ok := m.checked[ns]; ok && now.Sub(at) < m.d.cfg.PolicyRefresh {
			m.mu.Unlock()
			return
		}
	}
	m.checked[ns] = now
	m.pending[ns] = m.pending[ns] || force
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// run starts and stops pushers until ctx ends, then stops them all and
// waits for them (their in-flight requests are canceled and handed back).
func (m *pushManager) run(ctx context.Context) {
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()
	cfg := &m.d.cfg
	recheck := time.NewTicker(cfg.PolicyRefresh)
	defer recheck.Stop()
	scan := time.NewTicker(cfg.SweepInterval)
	defer scan.Stop()
	m.scan(ctx)
	for {
		select {
		case <-ctx.Done():
			m.stopAll()
			return
		case <-m.kick:
			m.mu.Lock()
			names := make([]string, 0, len(m.pending))
			for ns := range m.pending {
				names = append(names, ns)
			}
			clear(m.pending)
			m.mu.Unlock()
			for _, ns := range names {
				m.check(ctx, ns)
			}
		case <-recheck.C:
			m.mu.Lock()
			names := make([]string, 0, len(m.pushers))
			for ns := range m.pushers {
				names = append(names, ns)
			}
			// Forget namespaces not named for a while (deleted ones), so
			// the map does not grow with every name ever seen.
			now := cfg.Clock.Now()
			for ns, at := range m.checked {
				if now.Sub(at) > 2*cfg.PolicyRefresh {
					delete(m.checked, ns)
				}
			}
			m.mu.Unlock()
			for _, ns := range names {
				m.check(ctx, ns)
			}
		case <-scan.C:
			m.scan(ctx)
		}
	}
}

// scan looks at the policy of every namespace the store knows.
func (m *pushManager) scan(ctx context.Context) {
	if m.d.cfg.Namespaces == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, m.d.cfg.StoreTimeout)
	names, err := m.d.cfg.Namespaces.Namespaces(lctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: push: listing namespaces failed; retried at the next scan", slog.String("error", err.Error()))
		}
		return
	}
	for _, ns := range names {
		if ctx.Err() != nil {
			return
		}
		m.check(ctx, ns)
	}
}

// check starts a pusher for ns when its policy has Push and none runs,
// and stops the one that runs when it has not (or ns is gone).
func (m *pushManager) check(ctx context.Context, ns string) {
	cfg := &m.d.cfg
	want := false
	var pol storage.Policy
	if cfg.Policies != nil {
		pctx, cancel := context.WithTimeout(ctx, cfg.StoreTimeout)
		var err error
		pol, err = cfg.Policies.Policy(pctx, ns)
		cancel()
		switch {
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return // keep things as they are; the next look decides
		default:
			want = pol.Push.Enabled()
		}
	}
	m.mu.Lock()
	p := m.pushers[ns]
	m.checked[ns] = cfg.Clock.Now()
	switch {
	case want && p == nil && m.ctx != nil && m.ctx.Err() == nil && !m.closing:
		p = m.start(ns, pol)
		m.pushers[ns] = p
		delete(m.checked, ns)
	case !want && p != nil:
		delete(m.pushers, ns)
	default:
		p = nil
	}
	m.mu.Unlock()
	if p != nil && !want {
		p.stop()
		cfg.signals.pusherStopped(ns)
	}
}

// drain lets the pushers' requests in flight finish, for up to half of
// what is left of ctx (all of it when ctx has no deadline): Stop has ended
// their Serve calls, so no request starts. Pushers still busy then are
// canceled by stopAll.
func (m *pushManager) drain(ctx context.Context) {
	m.mu.Lock()
	m.closing = true
	ps := make([]*pusher, 0, len(m.pushers))
	for _, p := range m.pushers {
		p.draining.Store(true)
		ps = append(ps, p)
	}
	m.mu.Unlock()
	m.d.cfg.signals.draining()
	if dl, ok := ctx.Deadline(); ok {
		// A context's deadline is on the runtime's clock, so what is left
		// of it is too (not Config.Clock, which may be a test's).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		defer cancel()
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-ctx.Done():
			return
		}
	}
}

// stopAll stops every pusher and waits for them.
func (m *pushManager) stopAll() {
	m.mu.Lock()
	ps := make([]*pusher, 0, len(m.pushers))
	for _, p := range m.pushers {
		ps = append(ps, p)
	}
	clear(m.pushers)
	m.mu.Unlock()
	for _, p := range ps {
		p.cancel()
	}
	for _, p := range ps {
		<-p.done
	}
}

// pusher serves one namespace's push target on this replica.
type pusher struct {
	m      *pushManager
	ns     string
	cancel context.CancelFunc
	done   chan struct{} // closed when Serve and the requests have returned
	// draining: the replica is stopping; a delivery not yet pushed is
	// handed back instead.
	draining atomic.Bool
	// last is the policy last read: what a push uses when reading the
	// policy fails (a registry hiccup must not turn push off).
	last atomic.Pointer[storage.Policy]
}

// start runs a pusher for ns. m.mu is held.
func (m *pushManager) start(ns string, pol storage.Policy) *pusher {
	ctx, cancel := context.WithCancel(m.ctx)
	p := &pusher{m: m, ns: ns, cancel: cancel, done: make(chan struct{})}
	p.last.Store(&pol)
	go p.run(ctx)
	return p
}

// stop ends the pusher and waits for it.
func (p *pusher) stop() {
	p.cancel()
	<-p.done
}

func (p *pusher) run(ctx context.Context) {
	defer close(p.done)
	d := p.m.d
	conc := d.cfg.PushConcurrency
	// slots bounds the requests in flight to conc (see the package
	// comment's Push section); requests is what run waits for.
	slots := make(chan struct{}, conc)
	var requests sync.WaitGroup
	defer requests.Wait()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := d.Serve(ctx, Subscriber{
			Namespace:   p.ns,
			MaxInFlight: conc,
			internal:    true,
			Send: func(del storage.Delivery) error {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
				requests.Go(func() {
					defer func() { <-slots }()
					p.deliver(ctx, del)
				})
				return nil
			},
		})
		if errors.Is(err, ErrStopped) || ctx.Err() != nil {
			return
		}
		d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: push: serving the namespace ended; restarting",
			slog.String("namespace", p.ns), slog.Any("error", err))
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, d.cfg.SafetyPoll)
	}
}

// deliver POSTs one delivery and acks or nacks it by the outcome.
func (p *pusher) deliver(ctx context.Context, del storage.Delivery) {
	d := p.m.d
	cfg := &d.cfg
	tok := del.Token
	toks := []storage.Token{tok}
	sctx, cancel := context.WithTimeout(d.base, cfg.StoreTimeout)
	pol := d.policyOf(sctx, p.ns, *p.last.Load())
	p.last.Store(&pol)
	cancel()
	if ctx.Err() != nil || p.draining.Load() || !pol.Push.Enabled() || cfg.Pusher == nil {
		reason := ReasonPushStopping
		if ctx.Err() == nil && !p.draining.Load() {
			reason = ReasonPushOff
		}
		p.handBack(toks, reason, pol)
		return
	}
	if !p.holdLease(toks, pol) {
		return
	}
	start := cfg.Clock.Now()
	outcome, perr := cfg.Pusher.Push(ctx, pol.Push, del, pol.MaxAttempts, pol.AckTimeout)
	took := cfg.Clock.Now().Sub(start)
	if ctx.Err() != nil && outcome != storage.PushOK {
		// Stopping (or the target was removed): the request was cut
		// short; whether the endpoint processed it is unknown. It goes
		// back without costing an attempt; the idempotency key lets the
		// endpoint drop the repeat.
		p.handBack(toks, ReasonPushStopping, pol)
		return
	}
	cfg.PushMetrics.Pushed(p.ns, outcome, took)
	sctx, cancel = context.WithTimeout(d.base, cfg.StoreTimeout)
	defer cancel()
	if outcome == storage.PushOK {
		if _, err := cfg.Store.Ack(sctx, p.ns, toks); err != nil {
			d.log.LogAttrs(sctx, slog.LevelWarn, "dispatcher: push: acking a pushed task failed; it is pushed again when its lease runs out",
				slog.String("namespace", p.ns), slog.String("id", tok.ID), slog.String("error", err.Error()))
		}
		d.Settle(d.base, p.ns, toks, nil)
		return
	}
	reason := "push failed"
	if perr != nil {
		reason = perr.Error()
	}
	_, moved, err := cfg.Store.Nack(sctx, p.ns, toks, storage.NackOptions{Reason: reason, MaxAttempts: pol.MaxAttempts, Backoff: pol.Backoff})
	if err != nil {
		d.log.LogAttrs(sctx, slog.LevelWarn, "dispatcher: push: nacking a failed push failed; it is retried when its lease runs out",
			slog.String("namespace", p.ns), slog.String("id", tok.ID), slog.String("error", err.Error()))
	}
	d.Settle(d.base, p.ns, toks, nil)
	for _, mv := range moved {
		if mv.State == storage.StateScheduled {
			d.Notify(p.ns) // the retry may fall due before the loop's planned wake
		}
	}
}

// holdLease keeps the delivery leased for the whole request: the local
// lease estimate moves to now + ack timeout + pushLeaseMargin, which the
// replica's renewals (every Liveness/3) keep the store lease up to; when
// the store lease is not renewed that far on its own (an ack timeout
// below Liveness, whose pop leased it for the ack timeout only, or no
// renewals at all), the store lease is extended now too. It returns false
// when the delivery is no longer leased (taken back meanwhile): then
// nothing is pushed.
func (p *pusher) holdLease(toks []storage.Token, pol storage.Policy) bool {
	d := p.m.d
	cfg := &d.cfg
	by := pol.AckTimeout + pushLeaseMargin
	if cfg.Liveness <= 0 || pol.AckTimeout < cfg.Liveness {
		ctx, cancel := context.WithTimeout(d.base, cfg.StoreTimeout)
		res, err := cfg.Store.Extend(ctx, p.ns, toks, by)
		cancel()
		if err != nil {
			d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: push: extending the lease before a push failed; pushing anyway",
				slog.String("namespace", p.ns), slog.String("error", err.Error()))
		} else if len(res) == 1 && res[0].Status != storage.TokenOK {
			d.Settle(d.base, p.ns, toks, nil) // reaped or removed meanwhile
			return false
		}
	}
	d.LeaseExtended(p.ns, toks, by)
	return true
}

// handBack gives deliveries back for an immediate retry without costing an
// attempt.
func (p *pusher) handBack(toks []storage.Token, reason string, pol storage.Policy) {
	d := p.m.d
	ctx, cancel := context.WithTimeout(d.base, d.cfg.StoreTimeout)
	defer cancel()
	zero := time.Duration(0)
	d.nack(ctx, p.ns, toks, storage.NackOptions{RetryAfter: &zero, Reason: reason, MaxAttempts: math.MaxInt32,
		Backoff: pol.Backoff, Unsent: true})
	d.Settle(d.base, p.ns, toks, nil)
	d.Notify(p.ns)
}
