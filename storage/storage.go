// Package storage holds delayd's domain types, the sentinel errors every
// store returns, and the small interfaces the server and the dispatcher
// consume. Implementations live in subpackages: redisstore (the fast index)
// and mysqlstore (the durable authority), composed by storage/durable.
//
// Times are time.Time everywhere in Go; stores convert to Unix milliseconds
// only at their own boundary.
package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Clock tells the time on the Go side: the one clock abstraction of the
// module (dispatcher lease estimates, tenancy cache expiry). Due-ness is
// never decided by it; the store's clock does that.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock of time.Now.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Sentinel errors. Stores wrap everything else with fmt.Errorf("op: %w", err).
var (
	// ErrNotFound: the task (or namespace) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: a backing store could not be reached or timed out. Safe
	// to retry. Stores wrap connection and timeout errors with it.
	ErrUnavailable = errors.New("store unavailable")
	// ErrAlreadyExists: a namespace or key with that name exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrQuotaExceeded: a per-namespace quota (max pending tasks) was hit.
	ErrQuotaExceeded = errors.New("quota exceeded")
	// ErrNotEmpty: the namespace still has tasks.
	ErrNotEmpty = errors.New("namespace not empty")
	// ErrStale: an older generation tried to overwrite a newer one.
	ErrStale = errors.New("stale generation")
	// ErrGenerationMismatch: a compare-and-set write (UpsertSpec.
	// IfGeneration, Remove's ifGeneration) found another generation stored;
	// nothing changed. Stores return it inside a *ConflictError.
	ErrGenerationMismatch = errors.New("generation mismatch")
	// ErrNamespaceEnded: the write named an incarnation of the namespace
	// (its create time) that was deleted since; the caller's view of the
	// namespace is stale. Nothing was written.
	ErrNamespaceEnded = errors.New("namespace incarnation ended")
	// ErrInvalidCursor: a List cursor the store did not make (a crafted or
	// corrupted page token). The client's mistake, not the store's.
	ErrInvalidCursor = errors.New("invalid list cursor")
)

// ConflictError is a conditional write that changed nothing because of what
// is stored. Err is ErrAlreadyExists (create-only, and the task exists) or
// ErrGenerationMismatch (the stored generation is not the one expected);
// errors.Is sees it. Task is the task as stored (ID empty and Generation 0
// when there is none).
type ConflictError struct {
	Err  error
	Task Task
	// Expected is the version the write required (ErrGenerationMismatch):
	// its Generation, and its Incarnation when non-zero.
	Expected Version
}

func (e *ConflictError) Error() string {
	if errors.Is(e.Err, ErrGenerationMismatch) {
		return fmt.Sprintf("%v: expected generation %d (incarnation %d), stored %d (incarnation %d)",
			e.Err, e.Expected.Generation, e.Expected.Incarnation, e.Task.Generation, e.Task.Incarnation)
	}
	return fmt.Sprintf("task %q: %v (generation %d)", e.Task.ID, e.Err, e.Task.Generation)
}

// Unwrap returns Err.
func (e *ConflictError) Unwrap() error { return e.Err }

// Refusal says why a conditional upsert changed nothing.
type Refusal uint8

// Refusals of a conditional upsert (UpsertResult.Refused).
const (
	// NotRefused: the upsert applied (or was Stale).
	NotRefused Refusal = iota
	// RefusedExists: UpsertSpec.CreateOnly, and a task with the id exists.
	RefusedExists
	// RefusedGeneration: UpsertSpec.IfGeneration is not the stored
	// generation (or there is no task).
	RefusedGeneration
)

// Conflict returns the *ConflictError of a refused result of sp, nil
// otherwise.
func (r UpsertResult) Conflict(sp UpsertSpec) error {
	switch r.Refused {
	case RefusedExists:
		return &ConflictError{Err: ErrAlreadyExists, Task: r.Task}
	case RefusedGeneration:
		return &ConflictError{Err: ErrGenerationMismatch, Task: r.Task, Expected: sp.IfVersion()}
	}
	return nil
}

