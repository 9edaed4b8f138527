package storage

import (
	"context"
	"time"
)

// Tasks is what the task RPCs need: create, replace, cancel, look up.
type Tasks interface {
	// Upsert creates or replaces tasks of one namespace in one round trip.
	// Results are in spec order. A spec with an older Generation than the
	// store holds is reported Stale and changes nothing.
	Upsert(ctx context.Context, ns string, specs []UpsertSpec) ([]UpsertResult, error)
	// Upsert specs may be conditional (CreateOnly, IfGeneration): a spec
	// whose condition fails changes nothing and its result says Refused.
	//
	// Remove deletes a task in any state and returns the state it was in.
	// ErrNotFound if there was no such task. If ifVersion.Generation is
	// non-zero, the task is deleted only when its stored version matches
	// it (Version.Matches: the generation, and the incarnation unless that
	// is zero; ifVersion.ID is ignored); otherwise nothing changes and the
	// error is a *ConflictError (ErrGenerationMismatch) carrying the stored
	// task.
	Remove(ctx context.Context, ns, id string, ifVersion Version) (State, error)
	// RemoveTasks deletes the tasks p names (IDs) or one bounded page of
	// the tasks p.Filter selects, and says how many it deleted and where
	// the next page starts ("" = done).
	RemoveTasks(ctx context.Context, ns string, p RemoveTasksParams) (RemoveTasksResult, error)
	// Get returns one task. ErrNotFound if there is none.
	Get(ctx context.Context, ns, id string) (Task, error)
	// List returns one page (see ListParams) of the tasks of one state in
	// that state's order (due time, lease deadline, death time), and the
	// cursor of the next page ("" = last page).
	List(ctx context.Context, ns string, p ListParams) ([]Task, string, error)
}

// ListParams selects one page of Tasks.List.
type ListParams struct {
	// State to list; StateUnspecified lists StateScheduled.
	State State
	// Limit is the most tasks the page holds (stores cap it at their batch
	// size, 1,000).
	Limit int
	// Cursor is the previous page's next cursor; "" starts at the beginning.
	Cursor string
	// MaxBytes bounds the page by bytes: tasks are added while the sum of
	// their TaskWireSize stays within it. The first task of a page is
	// always added (a single task is bounded by the payload limit), so a
	// page is never empty while tasks remain, and paging goes on. 0 = no
	// byte bound.
	MaxBytes int
	// NoPayload leaves every Payload empty; the store does not read them,
	// and they do not count against MaxBytes.
	NoPayload bool
}

// TaskWireOverhead bounds what a task costs in a reply beyond its variable
// fields (namespace, id, kind, payload, last error, trace context): field
// tags, lengths, numbers and timestamps. The Lua list script uses the
// same figure (lua/list.lua).
const TaskWireOverhead = 256

// TaskWireSize is an upper bound of the bytes t takes in a reply (as one
// element of a repeated Task field).
func TaskWireSize(t Task) int {
	return TaskWireOverhead + len(t.Namespace) + len(t.ID) + len(t.Kind) + len(t.Payload) + len(t.LastError) + len(t.TraceParent)
}

// CutPage returns the longest prefix of ts whose TaskWireSize sum stays
// within maxBytes (at least one task when ts is not empty), and whether it
// cut anything. maxBytes <= 0 keeps everything.
func CutPage(ts []Task, maxBytes int) ([]Task, bool) {
	if maxBytes <= 0 {
		return ts, false
	}
	sum := 0
	for i, t := range ts {
		sum += TaskWireSize(t)
		if sum > maxBytes && i > 0 {
			return ts[:i], true
		}
	}
	return ts, false
}

