package client

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"time"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// TaskEvent is one thing that happened to a task (GetTaskHistory). Fields
// its kind does not carry are zero.
type TaskEvent struct {
	// Kind: upserted, rescheduled, delivered, nacked, lease_expired,
	// dead_lettered, requeued, removed or acked.
	Kind string `json:"kind"`
	// Time is when, by the store's clock (the one due times use).
	Time time.Time `json:"time"`
	// KeyID is the id of the API key that made the call (never its
	// secret); empty for the server's own moves.
	KeyID string `json:"key_id,omitempty"`
	// Generation is the task's generation after the event.
	Generation int64 `json:"generation,omitempty"`
	// Due is the due time the event set.
	Due time.Time `json:"due_time,omitzero"`
	// Attempt is the delivery attempt the event is about.
	Attempt int32 `json:"attempt,omitempty"`
	// Replica is the replica that delivered the task.
	Replica string `json:"replica,omitempty"`
	// Lateness is how long after its due time a delivered task left the
	// store.
	Lateness time.Duration `json:"lateness,omitempty"`
	// Reason is a nack's reason, or "lease expired".
	Reason string `json:"reason,omitempty"`
	// RetryAfter is the delay a nack asked for (0: the backoff).
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Schedule and Slot, on the upserted event of a schedule's firing:
	// the schedule's id and the slot the task fires for.
	Schedule string    `json:"schedule_id,omitempty"`
	Slot     time.Time `json:"slot_time,omitzero"`
}

// ErrNoHistory is returned by History when the namespace keeps no history
// (its policy's HistoryRetentionBytes is 0).
var ErrNoHistory = fmt.Errorf("the namespace keeps no task history (set its policy's history_retention_bytes)")

// History iterates over the kept events of task id of ns, oldest first, one
// page call at a time; it works after the task is gone. An error ends the
// iteration after it is yielded (ErrNoHistory when ns keeps none).
func (c *Client) History(ctx context.Context, ns, id string) iter.Seq2[TaskEvent, error] {
	return func(yield func(TaskEvent, error) bool) {
		token := ""
		for {
			resp, err := c.tasks.GetTaskHistory(ctx, &delaydv1.GetTaskHistoryRequest{Namespace: ns, Id: id, PageToken: token})
			if err != nil {
				yield(TaskEvent{}, fmt.Errorf("delayd task history %s %s: %w", ns, id, err))
				return
			}
			if !resp.GetHistoryEnabled() {
				yield(TaskEvent{}, ErrNoHistory)
				return
			}
			for _, e := range resp.GetEvents() {
				if !yield(eventFromProto(e), nil) {
					return
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				return
			}
		}
	}
}

// eventFromProto is the SDK's form of a wire event.
func eventFromProto(e *delaydv1.TaskEvent) TaskEvent {
	out := TaskEvent{
		Kind:       strings.ToLower(strings.TrimPrefix(e.GetKind().String(), "TASK_EVENT_KIND_")),
		KeyID:      e.GetKeyId(),
		Generation: e.GetGeneration(),
		Attempt:    e.GetAttempt(),
		Replica:    e.GetReplica(),
		Lateness:   e.GetLateness().AsDuration(),
		Reason:     e.GetReason(),
		RetryAfter: e.GetRetryAfter().AsDuration(),
	}
	if e.GetTime() != nil {
		out.Time = e.GetTime().AsTime()
	}
	if e.GetDueTime() != nil {
		out.Due = e.GetDueTime().AsTime()
	}
	if e.GetSlotTime() != nil {
		out.Slot = e.GetSlotTime().AsTime()
	}
	out.Schedule = e.GetScheduleId()
	return out
}
