package guard

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
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// quotaCountTTL is how long a namespace's task count is trusted before the
// quota check counts again.
const quotaCountTTL = time.Second

// quotaRecountWait bounds how long the call that counts a namespace again
// waits for the store; past it, that call too goes on with the last count.
// The first count of a namespace has no last count to fall back on and
// waits as long as its caller allows.
const quotaRecountWait = 250 * time.Millisecond

// pendingQuota enforces policy.max_pending_tasks on UpsertTask and
// BatchUpsertTasks, cheaply: it counts a namespace's tasks (all states) with
// Counter.Stats at most once per quotaCountTTL and adds the tasks this
// replica created since. While the store cannot count (Redis down or hung)
// the last count is kept, and once one count succeeded no call waits for
// another call's count, and the call that counts again waits at most
// quotaRecountWait: a hung index does not hold upserts, which durable mode
// can take without it. Upserts that would take the estimate past the
// quota are refused with ResourceExhausted, except replacements of tasks
// that exist (checked with Get only when the namespace is at its quota).
//
// On one replica the quota holds exactly under concurrency: an upsert
// reserves room for the tasks it may create before it writes (every item
// counted as new unless the namespace is at its quota, then only those that
// do not exist), and concurrent upserts see each other's reservations. With
// several replicas a namespace may overshoot by what the other replicas
// created within one count interval; it never stays over, since every later
// upsert of a new task is refused until the count drops.
type pendingQuota struct {
	policies policyLookup
	counter  storage.Counter
	tasks    storage.Tasks
	logger   *slog.Logger
	now      func() time.Time

	mu       sync.Mutex
	counts   map[string]*quotaCount
	reserved map[string]int64 // room held by upserts in progress, by namespace
}

type quotaCount struct {
	total   int64     // tasks counted at `at`, plus created since
	at      time.Time // when counted
	loading chan struct{}
}

func newPendingQuota(opts Config) *pendingQuota {
	return &pendingQuota{
		policies: opts.Tenancy,
		counter:  opts.Store,
		tasks:    opts.Store,
		logger:   opts.Logger,
		now:      opts.Clock.Now,
		counts:   make(map[string]*quotaCount),
		reserved: make(map[string]int64),
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
		if c != nil && c.loading != nil && !c.at.IsZero() {
			// Another call is counting: use the last count (plus what
			// this replica created since) rather than wait for a store
			// that may hang for its whole timeout.
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
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if !c.at.IsZero() {
			sctx, cancel = context.WithTimeout(ctx, quotaRecountWait)
		}
		st, err := q.counter.Stats(sctx, ns)
		cancel()

		q.mu.Lock()
		close(c.loading)
		c.loading = nil
		if err != nil {
			if c.at.IsZero() {
				delete(q.counts, ns)
				q.mu.Unlock()
				return 0, err
			}
			// The store cannot count now (Redis down or hung): keep using
			// the last count, plus what this replica created since, and
			// count again after another quotaCountTTL. The quota may then
			// overshoot by what other replicas create meanwhile.
			c.at = at
			n := c.total
			q.mu.Unlock()
			q.logger.LogAttrs(ctx, slog.LevelWarn, "quota: cannot count the namespace's tasks; using the last count",
				slog.String("namespace", ns), slog.Int64("count", n), slog.String("error", err.Error()))
			return n, nil
		}
		c.total = st.Scheduled + st.Delivered + st.Dead
		c.at = at
		n := c.total
		q.mu.Unlock()
		return n, nil
	}
}

// reserve holds room for n new tasks of ns if the estimate, the room held
// by upserts in progress and n fit in quota. have is the estimate it used.
func (q *pendingQuota) reserve(ctx context.Context, ns string, n, quota int64) (ok bool, have int64, err error) {
	have, err = q.estimate(ctx, ns)
	if err != nil {
		return false, 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if have+q.reserved[ns]+n > quota {
		return false, have + q.reserved[ns], nil
	}
	q.reserved[ns] += n
	return true, have, nil
}

// release gives back room reserved for ns and counts the tasks created.
func (q *pendingQuota) release(ns string, reserved, created int64) {
	q.mu.Lock()
	if reserved > 0 {
		if q.reserved[ns] -= reserved; q.reserved[ns] <= 0 {
			delete(q.reserved, ns)
		}
	}
	if c := q.counts[ns]; c != nil {
		c.total += created
	}
	q.mu.Unlock()
}

// check reserves room for an upsert of ids into ns, or refuses one that
// would take it past its quota. The caller releases what it reserved.
func (q *pendingQuota) check(ctx context.Context, ns string, ids []string) (reserved int64, _ error) {
	pol, ok, err := limitPolicy(ctx, q.policies, ns)
	if err != nil {
		return 0, rpcerr.ToStatus(ctx, q.logger, fmt.Errorf("quota: %w", err))
	}
	if !ok || pol.MaxPendingTasks <= 0 || len(ids) == 0 {
		return 0, nil
	}
	fits, have, err := q.reserve(ctx, ns, int64(len(ids)), pol.MaxPendingTasks)
	if err != nil {
		return 0, rpcerr.ToStatus(ctx, q.logger, fmt.Errorf("quota: count: %w", err))
	}
	if fits {
		return int64(len(ids)), nil
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
			return 0, rpcerr.ToStatus(ctx, q.logger, fmt.Errorf("quota: get: %w", err))
		}
		if have+fresh > pol.MaxPendingTasks {
			return 0, errQuotaFull(ns, have, pol.MaxPendingTasks)
		}
	}
	if fresh == 0 {
		return 0, nil
	}
	fits, have, err = q.reserve(ctx, ns, fresh, pol.MaxPendingTasks)
	if err != nil {
		return 0, rpcerr.ToStatus(ctx, q.logger, fmt.Errorf("quota: count: %w", err))
	}
	if !fits {
		return 0, errQuotaFull(ns, have, pol.MaxPendingTasks)
	}
	return fresh, nil
}

func errQuotaFull(ns string, have, quota int64) error {
	return status.Errorf(codes.ResourceExhausted,
		"namespace %q is at its task quota: it holds about %d tasks and policy.max_pending_tasks is %d; ack, remove or purge tasks, or raise the quota",
		ns, have, quota)
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
	reserved, err := q.check(ctx, ns, ids)
	if err != nil {
		return nil, err
	}
	resp, err := handler(ctx, req)
	var created int64
	switch r := resp.(type) {
	case *delaydv1.UpsertTaskResponse:
		if r.GetCreated() {
			created = 1
		}
	case *delaydv1.BatchUpsertTasksResponse:
		for _, res := range r.GetResults() {
			if res.GetCreated() {
				created++
			}
		}
	}
	q.release(ns, reserved, created)
	return resp, err
}
