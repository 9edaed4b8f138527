package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// quotaCountTTL is how long a namespace's task count is trusted before the
// quota check counts again.
const quotaCountTTL = time.Second

// pendingQuota enforces policy.max_pending_tasks on UpsertTask and
// BatchUpsertTasks, cheaply: it counts a namespace's tasks (all states) with
// Counter.Stats at most once per quotaCountTTL and adds the tasks this
// replica created since. Upserts that would take the estimate past the
// quota are refused with ResourceExhausted, except replacements of tasks
// that exist (checked with Get only when the namespace is at its quota).
//
// Under concurrency (several replicas, or requests racing between two
// counts) a namespace may overshoot its quota by what was created in that
// window; it never stays over, since every later upsert of a new task is
// refused until the count drops.
type pendingQuota struct {
	policies policyLookup
	counter  storage.Counter
	tasks    storage.Tasks
	logger   *slog.Logger
	now      func() time.Time

	mu     sync.Mutex
	counts map[string]*quotaCount
}

type quotaCount struct {
	total   int64     // tasks counted at `at`, plus created since
	at      time.Time // when counted
	loading chan struct{}
}

func newPendingQuota(opts Options) *pendingQuota {
	return &pendingQuota{
		policies: opts.Tenancy,
		counter:  opts.Store,
		tasks:    opts.Store,
		logger:   opts.Logger,
		now:      time.Now,
		counts:   make(map[string]*quotaCount),
	}
}

// estimate returns the namespace's task count, counting again when the last
// count is older than quotaCountTTL.
func (q *pendingQuota) estimate(ctx context.Context, ns string) (int64, error) {
	for {
		q.mu.Lock()
		c := q.counts[ns]
		if c != nil && c.loading == nil && q.now().Sub(c.at) < quotaCountTTL {
			n := c.total
			q.mu.Unlock()
			return n, nil
		}
		if c != nil && c.loading != nil {
			wait := c.loading
			q.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		if c == nil {
			c = &quotaCount{}
			q.counts[ns] = c
		}
		c.loading = make(chan struct{})
		q.mu.Unlock()

		at := q.now()
		st, err := q.counter.Stats(ctx, ns)

		q.mu.Lock()
		close(c.loading)
		c.loading = nil
		if err != nil {
			if c.at.IsZero() {
				delete(q.counts, ns)
			}
			q.mu.Unlock()
			return 0, err
		}
		c.total = st.Scheduled + st.Delivered + st.Dead
		c.at = at
		n := c.total
		q.mu.Unlock()
		return n, nil
	}
}

// created adds n tasks this replica created to the namespace's estimate.
func (q *pendingQuota) created(ns string, n int64) {
	if n == 0 {
		return
	}
	q.mu.Lock()
	if c := q.counts[ns]; c != nil {
		c.total += n
	}
	q.mu.Unlock()
}

// check refuses an upsert of ids into ns that would take it past its quota.
func (q *pendingQuota) check(ctx context.Context, ns string, ids []string) error {
	pol, ok, err := limitPolicy(ctx, q.policies, ns)
	if err != nil {
		return toStatus(ctx, q.logger, fmt.Errorf("quota: %w", err))
	}
	if !ok || pol.MaxPendingTasks <= 0 || len(ids) == 0 {
		return nil
	}
	have, err := q.estimate(ctx, ns)
	if err != nil {
		return toStatus(ctx, q.logger, fmt.Errorf("quota: count: %w", err))
	}
	if have+int64(len(ids)) <= pol.MaxPendingTasks {
		return nil
	}
	// At the quota: only tasks that are new count. Replacing a task that
	// exists does not grow the namespace.
	seen := make(map[string]bool, len(ids))
	var fresh int64
	for _, id := range ids {
		if seen[id] || storage.ValidateTaskID(id) != nil {
			continue // duplicates count once; invalid ids fail validation
		}
		seen[id] = true
		_, err := q.tasks.Get(ctx, ns, id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			fresh++
		case err != nil:
			return toStatus(ctx, q.logger, fmt.Errorf("quota: get: %w", err))
		}
		if have+fresh > pol.MaxPendingTasks {
			return status.Errorf(codes.ResourceExhausted,
				"namespace %q is at its task quota: it holds about %d tasks and policy.max_pending_tasks is %d; ack, remove or purge tasks, or raise the quota",
				ns, have, pol.MaxPendingTasks)
		}
	}
	return nil
}

func (q *pendingQuota) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var ns string
	var ids []string
	switch r := req.(type) {
	case *delaydv1.UpsertTaskRequest:
		ns, ids = r.GetNamespace(), []string{r.GetId()}
	case *delaydv1.BatchUpsertTasksRequest:
		ns = r.GetNamespace()
		ids = make([]string, len(r.GetTasks()))
		for i, t := range r.GetTasks() {
			ids[i] = t.GetId()
		}
	default:
		return handler(ctx, req)
	}
	if err := q.check(ctx, ns, ids); err != nil {
		return nil, err
	}
	resp, err := handler(ctx, req)
	switch r := resp.(type) {
	case *delaydv1.UpsertTaskResponse:
		if r.GetCreated() {
			q.created(ns, 1)
		}
	case *delaydv1.BatchUpsertTasksResponse:
		var n int64
		for _, res := range r.GetResults() {
			if res.GetCreated() {
				n++
			}
		}
		q.created(ns, n)
	}
	return resp, err
}
