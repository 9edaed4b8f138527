package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// Wake-ups (storage.Wakeups): the pub/sub channels scripts publish a
// namespace's changes on, and the policy-changed message.
//
// On one Redis (and the embedded store) every wake-up travels on one
// channel (Options.WakeChannel) with PUBLISH, and every replica hears all
// of them. On a Redis Cluster PUBLISH is broadcast to every node over the
// cluster bus, so a shard's wake-ups travel instead on the shard's own
// channel (delayd:{ns#k}:wake, keys.go) with SPUBLISH (lib.lua
// publish_wake; PublishSettled on shard 0's): they reach only the master
// that owns the shard and its replicas. A replica subscribes (SSUBSCRIBE,
// one connection per channel, to the slot's master) to the shard channels
// of the namespaces it serves (ServeWakeups), and still to the one channel
// for policy changes, which must reach replicas that do not serve the
// namespace (their policy caches, push discovery), and are rare.

// shardSubConfirm is how long a shard channel's subscription may go
// unconfirmed before it is made again on a fresh connection (its SSUBSCRIBE
// went to a node that no longer owns the slot, and was refused).
const shardSubConfirm = 5 * time.Second

// shardSubRetry is how soon a shard channel whose subscription Redis ended
// (its slot moved, or its master became a replica) is subscribed again,
// after the cluster's slot map is reloaded.
const shardSubRetry = 250 * time.Millisecond

// ServeWakeups says whether a dispatcher of this replica serves ns (see
// storage.Wakeups): on a Redis Cluster, a running SubscribeWakeups
// subscribes to ns's shard channels while at least one caller serves it,
// and calls fn with a wake-up of ns once each subscription is confirmed.
// On one Redis it does nothing: every wake-up reaches every replica.
func (s *Store) ServeWakeups(ns string, served bool) {
	if !s.sharded {
		return
	}
	s.wakes.mu.Lock()
	if served {
		s.wakes.served[ns]++
	} else if s.wakes.served[ns]--; s.wakes.served[ns] <= 0 {
		delete(s.wakes.served, ns)
	}
	s.wakes.mu.Unlock()
	select {
	case s.wakes.changed <- struct{}{}:
	default:
	}
}

// wakeSet is the namespaces ServeWakeups was told are served, with how
// many callers serve each.
type wakeSet struct {
	mu      sync.Mutex
	served  map[string]int
	changed chan struct{} // cap 1: the set changed since SubscribeWakeups looked
}

func newWakeSet() *wakeSet {
	return &wakeSet{served: map[string]int{}, changed: make(chan struct{}, 1)}
}

// names returns the namespaces served now.
func (w *wakeSet) names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.served))
	for ns := range w.served {
		out = append(out, ns)
	}
	return out
}

// SubscribeWakeups calls fn with every wake-up published by any replica
// (an upsert, nack, reap, requeue or restore that put an earlier task at
// the head of a namespace; a policy change, PublishPolicyChanged) until
// ctx is done, and then returns ctx.Err(). It fails with
// storage.ErrUnavailable when the subscription cannot be made. fn runs on
// the subscribing goroutine, one call at a time, and should not block.
// After a connection loss the subscription is re-made in the background;
// wake-ups published meanwhile are lost, and ready is called again once
// Redis confirms the new subscription (see storage.Wakeups). On a Redis
// Cluster the wake-ups of a namespace's tasks reach fn only while it is
// served (ServeWakeups); each shard channel's subscription, when Redis
// confirms it (first, after a failover, after its slot moved), calls fn
// with a wake-up of its namespace: that namespace's ready.
func (s *Store) SubscribeWakeups(ctx context.Context, ready func(), fn func(storage.Wakeup)) error {
	// The context of Subscribe only bounds the first connection; later
	// reconnections are go-redis's own.
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	sub := s.rdb.Subscribe(rctx, s.channel)
	defer sub.Close()
	_, err := sub.Receive(rctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return wrapErr("subscribe wakeups", err)
	}
	ready()
	var (
		shards  *shardSubs
		events  <-chan shardEvent
		changed <-chan struct{}
		tick    <-chan time.Time
	)
	if cc, ok := s.rdb.(*redis.ClusterClient); ok && s.sharded {
		shards = newShardSubs(s, cc)
		defer shards.close()
		events, changed = shards.events, s.wakes.changed
		t := time.NewTicker(time.Second)
		defer t.Stop()
		tick = t.C
		shards.sync(ctx)
	}
	// With subscriptions: go-redis re-subscribes after a lost connection
	// and Redis confirms it, which is when wake-ups reach us again.
	ch := sub.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-ch:
			if !ok {
				return fmt.Errorf("subscribe wakeups: %w: subscription closed", storage.ErrUnavailable)
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					ready()
				}
			case *redis.Message:
				fn(parseWakeMessage(m.Payload))
			}
		case <-changed:
			shards.sync(ctx)
		case now := <-tick:
			shards.check(ctx, now)
		case e := <-events:
			shards.handle(ctx, e, fn)
		}
	}
}

// shardSubs are the shard-channel subscriptions of one SubscribeWakeups
// call: one go-redis PubSub per channel (each routed to its slot's master,
// and re-routed by go-redis when its connection is lost), whose messages a
// goroutine each forwards to events. Only SubscribeWakeups' goroutine
// touches it.
type shardSubs struct {
	s      *Store
	cc     *redis.ClusterClient
	subs   map[string]*shardSub // by channel
	events chan shardEvent
	done   chan struct{} // closed by close: forwarders stop
	wg     sync.WaitGroup
}

// shardSub is the subscription of one shard channel.
type shardSub struct {
	ns string
	ps *redis.PubSub
	// since is when it was made or last lost; zero once Redis confirmed it.
	since time.Time
	// retryAt, when set, is when a subscription Redis ended is made again.
	retryAt time.Time
}

