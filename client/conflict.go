package client

import (
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Conflict is why a conditional write changed nothing.
type Conflict struct {
	// Exists is true for a CreateOnly upsert whose task already exists
	// (code AlreadyExists); false for an IfGeneration / RemoveIf whose
	// generation did not match (code FailedPrecondition).
	Exists bool
	// Generation and Incarnation are the stored task's; 0 when there is
	// no task.
	Generation  int64
	Incarnation int64
	// Expected is the generation the write required (IfGeneration,
	// RemoveIf); 0 for CreateOnly. ExpectedIncarnation is the incarnation
	// it required; 0 when it required none.
	Expected            int64
	ExpectedIncarnation int64
	// Task is the stored task; nil when there is none.
	Task *Task
}

// ConflictOf reports whether err (from Upsert, BatchUpsert's BatchResult.
// Err, Remove or RemoveIf) is a conditional write that changed nothing, and
// what is stored instead. It reads the google.rpc.ErrorInfo and the task
// delayd puts in the status details (see the TaskService documentation).
//
//	_, err := c.Upsert(ctx, "orders", client.TaskSpec{ID: id, When: client.After(15 * time.Minute), CreateOnly: true})
//	if cf, ok := client.ConflictOf(err); ok && cf.Exists {
//		err = nil // already scheduled, by an earlier try: its due time stays
//	}
func ConflictOf(err error) (*Conflict, bool) {
	st, ok := status.FromError(err)
	if !ok || (st.Code() != codes.AlreadyExists && st.Code() != codes.FailedPrecondition) {
		return nil, false
	}
	var cf *Conflict
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() != "delayd.v1" || (d.GetReason() != "TASK_EXISTS" && d.GetReason() != "GENERATION_MISMATCH") {
				continue
			}
			if cf == nil {
				cf = &Conflict{}
			}
			cf.Exists = d.GetReason() == "TASK_EXISTS"
			cf.Generation, _ = strconv.ParseInt(d.GetMetadata()["generation"], 10, 64)
			cf.Incarnation, _ = strconv.ParseInt(d.GetMetadata()["incarnation"], 10, 64)
			cf.Expected, _ = strconv.ParseInt(d.GetMetadata()["expected"], 10, 64)
			cf.ExpectedIncarnation, _ = strconv.ParseInt(d.GetMetadata()["expected_incarnation"], 10, 64)
		case *delaydv1.Task:
			if cf == nil {
				cf = &Conflict{}
			}
			t := taskFromProto(d)
			cf.Task = &t
		}
	}
	if cf == nil {
		return nil, false
	}
	return cf, true
}

// itemError is the error of one failed BatchUpsert item. For a failed
// condition (AlreadyExists, FailedPrecondition) it carries the details a
// single Upsert's error would, built from the item's task, so ConflictOf
// reads both alike.
func itemError(e *delaydv1.ItemError, task *delaydv1.Task, expected Version) error {
	st := status.New(codes.Code(e.GetCode()), e.GetMessage())
	var reason string
	switch st.Code() {
	case codes.AlreadyExists:
		reason = "TASK_EXISTS"
	case codes.FailedPrecondition:
		reason = "GENERATION_MISMATCH"
	default:
		return st.Err()
	}
	info := &errdetails.ErrorInfo{Domain: "delayd.v1", Reason: reason, Metadata: map[string]string{
		"generation":  strconv.FormatInt(task.GetGeneration(), 10),
		"incarnation": strconv.FormatInt(task.GetIncarnation(), 10),
	}}
	if reason == "GENERATION_MISMATCH" {
		info.Metadata["expected"] = strconv.FormatInt(expected.Generation, 10)
		if expected.Incarnation != 0 {
			info.Metadata["expected_incarnation"] = strconv.FormatInt(expected.Incarnation, 10)
		}
	}
	var ds *status.Status
	var err error
	if task != nil {
		ds, err = st.WithDetails(info, task)
	} else {
		ds, err = st.WithDetails(info)
	}
	if err != nil {
		return st.Err()
	}
	return ds.Err()
}