// Deliveries is what the dispatcher and the delivery RPCs need.
type Deliveries interface {
	// Pop moves at most p.Limit due tasks (due time <= the store clock) of
	// ns into a lease of p.LeaseFor, counts the attempt, and returns them in
	// due order; with p.MaxRate, at most as many as the namespace's
	// dispatch-rate bucket holds tokens (see PopParams). It never deletes
	// anything.
	Pop(ctx context.Context, ns string, p PopParams) ([]Delivery, error)
	// PopWake is Pop that also answers the store clock at the pop and when
	// the namespace has work next (as NextWake would right after the pop),
	// so a dispatcher's wake costs one store call: one script call for an
	// unsharded Redis namespace (a sharded one fans out, then asks each
	// shard's next wake).
	PopWake(ctx context.Context, ns string, p PopParams) (PopResult, error)
	// Ack deletes the tasks the tokens name, if each is still the delivery in
	// flight (same generation and attempt). Statuses are in token order.
	Ack(ctx context.Context, ns string, tokens []Token) ([]TokenStatus, error)
	// Nack puts the deliveries back to scheduled per opts, or to dead when
	// their attempts are used up. It returns a status per token and, for
	// every token that was applied, where the task went.
	Nack(ctx context.Context, ns string, tokens []Token, opts NackOptions) ([]TokenStatus, []Moved, error)
	// Extend sets the lease of the deliveries to store-now + by.
	Extend(ctx context.Context, ns string, tokens []Token, by time.Duration) ([]ExtendResult, error)
	// Reap takes at most limit expired leases of ns back to scheduled with
	// backoff (or to dead when attempts are used up) and returns where each
	// went. Safe to run from every replica at once.
	Reap(ctx context.Context, ns string, limit int, opts NackOptions) ([]Moved, error)
	// NextWake returns the earliest of the namespace's first due time and
	// first lease deadline, and the store clock now. ok is false when the
	// namespace has neither.
	NextWake(ctx context.Context, ns string) (next time.Time, now time.Time, ok bool, err error)
	// ExpectPop tells the store that this replica pops ns within the given
	// time (the dispatcher's next wake): acks and nacks of ns that arrive
	// meanwhile may wait for that pop and be settled in its store call, at
	// most until the time given (then on their own). 0 or less: no pop
	// soon; what waits for one is settled now. Never blocks; a store whose
	// acks are not held back ignores it.
	ExpectPop(ns string, within time.Duration)
}

// PopResult is what one PopWake did and what it saw.
type PopResult struct {
	// Deliveries are the popped tasks, in due order (Pop's answer).
	Deliveries []Delivery
	// Now is the store clock at the pop.
	Now time.Time
	// Next is the earlier of the namespace's first due time and first
	// lease deadline after the pop; zero when HasNext is false.
	Next time.Time
	// HasNext is false when the namespace has no scheduled task and no
	// delivery in flight.
	HasNext bool
	// NextDue is the namespace's first due time after the pop, apart from
	// lease deadlines; zero when no task is scheduled. Set only with
	// DueKnown.
	NextDue time.Time
	// DueKnown says the store told NextDue apart from Next (an unsharded
	// Redis namespace, the in-memory store). A dispatcher holding back
	// reaping after store trouble sleeps until NextDue instead of the whole
	// hold when Next is an expired lease; without it, it polls.
	DueKnown bool
}

