package dispatcher

import (
	"context"

	"github.com/delayd/delayd/storage"
)

// A namespace loop's policy: read through the Policies cache every
// PolicyRefresh (sooner while paused, at once after an announced change).

// refreshPolicy re-reads the policy every PolicyRefresh (every SafetyPoll
// while the namespace is paused, so a resume whose announcement was lost
// still applies soon) and returns it.
func (n *namespace) refreshPolicy(ctx context.Context) storage.Policy {
	now := n.d.cfg.Clock.Now()
	n.mu.Lock()
	pol, at, stale := n.pol, n.polAt, n.polStale
	n.mu.Unlock()
	every := n.d.cfg.PolicyRefresh
	if pol.Paused {
		every = min(every, n.d.cfg.SafetyPoll)
	}
	if !at.IsZero() && !stale && now.Sub(at) < every {
		return pol
	}
	if at.IsZero() {
		pol = storage.DefaultPolicy()
	}
	n.mu.Lock()
	n.polStale = false // a change announced from here on is read again
	n.mu.Unlock()
	pol = n.d.policyOf(ctx, n.name, pol)
	n.mu.Lock()
	n.pol, n.polAt = pol, now
	n.mu.Unlock()
	return pol
}

// expirePolicy makes the loop re-read the policy on its next round.
func (n *namespace) expirePolicy() {
	n.mu.Lock()
	n.polStale = true
	n.mu.Unlock()
}

// policy returns the policy the loop last read, reading it if it never did.
func (n *namespace) policy(ctx context.Context) storage.Policy {
	n.mu.Lock()
	pol, at := n.pol, n.polAt
	n.mu.Unlock()
	if !at.IsZero() {
		return pol
	}
	return n.d.policyOf(ctx, n.name, storage.DefaultPolicy())
}
