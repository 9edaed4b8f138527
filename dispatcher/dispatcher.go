// Package dispatcher moves due tasks from the store to subscriber streams:
// it pops by credit, sleeps until the earliest due time, wakes on upserts
// from any replica, reaps expired leases and applies retry backoff.
//
// # Model
//
// A subscriber (one gRPC Subscribe stream) is served by [Dispatcher.Serve],
// which runs in the stream's own goroutine and is the only caller of its
// Send: one sender per stream. Each stream has credit = max_in_flight minus
// the deliveries it holds unacked. Per namespace with at least one local
// subscriber, one loop goroutine pops at most the namespace's total free
// credit (so a replica with no subscriber for a namespace never pops it),
// spreads the deliveries round robin over the streams with free credit, and
// hands each to the stream through a channel whose capacity is the stream's
// max_in_flight. A push never blocks and never drops: a stream only receives
// what its credit and its channel can take, so a slow subscriber holds up
// only itself.
//
// # Credit
//
// A stream's credit comes back when, on this replica, an ack or nack names
// one of its deliveries ([Dispatcher.Settle], called by the delivery RPCs
// whatever the per-token answer), or when the delivery's lease runs out by
// the local estimate of the deadline (the store's reaper then retries the
// task). An ack sent to another replica is not seen here: the credit comes
// back at lease expiry. Clients should therefore ack over the connection
// they subscribed on (the Go client does). [Dispatcher.LeaseExtended] moves
// the local estimate when a lease is extended here.
//
// # Timing
//
// Each namespace loop sleeps until the namespace's next wake (the earlier of
// the first due time and the first lease deadline, measured against the
// store's clock, so the local clock's offset does not matter), which the
// store answers in the same call as the pop (storage.Deliveries.PopWake):
// one store call per wake. Wakes are timed to Config.WakePrecision (1 ms):
// signals within it of the last store call join one wake. It wakes early on
// [Dispatcher.Notify] (a local upsert), on a storage.Wakeups notice (an
// upsert on any replica), when credit comes back while due tasks wait, and
// at the latest after Config.SafetyPoll. Due-ness is decided by the store's
// Pop (Redis TIME), never by this package. An idle dispatcher blocks in
// select: no busy loop.
//
// # Leases
//
// A delivery's lease in the store is short: Config.Liveness (6 s), renewed
// by this replica every third of it for every delivery its streams hold,
// up to the ack timeout the subscriber was told. So the deliveries of a
// replica that dies (SIGKILL, a lost machine) come back within about
// Liveness, not after the whole ack timeout; and a live replica's
// deliveries stay leased for the full ack timeout. Renewal runs in a
// goroutine of its own per namespace, apart from the namespace loop, and
// retries a failed renewal every 100 ms; after store trouble, reaping waits
// until the holders could renew (renew.go), so a slow loop, a starved
// process or a store stall shorter than the ack timeout does not take
// leases from live streams.
//
// A delivery that waited in its stream's queue (a stream whose Send is
// slow) until its store lease ran out, by the store's clock as this replica
// knows it (the local clock plus the offset the last pop showed), is never
// sent: the store may have given the task to another subscriber meanwhile.
// It is handed back instead, without costing an attempt.
//
// A stream that ends, and Stop, leave what the stream was SENT leased for
// the rest of its ack timeout (the store lease is set to it): the
// subscriber may be working on it and can ack it over any stream of any
// replica, so a rolling deploy or a reconnect does not redeliver the tasks
// in progress. Deliveries popped for a stream but never sent to it are
// handed back at once (Nack, retry now, reason "no subscriber") without
// costing an attempt. Each namespace loop also reaps the namespace's
// expired leases (Store.Reap, safe on every replica at once), and, when
// Config.Namespaces is set, a slower sweep reaps every namespace this
// replica does not serve. Policies are re-read every Config.PolicyRefresh,
// and at once when a change is announced: [Dispatcher.PolicyChanged] on the
// replica that made it, which tells the others over the wake-up channel
// (storage.Wakeups).
//
// # Rate cap
//
// A namespace whose policy sets MaxDispatchRate pops through the store's
// token bucket for it (storage.PopParams.MaxRate, burst
// storage.DispatchBurst), shared by every replica. When a pop leaves due
// tasks behind with credit free, the loop waits one token's time (at
// least rateWaitMin) instead of polling.
//
// # Pause
//
// A namespace whose policy says Paused pops nothing: its loop still renews
// and reaps leases and hands back what cannot be sent, and re-reads the
// policy at every wake (an announced resume wakes it) or at the latest
// every SafetyPoll.
//
// # Push
//
// Namespaces with an HTTP push target are served by internal subscribers
// that POST what they are given (push.go).
//
// # Shutdown
//
// Stop stops the namespace loops (a pop in progress completes and is
// distributed), then leaves what the streams were sent leased and hands
// back what they were not, then ends every Serve with [ErrStopped] (the
// server answers Unavailable "reconnect"), then stops the wake-up
// subscription and the sweeper, waiting for each.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// ErrStopped is returned by Serve when the dispatcher is not running
// (before Start, or being stopped): the subscriber should reconnect,
// possibly to another replica.
var ErrStopped = errors.New("dispatcher stopped")

