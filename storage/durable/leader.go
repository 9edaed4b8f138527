package durable

import (
	"context"
	"errors"
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

// keepLease renews the leader lease during a long pass, at most every
// third of its TTL, and fails when it was lost.
func (s *leaderLease) keep(ctx context.Context, last *time.Time) error {
	if time.Since(*last) < s.ttl/3 {
		return nil
	}
	*last = time.Now()
	lead, err := s.tryLead(ctx)
	if err != nil {
		return err
	}
	if !lead {
		return errors.New("leader lease lost")
	}
	return nil
}
