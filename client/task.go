package client

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// State is where a task is in its lifecycle.
type State int32

// Task states; the values are delayd.v1.TaskState's.
const (
	// StateUnspecified is no state; in List it means StateScheduled.
	StateUnspecified State = State(delaydv1.TaskState_TASK_STATE_UNSPECIFIED)
	// StateScheduled: waiting for its due time, or due and waiting for a
	// subscriber.
	StateScheduled State = State(delaydv1.TaskState_TASK_STATE_SCHEDULED)
	// StateDelivered: leased to a subscriber until its lease deadline.
	StateDelivered State = State(delaydv1.TaskState_TASK_STATE_DELIVERED)
	// StateDead: used up the namespace's max attempts; kept as a dead letter.
	StateDead State = State(delaydv1.TaskState_TASK_STATE_DEAD)
)

// String returns "scheduled", "delivered", "dead" or "unspecified".
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

// Task is a delay task as delayd stores it. Zero times mean "not set".
type Task struct {
	// Namespace the task belongs to.
	Namespace string
	// ID is unique within the namespace.
	ID string
	// Kind is the producer's label, e.g. "order.close"; may be empty.
	Kind string
	// Payload is delivered as given.
	Payload []byte
	// DueTime is when the task falls due (after a nack or an expired lease:
	// when it is retried), by delayd's clock, millisecond precision.
	DueTime time.Time
	// State is the lifecycle state.
	State State
	// Attempt counts deliveries so far, including one in flight.
	Attempt int32
	// Generation is bumped by every upsert of (Namespace, ID).
	Generation int64
	// Incarnation names this life of (Namespace, ID): kept by every upsert,
	// larger for a task created again after a remove or an ack (which
	// starts over at generation 1). See [Task.Version].
	Incarnation int64
	// CreateTime is when the task was first created.
	CreateTime time.Time
	// UpdateTime is when the task last changed.
	UpdateTime time.Time
	// LastError is the reason of the last nack, or "lease expired".
	LastError string
	// LeaseDeadline is set while the task is StateDelivered.
	LeaseDeadline time.Time
	// DeadTime is set while the task is StateDead.
	DeadTime time.Time
	// TraceParent is the W3C traceparent of the traced upsert that last
	// wrote the task, on deliveries from a delayd that traces; empty
	// otherwise. Consume links each handler's span to it.
	TraceParent string
}

// When is a task's due time: absolute ([At]) or relative to delayd's clock
// ([After]). The zero When is invalid, so a forgotten due time is an error
// rather than "now".
type When struct {
	at    time.Time
	delay time.Duration
	set   bool
}

// At makes a task due at t. A time in the past means "due now".
func At(t time.Time) When { return When{at: t, set: true} }

// After makes a task due d from now, where now is delayd's clock (the Redis
// server's), so producers whose clocks differ still agree. d must not be
// negative; 0 means "due now".
func After(d time.Duration) When { return When{delay: d, set: true} }

// IsZero reports whether w was not set with At or After.
func (w When) IsZero() bool { return !w.set }

// TaskSpec is one task to create or replace.
type TaskSpec struct {
	// ID is the task id, unique within the namespace: 1-128 characters of
	// [A-Za-z0-9._-]. Use your own key (order id, device id...) so that
	// upserting again replaces the task and removing it needs nothing else.
	ID string
	// Kind is an optional label (at most 128 printable characters).
	Kind string
	// Payload is opaque and delivered as given; at most the namespace's
	// payload limit (64 KiB unless configured otherwise).
	Payload []byte
	// When the task falls due: client.At(t) or client.After(d). Required.
	When When
	// CreateOnly: if a task with this ID exists (in any state), nothing
	// changes and the upsert fails with AlreadyExists; [ConflictOf] gives
	// the existing task. Use it when the task is scheduled once per event
	// (an order's close): a retry after a timeout then never moves the due
	// time. Not combined with IfGeneration.
	CreateOnly bool
	// IfGeneration, if non-zero, makes the upsert a compare-and-set: it
	// applies only when the stored task has exactly this generation (as
	// last read in Task.Generation), else it fails with FailedPrecondition
	// and [ConflictOf] gives the current generation and task.
	IfGeneration int64
	// IfIncarnation, with IfGeneration, also requires the stored task to be
	// this incarnation (Task.Incarnation as last read), so the upsert never
	// applies to a task removed and created again since (it starts over at
	// generation 1). Zero means any incarnation.
	IfIncarnation int64
}

// Version names one version of a task: its incarnation and generation.
type Version struct {
	Incarnation int64
	Generation  int64
}

// Version is t's version, for [Client.RemoveIf] (or TaskSpec.IfGeneration
// and IfIncarnation).
func (t Task) Version() Version { return Version{Incarnation: t.Incarnation, Generation: t.Generation} }

func (s TaskSpec) proto(ns string) *delaydv1.UpsertTaskRequest {
	req := &delaydv1.UpsertTaskRequest{Namespace: ns, Id: s.ID, Kind: s.Kind, Payload: s.Payload,
		CreateOnly: s.CreateOnly, IfGeneration: s.IfGeneration, IfIncarnation: s.IfIncarnation}
	switch {
	case !s.When.set:
	case !s.When.at.IsZero():
		req.When = &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(s.When.at)}
	default:
		req.When = &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(s.When.delay)}
	}
	return req
}

func taskFromProto(p *delaydv1.Task) Task {
	if p == nil {
		return Task{}
	}
	return Task{
		Namespace:     p.GetNamespace(),
		ID:            p.GetId(),
		Kind:          p.GetKind(),
		Payload:       p.GetPayload(),
		DueTime:       timeFromProto(p.GetDueTime()),
		State:         State(p.GetState()),
		Attempt:       p.GetAttempt(),
		Generation:    p.GetGeneration(),
		CreateTime:    timeFromProto(p.GetCreateTime()),
		UpdateTime:    timeFromProto(p.GetUpdateTime()),
		LastError:     p.GetLastError(),
		LeaseDeadline: timeFromProto(p.GetLeaseDeadline()),
		DeadTime:      timeFromProto(p.GetDeadTime()),
		TraceParent:   p.GetTraceparent(),
		Incarnation:   p.GetIncarnation(),
	}
}

func timeFromProto(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