// Store is what the dispatcher needs from the task index.
type Store interface {
	storage.Deliveries
}

// NamespaceLister lists every namespace known to the store, so the lease
// reaper can sweep namespaces this replica has no subscriber for.
type NamespaceLister interface {
	// Namespaces returns the names of all namespaces.
	Namespaces(ctx context.Context) ([]string, error)
}

// Policies answers each namespace's policy (the tenancy registry, or
// storage.StaticPolicies).
type Policies interface {
	storage.Policies
	// Invalidate drops whatever answer for ns is cached, so the next
	// Policy reads the registry: another replica announced that ns's
	// policy changed.
	Invalidate(ns string)
}

// DefaultSafetyPoll is Config.SafetyPoll's default.
const DefaultSafetyPoll = time.Second

// DefaultWakePrecision is Config.WakePrecision's default: the store's clock
// counts milliseconds, so finer wakes would not pop anything sooner.
const DefaultWakePrecision = time.Millisecond

// Metrics receives what the dispatcher observes (package metrics implements
// it). Its methods are called on the delivery path and must not block.
type Metrics interface {
	// Delivered reports that a delivery of ns was sent to its subscriber
	// lateness after the task's due time, by the store's clock.
	Delivered(ns string, lateness time.Duration)
	// Subscribers reports that ns's Subscribe streams on this replica
	// changed by delta (+1 registered, -1 ended).
	Subscribers(ns string, delta int)
}

type noMetrics struct{}

func (noMetrics) Delivered(string, time.Duration) {}
func (noMetrics) Subscribers(string, int)         {}

// Reasons stored as a task's last error when the dispatcher gives a delivery
// back.
const (
	// ReasonStreamClosed: the subscriber's stream ended while it held the
	// delivery.
	ReasonStreamClosed = "subscriber stream closed"
	// ReasonNoSubscriber: the task was popped for a stream that ended before
	// it could be handed over; it was never sent.
	ReasonNoSubscriber = "no subscriber"
	// ReasonLeaseExpired: the lease ran out before an ack.
	ReasonLeaseExpired = "lease expired"
)

