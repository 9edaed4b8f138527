package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/tenancy"
)

// taskService implements delaydv1.TaskServiceServer over a storage.Tasks.
// It validates every request before the store sees it, asks the namespace's
// policy for payload and horizon limits, and tells the dispatcher when an
// upsert put an earlier task at the head of a namespace.
type taskService struct {
	delaydv1.UnimplementedTaskServiceServer

	tasks      storage.Tasks
	history    storage.History
	tenancy    Tenancy
	subs       Subscriptions
	logger     *slog.Logger
	maxBatch   int
	maxPayload int // most payload bytes of one batch, in total
	maxList    int // most bytes of one list page
	now        func() time.Time
}

func newTaskService(opts Options) *taskService {
	return &taskService{
		tasks:      opts.Store,
		history:    opts.History,
		tenancy:    opts.Tenancy,
		subs:       opts.Subscriptions,
		logger:     opts.Logger,
		maxBatch:   opts.Limits.MaxBatch,
		maxPayload: opts.Limits.MaxBatchPayloadBytes,
		maxList:    opts.Limits.MaxListBytes,
		now:        opts.Clock.Now,
	}
}

// UpsertTask creates or replaces one task.
func (s *taskService) UpsertTask(ctx context.Context, req *delaydv1.UpsertTaskRequest) (*delaydv1.UpsertTaskResponse, error) {
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	n, err := s.namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	if err := s.keyStillValid(ctx); err != nil {
		return nil, err
	}
	spec, err := upsertSpec("", req, "", n.Policy, s.now())
	spec.TraceParent = traceParent(ctx)
	spec.NamespaceIncarnation = n.Incarnation()
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	results, err := s.tasks.Upsert(ctx, ns, []storage.UpsertSpec{spec})
	if err != nil {
		return nil, s.upsertFailed(ctx, ns, fmt.Errorf("upsert: %w", err))
	}
	if len(results) != 1 {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("upsert: store returned %d results for 1 spec", len(results)))
	}
	r := results[0]
	if err := r.Conflict(spec); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if r.Earliest {
		s.notify(ns)
	}
	return &delaydv1.UpsertTaskResponse{Task: wire.Task(r.Task), Created: r.Created}, nil
}

// BatchUpsertTasks validates every item, upserts the valid ones in one store
// call and answers per item in request order. An invalid item fails only
// itself; the call fails as a whole only when the namespace or the batch
// size is invalid or the store call fails.
func (s *taskService) BatchUpsertTasks(ctx context.Context, req *delaydv1.BatchUpsertTasksRequest) (*delaydv1.BatchUpsertTasksResponse, error) {
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	items := req.GetTasks()
	if err := validateBatchSize("tasks", len(items), s.maxBatch); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	if err := validateBatchPayload(items, s.maxPayload); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	n, err := s.namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	if err := s.keyStillValid(ctx); err != nil {
		return nil, err
	}
	pol, inc := n.Policy, n.Incarnation()

	out := make([]*delaydv1.BatchUpsertTaskResult, len(items))
	specs := make([]storage.UpsertSpec, 0, len(items))
	tp := traceParent(ctx)
	index := make([]int, 0, len(items)) // index[k] is the item specs[k] came from
	now := s.now()
	for i, item := range items {
		spec, err := upsertSpec(fmt.Sprintf("tasks[%d].", i), item, ns, pol, now)
		if err != nil {
			st, _ := status.FromError(rpcerr.ToStatus(ctx, s.logger, err))
			out[i] = &delaydv1.BatchUpsertTaskResult{Error: &delaydv1.ItemError{Code: int32(st.Code()), Message: st.Message()}}
			continue
		}
		spec.TraceParent = tp
		spec.NamespaceIncarnation = inc
		specs = append(specs, spec)
		index = append(index, i)
	}
	if len(specs) > 0 {
		results, err := s.tasks.Upsert(ctx, ns, specs)
		if err != nil {
			return nil, s.upsertFailed(ctx, ns, fmt.Errorf("batch upsert: %w", err))
		}
		if len(results) != len(specs) {
			return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("batch upsert: store returned %d results for %d specs", len(results), len(specs)))
		}
		earliest := false
		for k, r := range results {
			if err := r.Conflict(specs[k]); err != nil {
				// A failed condition: the item's error, with the task as
				// stored (none when there is none).
				st, _ := status.FromError(rpcerr.ToStatus(ctx, s.logger, err))
				res := &delaydv1.BatchUpsertTaskResult{Error: &delaydv1.ItemError{Code: int32(st.Code()), Message: st.Message()}}
				if r.Task.ID != "" {
					res.Task = wire.Task(r.Task)
				}
				out[index[k]] = res
				continue
			}
			out[index[k]] = &delaydv1.BatchUpsertTaskResult{Task: wire.Task(r.Task), Created: r.Created}
			earliest = earliest || r.Earliest
		}
		if earliest {
			s.notify(ns)
		}
	}
	return &delaydv1.BatchUpsertTasksResponse{Results: out}, nil
}

