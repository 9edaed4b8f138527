// Package wire converts between delayd's domain types (storage) and their
// protobuf form (gen/delayd/v1) where both edges and the error mapping
// need the same answer: tasks, times and the enumerations.
package wire

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// The enumerations that cross the edge are converted here, by name, never by
// a cast that relies on storage's numbers matching the proto's. A value
// without a counterpart becomes UNSPECIFIED (to the wire) or is reported as
// not ok (from the wire); wire_test.go checks every value both ways.

// State is a task state's wire form.
func State(s storage.State) delaydv1.TaskState {
	switch s {
	case storage.StateScheduled:
		return delaydv1.TaskState_TASK_STATE_SCHEDULED
	case storage.StateDelivered:
		return delaydv1.TaskState_TASK_STATE_DELIVERED
	case storage.StateDead:
		return delaydv1.TaskState_TASK_STATE_DEAD
	}
	return delaydv1.TaskState_TASK_STATE_UNSPECIFIED
}

// Scope is a key scope's wire form.
func Scope(s storage.Scope) delaydv1.KeyScope {
	switch s {
	case storage.ScopeProduce:
		return delaydv1.KeyScope_KEY_SCOPE_PRODUCE
	case storage.ScopeConsume:
		return delaydv1.KeyScope_KEY_SCOPE_CONSUME
	case storage.ScopeAdmin:
		return delaydv1.KeyScope_KEY_SCOPE_ADMIN
	}
	return delaydv1.KeyScope_KEY_SCOPE_UNSPECIFIED
}

// ScopeFrom is the key scope a wire scope names; ok is false for
// UNSPECIFIED and unknown values.
func ScopeFrom(s delaydv1.KeyScope) (_ storage.Scope, ok bool) {
	switch s {
	case delaydv1.KeyScope_KEY_SCOPE_PRODUCE:
		return storage.ScopeProduce, true
	case delaydv1.KeyScope_KEY_SCOPE_CONSUME:
		return storage.ScopeConsume, true
	case delaydv1.KeyScope_KEY_SCOPE_ADMIN:
		return storage.ScopeAdmin, true
	}
	return storage.ScopeUnspecified, false
}

// TokenStatus is a per-token answer's wire form.
func TokenStatus(s storage.TokenStatus) delaydv1.TokenStatus {
	switch s {
	case storage.TokenOK:
		return delaydv1.TokenStatus_TOKEN_STATUS_OK
	case storage.TokenStale:
		return delaydv1.TokenStatus_TOKEN_STATUS_STALE
	case storage.TokenNotFound:
		return delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND
	}
	return delaydv1.TokenStatus_TOKEN_STATUS_UNSPECIFIED
}

// EventKind is a task event kind's wire form.
func EventKind(k storage.EventKind) delaydv1.TaskEventKind {
	switch k {
	case storage.EventUpserted:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_UPSERTED
	case storage.EventRescheduled:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_RESCHEDULED
	case storage.EventDelivered:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_DELIVERED
	case storage.EventNacked:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_NACKED
	case storage.EventLeaseExpired:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_LEASE_EXPIRED
	case storage.EventDeadLettered:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_DEAD_LETTERED
	case storage.EventRequeued:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_REQUEUED
	case storage.EventRemoved:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_REMOVED
	case storage.EventAcked:
		return delaydv1.TaskEventKind_TASK_EVENT_KIND_ACKED
	}
	return delaydv1.TaskEventKind_TASK_EVENT_KIND_UNSPECIFIED
}

// Task converts a stored task to its wire form; zero times are left
// unset.
func Task(t storage.Task) *delaydv1.Task {
	return &delaydv1.Task{
		Namespace:     t.Namespace,
		Id:            t.ID,
		Kind:          t.Kind,
		Payload:       t.Payload,
		DueTime:       Time(t.DueTime),
		State:         State(t.State),
		Attempt:       t.Attempt,
		Generation:    t.Generation,
		CreateTime:    Time(t.CreateTime),
		UpdateTime:    Time(t.UpdateTime),
		LastError:     t.LastError,
		LeaseDeadline: Time(t.LeaseDeadline),
		DeadTime:      Time(t.DeadTime),
		Traceparent:   t.TraceParent,
		Incarnation:   t.Incarnation,
	}
}

func Time(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
