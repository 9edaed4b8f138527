// Package dispatcher moves due tasks from the store to subscriber streams:
// it pops by credit, sleeps until the earliest due time, wakes on upserts
// from any replica, reaps expired leases and applies retry backoff.
//
// This file is the seam the server and the daemon code against; the delivery
// work fills it in.
package dispatcher

import (
	"context"
	"log/slog"
	"time"

	"github.com/delayd/delayd/storage"
)

// Store is what the dispatcher needs from the task index.
type Store interface {
	storage.Deliveries
}

// Config configures a Dispatcher.
type Config struct {
	// Store is the task index to pop from. Required.
	Store Store
	// Wakeups delivers "earlier task at the head" notices from every replica.
	// If nil, only the safety-net poll and local upserts wake the dispatcher.
	Wakeups storage.Wakeups
	// Policies answers each namespace's policy. If nil, storage.DefaultPolicy.
	Policies storage.Policies
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// SafetyPoll is the slow poll that catches a missed wake-up. If unset or
	// zero, 1 second is used.
	SafetyPoll time.Duration
}

// Dispatcher pushes due tasks to subscribers. Start it once, Stop it once.
type Dispatcher struct {
	cfg Config
}

// New returns a Dispatcher; it does nothing until Start.
func New(cfg Config) (*Dispatcher, error) {
	return &Dispatcher{cfg: cfg}, nil
}

// Start begins the dispatcher's background work; it returns at once.
func (d *Dispatcher) Start(ctx context.Context) error { return nil }

// Stop stops popping, hands back what streams still hold, ends the streams
// and waits for every goroutine, or until ctx is done.
func (d *Dispatcher) Stop(ctx context.Context) error { return nil }

// Notify tells the dispatcher that an upsert on this replica made a task
// the earliest of ns, so it re-plans its sleep at once.
func (d *Dispatcher) Notify(ns string) {}
