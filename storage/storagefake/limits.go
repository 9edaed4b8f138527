package storagefake

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// limits is the state of storage.SharedLimits, as redisstore keeps it in
// Redis (lua/ratetake.lua, lua/subscribers.lua): one request bucket and one
// set of leased Subscribe streams per namespace, shared by every replica
// over this Store.
type limits struct {
	mu      sync.Mutex
	buckets map[string]bucket
	subs    map[string]map[string]time.Time // namespace -> stream id -> lease end
}

// TakeRequestToken implements storage.SharedLimits.
func (s *Store) TakeRequestToken(_ context.Context, ns string, rate float64, burst int) (bool, error) {
	if err := storage.ValidateNamespace(ns); err != nil {
		return false, err
	}
	if !(rate > 0) {
		return true, nil
	}
	l := &s.lim
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]bucket{}
	}
	size := float64(max(1, burst))
	now := s.clock.Now().UnixMicro()
	tokens := size
	if b, ok := l.buckets[ns]; ok {
		tokens = math.Min(size, b.tokens+float64(max(0, now-b.atUS))*rate/1e6)
	}
	if tokens < 1 {
		return false, nil
	}
	l.buckets[ns] = bucket{tokens: tokens - 1, atUS: now}
	return true, nil
}

// streams returns ns's streams without the expired ones; l.mu is held.
func (s *Store) streams(ns string) map[string]time.Time {
	l := &s.lim
	if l.subs == nil {
		l.subs = map[string]map[string]time.Time{}
	}
	m := l.subs[ns]
	if m == nil {
		m = map[string]time.Time{}
		l.subs[ns] = m
	}
	now := s.clock.Now()
	for id, end := range m {
		if !end.After(now) {
			delete(m, id)
		}
	}
	return m
}

// AcquireSubscriber implements storage.SharedLimits.
func (s *Store) AcquireSubscriber(_ context.Context, ns, id string, most int, lease time.Duration) (bool, int, error) {
	if err := storage.ValidateNamespace(ns); err != nil {
		return false, 0, err
	}
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	m := s.streams(ns)
	if _, have := m[id]; !have && most > 0 && len(m) >= most {
		return false, len(m), nil
	}
	m[id] = s.clock.Now().Add(lease)
	return true, len(m), nil
}

// RenewSubscribers implements storage.SharedLimits.
func (s *Store) RenewSubscribers(_ context.Context, ns string, ids []string, lease time.Duration) error {
	if err := storage.ValidateNamespace(ns); err != nil {
		return err
	}
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	m := s.streams(ns)
	for _, id := range ids {
		m[id] = s.clock.Now().Add(lease)
	}
	return nil
}

// ReleaseSubscriber implements storage.SharedLimits.
func (s *Store) ReleaseSubscriber(_ context.Context, ns, id string) error {
	if err := storage.ValidateNamespace(ns); err != nil {
		return err
	}
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	delete(s.streams(ns), id)
	return nil
}

// PublishSettled tells every wake-up subscriber that tokens of ns were
// settled.
func (s *Store) PublishSettled(_ context.Context, ns string, tokens []storage.Token) error {
	if len(tokens) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publishWakeup(storage.Wakeup{Namespace: ns, Settled: append([]storage.Token(nil), tokens...)})
	return nil
}
