package dispatcher

import (
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// This file lets the package's external tests wait for what a dispatcher
// did (signals.go) instead of sleeping.

// EventKind says what happened.
type EventKind int

const (
	EventPlanned       EventKind = iota + 1 // a namespace loop round planned its next wake
	EventPusherStopped                      // a namespace's pusher stopped (push turned off)
	EventDraining                           // Stop began waiting for pushes in flight
)

// Event is one thing a dispatcher did.
type Event struct {
	Kind      EventKind
	Namespace string         // EventPlanned, EventPusherStopped
	Policy    storage.Policy // EventPlanned: the policy the round used
	Wait      time.Duration  // EventPlanned: the sleep planned
	Blocked   bool           // EventPlanned: blocked on credit
}

// Signals receives the events of one dispatcher.
type Signals struct {
	mu      sync.Mutex
	waiters []waiter
}

type waiter struct {
	match func(Event) bool
	done  chan struct{}
}

// Watch makes the dispatcher built from c report its events to the
// returned Signals. Call it before New.
func Watch(c *Config) *Signals {
	s := &Signals{}
	c.signals = signals{
		onPlanned: func(ns string, pol storage.Policy, p plan) {
			s.fire(Event{Kind: EventPlanned, Namespace: ns, Policy: pol, Wait: p.wait, Blocked: p.blocked})
		},
		onPusherStopped: func(ns string) { s.fire(Event{Kind: EventPusherStopped, Namespace: ns}) },
		onDraining:      func() { s.fire(Event{Kind: EventDraining}) },
	}
	return s
}

// Next returns a channel that is closed at the first event from now on
// that match accepts. Ask before causing the event.
func (s *Signals) Next(match func(Event) bool) <-chan struct{} {
	done := make(chan struct{})
	s.mu.Lock()
	s.waiters = append(s.waiters, waiter{match: match, done: done})
	s.mu.Unlock()
	return done
}

func (s *Signals) fire(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.waiters[:0]
	for _, w := range s.waiters {
		if w.match(e) {
			close(w.done)
			continue
		}
		kept = append(kept, w)
	}
	s.waiters = kept
}