// Config configures a Dispatcher.
type Config struct {
	// Store is the task index to pop from. Required.
	Store Store
	// Wakeups delivers "earlier task at the head" notices from every replica.
	// If nil, only the safety-net poll and local upserts wake the dispatcher.
	Wakeups storage.Wakeups
	// Feed carries copies of deliveries between replicas, so Watch sees
	// the deliveries of every replica (watchfeed.go). If nil, Watch sees
	// this replica's deliveries only.
	Feed storage.DeliveryFeed
	// Policies answers each namespace's policy. If nil, storage.DefaultPolicy.
	Policies Policies
	// Namespaces, if set, lets the reaper sweep every namespace every
	// SweepInterval, including those this replica has no subscriber for. If
	// nil, only namespaces with a local subscriber are reaped (by their
	// loops), which is enough for delivery: a namespace without subscribers
	// delivers nothing anyway, and its loop reaps at once when one connects.
	Namespaces NamespaceLister
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// Metrics receives delivery lateness and subscriber counts. If nil,
	// nothing is reported.
	Metrics Metrics
	// Clock reads local time. If nil, the system clock.
	Clock storage.Clock
	// signals are the tests' hooks (signals.go); unset in production.
	signals signals
	// SafetyPoll is the slow poll that catches a missed wake-up. If unset or
	// zero, 1 second is used.
	SafetyPoll time.Duration
	// WakePrecision is how finely the namespace loops time their wakes:
	// a planned wake is rounded up to a multiple of it (tasks due within
	// one step are popped by one store call), and wake signals (upserts of
	// an earlier task on any replica, credit coming back) that arrive
	// within it of the loop's last store call are joined into one wake
	// that far after it. A task is never popped before it is due; it may
	// be popped up to WakePrecision later than it would be otherwise. If
	// zero, DefaultWakePrecision (1 ms); negative: no rounding or joining.
	WakePrecision time.Duration
	// PopBatch is the most tasks one Pop call moves. Each Pop is one Lua
	// script that blocks Redis while it runs (tens of microseconds per task),
	// so the batch is kept small enough that a burst of due tasks never holds
	// Redis for long. If unset or zero, 128.
	PopBatch int
	// PopConcurrency is the most Pop calls one namespace has in flight at
	// once; a namespace issues more than one only when its streams' free
	// credit exceeds PopBatch and its last pop came back full (a backlog;
	// each call pops at most PopBatch, and their limits add up to no more
	// than the free credit). Pops are atomic
	// scripts, so concurrent ones never return the same task; running them
	// together overlaps their round trips, which is what bounds the drain of
	// a backlog. If unset or zero, 4; 1 pops one batch at a time.
	PopConcurrency int
	// ReapBatch is the most expired leases one Reap call takes back. If unset
	// or zero, 128.
	ReapBatch int
	// PolicyRefresh is how often a namespace's policy is re-read, so policy
	// changes apply without a restart. If unset or zero, 10 seconds.
	PolicyRefresh time.Duration
	// SweepInterval is how often every namespace is reaped when Namespaces
	// is set. If unset or zero, 30 seconds.
	SweepInterval time.Duration
	// StoreTimeout bounds each store call. If unset or zero, 5 seconds.
	StoreTimeout time.Duration
	// LateWarn is the lateness (send time minus due time, by the store's
	// clock) above which a delivery counts as late: late deliveries are
	// logged at WARN, at most once per namespace every 10 seconds, with how
	// many there were and the worst, so a stall is never silent. If zero,
	// DefaultLateWarn; negative: never logged (the lateness histogram still
	// counts every delivery).
	LateWarn time.Duration
	// Pusher, if set, POSTs the due tasks of namespaces whose policy has a
	// push target (push.go). If nil, push is disabled: such namespaces'
	// tasks wait.
	Pusher Pusher
	// PushConcurrency is the most push requests one namespace has in
	// flight on this replica (its pusher's max_in_flight). If zero,
	// DefaultPushConcurrency.
	PushConcurrency int
	// PushMetrics receives every push request's outcome. If nil, nothing
	// is reported.
	PushMetrics PushMetrics
	// Liveness is how long a delivery stays leased in the store unless this
	// replica renews it; the replica renews every Liveness/3, up to the
	// namespace's ack timeout. A replica that stops (crash, hang) has its
	// deliveries taken back after about Liveness instead of the whole ack
	// timeout. A renewal may come up to two thirds of Liveness late before
	// the lease runs out (the margin for a loaded machine); after a store
	// call failed or took a sixth of Liveness, reaping waits Liveness/2 so
	// renewals get in first. Keep it well above the worst pause of the
	// process. If zero, 6 seconds; negative: no renewal, the store lease is
	// the ack timeout.
	Liveness time.Duration
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Clock == nil {
		c.Clock = storage.SystemClock{}
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.SafetyPoll <= 0 {
		c.SafetyPoll = DefaultSafetyPoll
	}
	if c.WakePrecision == 0 {
		c.WakePrecision = DefaultWakePrecision
	}
	if c.PopBatch <= 0 {
		c.PopBatch = 128
	}
	if c.PopConcurrency <= 0 {
		c.PopConcurrency = 4
	}
	if c.ReapBatch <= 0 {
		c.ReapBatch = 128
	}
	if c.PolicyRefresh <= 0 {
		c.PolicyRefresh = 10 * time.Second
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 30 * time.Second
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 5 * time.Second
	}
	if c.Liveness == 0 {
		c.Liveness = 6 * time.Second
	}
	if c.LateWarn == 0 {
		c.LateWarn = DefaultLateWarn
	}
	if c.PushConcurrency <= 0 {
		c.PushConcurrency = DefaultPushConcurrency
	}
	if c.PushMetrics == nil {
		c.PushMetrics = noPushMetrics{}
	}
}

// DefaultLateWarn is Config.LateWarn's default: a task delivered a second or
// more after its due time is worth an operator's attention.
const DefaultLateWarn = time.Second

// Dispatcher pushes due tasks to subscribers. Start it once, Stop it once.
// Its methods are safe for concurrent use.
type Dispatcher struct {
	cfg Config
	log *slog.Logger

	// base is the context of store calls: never canceled by Stop, so a call
	// in progress completes (each call has its own StoreTimeout).
	base context.Context
	// cancel ends the wake-up subscription and the sweeper.
	cancel context.CancelFunc

	mu       sync.Mutex
	state    int // stateNew, stateRunning, stateStopped
	nss      map[string]*namespace
	loops    sync.WaitGroup // namespace loops
	bg       sync.WaitGroup // wake-up subscription and sweeper
	serving  sync.WaitGroup // Serve and Watch calls
	streamID uint64
	// stopped is closed by Stop: every Watch returns ErrStopped.
	stopped chan struct{}
	watch   watchers
	// feed publishes delivery copies when Config.Feed is set; else nil.
	feed *feedPublisher
	// push runs the pushers when Config.Pusher is set; else nil.
	push *pushManager
	// health tells reaping to wait after store trouble (renew.go).
	health *health
}

const (
	stateNew = iota
	stateRunning
	stateStopped
)

// New returns a Dispatcher; it does nothing until Start.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Store == nil {
		return nil, errors.New("dispatcher: Config.Store is required")
	}
	cfg.setDefaults()
	d := &Dispatcher{cfg: cfg, log: cfg.Logger, nss: make(map[string]*namespace), stopped: make(chan struct{})}
	// The store answers again: every loop tries now (wakeAll only pokes).
	d.health = newHealth(cfg.Liveness, func() { d.wakeAll("") })
	d.cfg.Store = observedStore{Store: cfg.Store, h: d.health}
	if cfg.Feed != nil {
		d.feed = newFeedPublisher(cfg.Feed, cfg.Clock, cfg.StoreTimeout)
	}
	if cfg.Pusher != nil {
		d.push = newPushManager(d)
	}
	return d, nil
}