// RemoveTask deletes a task in any state; a missing task is removed=false.
// With if_generation, a task at another generation is FailedPrecondition.
func (s *taskService) RemoveTask(ctx context.Context, req *delaydv1.RemoveTaskRequest) (*delaydv1.RemoveTaskResponse, error) {
	ns, id := req.GetNamespace(), req.GetId()
	if err := validateNamespaceAndID(ns, id); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	ifVersion, err := ifVersionOf("", req.GetIfGeneration(), req.GetIfIncarnation())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	prev, err := s.tasks.Remove(ctx, ns, id, ifVersion)
	if errors.Is(err, storage.ErrNotFound) {
		return &delaydv1.RemoveTaskResponse{}, nil
	}
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("remove: %w", err))
	}
	return &delaydv1.RemoveTaskResponse{Removed: true, PreviousState: wire.State(prev)}, nil
}

// RemoveTasks deletes the named tasks, or one bounded page of the tasks a
// filter selects, and answers how many it deleted.
func (s *taskService) RemoveTasks(ctx context.Context, req *delaydv1.RemoveTasksRequest) (*delaydv1.RemoveTasksResponse, error) {
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	p, err := removeTasksParams(req)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	res, err := s.tasks.RemoveTasks(ctx, ns, p)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("remove tasks: %w", err))
	}
	resp := &delaydv1.RemoveTasksResponse{Removed: res.Removed, NextPageToken: encodeRemoveToken(ns, p.Filter, res.Next)}
	if len(p.IDs) > 0 {
		if len(res.States) != len(p.IDs) {
			return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("remove tasks: the store answered %d states for %d ids", len(res.States), len(p.IDs)))
		}
		resp.Results = make([]*delaydv1.RemoveTaskResult, len(p.IDs))
		for i, id := range p.IDs {
			st := res.States[i]
			resp.Results[i] = &delaydv1.RemoveTaskResult{Id: id, Removed: st != storage.StateUnspecified, PreviousState: wire.State(st)}
		}
	}
	return resp, nil
}

// GetTask returns one task or NotFound.
func (s *taskService) GetTask(ctx context.Context, req *delaydv1.GetTaskRequest) (*delaydv1.GetTaskResponse, error) {
	ns, id := req.GetNamespace(), req.GetId()
	if err := validateNamespaceAndID(ns, id); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	t, err := s.tasks.Get(ctx, ns, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "task %q not found in namespace %q", id, ns)
	}
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("get: %w", err))
	}
	return &delaydv1.GetTaskResponse{Task: wire.Task(t)}, nil
}

// ListTasks returns one page of the tasks of one state.
func (s *taskService) ListTasks(ctx context.Context, req *delaydv1.ListTasksRequest) (*delaydv1.ListTasksResponse, error) {
	ns := req.GetNamespace()
	if err := validateNamespace("namespace", ns); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	state, err := listState(req.GetState())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	cursor, err := decodePageToken(req.GetPageToken(), ns, state)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	noPayload, err := taskView(req.GetView())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	tasks, next, err := s.tasks.List(ctx, ns, storage.ListParams{
		State: state, Limit: size, Cursor: cursor, MaxBytes: s.maxList, NoPayload: noPayload,
	})
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("list: %w", err))
	}
	resp := &delaydv1.ListTasksResponse{
		Tasks:         make([]*delaydv1.Task, len(tasks)),
		NextPageToken: encodePageToken(ns, state, next),
	}
	for i, t := range tasks {
		resp.Tasks[i] = wire.Task(t)
	}
	return resp, nil
}