// PopParams says what one Pop may take.
type PopParams struct {
	// Limit is the most tasks to lease; stores cap it at their batch size
	// (redisstore: MaxBatch). 0 or less: nothing.
	Limit int
	// LeaseFor is the store lease of each delivery.
	LeaseFor time.Duration
	// TellFor is the ack timeout the subscriber is told, when longer than
	// LeaseFor (a dispatcher keeps the store lease short and renews it):
	// the store keeps its time of the pop + TellFor with the delivery as
	// the deadline the subscriber was told, and Get and List show it as the
	// task's LeaseDeadline while the delivery is in flight instead of the
	// store lease, as does the Delivery's Task. An Extend that sets the
	// store lease past it moves it there (the told deadline is the latest
	// any party was given). 0 or at most LeaseFor: the store lease is what
	// the subscriber is told.
	TellFor time.Duration
	// MaxRate, if > 0, caps the deliveries of the namespace per second,
	// across every Pop of every replica: the namespace has one token bucket
	// in the store, refilled at MaxRate tokens per second (by the store's
	// clock) up to Burst, and the Pop takes at most as many tasks as it
	// holds whole tokens, atomically with the move. 0: no cap (the bucket
	// is not touched).
	MaxRate float64
	// Burst is the bucket's size, the most deliveries at once after an idle
	// spell; below 1 it is 1. Ignored without MaxRate.
	Burst int
	// Kinds, if not empty, restricts the pop to tasks whose Kind is one of
	// them, taken in due order from the first KindScanWindow due tasks of
	// the namespace only (so a pop stays bounded): tasks of other kinds
	// stay scheduled, in place.
	Kinds []string
	// RequestID, if not empty, makes the pop one that can be asked again:
	// a store call's answer can be lost after the store did the work (a
	// timeout, a cut connection, a stalled server that runs the call after
	// its caller gave up), and the tasks it leased would wait, leased to
	// nobody, until their lease runs out. The store keeps the pop's answer
	// under the id for RequestWindow; a Pop with an id whose record exists
	// answers the recorded deliveries (the same tokens and lease
	// deadlines) and leases nothing. So a pop whose answer was lost is
	// asked again with the same id and Limit 0: the answer is what the
	// first one leased, or, when it has not run, nothing — and the record
	// of that nothing makes the first one, should it run later, lease
	// nothing (it is cancelled). A namespace's shards keep a record each,
	// and only a Pop of Limit 0 asks every shard: ask again with Limit 0
	// to get the whole answer. One id is one pop; ids are the caller's to
	// make unique (a replica's prefix and a counter).
	RequestID string
	// RequestWindow is how long the record of a pop with a RequestID is
	// kept (by the store's clock, from the pop): a pop asked again later
	// may lease anew. 0 or less: DefaultRequestWindow. Memory is bounded
	// by the pop rate times the window.
	RequestWindow time.Duration
}

// DefaultRequestWindow is how long a store keeps the record of a request
// (PopParams.RequestWindow) unless told otherwise.
const DefaultRequestWindow = 30 * time.Second

// RequestWindowOf is p's RequestWindow, DefaultRequestWindow when unset.
func (p PopParams) RequestWindowOf() time.Duration {
	if p.RequestWindow <= 0 {
		return DefaultRequestWindow
	}
	return p.RequestWindow
}

// KindScanWindow is how many due tasks, from the head, a Pop with Kinds
// looks at. While more tasks of kinds nobody pops are due ahead of them,
// tasks of the wanted kinds wait.
const KindScanWindow = 1000

// DeadLetters is what the dead-letter admin RPCs need.
type DeadLetters interface {
	// Requeue moves the dead tasks p selects back to scheduled, due after
	// p.Delay, with attempts reset. Ids that are not dead are skipped.
	// Returns where each moved task went.
	Requeue(ctx context.Context, ns string, p RequeueParams) ([]Moved, error)
	// Purge deletes the dead tasks p selects and returns the ids it deleted.
	Purge(ctx context.Context, ns string, p PurgeParams) ([]string, error)
}

// TaskFilter selects tasks by what they are; set fields must all match,
// zero fields match everything.
type TaskFilter struct {
	// Kind, if set, is the kind the tasks have (exact).
	Kind string
	// IDPrefix, if set, is how the tasks' ids start.
	IDPrefix string
	// State, if set, is the state the tasks are in.
	State State
}

// RemoveTasksParams selects the tasks RemoveTasks deletes.
type RemoveTasksParams struct {
	// IDs are the tasks to delete (ids that do not exist are skipped); at
	// most the store's batch size (redisstore: MaxBatch). If empty, Filter
	// selects.
	IDs []string
	// Filter selects the tasks, walked one bounded page per call.
	Filter TaskFilter
	// Cursor is where the walk continues: RemoveTasksResult.Next of the
	// previous call with the same Filter; "" from the start.
	Cursor string
	// Limit is how many tasks one call examines at most (removed or not).
	// Stores clamp it to 1..their batch size; zero means the batch size.
	Limit int
}

// RemoveTasksResult is what one RemoveTasks call did.
type RemoveTasksResult struct {
	// Removed counts the tasks deleted by the call.
	Removed int64
	// States answers IDs one by one, in IDs order: the state each task was
	// in when it was deleted, StateUnspecified when there was no such task
	// (an id repeated in IDs is deleted once: its repeats answer
	// StateUnspecified). Nil for a Filter walk.
	States []State
	// Next is the cursor of the next page of a Filter walk; "" when the
	// walk is done (and always for IDs).
	Next string
}

