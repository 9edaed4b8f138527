package bench

import (
	"context"
	"time"
)

// item is one task a producer upserts.
type item struct {
	id  string
	due time.Time // millisecond precision, by the Redis clock
}

// sink receives what a system's consumers see. Its methods are called from
// many goroutines at once.
type sink interface {
	// delivered is called once per delivery, as soon as it reaches the
	// consumer, with the local time it arrived.
	delivered(ns, id string, at time.Time)
	// acked is called when n deliveries were acknowledged (for the
	// baseline, whose pop deletes, right after delivered), at local time
	// at; failed counts acks answered with anything but OK.
	acked(n, failed int, at time.Time)
}

// system is one implementation under test: delayd over gRPC, or the
// baseline design on Redis.
type system interface {
	// name labels the system in reports ("delayd", "baseline-1s", ...).
	name() string
	// setup prepares the namespaces (queues) of a run.
	setup(ctx context.Context, nss []string) error
	// upsert creates tasks in ns: one call per task when len(items) == 1
	// and unary is true, otherwise one batch call for all of items.
	upsert(ctx context.Context, ns string, items []item, payload []byte, unary bool) error
	// consume starts consuming nss with subscribers consumers in total,
	// reporting to s, until stop is called. stop waits for every goroutine.
	consume(ctx context.Context, nss []string, subscribers, maxInFlight int, s sink) (stop func(), err error)
	// cpu returns the CPU time of the process that does the system's work
	// and what that figure covers; ok is false when it cannot be measured.
	cpu() (d time.Duration, scope string, ok bool)
	// pid is that process's id, for its syscall and context-switch counts
	// (this process's for a system that runs in delaybench); 0 if unknown.
	pid() int
	// cleanup deletes everything the run left in the stores.
	cleanup(ctx context.Context, nss []string) error
}
