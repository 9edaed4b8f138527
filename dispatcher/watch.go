package dispatcher

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
)

// Watched is a copy of one delivery, as a watcher sees it.
type Watched struct {
	// Delivery is the delivery as it was sent to its subscriber.
	Delivery storage.Delivery
	// SentAt is when the subscriber's Send returned (the local clock).
	SentAt time.Time
	// Missed counts copies this watcher missed, because it read too slowly,
	// since the previous Watched it got.
	Missed int64
}

// Watcher is one observer of a namespace's deliveries.
type Watcher struct {
	// Namespace to watch; already validated.
	Namespace string
	// Buffer is how many copies may wait for Send before further ones are
	// missed. Values below 1 are taken as 256.
	Buffer int
	// BufferBytes bounds the payload bytes of the copies waiting for Send:
	// a copy that would go past it is missed (one copy always fits, so a
	// payload larger than the bound is still seen by a watcher that keeps
	// up). Values below 1 are taken as DefaultWatchBufferBytes.
	BufferBytes int
	// Send pushes one copy to the watcher, one call at a time, from a
	// goroutine of the watch's own (so a Send stuck on a reader that stopped
	// reading can be given up on). It must return once Watch's ctx ends (a
	// gRPC stream's Send does when its handler returns). An error ends
	// Watch.
	Send func(Watched) error
	// Stall is how long one Send may take: a watcher whose Send has not
	// returned by then has stopped reading (its transport holds what it was
	// sent), and Watch ends with ErrWatchBehind instead of holding its
	// copies. If zero, DefaultWatchStall.
	Stall time.Duration
	// Ready, if set, is called once the watcher is registered and before any
	// Send. An error ends Watch.
	Ready func() error
}

// DefaultWatchBufferBytes is Watcher.BufferBytes's default: 256 KiB of
// payloads may wait for a watcher that reads slowly, the copy being sent
// included.
const DefaultWatchBufferBytes = 256 << 10

// DefaultWatchStall is Watcher.Stall's default.
const DefaultWatchStall = 10 * time.Second

// ErrWatchBehind ends a watch whose Send did not return within
// Watcher.Stall: its reader stopped reading.
var ErrWatchBehind = errors.New("the watcher stopped reading: a copy could not be sent")

// watchCopyOverhead is what a waiting copy costs besides its payload (the
// task's id, kind and fields), counted against Watcher.BufferBytes.
const watchCopyOverhead = 256

// watcher is a registered Watcher. ch and missed are written by offer
// (any stream's sender, or the feed's subscription) and read by the
// watcher's own Watch goroutine.
type watcher struct {
	ch       chan Watched
	missed   atomic.Int64
	bytes    atomic.Int64 // cost of the copies in ch
	maxBytes int64
}

func newWatcher(w Watcher) *watcher {
	return &watcher{ch: make(chan Watched, w.Buffer), maxBytes: int64(w.BufferBytes)}
}

// copyCost is what c costs against Watcher.BufferBytes.
func copyCost(c Watched) int64 {
	return int64(len(c.Delivery.Task.Payload) + watchCopyOverhead)
}

// offer queues c without blocking; a full watcher (by count or by bytes)
// misses it and counts it.
func (w *watcher) offer(c Watched) {
	cost := copyCost(c)
	if n := w.bytes.Add(cost); n > w.maxBytes && n != cost {
		w.bytes.Add(-cost)
		w.missed.Add(1)
		return
	}
	select {
	case w.ch <- c:
	default:
		w.bytes.Add(-cost)
		w.missed.Add(1)
	}
}

// next is the copy to send after c was taken from ch. It counts against
// the watcher's bytes until its Send returned (sender).
func (w *watcher) next(c Watched) Watched {
	c.Missed = w.missed.Swap(0)
	return c
}

// sent gives back what c counted against the watcher's bytes, once its
// Send returned: until then it is the transport's, and still the watch's.
func (w *watcher) sent(c Watched) { w.bytes.Add(-copyCost(c)) }