// Matches reports whether a stored task of version (inc, gen) meets the
// compare-and-set condition want: want.Generation equal, and
// want.Incarnation equal unless it is zero. A zero want matches anything.
func (want Version) Matches(inc, gen int64) bool {
	return want.Generation == 0 || (gen == want.Generation && (want.Incarnation == 0 || inc == want.Incarnation))
}

// State is where a task is in its lifecycle.
type State uint8

// Task states. The edge converts them to delayd.v1.TaskState by name
// (server/wire); nothing relies on the numbers matching.
const (
	StateUnspecified State = iota
	StateScheduled
	StateDelivered
	StateDead
)

// String returns the state's name in lower case ("scheduled", ...).
func (s State) String() string {
	switch s {
	case StateScheduled:
		return "scheduled"
	case StateDelivered:
		return "delivered"
	case StateDead:
		return "dead"
	default:
		return "unspecified"
	}
}

// Task is one delay task.
type Task struct {
	Namespace string
	ID        string
	Kind      string
	Payload   []byte
	// DueTime is when the task falls due (or is retried), millisecond precision.
	DueTime time.Time
	State   State
	// Attempt counts deliveries so far, including one in flight.
	Attempt int32
	// Generation is bumped by every upsert of (Namespace, ID); starts at 1.
	Generation int64
	// Incarnation names this life of (Namespace, ID): it is set when the
	// task is created and kept by every upsert that replaces it, and a task
	// re-created after a remove or an ack gets a larger one. (Incarnation,
	// Generation) orders the versions of a task across its whole history;
	// 0 only for tasks stored before incarnations existed.
	Incarnation int64
	CreateTime  time.Time
	UpdateTime  time.Time
	// LastError is the reason of the last nack or expiry; empty if none.
	LastError string
	// LeaseDeadline is set while State is StateDelivered: the deadline the
	// subscriber was told (in a Delivery; from Get and List the one the
	// pop kept, see PopParams.TellFor, moved by any later Extend past it).
	// The store's own lease may end sooner: the dispatcher keeps it short
	// and renews it up to this deadline (see dispatcher.Config.Liveness).
	LeaseDeadline time.Time
	// DeadTime is set while State is StateDead.
	DeadTime time.Time
	// TraceParent is the W3C traceparent of the upsert that last wrote the
	// task, when the server traces; empty otherwise. Set on deliveries
	// (Pop) by a store that keeps trace contexts; best effort.
	TraceParent string
}

// UpsertSpec is one task to create or replace.
type UpsertSpec struct {
	ID      string
	Kind    string
	Payload []byte
	// DueTime is the absolute due time. If zero, Delay is used. Stores keep
	// milliseconds and round a finer time UP (DueMilli), so a task is never
	// due before the instant asked for.
	DueTime time.Time
	// Delay is resolved against the store's clock (Redis TIME) when DueTime
	// is zero, so every replica agrees on "now"; the due time is rounded up
	// to the millisecond, so the task is never due before now + Delay.
	Delay time.Duration
	// Generation, if non-zero, is the exact generation to store (durable mode
	// assigns generations in MySQL). A store that already holds a newer
	// generation leaves the task unchanged and reports Stale. If zero, the
	// store bumps the generation it holds (1 for a new task).
	Generation int64
	// Incarnation, if non-zero (with Generation), is the exact incarnation
	// to store (durable mode decides it in MySQL): the version
	// (Incarnation, Generation) is then stored unless the store holds a
	// newer version (Stale) or that very one (no change). If zero, a new
	// task gets a new incarnation and a replaced one keeps its own.
	Incarnation int64
	// TraceParent is the W3C traceparent of the upsert call, kept with the
	// task so its delivery can link back to the producer's span; empty
	// when the call was not traced.
	TraceParent string
	// CreateOnly: if a task with the id exists (in any state), nothing
	// changes and the result is RefusedExists with the stored task. Not
	// combined with Generation.
	CreateOnly bool
	// IfGeneration, if non-zero: the upsert applies only when the stored
	// task's generation equals it; otherwise nothing changes and the result
	// is RefusedGeneration with the stored task (zero when there is none).
	// Decided atomically by the store that decides generations (MySQL in
	// durable mode). Not combined with Generation.
	IfGeneration int64
	// IfIncarnation, with IfGeneration: the stored task's incarnation must
	// equal it too (so a task removed and created again since it was read
	// never matches). Zero means any incarnation.
	IfIncarnation int64
	// NamespaceIncarnation, if non-zero, is the incarnation of the
	// namespace (its create time in Unix milliseconds) the caller wrote
	// for. Every spec of one Upsert call carries the same value. A store
	// that knows that incarnation was deleted (DropNamespace ended it or a
	// later one) refuses the whole call with ErrNamespaceEnded, so a write
	// through a stale view never lands in a namespace re-created under the
	// same name. 0: not checked (refused only while the namespace's last
	// incarnation has ended and no later one has written).
	NamespaceIncarnation int64
}

