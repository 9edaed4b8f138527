package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/delayd/delayd/metrics"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage/durable"
	"github.com/delayd/delayd/storage/mysqlstore"
	"github.com/delayd/delayd/storage/redisstore"
)

// This file is durable mode's wiring (Config.MySQLDSN): MySQL is the
// authority for every task and the Redis store becomes its index. Start
// calls openDurable, hands the result to the server and the dispatcher, and
// keeps health NOT_SERVING until the index is complete; Stop closes it
// after the gRPC server and before Redis.

// durableMode is the durable-mode part of a running Daemon.
type durableMode struct {
	store *durable.Store
	stop  chan struct{} // closed when the daemon stops: stop waiting for readiness
	done  chan struct{} // closed when serveWhenIndexed has returned
}

// openDurable connects to MySQL (mysqlstore, the authority), applies the
// schema migrations and starts the durable store over it and index (its committer and reconciler). It returns
// nil, nil when cfg.MySQLDSN is empty.
func openDurable(ctx context.Context, cfg Config, index *redisstore.Store, shards *redisstore.RegistryShards, logger *slog.Logger, m *metrics.Metrics) (*durableMode, error) {
	if cfg.MySQLDSN == "" {
		return nil, nil
	}
	logger = logger.With("component", "durable")
	db, err := mysqlstore.Open(ctx, mysqlstore.Config{DSN: cfg.MySQLDSN, Logger: logger, OpTimeout: cfg.StoreTimeout})
	if err != nil {
		return nil, fmt.Errorf("durable mode: %w", err)
	}
	s, err := durable.New(db, durable.Config{
		Index:                 index,
		Logger:                logger,
		OpTimeout:             cfg.StoreTimeout,
		ReconcileInterval:     cfg.ReconcileInterval,
		FullReconcileInterval: cfg.FullReconcileInterval,
		Metrics:               reconcileMetrics(m),
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("durable mode: %w", err)
	}
	// Shard counts come from the namespaces' authority from now on, before
	// Start rebuilds any index.
	shards.Use(s.Registry())
	if err := s.Start(ctx); err != nil {
		_ = s.Stop(ctx)
		return nil, fmt.Errorf("durable mode: %w", err)
	}
	return &durableMode{store: s, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// reconcileMetrics is m as the reconciler's metrics, or nil (a nil
// *metrics.Metrics must not become a non-nil interface).
func reconcileMetrics(m *metrics.Metrics) durable.ReconcileMetrics {
	if m == nil {
		return nil
	}
	return m
}

// serveWhenIndexed sets health SERVING once every namespace's index is
// complete (rebuilt from MySQL where Redis lost it), or returns when the
// daemon stops first. Run it in its own goroutine.
func (du *durableMode) serveWhenIndexed(srv *server.Server, logger *slog.Logger) {
	defer close(du.done)
	select {
	case <-du.store.Ready():
		srv.SetServing(true)
		logger.Info("durable mode: index complete; health SERVING")
	case <-du.stop:
	}
}

// stopWaiting ends serveWhenIndexed and waits for it, so it cannot set
// SERVING after Stop set NOT_SERVING.
func (du *durableMode) stopWaiting() {
	close(du.stop)
	<-du.done
}

// close stops the durable store: accepted writes are committed and indexed,
// the reconciler ends and the MySQL pool closes.
func (du *durableMode) close(ctx context.Context) error {
	return du.store.Stop(ctx)
}
