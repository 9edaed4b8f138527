package client

import (
	"context"
	"fmt"
	"iter"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// MaxBatch is the most tasks BatchUpsert sends in one BatchUpsertTasks call
// (the server's default limit); longer slices are sent in several calls.
const MaxBatch = 1000

// UpsertResult is the stored task after an upsert.
type UpsertResult struct {
	// Task as stored: state StateScheduled, Generation bumped.
	Task Task
	// Created is true when the task did not exist before.
	Created bool
}

// Upsert creates the task spec names in namespace ns, or replaces it: new due
// time, kind and payload. Replacing bumps the task's generation and puts it
// back to StateScheduled even when it is delivered or dead, so a delivery
// made before the upsert can no longer ack or nack it (the ack answers
// STALE). Upsert is idempotent by (ns, spec.ID) and retried on Unavailable.
//
// Concurrent Upsert calls are coalesced into BatchUpsertTasks calls unless
// batching is off (see [BatchSettings]: on by default, with no linger); each
// still gets its own result and error, and calls for one id keep their
// order. A delay (After) is resolved by delayd when the call reaches it.
//
// Upsert is how a deadline is renewed: a device heartbeat that upserts
// "device-7 offline" After(30 s) pushes the same task 30 s further each time.
func (c *Client) Upsert(ctx context.Context, ns string, spec TaskSpec) (*UpsertResult, error) {
	if err := checkSpec(spec); err != nil {
		return nil, fmt.Errorf("delayd upsert %s/%s: %w", ns, spec.ID, err)
	}
	if c.pub != nil {
		r, err := c.pub.upsert(ctx, ns, spec.proto(""))
		if err != nil {
			return nil, fmt.Errorf("delayd upsert %s/%s: %w", ns, spec.ID, err)
		}
		return r, nil
	}
	resp, err := c.tasks.UpsertTask(ctx, spec.proto(ns))
	if err != nil {
		return nil, fmt.Errorf("delayd upsert %s/%s: %w", ns, spec.ID, err)
	}
	return &UpsertResult{Task: taskFromProto(resp.GetTask()), Created: resp.GetCreated()}, nil
}

// BatchResult is the outcome of one item of BatchUpsert.
type BatchResult struct {
	// Task as stored. When Err is set: the existing task for AlreadyExists
	// (CreateOnly), the current one for FailedPrecondition (IfGeneration;
	// zero when there is none), zero otherwise.
	Task Task
	// Created is true when the task did not exist before.
	Created bool
	// Err is set when this item failed (a gRPC status error:
	// InvalidArgument, ResourceExhausted...); the other items are not
	// affected.
	Err error
}

// BatchUpsert upserts many tasks of namespace ns and answers per item, in
// spec order. It sends MaxBatch tasks per call, so a long slice costs several
// round trips. An item that is malformed fails alone (its BatchResult.Err);
// the returned error is set only when a whole call failed, and then the
// results hold the items of the calls that went through before it (upserts
// are idempotent: retrying the whole slice is safe).
func (c *Client) BatchUpsert(ctx context.Context, ns string, specs []TaskSpec) ([]BatchResult, error) {
	out := make([]BatchResult, 0, len(specs))
	for start := 0; start < len(specs); start += MaxBatch {
		chunk := specs[start:min(start+MaxBatch, len(specs))]
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: make([]*delaydv1.UpsertTaskRequest, len(chunk))}
		for i, s := range chunk {
			req.Tasks[i] = s.proto("")
		}
		resp, err := c.tasks.BatchUpsertTasks(ctx, req)
		if err != nil {
			return out, fmt.Errorf("delayd batch upsert %s (items %d-%d): %w", ns, start, start+len(chunk)-1, err)
		}
		if len(resp.GetResults()) != len(chunk) {
			return out, fmt.Errorf("delayd batch upsert %s: %w", ns,
				status.Errorf(codes.Internal, "server answered %d results for %d items", len(resp.GetResults()), len(chunk)))
		}
		for i, r := range resp.GetResults() {
			br := BatchResult{Created: r.GetCreated(), Task: taskFromProto(r.GetTask())}
			if e := r.GetError(); e != nil {
				br.Err = itemError(e, r.GetTask(), Version{Generation: chunk[i].IfGeneration, Incarnation: chunk[i].IfIncarnation})
			}
			out = append(out, br)
		}
	}
	return out, nil
}

