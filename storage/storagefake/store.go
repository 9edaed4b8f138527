// Package storagefake holds in-memory and faulty task stores for the tests
// of the layers above the stores (dispatcher, server, tenancy), as asynq's
// internal/testbroker does: they run without Redis or MySQL, and a test can
// make any store call fail or hang on purpose.
//
// Store keeps the Redis index's semantics (incarnations, generations,
// delivery sequence numbers, token checks, retry backoff, list cursors,
// wake-ups); the conformance suite in storage/storetest runs against it, so
// a layer tested on the fake is tested against the contract the real stores
// keep. It is a fake, never a store to run delayd on: nothing is persisted
// and one process sees it. Tests only: production code never imports it (the
// boundary check in internal/boundary enforces that).
package storagefake

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// MaxBatch is the most tasks one List page, Requeue or Purge of All
// handles, as in the Redis index.
const MaxBatch = 1000

// Store is an in-memory task store with the Redis index's semantics. The zero
// value is not usable; call New. Safe for concurrent use.
type Store struct {
	clock storage.Clock

	mu     sync.Mutex
	nss    map[string]map[string]*record // namespace -> id -> record
	lastUS int64                         // last microsecond handed out as a clock reading
	subs   map[int]chan storage.Wakeup
	// buckets are the dispatch-rate token buckets by namespace (Pop).
	buckets map[string]bucket
	nextSb  int
	// watchers: namespace -> subscription id -> copies (DeliveryFeed)
	watchers map[string]map[int]chan storage.WatchCopy
	// lives: namespace -> its incarnations (the Redis index's life key)
	lives map[string]life
	// lim is the state of storage.SharedLimits (limits.go).
	lim limits
	// hist is each namespace incarnation's task events (history.go),
	// oldest first.
	hist map[histKey][]histEntry
	// histSeq numbers the events, the cursor of TaskHistory.
	histSeq int64
	// scheds: namespace -> schedule id -> schedule (schedules.go).
	scheds map[string]map[string]storage.Schedule
	// pops are the records of pops with a request id (PopParams.RequestID),
	// by namespace and id, until they expire.
	pops map[popKey]popRecord
	// popsPruneAt is the size of pops at which expired records are swept.
	popsPruneAt int
}

// popKey names the record of a pop with a request id.
type popKey struct{ ns, id string }

// popRecord is what a pop with a request id leased, kept until expires
// (Unix ms by the store's clock), as pop.lua keeps it in Redis.
type popRecord struct {
	dels    []storage.Delivery
	expires int64
}

// life is the latest namespace incarnation that wrote and the latest one
// DropNamespace ended (create times, ms; 0 = none).
type life struct{ live, ended int64 }

// claim checks a write for namespace incarnation inc of ns as upsert.lua
// does; called with s.mu held.
func (s *Store) claim(ns string, inc int64) error {
	l := s.lives[ns]
	switch {
	case inc == 0 && l.ended > 0 && l.ended >= l.live:
		return fmt.Errorf("upsert: namespace %q: %w", ns, storage.ErrNamespaceEnded)
	case inc == 0:
		return nil
	case inc <= l.ended:
		return fmt.Errorf("upsert: namespace %q incarnation %d: %w", ns, inc, storage.ErrNamespaceEnded)
	}
	if inc > l.live {
		l.live = inc
		s.lives[ns] = l
	}
	return nil
}

// record is one task. Its state decides which fields mean something, as the
// three ZSETs of the Redis index do: scheduled → due, delivered → lease,
// dead → died.
type record struct {
	task  storage.Task // Namespace, ID, Kind, Payload, ... as Get shows it
	dseq  int64        // delivery sequence of the last delivery
	lease int64        // lease deadline ms while delivered
	told  int64        // told deadline ms while delivered (PopParams.TellFor); 0 = the lease
	died  int64        // death time ms while dead
	due   int64        // due ms while scheduled; the due it was popped at otherwise
}

// New returns an empty store on clock (storage.SystemClock{} when nil).
func New(clock storage.Clock) *Store {
	if clock == nil {
		clock = storage.SystemClock{}
	}
	return &Store{clock: clock, nss: map[string]map[string]*record{}, subs: map[int]chan storage.Wakeup{},
		lives: map[string]life{}, buckets: map[string]bucket{}, pops: map[popKey]popRecord{}}
}

var (
	_ storage.Store        = (*Store)(nil)
	_ storage.Wakeups      = (*Store)(nil)
	_ storage.DeliveryFeed = (*Store)(nil)
	_ storage.SharedLimits = (*Store)(nil)
	_ storage.History      = (*Store)(nil)
	_ storage.Forecaster   = (*Store)(nil)
)

// now reads the clock in milliseconds and microseconds; microseconds strictly
// increase from call to call, as the incarnations and delivery sequences
// made from them must. s.mu is held.
func (s *Store) now() (ms, us int64) {
	us = s.clock.Now().UnixMicro()
	if us <= s.lastUS {
		us = s.lastUS + 1
	}
	s.lastUS = us
	return us / 1000, us
}

func (s *Store) ns(ns string) map[string]*record {
	m := s.nss[ns]
	if m == nil {
		m = map[string]*record{}
		s.nss[ns] = m
	}
	return m
}

// score is a record's score in its state's set.
func (r *record) score() int64 {
	switch r.task.State {
	case storage.StateDelivered:
		return r.lease
	case storage.StateDead:
		return r.died
	default:
		return r.due
	}
}

// sorted returns the records of one state in set order (score, then id).
func sorted(m map[string]*record, st storage.State) []*record {
	var out []*record
	for _, r := range m {
		if r.task.State == st {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *record) int {
		return cmp.Or(cmp.Compare(a.score(), b.score()), strings.Compare(a.task.ID, b.task.ID))
	})
	return out
}

// head is the earliest due ms of the namespace; ok false when none is scheduled.
func head(m map[string]*record) (due int64, ok bool) {
	for _, r := range m {
		if r.task.State == storage.StateScheduled && (!ok || r.due < due) {
			due, ok = r.due, true
		}
	}
	return due, ok
}

// view is the task as Get shows it.
func (r *record) view() storage.Task {
	t := r.task
	t.Payload = slices.Clone(t.Payload)
	t.LeaseDeadline, t.DeadTime = time.Time{}, time.Time{}
	t.DueTime = time.UnixMilli(r.due)
	switch t.State {
	case storage.StateDelivered:
		t.LeaseDeadline = time.UnixMilli(max(r.lease, r.told))
	case storage.StateDead:
		t.DeadTime = time.UnixMilli(r.died)
	}
	return t
}

// Namespaces returns, sorted, the namespaces that hold any task.
func (s *Store) Namespaces(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for ns, m := range s.nss {
		if len(m) > 0 {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Now is the store's clock to the microsecond, as Redis TIME reads it: a
// task upserted with a delay after Now is due no earlier than Now + delay.
func (s *Store) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, us := s.now()
	return time.UnixMicro(us)
}