// RequeueParams selects the dead tasks Requeue moves back and says when they
// fall due.
type RequeueParams struct {
	// IDs are the dead tasks to requeue; ids that are not dead are skipped.
	// Ignored when All is set.
	IDs []string
	// All selects the oldest dead tasks, up to Limit, instead of IDs.
	All bool
	// Limit bounds All. Stores clamp it to 1..their batch size (redisstore:
	// 1..MaxBatch); zero means 1.
	Limit int
	// Delay is how long after the store's now the tasks fall due. Zero or
	// negative: at once.
	Delay time.Duration
}

// RestoreParams says which versions a re-index of tasks read from the
// durable authority (durable mode's Index.Restore, implemented by
// redisstore) may overwrite.
type RestoreParams struct {
	// Repair writes each task unless the index holds that very version:
	// the authority wins even over a version the index holds as newer but
	// the authority never committed (the reconciler's repair). Without it
	// a task is written only over an older version or none (a rebuild).
	// Either way a version the index's ack marker names is never written.
	Repair bool
}

// PurgeParams selects the dead tasks Purge deletes.
type PurgeParams struct {
	// IDs are the dead tasks to delete; ids that are not dead are skipped.
	// Ignored when All is set.
	IDs []string
	// All selects the oldest dead tasks, up to Limit, instead of IDs.
	All bool
	// Limit bounds All, clamped as for RequeueParams.Limit.
	Limit int
}

// Store is the task store contract, declared here once: the task RPCs,
// ack / nack / extend, the dead-letter RPCs, stats and quotas, and the bulk
// drop of a forced DeleteNamespace. redisstore, the durable store and
// storagefake implement it; the metrics and history decorators wrap one and
// are one; the server, the dispatcher and storetest's conformance suite take
// one. A store that lacks a method does not compile into the daemon instead
// of silently losing a feature.
type Store interface {
	Tasks
	Deliveries
	DeadLetters
	Counter
	// DropNamespace deletes every task of ns in every state, in bulk, and
	// returns how many it deleted. With an incarnation (the namespace's
	// create time, Unix ms; 0 = none) it first ends it: from then on an
	// Upsert whose specs name that incarnation (or an earlier one) fails
	// with ErrNamespaceEnded, so nothing written through a stale view
	// survives into a namespace re-created under the same name.
	DropNamespace(ctx context.Context, ns string, incarnation int64) (int64, error)
}

// Counter is what stats and quotas need.
type Counter interface {
	// Stats counts the namespace's tasks per state.
	Stats(ctx context.Context, ns string) (Stats, error)
	// DueKinds counts the namespace's due tasks per kind among the first
	// KindScanWindow of them (in due order), so an operator sees which
	// kinds wait (for a stream that takes them).
	DueKinds(ctx context.Context, ns string) (DueKinds, error)
}

// DueKinds is what DueKinds counted.
type DueKinds struct {
	// Counts maps a kind ("" for tasks without one) to its due tasks.
	Counts map[string]int64
	// Partial is true when more tasks were due than the window held: the
	// counts cover the head only.
	Partial bool
}

// WatchCopy is a copy of one delivery for people watching a namespace
// (WatchDeliveries, delayctl tail, the console): the task as delivered and
// when, never the delivery's token, so nobody can settle it with a copy.
type WatchCopy struct {
	// Task as delivered: State StateDelivered, Attempt counting this delivery.
	Task Task
	// LeaseDeadline is when the delivery's lease ends (the store's clock).
	LeaseDeadline time.Time
	// SentAt is when the replica sent the delivery (that replica's clock).
	SentAt time.Time
	// Dropped counts copies of the same namespace the publishing replica
	// dropped (its queue of copies was full) since the previous one it
	// published.
	Dropped int64
}