// Start begins the dispatcher's background work (the wake-up subscription
// and the sweeper); it returns at once. Namespace loops start with their
// first subscriber. ctx's values are kept for store calls; its cancellation
// does not stop the dispatcher: Stop does.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != stateNew {
		return errors.New("dispatcher: Start called twice")
	}
	d.state = stateRunning
	d.base = context.WithoutCancel(ctx)
	bgCtx, cancel := context.WithCancel(d.base)
	d.cancel = cancel
	if d.cfg.Wakeups != nil {
		d.bg.Add(1)
		go d.runWakeups(bgCtx)
	}
	if d.cfg.Namespaces != nil {
		d.bg.Add(1)
		go d.runSweeper(bgCtx)
	}
	if d.feed != nil {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			d.feed.run(bgCtx, d.log)
		}()
	}
	if d.push != nil {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			d.push.run(bgCtx)
		}()
	}
	return nil
}

// Stop stops popping, hands back what streams still hold, ends the streams
// (their Serve returns ErrStopped) and waits for every goroutine, or until
// ctx is done (then it returns ctx's error; handing back uses ctx too).
func (d *Dispatcher) Stop(ctx context.Context) error {
	d.mu.Lock()
	if d.state != stateRunning {
		d.state = stateStopped
		d.mu.Unlock()
		return nil
	}
	d.state = stateStopped
	close(d.stopped)
	nss := make([]*namespace, 0, len(d.nss))
	for _, n := range d.nss {
		nss = append(nss, n)
		close(n.quit)
	}
	d.nss = make(map[string]*namespace)
	d.mu.Unlock()

	// 1. Stop popping: wait for the namespace loops, so every delivery they
	// popped sits in a stream before it is handed back.
	if err := waitCtx(ctx, &d.loops); err != nil {
		return fmt.Errorf("dispatcher stop: waiting for namespace loops: %w", err)
	}
	// 2. Leave what the streams were sent leased, hand back the rest, end
	// the streams.
	for _, n := range nss {
		sent, unsent := n.closeAll()
		d.handBack(ctx, n, sent, unsent)
	}
	// 3. Wait for the Serve calls (the streams' senders) to return.
	errServe := waitCtx(ctx, &d.serving)
	// 4. Let push requests in flight finish (for half of what is left of
	// ctx), then stop the wake-up subscription, the sweeper and the
	// pushers (requests still in flight are canceled and handed back).
	if d.push != nil {
		d.push.drain(ctx)
	}
	d.cancel()
	errBg := waitCtx(ctx, &d.bg)
	if errServe != nil {
		return fmt.Errorf("dispatcher stop: waiting for streams: %w", errServe)
	}
	if errBg != nil {
		return fmt.Errorf("dispatcher stop: waiting for background work: %w", errBg)
	}
	return nil
}

