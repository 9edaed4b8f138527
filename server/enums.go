package server

import (
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// The enumerations that cross the edge are converted here, by name, never by
// a cast that relies on storage's numbers matching the proto's. A value
// without a counterpart becomes UNSPECIFIED (to the wire) or is reported as
// not ok (from the wire); enums_test.go checks every value both ways.

// stateToProto is a task state's wire form.
func stateToProto(s storage.State) delaydv1.TaskState {
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

// scopeToProto is a key scope's wire form.
func scopeToProto(s storage.Scope) delaydv1.KeyScope {
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

// scopeFromProto is the key scope a wire scope names; ok is false for
// UNSPECIFIED and unknown values.
func scopeFromProto(s delaydv1.KeyScope) (_ storage.Scope, ok bool) {
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

// tokenStatusToProto is a per-token answer's wire form.
func tokenStatusToProto(s storage.TokenStatus) delaydv1.TokenStatus {
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

// eventKindToProto is a task event kind's wire form.
func eventKindToProto(k storage.EventKind) delaydv1.TaskEventKind {
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