// IfVersion is the compare-and-set condition of sp (zero when none).
func (sp UpsertSpec) IfVersion() Version {
	if sp.IfGeneration == 0 {
		return Version{}
	}
	return Version{ID: sp.ID, Incarnation: sp.IfIncarnation, Generation: sp.IfGeneration}
}

// UpsertResult is the outcome of one UpsertSpec, in request order.
type UpsertResult struct {
	// Task is the task as stored after the upsert.
	Task Task
	// Created is true when the task did not exist before.
	Created bool
	// Earliest is true when the task became the earliest due task of its
	// namespace (a dispatcher sleeping longer should wake up). In a sharded
	// namespace it may also be true when the task became the earliest of
	// its shard only: a wake-up too many, never one too few.
	Earliest bool
	// Stale is true when Generation was given and the store held a newer
	// version; Task is then the stored, newer task. When the store held the
	// very version given, nothing changed and Task is the stored task, with
	// Stale and Created false.
	Stale bool
	// Refused is set when a condition (CreateOnly, IfGeneration) failed:
	// nothing changed and Task is the stored task (zero when there is
	// none). See Conflict.
	Refused Refusal
}

// Delivery is a task popped into a lease.
type Delivery struct {
	// Task has State StateDelivered and Attempt counting this delivery.
	Task Task
	// Token names this delivery.
	Token Token
	// LeaseDeadline is when the lease ends (by the store's clock): from a
	// Pop, the store lease (PopParams.LeaseFor), which Task.LeaseDeadline
	// (the told deadline) may exceed.
	LeaseDeadline time.Time
}

// Token names one delivery: the task, its incarnation and generation, and
// the delivery's sequence number. Its wire form (an opaque string) is the
// server's business.
type Token struct {
	Namespace   string
	ID          string
	Incarnation int64
	Generation  int64
	// Attempt is the task's attempt count of this delivery (informational:
	// it restarts after a requeue, so it does not name the delivery).
	Attempt int32
	// Delivery is the delivery's sequence number: it increases with every
	// delivery of an incarnation and never repeats, not after a requeue, a
	// rebuild of the index or a restored Redis snapshot (the store derives
	// it from its clock), so a token never names two deliveries. Never 0.
	Delivery int64
}

// TokenStatus is the per-token answer of ack, nack and extend.
type TokenStatus uint8

// Token statuses. The edge converts them to delayd.v1.TokenStatus by name
// (server/wire).
const (
	TokenUnspecified TokenStatus = iota
	// TokenOK: applied.
	TokenOK
	// TokenStale: the task has a newer generation or attempt; nothing changed.
	TokenStale
	// TokenNotFound: the task no longer exists or is not in flight; nothing changed.
	TokenNotFound
)

// ExtendResult is the per-token answer of ExtendLease.
type ExtendResult struct {
	Status TokenStatus
	// LeaseDeadline is the new deadline when Status is TokenOK.
	LeaseDeadline time.Time
}

// Backoff is a retry schedule: the delay before retry n (n = the attempt
// that just failed, from 1) is min(Max, Initial * Multiplier^(n-1)), then
// jittered down by up to Jitter (a fraction, 0..1) of itself.
type Backoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     float64
}