func waitCtx(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Notify tells the dispatcher that an upsert on this replica made a task
// the earliest of ns, so it re-plans its sleep at once. It never blocks and
// does nothing when this replica has no subscriber for ns.
func (d *Dispatcher) Notify(ns string) {
	d.mu.Lock()
	n := d.nss[ns]
	d.mu.Unlock()
	if n != nil {
		n.poke(n.wake)
	} else if d.push != nil {
		d.push.hint(ns, false) // a namespace with a push target starts its pusher
	}
}

// Subscriber is one stream to serve.
type Subscriber struct {
	// Namespace to deliver due tasks of; already validated.
	Namespace string
	// MaxInFlight is the most unacked deliveries the stream holds. Values
	// below 1 are taken as 1.
	MaxInFlight int
	// Kinds, if not empty, are the only task kinds the stream receives
	// (storage.PopParams.Kinds): the namespace loop pops for the free
	// credit of the streams with the same kinds and hands the tasks to
	// them only. Tasks whose kind no stream wants stay scheduled.
	Kinds []string
	// Send pushes one delivery to the subscriber. Serve calls it from its own
	// goroutine only, one call at a time. An error ends Serve. Unused when
	// SendBatch is set.
	Send func(storage.Delivery) error
	// SendBatch, if set, pushes several deliveries in one message (a
	// StreamDeliveries response): Serve hands it what the stream's queue
	// holds, up to MaxBatch deliveries and about MaxBatchBytes
	// (storage.TaskWireSize each; a larger delivery goes alone), from its
	// own goroutine only, one call at a time. An error ends Serve.
	SendBatch func([]storage.Delivery) error
	// MaxBatch is the most deliveries per SendBatch call; below 1, 1.
	MaxBatch int
	// MaxBatchBytes bounds the deliveries of one SendBatch call; 0 or
	// less: no bound but MaxBatch.
	MaxBatchBytes int
	// Credit, if set, carries new max_in_flight values for the stream
	// while it is served (values below 1 are taken as 1): more credit lets
	// the namespace pop for it at once; less stops new deliveries until it
	// holds fewer than the new value.
	Credit <-chan int
	// Ready, if set, is called once the stream is registered and before any
	// Send (the server sends the stream's headers there, so a client knows
	// it is subscribed). An error ends Serve.
	Ready func() error
	// internal marks a pusher (push.go): not counted as a subscriber.
	internal bool
}

// Serve registers sub and sends it deliveries until ctx is done (the stream
// ended), Send fails, or the dispatcher stops. It runs in the caller's
// goroutine, which is the stream's only sender. When it returns, whatever
// the stream still held has been handed back (Nack, retry at once). It
// returns ErrStopped when the dispatcher is not running or stops, ctx's
// error when ctx ends, or Send's or Ready's error.
func (d *Dispatcher) Serve(ctx context.Context, sub Subscriber) error {
	if sub.MaxInFlight < 1 {
		sub.MaxInFlight = 1
	}
	d.mu.Lock()
	if d.state != stateRunning {
		d.mu.Unlock()
		return ErrStopped
	}
	n := d.nss[sub.Namespace]
	if n == nil {
		n = newNamespace(d, sub.Namespace)
		d.nss[sub.Namespace] = n
		d.loops.Add(1)
		go n.run()
	}
	d.streamID++
	st := newStream(d.streamID, sub.MaxInFlight, sub.Kinds)
	n.add(st)
	d.serving.Add(1)
	d.mu.Unlock()
	defer d.serving.Done()
	if !sub.internal {
		d.cfg.Metrics.Subscribers(sub.Namespace, 1)
		defer d.cfg.Metrics.Subscribers(sub.Namespace, -1)
	}

	err := d.sendLoop(ctx, n, st, sub)
	if errors.Is(err, ErrStopped) {
		return err // Stop handed back what the stream held.
	}
	d.release(n, st)
	return err
}

func (d *Dispatcher) sendLoop(ctx context.Context, n *namespace, st *stream, sub Subscriber) error {
	if sub.Ready != nil {
		if err := sub.Ready(); err != nil {
			return err
		}
	}
	n.poke(n.credit) // New credit: pop for it.
	if sub.SendBatch != nil {
		return d.sendBatches(ctx, n, st, sub)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-st.done:
			return ErrStopped
		case <-st.ready:
			for {
				del, lateness, ok, expired := n.next(st)
				if len(expired) > 0 {
					d.handBackExpired(n, expired)
				}
				if !ok {
					break
				}
				if err := sub.Send(del); err != nil {
					// Not sent after all: it goes back without costing an
					// attempt (unless Stop already let go of it as sent).
					n.unmarkSent(st, del.Token)
					return err
				}
				d.sent(n, del, lateness)
			}
		}
	}
}

