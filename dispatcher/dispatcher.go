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
	"sync"
	"sync/atomic"
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

// DefaultAckRide is Config.AckRide's default: a steady flow of a few hundred
// tasks a second per namespace wakes its loop every few milliseconds, and
// its acks ride those wakes' pops.
const DefaultAckRide = 3 * time.Millisecond

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
	// AckRide is how far ahead a namespace loop tells the store of its next
	// pop (Store.ExpectPop): while the loop sleeps at most AckRide before a
	// round that pops (credit is free, the namespace is not paused), the
	// acks and nacks of the namespace that arrive wait for that pop and are
	// settled in its store call instead of one of their own, so a wake of
	// a steady flow is one store call for its acks and its pop. An ack
	// waits at most AckRide plus WakePrecision; one that arrives with no
	// pop that close is settled at once. If zero, DefaultAckRide (3 ms);
	// negative: never told (acks are settled on their own).
	AckRide time.Duration
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
	if c.AckRide == 0 {
		c.AckRide = DefaultAckRide
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
	// reqPrefix and reqSeq make the request ids of pops (askagain.go).
	reqPrefix string
	reqSeq    atomic.Uint64
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
	d := &Dispatcher{cfg: cfg, log: cfg.Logger, nss: make(map[string]*namespace), stopped: make(chan struct{}), reqPrefix: newReqPrefix()}
	// The store answers again: every loop tries now (wakeAll only pokes).
	d.health = newHealth(cfg.Liveness, func() { d.wakeAll("") })
	d.cfg.Store = observedStore{Store: cfg.Store, h: d.health, clock: cfg.Clock}
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
