package storagefake

import (
	"context"

	"github.com/delayd/delayd/storage"
)

// The fake's wake-ups and watch copies, delivered in process.

// publish tells every wake-up subscriber about ns. s.mu is held.
func (s *Store) publish(ns string) { s.publishWakeup(storage.Wakeup{Namespace: ns}) }

// publishWakeup hands w to every wake-up subscriber. s.mu is held.
func (s *Store) publishWakeup(w storage.Wakeup) {
	for _, ch := range s.subs {
		select {
		case ch <- w:
		default: // a slow subscriber misses it, as with Redis pub/sub under pressure
		}
	}
}

// PublishPolicyChanged tells every wake-up subscriber that ns's policy
// changed.
func (s *Store) PublishPolicyChanged(_ context.Context, ns string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publishWakeup(storage.Wakeup{Namespace: ns, PolicyChanged: true})
	return nil
}

// ServeWakeups does nothing: every wake-up reaches every subscriber.
func (s *Store) ServeWakeups(string, bool) {}

// SubscribeWakeups calls fn with every wake-up until ctx is done; ready
// once, when the subscription is made.
func (s *Store) SubscribeWakeups(ctx context.Context, ready func(), fn func(storage.Wakeup)) error {
	ch := make(chan storage.Wakeup, 1024)
	s.mu.Lock()
	id := s.nextSb
	s.nextSb++
	s.subs[id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, id)
		s.mu.Unlock()
	}()
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case w := <-ch:
			fn(w)
		}
	}
}

// PublishWatchCopies hands each copy to the subscriptions of its namespace,
// as Redis pub/sub does: a subscription whose buffer (1,024) is full loses
// it. It answers how many subscriptions each copy reached.
func (s *Store) PublishWatchCopies(_ context.Context, copies []storage.WatchCopy) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, len(copies))
	for i, c := range copies {
		for _, ch := range s.watchers[c.Task.Namespace] {
			out[i]++
			select {
			case ch <- c:
			default:
			}
		}
	}
	return out, nil
}

// SubscribeWatchCopies subscribes to ns's copies; see storage.DeliveryFeed.
func (s *Store) SubscribeWatchCopies(ctx context.Context, ns string, ready func() error, fn func(storage.WatchCopy) error) error {
	ch := make(chan storage.WatchCopy, 1024)
	s.mu.Lock()
	if s.watchers == nil {
		s.watchers = map[string]map[int]chan storage.WatchCopy{}
	}
	if s.watchers[ns] == nil {
		s.watchers[ns] = map[int]chan storage.WatchCopy{}
	}
	id := s.nextSb
	s.nextSb++
	s.watchers[ns][id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers[ns], id)
		if len(s.watchers[ns]) == 0 {
			delete(s.watchers, ns)
		}
		s.mu.Unlock()
	}()
	if err := ready(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case c := <-ch:
			if err := fn(c); err != nil {
				return err
			}
		}
	}
}