// namespace returns the namespace (its effective policy and its create
// time, the incarnation upserts are written for), creating it when the
// registry auto-creates, or a status error to return as is.
func (s *taskService) namespace(ctx context.Context, ns string) (storage.Namespace, error) {
	n, err := s.tenancy.Namespace(ctx, ns, true)
	if _, err := policyStatus(ctx, s.logger, ns, n.Policy, err); err != nil {
		return storage.Namespace{}, err
	}
	return n, nil
}

// keyStillValid re-reads the request's API key, when it is a namespace's
// own, after the namespace was looked up for a write: a lookup that found
// the namespace deleted or re-created has dropped the old incarnation's
// keys from the cache, and a key deleted with its namespace must not write
// into a namespace re-created under the same name. A cache hit otherwise.
func (s *taskService) keyStillValid(ctx context.Context) error {
	p := guard.PrincipalFrom(ctx)
	if p == nil || p.Global() {
		return nil
	}
	_, err := s.tenancy.Key(ctx, p.KeyID)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, storage.ErrNotFound):
		return status.Errorf(codes.Unauthenticated, "API key %s was revoked (or deleted with its namespace)", p.KeyID)
	case errors.Is(err, tenancy.ErrTooManyKeyMisses):
		return guard.ErrKeyFlood
	}
	return rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("key: %w", err))
}

// upsertFailed answers a failed upsert. When the store refused it because
// the namespace incarnation the cache named has ended (the namespace was
// deleted on some replica), the cached namespace is dropped and the answer
// says whether the name is gone (NotFound) or was re-created meanwhile
// (Aborted: retrying writes into the new namespace, if the key may).
func (s *taskService) upsertFailed(ctx context.Context, ns string, err error) error {
	if !errors.Is(err, storage.ErrNamespaceEnded) {
		return rpcerr.ToStatus(ctx, s.logger, err)
	}
	s.tenancy.ForgetNamespace(ns)
	if _, lerr := s.tenancy.Namespace(ctx, ns, false); lerr == nil {
		return status.Errorf(codes.Aborted, "namespace %q was deleted and re-created while this request was in flight; nothing was written: retry", ns)
	}
	return status.Errorf(codes.NotFound, "namespace %q was deleted; nothing was written", ns)
}

func (s *taskService) notify(ns string) {
	s.subs.Notify(ns)
}

func validateNamespaceAndID(ns, id string) error {
	if err := validateNamespace("namespace", ns); err != nil {
		return err
	}
	return validateTaskID("id", id)
}

// traceParent returns the W3C traceparent of the span ctx carries (the
// OpenTelemetry server span of this call, when the server traces), or ""
// when there is none.
func traceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// GetTaskHistory pages through one task's events, oldest first.
func (s *taskService) GetTaskHistory(ctx context.Context, req *delaydv1.GetTaskHistoryRequest) (*delaydv1.GetTaskHistoryResponse, error) {
	ns, id := req.GetNamespace(), req.GetId()
	if err := validateNamespaceAndID(ns, id); err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	cursor, err := decodePageToken(req.GetPageToken(), historyTokenScope(ns, id), historyTokenState)
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, err)
	}
	// The namespace's incarnation names the history read: a namespace
	// re-created under a deleted one's name reads only its own.
	n, err := s.tenancy.Namespace(ctx, ns, false)
	pol, err := policyStatus(ctx, s.logger, ns, n.Policy, err)
	if err != nil {
		return nil, err
	}
	events, next, err := s.history.TaskHistory(ctx, ns, storage.HistoryParams{Incarnation: n.Incarnation(), ID: id, Limit: size, Cursor: cursor, MaxBytes: s.maxList})
	if errors.Is(err, storage.ErrInvalidCursor) {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("page_token", "is not a token this server issued; start again with an empty page_token"))
	}
	if err != nil {
		return nil, rpcerr.ToStatus(ctx, s.logger, fmt.Errorf("task history: %w", err))
	}
	resp := &delaydv1.GetTaskHistoryResponse{
		Events:         make([]*delaydv1.TaskEvent, len(events)),
		NextPageToken:  encodePageToken(historyTokenScope(ns, id), historyTokenState, next),
		HistoryEnabled: pol.HistoryRetentionBytes > 0,
	}
	for i, e := range events {
		resp.Events[i] = eventToProto(e)
	}
	return resp, nil
}