// sent records a delivery its subscriber was sent: watchers' copies,
// lateness metric, late-delivery log.
func (d *Dispatcher) sent(n *namespace, del storage.Delivery, lateness time.Duration) {
	if d.feed != nil {
		d.feed.offer(n.name, del, d.cfg.Clock.Now())
	} else {
		d.watch.observe(n.name, del, d.cfg.Clock.Now())
	}
	d.cfg.Metrics.Delivered(n.name, lateness)
	if d.cfg.LateWarn > 0 && lateness >= d.cfg.LateWarn {
		n.late(lateness)
	}
}

// sendBatches is sendLoop for a subscriber with SendBatch: each wake sends
// what the stream's queue holds in messages of at most MaxBatch deliveries
// and about MaxBatchBytes, and Credit changes the stream's max_in_flight.
func (d *Dispatcher) sendBatches(ctx context.Context, n *namespace, st *stream, sub Subscriber) error {
	maxBatch := max(sub.MaxBatch, 1)
	batch := make([]storage.Delivery, 0, min(maxBatch, st.max))
	lates := make([]time.Duration, 0, cap(batch))
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-st.done:
			return ErrStopped
		case m := <-sub.Credit:
			if n.setMax(st, max(m, 1)) {
				n.poke(n.credit)
			}
			continue
		case <-st.ready:
		}
		for {
			batch, lates = batch[:0], lates[:0]
			size := 0
			for len(batch) < maxBatch {
				if sub.MaxBatchBytes > 0 && len(batch) > 0 && size >= sub.MaxBatchBytes {
					break
				}
				del, lateness, ok, expired := n.next(st)
				if len(expired) > 0 {
					d.handBackExpired(n, expired)
				}
				if !ok {
					break
				}
				size += storage.TaskWireSize(del.Task)
				batch = append(batch, del)
				lates = append(lates, lateness)
				if sub.MaxBatchBytes > 0 && size > sub.MaxBatchBytes && len(batch) > 1 {
					// Over the bound: this one goes first in the next
					// message instead.
					batch = batch[:len(batch)-1]
					lates = lates[:len(lates)-1]
					n.requeueFront(st, del)
					break
				}
			}
			if len(batch) == 0 {
				break
			}
			if err := sub.SendBatch(batch); err != nil {
				// Not sent after all: they go back without costing an
				// attempt (unless Stop already let go of them as sent).
				for _, del := range batch {
					n.unmarkSent(st, del.Token)
				}
				return err
			}
			for i, del := range batch {
				d.sent(n, del, lates[i])
			}
		}
	}
}