// DeliveryFeed carries copies of deliveries between replicas, so a watcher
// connected to one replica sees the deliveries every replica makes. It is
// best effort: a copy can be lost (a full queue, a connection loss), a
// delivery never is, and nothing here changes a delivery.
type DeliveryFeed interface {
	// PublishWatchCopies offers each copy to the watchers of its task's
	// namespace on every replica, and returns, per copy in order, how many
	// subscriptions received it (0: nobody watches that namespace now).
	PublishWatchCopies(ctx context.Context, copies []WatchCopy) ([]int64, error)
	// SubscribeWatchCopies subscribes to the copies of ns that any replica
	// publishes, calls ready once the subscription is in place, then fn for
	// each copy, one call at a time, until ctx is done (it returns
	// ctx.Err()), ready or fn fails (their error), or the subscription is
	// lost (an error wrapping ErrUnavailable). fn may run on a goroutine
	// the feed shares between subscriptions: it must not block.
	SubscribeWatchCopies(ctx context.Context, ns string, ready func() error, fn func(WatchCopy) error) error
}

// Wakeup is one notice to the dispatchers of every replica.
type Wakeup struct {
	// Namespace the notice is about.
	Namespace string
	// PolicyChanged: the namespace's policy was changed (pause, resume, a
	// rate cap): re-read it now instead of at the next refresh. False: an
	// earlier task is at the head of the namespace.
	PolicyChanged bool
	// Settled, when set, are deliveries of the namespace an ack or nack on
	// some replica settled that its own streams did not hold: the replica
	// whose stream holds them frees their credit now instead of when their
	// leases end (PublishSettled).
	Settled []Token
}

// Wakeups tells dispatchers when an upsert on any replica put an earlier task
// at the head of a namespace, or a policy changed.
type Wakeups interface {
	// SubscribeWakeups calls fn with every wake-up until ctx is done. It
	// returns when ctx is done or the subscription fails. It calls ready
	// each time the subscription is made (first, and again after a lost
	// connection was re-made): every wake-up published after ready reaches
	// fn, and ones published before it may not have — so the caller looks
	// again at whatever it was waiting on (pub/sub keeps nothing for a
	// subscriber that is not there yet). ready and fn run on the
	// subscribing goroutine, one call at a time, and should not block.
	SubscribeWakeups(ctx context.Context, ready func(), fn func(Wakeup)) error
	// PublishPolicyChanged tells the dispatchers of every replica
	// (subscribed at the time) that ns's policy changed. Best effort: a
	// replica that misses it reads the policy at its next refresh.
	PublishPolicyChanged(ctx context.Context, ns string) error
	// PublishSettled tells the dispatchers of every replica that tokens
	// (deliveries of ns) were acked or nacked, so the one whose stream
	// holds them frees its credit at once. Best effort: a replica that
	// misses it frees the credit when the lease ends.
	PublishSettled(ctx context.Context, ns string, tokens []Token) error
	// ServeWakeups tells the store whether a dispatcher of this replica
	// serves ns (runs a loop for it), counted per call: a store whose
	// wake-ups travel per namespace shard (Redis Cluster sharded pub/sub)
	// subscribes to ns's only while it is served, and its running
	// SubscribeWakeups calls fn with a wake-up of ns each time such a
	// subscription is confirmed (ns's ready: wake-ups published before it
	// may be lost). A store whose every wake-up reaches every replica
	// ignores it. It does not block.
	ServeWakeups(ns string, served bool)
}

// SharedLimits are per-namespace limits counted once for every replica
// (in Redis), so N replicas do not allow N times a namespace's limit.
type SharedLimits interface {
	// TakeRequestToken takes one token of ns's request bucket, refilled
	// at rate per second up to burst and shared by every replica; false
	// when it is empty.
	TakeRequestToken(ctx context.Context, ns string, rate float64, burst int) (bool, error)
	// AcquireSubscriber adds Subscribe stream id (unique across replicas)
	// to ns's streams, leased for lease, unless most (> 0) streams are
	// held already; it answers whether it did and how many are held.
	AcquireSubscriber(ctx context.Context, ns, id string, most int, lease time.Duration) (ok bool, held int, err error)
	// RenewSubscribers renews the leases of ns's streams ids (re-adding
	// any whose lease lapsed: they are still open).
	RenewSubscribers(ctx context.Context, ns string, ids []string, lease time.Duration) error
	// ReleaseSubscriber removes stream id from ns's streams.
	ReleaseSubscriber(ctx context.Context, ns, id string) error
}