// Policy is how one namespace's tasks are treated.
type Policy struct {
	// AckTimeout is the lease per delivery. Default 30 s.
	AckTimeout time.Duration
	// MaxAttempts is the number of deliveries before a task is dead. Default 10.
	MaxAttempts int32
	// Backoff is the retry schedule. Default 1 s doubling to 10 min, 20% jitter.
	Backoff Backoff
	// MaxPayloadBytes is the largest payload accepted. Default 64 KiB.
	MaxPayloadBytes int
	// MaxPendingTasks caps the tasks the namespace holds; 0 = unlimited.
	MaxPendingTasks int64
	// RateLimit is requests per second across the namespace; 0 = unlimited.
	RateLimit float64
	// RateBurst is the burst above RateLimit.
	RateBurst int
	// MaxSubscribers caps concurrent Subscribe streams of the namespace on
	// one server replica. Default 100.
	MaxSubscribers int
	// MaxDelay is the furthest ahead a task may be due. Default 366 days.
	MaxDelay time.Duration
	// Paused stops deliveries of the namespace on every replica: the
	// dispatchers pop nothing while it is set (leases already out run
	// their course). Default false.
	Paused bool
	// MaxDispatchRate caps the namespace's deliveries per second across
	// every replica (DispatchBurst at once); 0 = unlimited.
	MaxDispatchRate float64
	// Shards is how many shards the namespace's tasks are spread over (a
	// task's shard comes from a hash of its id; see redisstore.ShardOf), so
	// one namespace can use several Redis Cluster masters. Set at create,
	// 1..MaxShards; it cannot change later. Default 1.
	Shards int
	// Push, when its URL is set, makes the dispatchers POST the
	// namespace's due tasks to an HTTP endpoint instead of serving them to
	// Subscribe streams. Zero: no push.
	Push PushTarget
	// HistoryRetentionBytes, if > 0, makes the stores keep the namespace's
	// task events (History), about this many bytes of them (HistoryKeep
	// events). Zero: no history, and no call pays for it.
	HistoryRetentionBytes int64
	// MaxSchedules caps the namespace's schedules (recurring tasks).
	// Default 1,000.
	MaxSchedules int
}

// PushTarget is an HTTP endpoint due tasks are POSTed to, and the key they
// are signed with. The registries store the secret as it is (it is needed
// to sign); the API never returns it.
type PushTarget struct {
	// URL is the http or https URL requests go to; "" = no push.
	URL string
	// Secret is the HMAC-SHA256 key of the requests' signature.
	Secret string
}

// Enabled reports whether the target is set.
func (t PushTarget) Enabled() bool { return t.URL != "" }

// PushOutcome is how one push request ended.
type PushOutcome uint8

// Push outcomes. Only PushOK acks the delivery; every other one nacks it
// with the namespace's backoff.
const (
	// PushOK: the endpoint answered 2xx.
	PushOK PushOutcome = iota
	// PushHTTPError: the endpoint answered another status (or a redirect,
	// which is never followed).
	PushHTTPError
	// PushTimeout: no answer within the namespace's ack timeout.
	PushTimeout
	// PushConnectError: the connection failed (refused, reset, DNS, TLS).
	PushConnectError
	// PushRefused: the target's host, or an address it resolved to, is
	// not one the operator allows (--push-allow); nothing was sent.
	PushRefused
	// NumPushOutcomes is the number of outcomes (for per-outcome arrays).
	NumPushOutcomes
)

// String is the outcome's metric label value.
func (o PushOutcome) String() string {
	switch o {
	case PushOK:
		return "ok"
	case PushHTTPError:
		return "http_error"
	case PushTimeout:
		return "timeout"
	case PushConnectError:
		return "connect_error"
	case PushRefused:
		return "refused"
	}
	return "unknown"
}

// MaxShards is the most shards a namespace may have.
const MaxShards = 256

// LateFrom is the instant the lateness of a delivery of t is measured
// from: its due time, or, for a task created with a due time already past
// (accepted as due now), its creation. A task upserted "due 2020-01-01" is
// not years late when delivered at once. Not UpdateTime: a popped task's
// update time is the pop itself. A retry's due time is set by the store
// after the task was written, so it is never before CreateTime; a task
// replaced with a past due time is measured from its creation (an upper
// bound). The dispatcher's lateness metric and late-delivery log, the
// history's recent lateness and delivered events, and GetNamespaceStats'
// oldest due lateness all use this rule.
func LateFrom(t Task) time.Time {
	if t.CreateTime.After(t.DueTime) {
		return t.CreateTime
	}
	return t.DueTime
}

