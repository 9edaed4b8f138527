package dispatcher

import (
	"context"
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
//     copy of it for FeedRecheck (1 s) and then tries once more. So a
//     namespace nobody watches costs at most one PUBLISH per second per
//     replica that delivers in it. A new watcher sees its own replica's
//     deliveries from the moment it is ready (Watch clears that replica's
//     mark) and the other replicas' at the latest FeedRecheck after that;
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
	// quiet maps a namespace to the time (UnixNano) before which no copy of
	// it is published, because nobody watched it at the last PUBLISH.
	quiet sync.Map // string -> int64
	// dropped maps a namespace to the copies dropped since its last
	// published one.
	dropped sync.Map // string -> *atomic.Int64
}

func newFeedPublisher(feed storage.DeliveryFeed, clock storage.Clock, timeout time.Duration) *feedPublisher {
	return &feedPublisher{feed: feed, clock: clock, timeout: timeout, q: make(chan storage.WatchCopy, feedQueue)}
}

// watched reports whether copies of ns are published now.
func (p *feedPublisher) watched(ns string, now time.Time) bool {
	until, ok := p.quiet.Load(ns)
	return !ok || now.UnixNano() >= until.(int64)
}

// offer queues a copy of del, never blocking.
func (p *feedPublisher) offer(ns string, del storage.Delivery, at time.Time) {
	if !p.watched(ns, at) {
		return
	}
	select {
	case p.q <- storage.WatchCopy{Task: del.Task, LeaseDeadline: del.LeaseDeadline, SentAt: at}:
	default:
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
			continue
		}
		now := p.clock.Now()
		for i, n := range got {
			ns := batch[i].Task.Namespace
			if n == 0 {
				p.quiet.Store(ns, now.Add(FeedRecheck).UnixNano())
			} else {
				p.quiet.Delete(ns)
			}
		}
	}
}

// watchFeed is Watch with Config.Feed: the watcher's copies come from the
// namespace's feed channel, which carries every replica's deliveries.
func (d *Dispatcher) watchFeed(ctx context.Context, w Watcher, stopped <-chan struct{}) error {
	ctx, cancel := context.WithCancel(ctx)
	wt := &watcher{ch: make(chan Watched, w.Buffer)}
	ready := make(chan struct{})
	subErr := make(chan error, 1)
	go func() {
		subErr <- d.cfg.Feed.SubscribeWatchCopies(ctx, w.Namespace,
			func() error { close(ready); return nil },
			func(c storage.WatchCopy) error {
				if c.Dropped > 0 {
					wt.missed.Add(c.Dropped)
				}
				select { // never block the subscription: a slow watcher misses copies
				case wt.ch <- Watched{Delivery: storage.Delivery{Task: c.Task, LeaseDeadline: c.LeaseDeadline}, SentAt: c.SentAt}:
				default:
					wt.missed.Add(1)
				}
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
	// This replica publishes its next copy of the namespace whatever PUBLISH
	// said before, so a watcher misses none of its own replica's deliveries
	// made after Ready.
	d.feed.quiet.Delete(w.Namespace)
	if w.Ready != nil {
		if err := w.Ready(); err != nil {
			return err
		}
	}
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
			c.Missed = wt.missed.Swap(0)
			if err := w.Send(c); err != nil {
				return err
			}
		}
	}
}
