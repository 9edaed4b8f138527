package durable

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// leaderLease is the reconciler's leader lease, one across the replicas
// that share a MySQL database: a key in the index that the holder renews.
type leaderLease struct {
	idx       Index
	name      string        // leaderPrefix + the database name
	holder    string        // Config.Holder
	ttl       time.Duration // Config.LeaderTTL
	opTimeout time.Duration
}

// tryLead takes or renews the leader lease.
func (s *leaderLease) tryLead(ctx context.Context) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	return s.idx.TryLead(cctx, s.name, s.holder, s.ttl)
}

// hold renews the lease on a goroutine of its own, every third of its TTL,
// while the leader works under the returned context; stop ends the
// renewals. The renewals do not wait for the work: a step slowed by a slow
// MySQL or a starved process (the passes' steps run for seconds on a busy
// machine) once let the lease run out between two renewals made between
// steps, and the other replica took over in the middle of the pass. The
// context is cancelled, with errLeaseLost as its cause, once a renewal
// finds the lease held by another holder, or once no renewal has
// succeeded for a whole TTL (the lease may have run out): keep then fails
// and the pass stops at its next step.
func (s *leaderLease) hold(ctx context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(s.ttl/3, time.Millisecond))
		defer tick.Stop()
		renewed := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			sent := time.Now()
			lead, err := s.tryLead(ctx)
			switch {
			case err == nil && lead:
				renewed = sent
			case err == nil:
				cancel(errLeaseLost)
				return
			case time.Since(renewed) >= s.ttl:
				cancel(fmt.Errorf("%w: no renewal for %v: %v", errLeaseLost, s.ttl, err))
				return
			}
		}
	}()
	return ctx, func() {
		cancel(nil)
		<-done
	}
}

// errLeaseLost is why a pass under hold stopped.
var errLeaseLost = errors.New("leader lease lost")

// keep fails when the lease that hold renews was lost: the pass stops
// between two steps instead of going on as a second leader.
func (s *leaderLease) keep(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}