// release unregisters a stream whose Serve ended and hands back what it
// held; the namespace loop stops with its last stream. Then the hand-back
// waits for the loop to end (a store call in progress completes, bounded by
// StoreTimeout), so a pop the dying loop started cannot take the handed-back
// tasks only to hand them back again.
func (d *Dispatcher) release(n *namespace, st *stream) {
	d.mu.Lock()
	sent, unsent, empty := n.remove(st)
	last := empty && d.nss[n.name] == n
	if last {
		delete(d.nss, n.name)
		close(n.quit)
	}
	d.mu.Unlock()
	if last {
		<-n.exited
	}
	if len(sent)+len(unsent) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(d.base, d.cfg.StoreTimeout)
	defer cancel()
	d.handBack(ctx, n, sent, unsent)
}

// handBack lets go of deliveries a stream held. Sent ones stay leased until
// the ack timeout the subscriber was told (their store lease, kept short by
// renewals, is set to it), so their acks work on any replica; unsent ones
// go back for an immediate retry without costing an attempt.
func (d *Dispatcher) handBack(ctx context.Context, n *namespace, sent []heldLease, unsent []storage.Token) {
	if d.cfg.Liveness > 0 && len(sent) > 0 {
		_, _ = d.renew(ctx, n, sent, true) // logged; on failure the short lease runs out
	}
	if len(unsent) > 0 {
		zero := time.Duration(0)
		pol := n.policy(ctx)
		d.nack(ctx, n.name, unsent, storage.NackOptions{RetryAfter: &zero, Reason: ReasonNoSubscriber,
			MaxAttempts: math.MaxInt32, Backoff: pol.Backoff, Unsent: true})
		// Another local stream may take them at once.
		n.poke(n.wake)
	}
}