// DispatchBurst is the token-bucket size that goes with a dispatch rate
// cap: a tenth of a second's deliveries, at least 1, so a drained bucket
// lets only a small burst through before the rate holds.
func DispatchBurst(rate float64) int {
	return int(max(1, math.Ceil(rate/10)))
}

// DefaultPolicy returns the policy a namespace has unless configured
// otherwise.
func DefaultPolicy() Policy {
	return Policy{
		AckTimeout:  30 * time.Second,
		MaxAttempts: 10,
		Backoff: Backoff{
			Initial:    time.Second,
			Max:        10 * time.Minute,
			Multiplier: 2,
			Jitter:     0.2,
		},
		MaxPayloadBytes: 64 << 10,
		MaxSubscribers:  100,
		MaxDelay:        366 * 24 * time.Hour,
		Shards:          1,
		MaxSchedules:    1000,
	}
}

// Moved describes where a nack, an expired lease or a requeue moved a task:
// back to StateScheduled (due at DueTime) or to StateDead. Durable mode
// writes it through to MySQL.
type Moved struct {
	ID          string
	Incarnation int64
	Generation  int64
	Attempt     int32
	State       State
	DueTime     time.Time
	DeadTime    time.Time
	LastError   string
}

// Version names one version of a task: its incarnation and generation.
// Versions of one id are ordered by incarnation, then generation.
type Version struct {
	ID          string
	Incarnation int64
	Generation  int64
}

// Newer reports whether v is a later version than w (of the same id).
func (v Version) Newer(w Version) bool {
	return v.Incarnation > w.Incarnation || (v.Incarnation == w.Incarnation && v.Generation > w.Generation)
}

// NackOptions says how nacked deliveries are retried.
type NackOptions struct {
	// RetryAfter, if non-nil, is the delay before the retry; nil means the
	// policy's backoff for the attempt.
	RetryAfter *time.Duration
	// Reason is kept as the task's LastError.
	Reason string
	// MaxAttempts: a task whose attempt has reached it becomes dead instead.
	MaxAttempts int32
	// Backoff is used when RetryAfter is nil.
	Backoff Backoff
	// Unsent says the deliveries were popped but never sent to a
	// subscriber: each gives back the attempt its pop counted (Nack only).
	Unsent bool
	// ExpiredBy, if not zero, limits a Reap to leases whose deadline is at
	// or before it, by the store's clock, even when the store runs the reap
	// later (Reap only). The caller sets it to the store's time when it
	// decided to reap: a reap that waited in a stalled store (SIGSTOP, a
	// long pause) and ran when it resumed then takes back only the leases
	// that had run out when it was sent, not those that ran out during the
	// stall, whose holders' renewals were held up by the same stall. Zero:
	// every lease expired at the store's now.
	ExpiredBy time.Time
}

// Stats counts one namespace's tasks.
type Stats struct {
	Scheduled int64
	Delivered int64
	Dead      int64
	// DueNow counts scheduled tasks whose due time has passed.
	DueNow int64
	// OldestDue is the due time of the earliest scheduled task; zero if none.
	OldestDue time.Time
	// Now is the store clock when the stats were taken.
	Now time.Time
}

// Policies answers the policy of a namespace. The namespace registry
// implements it; StaticPolicies serves one policy for every namespace.
type Policies interface {
	// Policy returns the namespace's policy with defaults filled in.
	// ErrNotFound if the namespace does not exist (and is not auto-created).
	Policy(ctx context.Context, ns string) (Policy, error)
}

// StaticPolicies serves the same policy for every namespace.
type StaticPolicies struct{ P Policy }

// Policy returns s.P for every namespace.
func (s StaticPolicies) Policy(context.Context, string) (Policy, error) { return s.P, nil }

// Invalidate does nothing: nothing is cached (dispatcher.Policies).
func (StaticPolicies) Invalidate(string) {}

// DueMilli is t in Unix milliseconds rounded UP: the millisecond a task due
// at t is stored as, so it is never due early (t.UnixMilli() rounds down).
func DueMilli(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.Nanosecond()%int(time.Millisecond) != 0 {
		ms++
	}
	return ms
}

// DelayMicros is d in whole microseconds rounded UP, the unit a store
// resolves a relative delay in; negative delays are 0.
func DelayMicros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
