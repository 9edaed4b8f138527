package durable

import (
	"context"
	"log/slog"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// pruner deletes task history rows past HistoryRetention; the leader runs
// it after every pass.
type pruner struct {
	db        authority.Authority
	clock     storage.Clock
	log       *slog.Logger
	warn      *throttle
	retention time.Duration // Config.HistoryRetention; 0: nothing to prune
	opTimeout time.Duration
}

// runOnce deletes history rows older than HistoryRetention, in
// bounded batches.
func (s *pruner) runOnce(ctx context.Context) {
	if s.retention <= 0 {
		return
	}
	cutoff := s.clock.Now().Add(-s.retention)
	total := int64(0)
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, s.opTimeout)
		n, err := s.db.PruneHistory(cctx, cutoff, 1000)
		cancel()
		if err != nil {
			s.warn.warn("prune", "reconciler: pruning history failed", "err", err)
			return
		}
		total += n
		if n < 1000 {
			break
		}
	}
	if total > 0 {
		s.log.Info("pruned task history", "rows", total, "retention", s.retention)
	}
}