// sender runs a watcher's Sends on a goroutine of its own, so that the
// watch can give up on one that does not return (ErrWatchBehind) without
// calling Send from two goroutines: the next Send waits for the last.
type sender struct {
	in     chan Watched
	result chan error
	stall  time.Duration
}

func startSender(w Watcher, wt *watcher) *sender {
	s := &sender{in: make(chan Watched), result: make(chan error, 1), stall: w.Stall}
	if s.stall <= 0 {
		s.stall = DefaultWatchStall
	}
	go func() {
		for c := range s.in {
			err := w.Send(c)
			wt.sent(c)
			s.result <- err
			if err != nil {
				return
			}
		}
	}()
	return s
}

// send hands c to the sender and waits for its Send, at most the stall.
func (s *sender) send(ctx context.Context, stopped <-chan struct{}, c Watched) error {
	s.in <- c // the sender is idle: every send waits for its result
	t := time.NewTimer(s.stall)
	defer t.Stop()
	select {
	case err := <-s.result:
		return err
	case <-t.C:
		return ErrWatchBehind
	case <-ctx.Done():
		return ctx.Err()
	case <-stopped:
		return ErrStopped
	}
}

// close ends the sender once its Send in progress, if any, returned.
func (s *sender) close() { close(s.in) }

// watchers is the dispatcher's registry of watchers per namespace. Watching
// never changes delivery: observe copies a delivery after its subscriber's
// Send returned, never blocks (a full watcher misses the copy and is told
// how many it missed), and takes nothing from any stream's credit.
type watchers struct {
	count atomic.Int64 // registered watchers; observe skips the lock at 0
	mu    sync.Mutex
	byNS  map[string]map[*watcher]struct{}
}

func (ws *watchers) add(ns string, w *watcher) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.byNS == nil {
		ws.byNS = make(map[string]map[*watcher]struct{})
	}
	set := ws.byNS[ns]
	if set == nil {
		set = make(map[*watcher]struct{})
		ws.byNS[ns] = set
	}
	set[w] = struct{}{}
	ws.count.Add(1)
}

func (ws *watchers) remove(ns string, w *watcher) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	set := ws.byNS[ns]
	delete(set, w)
	if len(set) == 0 {
		delete(ws.byNS, ns)
	}
	ws.count.Add(-1)
}

// observe offers a copy of del to every watcher of ns without blocking.
func (ws *watchers) observe(ns string, del storage.Delivery, at time.Time) {
	if ws.count.Load() == 0 {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.byNS[ns] {
		w.offer(Watched{Delivery: del, SentAt: at})
	}
}

// Watch registers w and sends it a copy of each delivery this dispatcher
// (with Config.Feed: any replica's dispatcher) sends to a subscriber of
// w.Namespace, until ctx is done, Send fails or stalls, or the dispatcher
// stops. It runs in the caller's goroutine, with the watcher's Sends on one
// goroutine of its own (which ends once a Send in progress returned), and
// never takes or hands back a delivery. It returns ErrStopped when the
// dispatcher is not running or stops, ctx's error when ctx ends,
// ErrWatchBehind when a Send took longer than w.Stall, or Send's or
// Ready's error.
func (d *Dispatcher) Watch(ctx context.Context, w Watcher) error {
	if w.Buffer < 1 {
		w.Buffer = 256
	}
	if w.BufferBytes < 1 {
		w.BufferBytes = DefaultWatchBufferBytes
	}
	d.mu.Lock()
	if d.state != stateRunning {
		d.mu.Unlock()
		return ErrStopped
	}
	stopped := d.stopped
	d.serving.Add(1)
	d.mu.Unlock()
	defer d.serving.Done()

	if d.feed != nil {
		return d.watchFeed(ctx, w, stopped)
	}
	wt := newWatcher(w)
	d.watch.add(w.Namespace, wt)
	defer d.watch.remove(w.Namespace, wt)
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
		case c := <-wt.ch:
			if err := out.send(ctx, stopped, wt.next(c)); err != nil {
				return err
			}
		}
	}
}