// handBackExpired hands back, from a stream's sender, deliveries whose
// lease ran out before they could be sent (see namespace.next).
func (d *Dispatcher) handBackExpired(n *namespace, expired []storage.Token) {
	d.log.LogAttrs(context.Background(), slog.LevelWarn, "dispatcher: deliveries waited for their stream until their lease ran out; handing them back unsent",
		slog.String("namespace", n.name), slog.Int("deliveries", len(expired)))
	ctx, cancel := context.WithTimeout(d.base, d.cfg.StoreTimeout)
	defer cancel()
	d.handBack(ctx, n, nil, expired)
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

func (d *Dispatcher) nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) {
	for start := 0; start < len(tokens); start += d.cfg.PopBatch {
		end := min(start+d.cfg.PopBatch, len(tokens))
		if _, _, err := d.cfg.Store.Nack(ctx, ns, tokens[start:end], opts); err != nil {
			// The leases run out and the reaper retries the tasks.
			d.log.LogAttrs(ctx, slog.LevelWarn, "dispatcher: handing back deliveries failed; they are retried when their leases run out",
				slog.String("namespace", ns), slog.Int("deliveries", end-start), slog.String("error", err.Error()))
		}
	}
}

// Settle frees the credit of deliveries of ns that an ack or nack on this
// replica answered (whatever the per-token status), and lets the namespace
// pop for it. Of the tokens no local stream holds, those the store settled
// (settled[i] true; nil: none) are announced to every replica over the
// wake-up channel (storage.Wakeups.PublishSettled), so the replica whose
// stream holds them frees their credit now instead of when their leases
// end. Announcing blocks for at most StoreTimeout; a failure is logged
// (the credit then comes back at lease end).
func (d *Dispatcher) Settle(ctx context.Context, ns string, tokens []storage.Token, settled []bool) {
	d.mu.Lock()
	n := d.nss[ns]
	d.mu.Unlock()
	var elsewhere []storage.Token
	if n != nil {
		held := n.settle(tokens)
		if len(held) > 0 {
			n.poke(n.credit)
		}
		for i, tok := range tokens {
			if i < len(settled) && settled[i] && !held[tok] {
				elsewhere = append(elsewhere, tok)
			}
		}
	} else {
		for i, tok := range tokens {
			if i < len(settled) && settled[i] {
				elsewhere = append(elsewhere, tok)
			}
		}
	}
	if len(elsewhere) == 0 || d.cfg.Wakeups == nil {
		return
	}
	// The deliveries are settled whether or not the caller waits on.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StoreTimeout)
	defer cancel()
	if err := d.cfg.Wakeups.PublishSettled(ctx, ns, elsewhere); err != nil {
		d.log.LogAttrs(ctx, slog.LevelDebug, "dispatcher: announcing settled deliveries to the other replicas failed; their streams get the credit back when the leases end",
			slog.String("namespace", ns), slog.Int("deliveries", len(elsewhere)), slog.String("error", err.Error()))
	}
}

// settledElsewhere frees the credit of deliveries another replica settled
// (a Settled wake-up) that a stream of this replica holds.
func (d *Dispatcher) settledElsewhere(ns string, tokens []storage.Token) {
	d.mu.Lock()
	n := d.nss[ns]
	d.mu.Unlock()
	if n != nil && len(n.settle(tokens)) > 0 {
		n.poke(n.credit)
	}
}

// LeaseExtended moves the local lease estimate of deliveries of ns whose
// lease ExtendLease on this replica set to store-now + by, so their credit
// is not freed before the new deadline.
func (d *Dispatcher) LeaseExtended(ns string, tokens []storage.Token, by time.Duration) {
	d.mu.Lock()
	n := d.nss[ns]
	d.mu.Unlock()
	if n != nil {
		n.extend(tokens, d.cfg.Clock.Now().Add(by))
	}
}

// Subscribers returns the number of streams of ns this replica serves.
func (d *Dispatcher) Subscribers(ns string) int {
	d.mu.Lock()
	n := d.nss[ns]
	d.mu.Unlock()
	if n == nil {
		return 0
	}
	return n.streamCount()
}

func (d *Dispatcher) runWakeups(ctx context.Context) {
	defer d.bg.Done()
	backoff := 50 * time.Millisecond
	for {
		start := time.Now()
		// Each time the subscription is made, look again at every
		// namespace: a wake-up published before it was lost.
		err := d.cfg.Wakeups.SubscribeWakeups(ctx, func() { d.wakeAll("") }, d.wakeup)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
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

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
