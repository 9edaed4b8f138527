package dispatcher

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"time"

	"github.com/delayd/delayd/storage"
)

// A subscriber's side of the dispatcher: Serve runs one stream's send loop
// over the deliveries its namespace loop hands it, and what comes back from
// the stream or the RPCs (settles, nacks, lease extensions, hand-backs)
// returns its credit.

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
		if d.cfg.Wakeups != nil {
			d.cfg.Wakeups.ServeWakeups(sub.Namespace, true)
		}
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
		if d.cfg.Wakeups != nil {
			d.cfg.Wakeups.ServeWakeups(n.name, false)
		}
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