// RemoveResult says what Remove removed.
type RemoveResult struct {
	// Removed is false when there was no such task (never created, already
	// acked, removed or purged). That is not an error.
	Removed bool
	// PreviousState is the state the task was in; StateDelivered means a
	// delivery was in flight and may still reach a subscriber (its ack will
	// answer NOT_FOUND).
	PreviousState State
}

// Remove cancels task id of namespace ns in any state. After it returns the
// task is never delivered again, except a delivery already in flight. It is
// idempotent and retried on Unavailable (so a retried call may report
// Removed false for a task its first attempt removed).
func (c *Client) Remove(ctx context.Context, ns, id string) (RemoveResult, error) {
	return c.remove(ctx, ns, id, Version{})
}

// RemoveIf cancels task id of namespace ns only if its stored version is
// still v (usually the Task.Version() you read): the generation, and the
// incarnation unless v.Incarnation is 0. When another write changed it
// meanwhile (a renewal racing a return bumps the generation; a remove and
// a re-create make a new incarnation), nothing is removed and the error has
// code FailedPrecondition; [ConflictOf] gives what is stored, so the caller
// can read again and decide. A task that does not exist is Removed false,
// as with Remove. v.Generation must be at least 1.
func (c *Client) RemoveIf(ctx context.Context, ns, id string, v Version) (RemoveResult, error) {
	if v.Generation < 1 || v.Incarnation < 0 {
		return RemoveResult{}, fmt.Errorf("delayd remove %s/%s: %w", ns, id,
			status.Errorf(codes.InvalidArgument, "version %+v: the generation last read (1 or more) is required", v))
	}
	return c.remove(ctx, ns, id, v)
}

func (c *Client) remove(ctx context.Context, ns, id string, v Version) (RemoveResult, error) {
	req := &delaydv1.RemoveTaskRequest{Namespace: ns, Id: id, IfGeneration: v.Generation, IfIncarnation: v.Incarnation}
	if c.pub != nil {
		r, err := c.pub.remove(ctx, req)
		if err != nil {
			return RemoveResult{}, fmt.Errorf("delayd remove %s/%s: %w", ns, id, err)
		}
		return r, nil
	}
	resp, err := c.tasks.RemoveTask(ctx, req)
	if err != nil {
		return RemoveResult{}, fmt.Errorf("delayd remove %s/%s: %w", ns, id, err)
	}
	return RemoveResult{Removed: resp.GetRemoved(), PreviousState: State(resp.GetPreviousState())}, nil
}

// TaskFilter selects the tasks RemoveMatching removes. Set fields must all
// match; at least one must be set.
type TaskFilter struct {
	// Kind, if set, is the tasks' kind (exact match).
	Kind string
	// IDPrefix, if set, is how the tasks' ids start.
	IDPrefix string
	// State, if set, is the tasks' state; StateUnspecified means any.
	State State
}

// RemoveIDs cancels the named tasks of namespace ns, in calls of MaxBatch
// ids, and returns how many existed and were removed. On an error, the
// count is what the calls before it removed (removing again is harmless).
func (c *Client) RemoveIDs(ctx context.Context, ns string, ids []string) (int64, error) {
	var n int64
	for start := 0; start < len(ids); start += MaxBatch {
		resp, err := c.tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: ns, Ids: ids[start:min(start+MaxBatch, len(ids))]})
		if err != nil {
			return n, fmt.Errorf("delayd remove tasks %s: %w", ns, err)
		}
		n += resp.GetRemoved()
	}
	return n, nil
}

// RemoveMatching cancels every task of namespace ns that f selects and
// returns how many it removed. The server walks the tasks in bounded pages
// (at most 1,000 examined per call, each call with its own timeout);
// RemoveMatching calls until the walk is done. Tasks created or
// rescheduled while it runs may be missed: call it again to be sure. On an
// error, the count is what the calls before it removed; calling again
// starts over, which is harmless.
func (c *Client) RemoveMatching(ctx context.Context, ns string, f TaskFilter) (int64, error) {
	req := &delaydv1.RemoveTasksRequest{Namespace: ns, Filter: &delaydv1.TaskFilter{
		Kind: f.Kind, IdPrefix: f.IDPrefix, State: delaydv1.TaskState(f.State)}}
	var n int64
	for {
		resp, err := c.tasks.RemoveTasks(ctx, req)
		if err != nil {
			return n, fmt.Errorf("delayd remove tasks %s: %w", ns, err)
		}
		n += resp.GetRemoved()
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return n, nil
		}
	}
}

