package storage

import (
	"context"
	"time"
)

// EventKind is what happened to a task, in its history.
type EventKind uint8

// The kinds of task events (delaydv1.TaskEventKind at the edge).
const (
	EventUnspecified EventKind = iota
	// EventUpserted: an upsert created the task.
	EventUpserted
	// EventRescheduled: an upsert replaced an existing task.
	EventRescheduled
	// EventDelivered: a pop leased the task to a subscriber.
	EventDelivered
	// EventNacked: a subscriber nacked a delivery.
	EventNacked
	// EventLeaseExpired: a delivery's lease ran out and the reaper took it back.
	EventLeaseExpired
	// EventDeadLettered: the task used up its attempts.
	EventDeadLettered
	// EventRequeued: an admin requeued the dead letter.
	EventRequeued
	// EventRemoved: the task was removed, or purged from the dead letters.
	EventRemoved
	// EventAcked: a subscriber acked the delivery.
	EventAcked
	// NumEventKinds bounds the kinds (for tables indexed by kind).
	NumEventKinds
)

var eventKindNames = [NumEventKinds]string{"unspecified", "upserted", "rescheduled", "delivered", "nacked", "lease_expired", "dead_lettered", "requeued", "removed", "acked"}

// String names the kind as the CLI and the stored records do.
func (k EventKind) String() string {
	if k < NumEventKinds {
		return eventKindNames[k]
	}
	return "unspecified"
}

// Event is one thing that happened to one task. Fields a kind does not
// carry are zero.
type Event struct {
	Kind EventKind
	// ID is the task's id.
	ID string
	// Time is when it happened by the store's clock (the clock due times
	// use), millisecond precision. Zero in RecordEvents: the store stamps
	// it with its clock when it writes the event.
	Time time.Time
	// KeyID is the id of the API key whose call made the event (never its
	// secret); empty for the server's own moves (delivery, expiry).
	KeyID string
	// Generation is the task's generation after the event.
	Generation int64
	// Due is the due time the event set (upsert, reschedule, nack, lease
	// expired, requeue).
	Due time.Time
	// Attempt is the delivery attempt the event is about.
	Attempt int32
	// Replica names the replica that delivered the task.
	Replica string
	// Lateness is how long after its due time a delivered task left the
	// store.
	Lateness time.Duration
	// Reason is a nack's reason, or "lease expired".
	Reason string
	// RetryAfter is the delay a nack asked for; zero means the backoff.
	RetryAfter time.Duration
	// Schedule, on the upserted event of a schedule's firing, is the
	// schedule's id, and Slot the slot the task fires for.
	Schedule string
	Slot     time.Time
}

// EventWireSize is what one event typically costs where it is kept (a
// Redis stream entry, a MySQL row) and in a reply, in bytes: the figure a
// namespace's history_retention_bytes is divided by to get the number of
// events kept (HistoryKeep), and the fixed part of EventSize.
const EventWireSize = 128

// MinHistoryRetentionBytes and MaxHistoryRetentionBytes bound
// Policy.HistoryRetentionBytes when it is set.
const (
	MinHistoryRetentionBytes = 64 << 10
	MaxHistoryRetentionBytes = 1 << 30
)

// HistoryKeep is how many events a namespace whose policy keeps
// retentionBytes of history keeps; 0 = none (history off).
func HistoryKeep(retentionBytes int64) int64 {
	if retentionBytes <= 0 {
		return 0
	}
	return max(1, retentionBytes/EventWireSize)
}

// EventSize is an upper bound of the bytes e takes in a reply.
func EventSize(e Event) int {
	return EventWireSize + len(e.ID) + len(e.KeyID) + len(e.Replica) + len(e.Reason) + len(e.Schedule)
}

// RecordParams is one write of History.RecordEvents.
type RecordParams struct {
	// Incarnation is the namespace incarnation the events happened in: its
	// create time, Unix ms (Namespace.CreateTime as the recorder looked it
	// up before the call that made them). Each incarnation has a history of
	// its own, so a namespace re-created under a deleted one's name never
	// reads the old one's events, whenever they were written.
	Incarnation int64
	// Keep is about how many events the incarnation's history keeps (the
	// oldest are dropped first); <= 0 records nothing.
	Keep int64
	// Events are the events to append, in order.
	Events []Event
}

