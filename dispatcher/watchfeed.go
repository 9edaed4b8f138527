package dispatcher

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
)

// The watch feed makes WatchDeliveries see the deliveries of every replica,
// not only of the one the watcher is connected to. With Config.Feed set:
//
//   - each delivery's copy goes, after its subscriber's Send returned, into
//     a bounded queue (never blocking the stream's sender; a full queue
//     drops the copy and counts it), and one publisher goroutine publishes
//     the queue in batches on the namespace's feed channel;
//   - only while someone watches: PUBLISH answers how many subscriptions got
//     a copy; when the answer for a namespace is 0, the replica publishes no
//     copy of it for FeedRecheck (1 s), then probes with one copy (copies
//     made while the probe is out are not published) and goes on as its
//     answer says. So a namespace nobody watches costs one PUBLISH per
//     second per replica that delivers in it, after the first batch.
//     A new watcher sees its own replica's deliveries from the moment it is
//     ready (a replica with watchers of its own publishes every copy of
//     their namespace) and the other replicas' at the latest FeedRecheck
//     and a probe's round trip after that;
//   - a watcher (Watch) subscribes to the namespace's channel and gets every
//     replica's copies from it, its own replica's included, so none twice.

// FeedRecheck is how long a replica publishes no copies of a namespace after
// PUBLISH told it nobody watches that namespace.
const FeedRecheck = time.Second

// feedQueue bounds the copies waiting for the publisher.
const feedQueue = 1024

// feedBatch bounds the copies published in one pipeline.
const feedBatch = 256

// feedPublisher queues and publishes copies. offer is called by stream
// senders; run is the one publisher goroutine.
type feedPublisher struct {
	feed    storage.DeliveryFeed
	clock   storage.Clock
	timeout time.Duration
	q       chan storage.WatchCopy
	// quiet maps a namespace to its state: absent (no answer yet) or
	// watchedNow: publish every copy; a time (UnixNano): publish nothing
	// before it, because nobody watched at the last PUBLISH; probing: one
	// copy is on its way to find out, publish nothing until its answer.
	quiet sync.Map // string -> int64
	// dropped maps a namespace to the copies dropped since its last
	// published one.
	dropped sync.Map // string -> *atomic.Int64
	// local counts this replica's watchers per namespace.
	local sync.Map // string -> *atomic.Int64
}

func newFeedPublisher(feed storage.DeliveryFeed, clock storage.Clock, timeout time.Duration) *feedPublisher {
	return &feedPublisher{feed: feed, clock: clock, timeout: timeout, q: make(chan storage.WatchCopy, feedQueue)}
}

// States of a namespace in feedPublisher.quiet besides a time.
const (
	watchedNow = int64(0)
	probing    = int64(math.MaxInt64)
)

// watched reports whether every copy of ns is published now (a probe due
// is not: offer starts it).
func (p *feedPublisher) watched(ns string) bool {
	if p.localWatchers(ns) > 0 {
		return true
	}
	until, ok := p.quiet.Load(ns)
	return !ok || until.(int64) == watchedNow
}

// localWatchers counts the watchers of ns on this replica.
func (p *feedPublisher) localWatchers(ns string) int64 {
	if c, ok := p.local.Load(ns); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// addLocal adds n to the watchers of ns on this replica: while there are
// any, every copy of ns is published, whatever an earlier PUBLISH said.
func (p *feedPublisher) addLocal(ns string, n int64) {
	c, _ := p.local.LoadOrStore(ns, new(atomic.Int64))
	c.(*atomic.Int64).Add(n)
}

// offer queues a copy of del, never blocking.
func (p *feedPublisher) offer(ns string, del storage.Delivery, at time.Time) {
	probe := false
	if v, ok := p.quiet.Load(ns); ok && v.(int64) != watchedNow && p.localWatchers(ns) == 0 {
		until := v.(int64)
		if at.UnixNano() < until || !p.quiet.CompareAndSwap(ns, until, probing) {
			return // quiet, or another sender's copy is the probe
		}
		probe = true
	}
	select {
	case p.q <- storage.WatchCopy{Task: del.Task, LeaseDeadline: del.LeaseDeadline, SentAt: at}:
	default:
		if probe {
			p.quiet.CompareAndSwap(ns, probing, watchedNow-1) // due again at once
		}
		c, _ := p.dropped.LoadOrStore(ns, new(atomic.Int64))
		c.(*atomic.Int64).Add(1)
	}
}

// run publishes queued copies until ctx ends.
func (p *feedPublisher) run(ctx context.Context, log interface {
	Debug(msg string, args ...any)
}) {
	batch := make([]storage.WatchCopy, 0, feedBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case c := <-p.q:
			batch = append(batch, c)
		}
	fill:
		for len(batch) < feedBatch {
			select {
			case c := <-p.q:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		for i := range batch {
			if c, ok := p.dropped.Load(batch[i].Task.Namespace); ok {
				batch[i].Dropped = c.(*atomic.Int64).Swap(0)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, p.timeout)
		got, err := p.feed.PublishWatchCopies(cctx, batch)
		cancel()
		if err != nil {
			log.Debug("watch feed: publishing delivery copies failed; they are lost (deliveries are not)", "copies", len(batch), "err", err)
			for _, c := range batch {
				p.quiet.Delete(c.Task.Namespace) // no answer: the next copies find out
			}
			continue
		}
		now := p.clock.Now()
		for i, n := range got {
			ns := batch[i].Task.Namespace
			if n == 0 {
				p.quiet.Store(ns, now.Add(FeedRecheck).UnixNano())
			} else {
				p.quiet.Store(ns, watchedNow)
			}
		}
	}
}

// watchFeed is Watch with Config.Feed: the watcher's copies come from the
// namespace's feed channel, which carries every replica's deliveries.
func (d *Dispatcher) watchFeed(ctx context.Context, w Watcher, stopped <-chan struct{}) error {
	ctx, cancel := context.WithCancel(ctx)
	wt := newWatcher(w)
	ready := make(chan struct{})
	subErr := make(chan error, 1)
	go func() {
		subErr <- d.cfg.Feed.SubscribeWatchCopies(ctx, w.Namespace,
			func() error { close(ready); return nil },
			func(c storage.WatchCopy) error {
				if c.Dropped > 0 {
					wt.missed.Add(c.Dropped)
				}
				// Never block the subscription: a slow watcher misses copies.
				wt.offer(Watched{Delivery: storage.Delivery{Task: c.Task, LeaseDeadline: c.LeaseDeadline}, SentAt: c.SentAt})
				return nil
			})
	}()
	// The subscription goroutine ends before Watch returns.
	defer func() { cancel(); <-subErr }()
	select {
	case <-ready:
	case err := <-subErr:
		subErr <- err // for the deferred receive
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-stopped:
		return ErrStopped
	}
	// While this watcher is here, this replica publishes every copy of the
	// namespace whatever PUBLISH said, so it misses none of its own
	// replica's deliveries made after Ready.
	d.feed.addLocal(w.Namespace, 1)
	defer d.feed.addLocal(w.Namespace, -1)
	if w.Ready != nil {
		if err := w.Ready(); err != nil {
			return err
		}
	}
	out := startSender(w, wt)
	defer out.close()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopped:
			return ErrStopped
		case err := <-subErr:
			subErr <- err
			return err
		case c := <-wt.ch:
			if err := out.send(ctx, stopped, wt.next(c)); err != nil {
				return err
			}
		}
	}
}