// Get returns task id of namespace ns. A task that does not exist (acked,
// removed, purged, never created) is an error with code NotFound.
func (c *Client) Get(ctx context.Context, ns, id string) (*Task, error) {
	resp, err := c.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: id})
	if err != nil {
		return nil, fmt.Errorf("delayd get %s/%s: %w", ns, id, err)
	}
	t := taskFromProto(resp.GetTask())
	return &t, nil
}

// Page is one page of ListPage.
type Page struct {
	// Tasks of the requested state in that state's order: scheduled by due
	// time, delivered by lease deadline, dead by time of death.
	Tasks []Task
	// NextPageToken fetches the next page; empty on the last page.
	NextPageToken string
}

// ListOptions selects what ListPage and List return.
type ListOptions struct {
	// State to list. If unset, StateScheduled.
	State State
	// PageSize is the most tasks per page: 1-1,000. If zero, 100. A page
	// may hold fewer and still have a NextPageToken: the server also cuts
	// pages by bytes (its --max-list-bytes, 1 MiB by default).
	PageSize int32
	// PageToken is a previous Page's NextPageToken; empty for the first page.
	// Only valid with the same namespace and State.
	PageToken string
	// NoPayload leaves the tasks' payloads out (TASK_VIEW_BASIC), so a page
	// of large tasks costs less and holds more. If false, payloads are
	// included.
	NoPayload bool
}

// ListPage returns one page of the tasks of namespace ns in one state.
func (c *Client) ListPage(ctx context.Context, ns string, opts ListOptions) (*Page, error) {
	resp, err := c.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{
		Namespace: ns,
		State:     delaydv1.TaskState(opts.State),
		PageSize:  opts.PageSize,
		PageToken: opts.PageToken,
		View:      listView(opts.NoPayload),
	})
	if err != nil {
		return nil, fmt.Errorf("delayd list %s %s: %w", ns, opts.State, err)
	}
	p := &Page{Tasks: make([]Task, len(resp.GetTasks())), NextPageToken: resp.GetNextPageToken()}
	for i, t := range resp.GetTasks() {
		p.Tasks[i] = taskFromProto(t)
	}
	return p, nil
}

// listView is the view of a listing that leaves payloads out or not.
func listView(noPayload bool) delaydv1.TaskView {
	if noPayload {
		return delaydv1.TaskView_TASK_VIEW_BASIC
	}
	return delaydv1.TaskView_TASK_VIEW_FULL
}

// List iterates over every task of namespace ns in state opts.State, fetching
// pages of opts.PageSize as it goes (opts.PageToken, if set, is where it
// starts). Each page is one call with its own timeout. An error ends the
// iteration after it is yielded. Tasks that change state while the
// iteration runs may be missed or seen twice.
//
//	for t, err := range c.List(ctx, "orders", client.ListOptions{State: client.StateDead}) {
//		if err != nil { return err }
//		fmt.Println(t.ID, t.LastError)
//	}
func (c *Client) List(ctx context.Context, ns string, opts ListOptions) iter.Seq2[Task, error] {
	return func(yield func(Task, error) bool) {
		for {
			p, err := c.ListPage(ctx, ns, opts)
			if err != nil {
				yield(Task{}, err)
				return
			}
			for _, t := range p.Tasks {
				if !yield(t, nil) {
					return
				}
			}
			if p.NextPageToken == "" {
				return
			}
			opts.PageToken = p.NextPageToken
		}
	}
}

// checkSpec catches what only the client can see: a missing due time (the
// zero When), and a negative delay. Everything else is the server's to judge.
func checkSpec(s TaskSpec) error {
	if !s.When.set {
		return status.Error(codes.InvalidArgument, "when: is required: use client.At(t) or client.After(d)")
	}
	if s.When.at.IsZero() && s.When.delay < 0 {
		return status.Errorf(codes.InvalidArgument, "when: delay %v is negative; use 0 for due now", s.When.delay)
	}
	return nil
}
