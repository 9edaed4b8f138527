package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// PublishWatchCopies publishes each copy on its namespace's watch channel
// (delayd:watch:<ns>) in one pipeline and returns PUBLISH's answer per copy:
// how many subscriptions, on any replica, received it. The copy travels as
// JSON (storage.WatchCopy's fields), so replicas of different versions read
// each other's copies.
func (s *Store) PublishWatchCopies(ctx context.Context, copies []storage.WatchCopy) ([]int64, error) {
	if len(copies) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(copies))
	for i, c := range copies {
		c.Task.Namespace = "" // the channel names it
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("publish watch copies: %w", err)
		}
		cmds[i] = pipe.Publish(ctx, watchChannel(copies[i].Task.Namespace), b)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, wrapErr("publish watch copies", err)
	}
	out := make([]int64, len(cmds))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// SubscribeWatchCopies subscribes to ns's watch channel; see
// storage.DeliveryFeed. Every subscription of the Store shares one pub/sub
// connection (watchHub): a replica holds one connection for all its
// watchers, however many there are, and a copy is decoded once and fanned
// out in process. fn is called on that connection's reader goroutine and
// must not block. After a connection loss go-redis re-subscribes in the
// background; copies published meanwhile are lost. A message that is not a
// copy is logged and skipped.
func (s *Store) SubscribeWatchCopies(ctx context.Context, ns string, ready func() error, fn func(storage.WatchCopy) error) error {
	sub := &watchSub{fn: fn, failed: make(chan error, 1)}
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	confirmed, err := s.hub.add(rctx, ns, sub)
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return wrapErr("subscribe watch copies", err)
	}
	defer s.hub.remove(ns, sub)
	select {
	case <-confirmed:
		cancel()
	case <-rctx.Done():
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("subscribe watch copies: %w: Redis did not confirm the subscription within %s", storage.ErrUnavailable, s.timeout)
	}
	if err := ready(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-sub.failed:
		return err
	}
}

// watchHubLinger is how long the watch hub keeps its pub/sub connection
// open after its last subscriber left: watches that open and close one
// after the other reuse it instead of opening a Redis connection each
// (before: 4 workers opening and closing watches made 2,029 connections in
// 5 s).
const watchHubLinger = 5 * time.Second

// watchHub is a Store's one pub/sub connection for watch channels, open
// while anyone subscribes and for watchHubLinger after: it SUBSCRIBEs a
// namespace's channel for its first subscriber and UNSUBSCRIBEs it after
// its last, and one reader goroutine fans each copy out to the namespace's
// subscribers.
type watchHub struct {
	rdb     redis.UniversalClient
	log     *slog.Logger
	timeout time.Duration

	mu    sync.Mutex
	ps    *redis.PubSub // nil while closed
	done  chan struct{} // closed when ps's reader ends
	chans map[string]*hubChannel
	idle  *time.Timer // closes ps when it fires; set while nobody subscribes
}

// hubChannel is one subscribed channel: its subscribers, and confirmed,
// closed once Redis confirmed the SUBSCRIBE.
type hubChannel struct {
	ns        string
	subs      map[*watchSub]struct{}
	confirmed chan struct{}
	ok        bool // confirmed is closed
}

// watchSub is one SubscribeWatchCopies call.
type watchSub struct {
	fn     func(storage.WatchCopy) error
	failed chan error // fn's first error
}

func (h *watchHub) add(ctx context.Context, ns string, sub *watchSub) (<-chan struct{}, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	if h.ps == nil {
		h.ps = h.rdb.Subscribe(context.WithoutCancel(ctx))
		h.done = make(chan struct{})
		h.chans = make(map[string]*hubChannel)
		go h.read(h.ps, h.done)
	}
	name := watchChannel(ns)
	c := h.chans[name]
	if c == nil {
		if err := h.ps.Subscribe(ctx, name); err != nil {
			h.lingerLocked()
			return nil, err
		}
		c = &hubChannel{ns: ns, subs: make(map[*watchSub]struct{}), confirmed: make(chan struct{})}
		h.chans[name] = c
	}
	c.subs[sub] = struct{}{}
	return c.confirmed, nil
}

func (h *watchHub) remove(ns string, sub *watchSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	name := watchChannel(ns)
	c := h.chans[name]
	if c == nil {
		return
	}
	delete(c.subs, sub)
	if len(c.subs) > 0 {
		return
	}
	delete(h.chans, name)
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	if err := h.ps.Unsubscribe(ctx, name); err != nil {
		h.log.Debug("watch channel: UNSUBSCRIBE failed; the connection's next reconnect drops it", "namespace", ns, "err", err)
	}
	cancel()
	h.lingerLocked()
}

// lingerLocked arms the timer that closes the connection when nobody
// subscribes, watchHubLinger from now.
func (h *watchHub) lingerLocked() {
	if len(h.chans) > 0 || h.ps == nil || h.idle != nil {
		return
	}
	h.idle = time.AfterFunc(watchHubLinger, h.closeIdle)
}

// closeIdle closes the connection if still nobody subscribes.
func (h *watchHub) closeIdle() {
	h.mu.Lock()
	if len(h.chans) > 0 || h.ps == nil {
		h.mu.Unlock()
		return
	}
	ps, done := h.ps, h.done
	h.ps, h.done, h.chans, h.idle = nil, nil, nil, nil
	h.mu.Unlock()
	_ = ps.Close() // outside the lock: its reader may be waiting for it
	<-done
}

// read fans out ps's messages until ps is closed.
func (h *watchHub) read(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	for {
		msg, err := ps.Receive(context.Background())
		if err != nil {
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			// The next Receive reconnects and re-subscribes every channel.
			h.log.Debug("watch channel: connection lost; reconnecting", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			h.mu.Lock()
			if c := h.chans[m.Channel]; h.ps == ps && c != nil && !c.ok {
				c.ok = true
				close(c.confirmed)
			}
			h.mu.Unlock()
		case *redis.Message:
			h.fanOut(ps, m)
		}
	}
}

func (h *watchHub) fanOut(ps *redis.PubSub, m *redis.Message) {
	h.mu.Lock()
	c := h.chans[m.Channel]
	if h.ps != ps || c == nil {
		h.mu.Unlock()
		return
	}
	ns := c.ns
	subs := make([]*watchSub, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	var wc storage.WatchCopy
	if err := json.Unmarshal([]byte(m.Payload), &wc); err != nil {
		h.log.Warn("watch channel: a message that is not a delivery copy", "namespace", ns, "err", err)
		return
	}
	wc.Task.Namespace = ns
	for _, s := range subs {
		c := wc
		if err := s.fn(c); err != nil {
			select {
			case s.failed <- err:
			default:
			}
		}
	}
}
