package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayd/delayd/storage"
)

// Store operations, the values of the op label.
const (
	opUpsert = iota
	opRemove
	opGet
	opList
	opPop
	opAck
	opNack
	opExtend
	opReap
	opNextWake
	opRequeue
	opPurge
	opStats
	opDropNamespace
	opRemoveTasks
	opDueKinds
	numOps
)

var opNames = [numOps]string{"upsert", "remove", "get", "list", "pop", "ack", "nack", "extend", "reap", "next_wake", "requeue", "purge", "stats", "drop_namespace", "remove_tasks", "due_kinds"}

// instrumented times every call of a Store and counts what the calls did.
type instrumented struct {
	next storage.Store
	m    *Metrics
	dur  [numOps]prometheus.Observer
	errs [numOps]prometheus.Counter
}

// InstrumentStore returns s reporting to m: every call's duration in
// delayd_store_call_duration_seconds{store=name, op} and its failure in
// delayd_store_errors_total; and what the calls did in the task counters
// (upserted, removed, acked, nacked, leases expired, dead). name is the
// store label: "redis", or "mysql" for the durable store (whose calls
// include the Redis index write). Wrap the one store the server and the
// dispatcher share, so each event is counted once.
func (m *Metrics) InstrumentStore(name string, s storage.Store) storage.Store {
	in := &instrumented{next: s, m: m}
	for op := range numOps {
		in.dur[op] = m.storeDur.WithLabelValues(name, opNames[op])
		in.errs[op] = m.storeErr.WithLabelValues(name, opNames[op])
	}
	return in
}

// done records one call of op that started at start.
func (s *instrumented) done(op int, start time.Time, err error) {
	s.dur[op].Observe(time.Since(start).Seconds())
	if isFailure(err) {
		s.errs[op].Inc()
	}
}

// isFailure tells a store failure from a domain answer (not found, stale,
// quota, ...) and from the caller giving up.
func isFailure(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, storage.ErrNotFound),
		errors.Is(err, storage.ErrAlreadyExists),
		errors.Is(err, storage.ErrQuotaExceeded),
		errors.Is(err, storage.ErrNotEmpty),
		errors.Is(err, storage.ErrStale),
		errors.Is(err, storage.ErrGenerationMismatch),
		errors.Is(err, context.Canceled):
		return false
	}
	return true
}

func (s *instrumented) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	start := time.Now()
	res, err := s.next.Upsert(ctx, ns, specs)
	s.done(opUpsert, start, err)
	n := 0
	for i := range res {
		if !res[i].Stale && res[i].Refused == storage.NotRefused {
			n++
		}
	}
	if n > 0 {
		s.m.ns(ns).upserted.Add(float64(n))
	}
	return res, err
}

func (s *instrumented) Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	start := time.Now()
	st, err := s.next.Remove(ctx, ns, id, ifVersion)
	s.done(opRemove, start, err)
	if err == nil {
		s.m.ns(ns).removed.Inc()
	}
	return st, err
}

func (s *instrumented) RemoveTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	start := time.Now()
	res, err := s.next.RemoveTasks(ctx, ns, p)
	s.done(opRemoveTasks, start, err)
	if res.Removed > 0 {
		s.m.ns(ns).removed.Add(float64(res.Removed))
	}
	return res, err
}

func (s *instrumented) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	start := time.Now()
	t, err := s.next.Get(ctx, ns, id)
	s.done(opGet, start, err)
	return t, err
}

func (s *instrumented) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	start := time.Now()
	ts, next, err := s.next.List(ctx, ns, p)
	s.done(opList, start, err)
	return ts, next, err
}

func (s *instrumented) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	start := time.Now()
	dels, err := s.next.Pop(ctx, ns, p)
	s.done(opPop, start, err)
	return dels, err
}

func (s *instrumented) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	start := time.Now()
	r, err := s.next.PopWake(ctx, ns, p)
	s.done(opPop, start, err)
	return r, err
}

func (s *instrumented) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	start := time.Now()
	sts, err := s.next.Ack(ctx, ns, tokens)
	s.done(opAck, start, err)
	if n := countOK(sts); n > 0 {
		s.m.ns(ns).acked.Add(float64(n))
	}
	return sts, err
}

func (s *instrumented) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	start := time.Now()
	sts, moved, err := s.next.Nack(ctx, ns, tokens, opts)
	s.done(opNack, start, err)
	if n := countOK(sts); n > 0 {
		s.m.ns(ns).nacked.Add(float64(n))
	}
	s.countDead(ns, moved)
	return sts, moved, err
}

func (s *instrumented) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	start := time.Now()
	res, err := s.next.Extend(ctx, ns, tokens, by)
	s.done(opExtend, start, err)
	return res, err
}

func (s *instrumented) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	start := time.Now()
	moved, err := s.next.Reap(ctx, ns, limit, opts)
	s.done(opReap, start, err)
	if len(moved) > 0 {
		s.m.ns(ns).expired.Add(float64(len(moved)))
		s.countDead(ns, moved)
	}
	return moved, err
}

func (s *instrumented) NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error) {
	start := time.Now()
	next, now, ok, err := s.next.NextWake(ctx, ns)
	s.done(opNextWake, start, err)
	return next, now, ok, err
}

// ExpectPop passes through (it makes no store call of its own).
func (s *instrumented) ExpectPop(ns string, within time.Duration) {
	s.next.ExpectPop(ns, within)
}

func (s *instrumented) Requeue(ctx context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	start := time.Now()
	moved, err := s.next.Requeue(ctx, ns, p)
	s.done(opRequeue, start, err)
	return moved, err
}

func (s *instrumented) Purge(ctx context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	start := time.Now()
	gone, err := s.next.Purge(ctx, ns, p)
	s.done(opPurge, start, err)
	return gone, err
}

func (s *instrumented) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	start := time.Now()
	st, err := s.next.Stats(ctx, ns)
	s.done(opStats, start, err)
	return st, err
}

func (s *instrumented) DueKinds(ctx context.Context, ns string) (storage.DueKinds, error) {
	start := time.Now()
	dk, err := s.next.DueKinds(ctx, ns)
	s.done(opDueKinds, start, err)
	return dk, err
}

func (s *instrumented) DropNamespace(ctx context.Context, ns string, incarnation int64) (int64, error) {
	start := time.Now()
	n, err := s.next.DropNamespace(ctx, ns, incarnation)
	s.done(opDropNamespace, start, err)
	if err == nil && incarnation > 0 {
		s.m.ForgetNamespace(ns) // deleted: its series go (forget.go)
	}
	return n, err
}

func (s *instrumented) countDead(ns string, moved []storage.Moved) {
	n := 0
	for i := range moved {
		if moved[i].State == storage.StateDead {
			n++
		}
	}
	if n > 0 {
		s.m.ns(ns).dead.Add(float64(n))
	}
}

func countOK(sts []storage.TokenStatus) int {
	n := 0
	for _, st := range sts {
		if st == storage.TokenOK {
			n++
		}
	}
	return n
}