type shardEventKind int

const (
	shardConfirmed shardEventKind = iota // Redis confirmed the SSUBSCRIBE
	shardEnded                           // Redis ended it (SUNSUBSCRIBE we did not ask for)
	shardMessage                         // a wake-up
)

type shardEvent struct {
	kind    shardEventKind
	ps      *redis.PubSub
	channel string
	payload string
}

func newShardSubs(s *Store, cc *redis.ClusterClient) *shardSubs {
	return &shardSubs{s: s, cc: cc, subs: map[string]*shardSub{}, events: make(chan shardEvent, 64), done: make(chan struct{})}
}

// sync subscribes to the shard channels of every namespace served and
// drops the others. A namespace whose shard count cannot be read now is
// tried again at the next check.
func (x *shardSubs) sync(ctx context.Context) {
	want := map[string]string{} // channel -> namespace
	for _, ns := range x.s.wakes.names() {
		n, err := x.s.shardCount(ctx, ns)
		if err != nil {
			x.s.log.Warn("wake-ups: reading the shard count failed; subscribing later", "namespace", ns, "error", err)
			continue
		}
		for k := range n {
			want[keysForN(ns, k, n).wake] = ns
		}
	}
	for ch, sub := range x.subs {
		if _, ok := want[ch]; !ok {
			_ = sub.ps.Close()
			delete(x.subs, ch)
		}
	}
	for ch, ns := range want {
		if _, ok := x.subs[ch]; !ok {
			x.subscribe(ctx, ch, ns)
		}
	}
}

// subscribe makes the subscription of channel (of ns) on a new connection
// to its slot's master, and starts its forwarder.
func (x *shardSubs) subscribe(ctx context.Context, channel, ns string) {
	rctx, cancel := context.WithTimeout(ctx, x.s.timeout)
	// An error here (the master down) is go-redis's to retry: the
	// channel stays in the PubSub, which reconnects until it answers.
	ps := x.cc.SSubscribe(rctx, channel)
	cancel()
	x.subs[channel] = &shardSub{ns: ns, ps: ps, since: time.Now()}
	in := ps.ChannelWithSubscriptions()
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		for m := range in {
			e := shardEvent{ps: ps, channel: channel}
			switch m := m.(type) {
			case *redis.Subscription:
				switch m.Kind {
				case "ssubscribe":
					e.kind = shardConfirmed
				case "sunsubscribe":
					e.kind = shardEnded
				default:
					continue
				}
			case *redis.Message:
				e.kind, e.payload = shardMessage, m.Payload
			default:
				continue
			}
			select {
			case x.events <- e:
			case <-x.done:
				return
			}
		}
	}()
}

// handle acts on one event of a shard channel's subscription.
func (x *shardSubs) handle(ctx context.Context, e shardEvent, fn func(storage.Wakeup)) {
	sub := x.subs[e.channel]
	if sub == nil || sub.ps != e.ps {
		return // of a subscription dropped or made again since
	}
	switch e.kind {
	case shardConfirmed:
		sub.since = time.Time{}
		// Wake-ups published before this were lost: look at ns again.
		fn(storage.Wakeup{Namespace: sub.ns})
	case shardEnded:
		// Redis ends the shard channels of a slot its node gave up (the
		// slot moved; the node became a replica). Reload the slot map and
		// subscribe again at its owner.
		x.cc.ReloadState(ctx)
		sub.retryAt = time.Now().Add(shardSubRetry)
		_ = sub.ps.Close()
		sub.ps = nil
	case shardMessage:
		fn(parseWakeMessage(e.payload))
	}
}

// check makes again the subscriptions Redis ended, once their retry time
// came, and those Redis has not confirmed within shardSubConfirm (refused
// by a node that no longer owns the slot); and subscribes namespaces sync
// could not.
func (x *shardSubs) check(ctx context.Context, now time.Time) {
	for ch, sub := range x.subs {
		switch {
		case sub.ps == nil && !now.Before(sub.retryAt):
		case sub.ps != nil && !sub.since.IsZero() && now.Sub(sub.since) > shardSubConfirm:
			x.cc.ReloadState(ctx)
			_ = sub.ps.Close()
		default:
			continue
		}
		x.subscribe(ctx, ch, sub.ns)
	}
	x.sync(ctx)
}

// close ends every subscription and waits for their forwarders.
func (x *shardSubs) close() {
	close(x.done)
	for _, sub := range x.subs {
		if sub.ps != nil {
			_ = sub.ps.Close()
		}
	}
	x.wg.Wait()
}

// PublishPolicyChanged publishes on the wake-up channel that ns's policy
// changed, so every replica's dispatcher re-reads it at once. It travels
// on the one channel even on a Redis Cluster: it must reach replicas that
// do not serve ns.
func (s *Store) PublishPolicyChanged(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Publish(ctx, s.channel, policyWakeMessage(ns)).Err(); err != nil {
		return wrapErr("publish policy change", err)
	}
	return nil
}

// publishWake publishes msg, a wake-up of ns, from Go: on ns's first
// shard's channel on a Redis Cluster (SPUBLISH), on the one channel
// otherwise.
func (s *Store) publishWake(ctx context.Context, op, ns, msg string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if s.sharded {
		n, cerr := s.shardCount(ctx, ns)
		if cerr != nil {
			return fmt.Errorf("%s: %w", op, cerr)
		}
		err = s.rdb.SPublish(ctx, keysForN(ns, 0, n).wake, msg).Err()
	} else {
		err = s.rdb.Publish(ctx, s.channel, msg).Err()
	}
	if err != nil {
		return wrapErr(op, err)
	}
	return nil
}