// HistoryParams selects one page of History.TaskHistory.
type HistoryParams struct {
	// Incarnation is the namespace incarnation whose history to read (its
	// create time, Unix ms, as RecordParams.Incarnation).
	Incarnation int64
	// ID is the task whose events to read.
	ID string
	// Limit is the most events the page holds (stores cap it at 1,000).
	Limit int
	// Cursor is the previous page's next cursor; "" starts at the oldest
	// event kept.
	Cursor string
	// MaxBytes bounds the page by the sum of EventSize (the first event is
	// always added); 0 = no byte bound.
	MaxBytes int
}

// HistoryScanWindow is how many events of a namespace (of any task) one
// TaskHistory call looks at, at most, in a store that keeps one log per
// namespace: a page may come back short, or empty with a next cursor,
// while the scan walks past other tasks' events.
const HistoryScanWindow = 5000

// History keeps what happened to the tasks of the namespaces whose policy
// asks for it (Policy.HistoryRetentionBytes), and reads it back, one
// history per namespace incarnation.
//
// The tenant boundary: events of an incarnation that DropNamespace has
// ended are never read back — not through that incarnation, not through a
// later one — even when they are recorded after the drop (a call that
// changed a task just before the delete records its events after it). A
// store drops such events: MySQL in the write's transaction, the Redis
// index right after writing them (it reads the namespace's life key in the
// same pipeline and removes what it wrote).
type History interface {
	// RecordEvents appends p.Events of ns's tasks, in order, to the history
	// of incarnation p.Incarnation, keeping about p.Keep events (the oldest
	// are dropped first; a store may keep somewhat more, never unboundedly
	// more). Events with a zero Time get the store's clock. Keep <= 0
	// records nothing; events of an ended incarnation are dropped, which is
	// not an error.
	RecordEvents(ctx context.Context, ns string, p RecordParams) error
	// TaskHistory returns one page of the events of task p.ID in the
	// history of incarnation p.Incarnation of ns, oldest first, and the
	// cursor of the next page ("" = every kept event was read). It works
	// after the task is gone, while its events are kept; it returns none
	// once DropNamespace has ended the incarnation.
	TaskHistory(ctx context.Context, ns string, p HistoryParams) ([]Event, string, error)
}

// Forecast counts the scheduled tasks of a namespace falling due in the
// next hour (per minute) and the next day (per hour).
type Forecast struct {
	// Now is the store clock the buckets start from.
	Now time.Time
	// PerMinute[i] counts tasks due in (Now+i min, Now+(i+1) min]; 60.
	// Tasks due at Now or before are due now (Stats.DueNow), not here.
	PerMinute []int64
	// PerHour[i] counts tasks due in (Now+i h, Now+(i+1) h]; 24.
	PerHour []int64
}

// ForecastMinutes and ForecastHours are the lengths of Forecast's series.
const (
	ForecastMinutes = 60
	ForecastHours   = 24
)

// Forecaster answers the due forecast of a namespace from the index,
// without reading every task: one range count per bucket.
type Forecaster interface {
	// Forecast counts ns's scheduled tasks due per minute over the next
	// hour and per hour over the next day, by the store's clock.
	Forecast(ctx context.Context, ns string) (Forecast, error)
}

// keyIDKey is the context key of WithKeyID.
type keyIDKey struct{}

// WithKeyID returns ctx carrying the id of the API key whose call it serves
// (the server's authentication puts it there), so the history a store call
// records names who made it.
func WithKeyID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, keyIDKey{}, id)
}

// KeyIDOf is the key id WithKeyID put into ctx; "" if none.
func KeyIDOf(ctx context.Context) string {
	id, _ := ctx.Value(keyIDKey{}).(string)
	return id
}

// RecentDeliveries is what one replica saw of a namespace's deliveries
// lately: their rate and lateness percentiles over Window.
type RecentDeliveries struct {
	// Window is the span the figures cover.
	Window time.Duration
	// Count is the deliveries in the window; PerSecond is Count / Window.
	Count     int64
	PerSecond float64
	// P50, P90 and P99 are lateness percentiles (delivery minus due time)
	// of the latest deliveries in the window; zero without any.
	P50, P90, P99 time.Duration
}
