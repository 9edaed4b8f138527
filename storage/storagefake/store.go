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
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
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
	// hist is each namespace's task events (history.go), oldest first.
	hist map[string][]histEntry
	// histSeq numbers the events, the cursor of TaskHistory.
	histSeq int64
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
		lives: map[string]life{}, buckets: map[string]bucket{}}
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

// publish tells every wake-up subscriber about ns. s.mu is held.
func (s *Store) publish(ns string) { s.publishWakeup(storage.Wakeup{Namespace: ns}) }

// publishWakeup hands w to every wake-up subscriber. s.mu is held.
func (s *Store) publishWakeup(w storage.Wakeup) {
	for _, ch := range s.subs {
		select {
		case ch <- w:
		default: // a slow subscriber misses it, as with Redis pub/sub under pressure
		}
	}
}

// Upsert creates or replaces tasks, in spec order, as upsert.lua does.
func (s *Store) Upsert(_ context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(specs) > 0 {
		if err := s.claim(ns, specs[0].NamespaceIncarnation); err != nil {
			return nil, err
		}
	}
	now, nowUS := s.now()
	m := s.ns(ns)
	first, hasFirst := head(m)
	wake := false
	out := make([]storage.UpsertResult, len(specs))
	for i, sp := range specs {
		var due int64
		switch {
		case !sp.DueTime.IsZero():
			due = storage.DueMilli(sp.DueTime)
		case sp.Delay <= 0:
			due = now
		default:
			due = (nowUS + storage.DelayMicros(sp.Delay) + 999) / 1000
		}
		old := m[sp.ID]
		switch {
		case sp.CreateOnly && old != nil:
			out[i] = storage.UpsertResult{Task: old.view(), Refused: storage.RefusedExists}
			continue
		case sp.IfGeneration != 0 && (old == nil || !sp.IfVersion().Matches(old.task.Incarnation, old.task.Generation)):
			out[i] = storage.UpsertResult{Refused: storage.RefusedGeneration}
			if old != nil {
				out[i].Task = old.view()
			}
			continue
		}
		inc, gen, created, dseq, created1 := sp.Incarnation, sp.Generation, time.UnixMilli(now), int64(0), true
		keep := false
		if old != nil {
			o := old.task
			if sp.Incarnation == 0 {
				inc = o.Incarnation
				if sp.Generation == 0 {
					gen = o.Generation + 1
				} else if o.Generation > sp.Generation {
					keep = true
				}
			} else if !(storage.Version{Incarnation: sp.Incarnation, Generation: sp.Generation}).Newer(
				storage.Version{Incarnation: o.Incarnation, Generation: o.Generation}) {
				keep = true
			}
			if inc == o.Incarnation {
				created, dseq, created1 = o.CreateTime, old.dseq, false
			}
		} else {
			if inc == 0 {
				inc = nowUS
			}
			if gen == 0 {
				gen = 1
			}
		}
		if keep {
			t := old.view()
			stale := t.Generation > sp.Generation
			if sp.Incarnation != 0 {
				stale = storage.Version{Incarnation: t.Incarnation, Generation: t.Generation}.Newer(
					storage.Version{Incarnation: sp.Incarnation, Generation: sp.Generation})
			}
			out[i] = storage.UpsertResult{Task: t, Stale: stale}
			continue
		}
		r := &record{due: due, dseq: dseq, task: storage.Task{
			Namespace: ns, ID: sp.ID, Kind: sp.Kind, Payload: slices.Clone(sp.Payload),
			State: storage.StateScheduled, Generation: gen, Incarnation: inc,
			CreateTime: created, UpdateTime: time.UnixMilli(now), TraceParent: sp.TraceParent,
		}}
		m[sp.ID] = r
		res := storage.UpsertResult{Task: r.view(), Created: created1}
		if !hasFirst || due < first {
			first, hasFirst = due, true
			res.Earliest, wake = true, true
		}
		out[i] = res
	}
	if wake {
		s.publish(ns)
	}
	return out, nil
}

// Remove deletes a task in any state; with ifVersion only at that version.
func (s *Store) Remove(_ context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.nss[ns][id]
	if r == nil {
		return storage.StateUnspecified, storage.ErrNotFound
	}
	if !ifVersion.Matches(r.task.Incarnation, r.task.Generation) {
		ifVersion.ID = id
		return storage.StateUnspecified, &storage.ConflictError{Err: storage.ErrGenerationMismatch, Task: r.view(), Expected: ifVersion}
	}
	delete(s.nss[ns], id)
	return r.task.State, nil
}

// RemoveTasks deletes p.IDs, or walks p.Filter as the Redis index does:
// scheduled, delivered, then dead tasks, each in set order, at most
// p.Limit (1..MaxBatch) examined per call.
func (s *Store) RemoveTasks(_ context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.nss[ns]
	if len(p.IDs) > 0 {
		res := storage.RemoveTasksResult{States: make([]storage.State, len(p.IDs))}
		for i, id := range p.IDs {
			if r, ok := m[id]; ok {
				res.States[i] = r.task.State
				delete(m, id)
				res.Removed++
			}
		}
		return res, nil
	}
	states := []storage.State{storage.StateScheduled, storage.StateDelivered, storage.StateDead}
	if p.Filter.State != storage.StateUnspecified {
		states = []storage.State{p.Filter.State}
	}
	var after *record
	if c := p.Cursor; c != "" {
		parts := strings.SplitN(strings.TrimPrefix(c, "f"), ":", 3)
		st, err := strconv.Atoi(parts[0])
		if !strings.HasPrefix(c, "f") || err != nil || len(parts) != 3 || !slices.Contains(states, storage.State(st)) {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", storage.ErrInvalidCursor)
		}
		sc, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", storage.ErrInvalidCursor)
		}
		states = states[slices.Index(states, storage.State(st)):]
		after = &record{task: storage.Task{ID: parts[2], State: storage.State(st)}, due: sc, lease: sc, died: sc}
	}
	budget := p.Limit
	if budget <= 0 || budget > MaxBatch {
		budget = MaxBatch
	}
	var res storage.RemoveTasksResult
	for _, st := range states {
		for _, r := range sorted(m, st) {
			if after != nil && after.task.State == st &&
				cmp.Or(cmp.Compare(r.score(), after.score()), strings.Compare(r.task.ID, after.task.ID)) <= 0 {
				continue
			}
			if budget == 0 {
				return res, nil
			}
			budget--
			res.Next = fmt.Sprintf("f%d:%d:%s", st, r.score(), r.task.ID)
			if (p.Filter.Kind == "" || r.task.Kind == p.Filter.Kind) && strings.HasPrefix(r.task.ID, p.Filter.IDPrefix) {
				delete(m, r.task.ID)
				res.Removed++
			}
		}
	}
	res.Next = ""
	return res, nil
}

// Get returns one task.
func (s *Store) Get(_ context.Context, ns, id string) (storage.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.nss[ns][id]
	if r == nil {
		return storage.Task{}, storage.ErrNotFound
	}
	return r.view(), nil
}

// List returns a page of one state's tasks in set order after p.Cursor,
// cut by p.MaxBytes as storage.ListParams says.
func (s *Store) List(_ context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	state := p.State
	if state == storage.StateUnspecified {
		state = storage.StateScheduled
	}
	limit := min(max(p.Limit, 1), MaxBatch)
	var after *record
	if cursor := p.Cursor; cursor != "" {
		parts := strings.SplitN(cursor, ":", 3)
		if len(parts) != 3 || parts[0] != strconv.Itoa(int(state)) {
			return nil, "", fmt.Errorf("list: %w", storage.ErrInvalidCursor)
		}
		sc, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("list: %w", storage.ErrInvalidCursor)
		}
		after = &record{task: storage.Task{ID: parts[2], State: state}, due: sc, lease: sc, died: sc}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		page []storage.Task
		recs []*record
	)
	for _, r := range sorted(s.nss[ns], state) {
		if after != nil && cmp.Or(cmp.Compare(r.score(), after.score()), strings.Compare(r.task.ID, after.task.ID)) <= 0 {
			continue
		}
		t := r.view()
		if p.NoPayload {
			t.Payload = nil
		}
		page = append(page, t)
		recs = append(recs, r)
		if len(page) == limit+1 {
			break
		}
	}
	more := len(page) > limit
	page = page[:min(len(page), limit)]
	if kept, cut := storage.CutPage(page, p.MaxBytes); cut {
		page, more = kept, true
	}
	next := ""
	if more {
		last := recs[len(page)-1]
		next = fmt.Sprintf("%d:%d:%s", state, last.score(), last.task.ID)
	}
	return page, next, nil
}

// Pop leases at most p.Limit due tasks, in due order; with p.MaxRate, at
// most the whole tokens of the namespace's bucket; with p.Kinds, only
// tasks of those kinds among the first KindScanWindow due ones, as pop.lua
// does.
func (s *Store) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	r, err := s.PopWake(ctx, ns, p)
	return r.Deliveries, err
}

// PopWake is Pop with the store's now and the namespace's next wake after
// the pop, in one step as pop.lua answers them.
func (s *Store) PopWake(_ context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dels := s.pop(ns, p)
	ms, _ := s.now()
	next, ok := s.nextWake(ns)
	r := storage.PopResult{Deliveries: dels, Now: time.UnixMilli(ms), Next: next, HasNext: ok, DueKnown: true}
	if due, ok := head(s.nss[ns]); ok {
		r.NextDue = time.UnixMilli(due)
	}
	return r, nil
}

// pop is Pop with s.mu held.
func (s *Store) pop(ns string, p storage.PopParams) []storage.Delivery {
	now, nowUS := s.now()
	deadline := now + p.LeaseFor.Milliseconds()
	limit := min(p.Limit, 1000)
	var tokens float64
	if p.MaxRate > 0 {
		burst := float64(max(p.Burst, 1))
		tokens = burst
		if b, ok := s.buckets[ns]; ok {
			tokens = min(burst, b.tokens+float64(max(nowUS-b.atUS, 0))*p.MaxRate/1e6)
		}
		limit = min(limit, int(tokens))
	}
	var out []storage.Delivery
	for i, r := range sorted(s.nss[ns], storage.StateScheduled) {
		if len(out) >= limit || r.due > now || (len(p.Kinds) > 0 && i >= storage.KindScanWindow) {
			break
		}
		if len(p.Kinds) > 0 && !slices.Contains(p.Kinds, r.task.Kind) {
			continue
		}
		r.task.State = storage.StateDelivered
		r.task.Attempt++
		r.dseq = max(r.dseq+1, nowUS)
		r.lease = deadline
		r.told = 0
		if p.TellFor > p.LeaseFor {
			r.told = now + p.TellFor.Milliseconds()
		}
		r.task.UpdateTime = time.UnixMilli(now)
		t := r.view()
		out = append(out, storage.Delivery{Task: t, LeaseDeadline: time.UnixMilli(deadline), Token: r.token(ns)})
	}
	if p.MaxRate > 0 && len(out) > 0 {
		s.buckets[ns] = bucket{tokens: tokens - float64(len(out)), atUS: nowUS}
	}
	return out
}

// bucket is a namespace's dispatch-rate token bucket (PopParams.MaxRate).
type bucket struct {
	tokens float64
	atUS   int64
}

func (r *record) token(ns string) storage.Token {
	return storage.Token{Namespace: ns, ID: r.task.ID, Incarnation: r.task.Incarnation,
		Generation: r.task.Generation, Attempt: r.task.Attempt, Delivery: r.dseq}
}

// check compares a token with the task it names, as token_check in lib.lua.
func (s *Store) check(ns string, tok storage.Token) (*record, storage.TokenStatus) {
	r := s.nss[ns][tok.ID]
	if r == nil || tok.Namespace != ns || tok.Delivery == 0 || r.task.Incarnation != tok.Incarnation {
		return nil, storage.TokenNotFound
	}
	if r.task.Generation == tok.Generation && r.dseq == tok.Delivery {
		if r.task.State == storage.StateDelivered {
			return r, storage.TokenOK
		}
		return nil, storage.TokenNotFound
	}
	if r.task.Generation > tok.Generation || (r.task.Generation == tok.Generation && r.dseq > tok.Delivery) {
		return nil, storage.TokenStale
	}
	return nil, storage.TokenNotFound
}

// Ack deletes the tasks whose delivery the tokens name.
func (s *Store) Ack(_ context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]storage.TokenStatus, len(tokens))
	for i, tok := range tokens {
		r, st := s.check(ns, tok)
		if st == storage.TokenOK {
			delete(s.nss[ns], r.task.ID)
		}
		out[i] = st
	}
	return out, nil
}

// settle moves an in-flight record to scheduled after its retry delay, or to
// dead when its attempts are used up (settle in lib.lua). k spreads the
// jitter of one call's tasks.
func settle(r *record, now int64, o storage.NackOptions, k int, seed float64) storage.Moved {
	r.task.UpdateTime = time.UnixMilli(now)
	r.task.LastError = o.Reason
	mv := storage.Moved{ID: r.task.ID, Incarnation: r.task.Incarnation, Generation: r.task.Generation,
		Attempt: r.task.Attempt, LastError: o.Reason}
	if o.MaxAttempts > 0 && r.task.Attempt >= o.MaxAttempts {
		r.task.State, r.died = storage.StateDead, now
		mv.State, mv.DeadTime = storage.StateDead, time.UnixMilli(now)
		return mv
	}
	r.task.State, r.due = storage.StateScheduled, now+delayFor(o, r.task.Attempt, k, seed)
	mv.State, mv.DueTime = storage.StateScheduled, time.UnixMilli(r.due)
	return mv
}

// delayFor is the retry delay after failed attempt n (delay_for in lib.lua).
func delayFor(o storage.NackOptions, n int32, k int, seed float64) int64 {
	if o.RetryAfter != nil {
		return max(o.RetryAfter.Milliseconds(), 0)
	}
	n = max(n, 1)
	b := o.Backoff
	d := float64(b.Initial.Milliseconds()) * math.Pow(b.Multiplier, float64(n-1))
	d = min(d, float64(b.Max.Milliseconds()))
	u := math.Mod(seed+float64(k)*0.6180339887498949, 1)
	return int64(math.Floor(d - d*b.Jitter*u))
}

// Nack puts the deliveries back per opts.
func (s *Store) Nack(_ context.Context, ns string, tokens []storage.Token, o storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	first, hasFirst := head(s.nss[ns])
	seed := rand.Float64()
	out := make([]storage.TokenStatus, len(tokens))
	var moved []storage.Moved
	wake := false
	for i, tok := range tokens {
		r, st := s.check(ns, tok)
		out[i] = st
		if st != storage.TokenOK {
			continue
		}
		if o.Unsent && r.task.Attempt > 0 {
			r.task.Attempt--
		}
		mv := settle(r, now, o, i, seed)
		moved = append(moved, mv)
		if mv.State == storage.StateScheduled && (!hasFirst || r.due < first) {
			first, hasFirst, wake = r.due, true, true
		}
	}
	if wake {
		s.publish(ns)
	}
	return out, moved, nil
}

// Extend sets the leases of the deliveries to store-now + by; a lease is
// never shortened (ZADD GT in extend.lua).
func (s *Store) Extend(_ context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	deadline := now + by.Milliseconds()
	out := make([]storage.ExtendResult, len(tokens))
	for i, tok := range tokens {
		r, st := s.check(ns, tok)
		out[i].Status = st
		if st == storage.TokenOK {
			r.lease = max(r.lease, deadline)
			out[i].LeaseDeadline = time.UnixMilli(deadline)
		}
	}
	return out, nil
}

// Reap takes at most limit expired leases back.
func (s *Store) Reap(_ context.Context, ns string, limit int, o storage.NackOptions) ([]storage.Moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	upto := now
	if !o.ExpiredBy.IsZero() {
		upto = min(upto, o.ExpiredBy.UnixMilli())
	}
	first, hasFirst := head(s.nss[ns])
	seed := rand.Float64()
	var moved []storage.Moved
	wake := false
	for k, r := range sorted(s.nss[ns], storage.StateDelivered) {
		if len(moved) == limit || r.lease > upto {
			break
		}
		mv := settle(r, now, o, k, seed)
		moved = append(moved, mv)
		if mv.State == storage.StateScheduled && (!hasFirst || r.due < first) {
			first, hasFirst, wake = r.due, true, true
		}
	}
	if wake {
		s.publish(ns)
	}
	return moved, nil
}

// NextWake returns the earliest due time or lease deadline and the store's now.
func (s *Store) NextWake(_ context.Context, ns string) (next, now time.Time, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms, _ := s.now()
	next, ok = s.nextWake(ns)
	return next, time.UnixMilli(ms), ok, nil
}

// nextWake is NextWake's answer with s.mu held.
func (s *Store) nextWake(ns string) (time.Time, bool) {
	var best int64
	ok := false
	for _, r := range s.nss[ns] {
		if r.task.State == storage.StateDead {
			continue
		}
		if sc := r.score(); !ok || sc < best {
			best, ok = sc, true
		}
	}
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(best), true
}

// selectDead returns the dead records p selects (ids or the oldest Limit).
func (s *Store) selectDead(ns string, ids []string, all bool, limit int) []*record {
	m := s.nss[ns]
	if all {
		d := sorted(m, storage.StateDead)
		return d[:min(len(d), min(max(limit, 1), MaxBatch))]
	}
	var out []*record
	for _, id := range ids {
		if r := m[id]; r != nil && r.task.State == storage.StateDead && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// Requeue moves dead tasks back to scheduled, attempts reset.
func (s *Store) Requeue(_ context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	first, hasFirst := head(s.nss[ns])
	due := now + max(p.Delay.Milliseconds(), 0)
	var moved []storage.Moved
	for _, r := range s.selectDead(ns, p.IDs, p.All, p.Limit) {
		r.task.State, r.task.Attempt, r.due, r.died = storage.StateScheduled, 0, due, 0
		r.task.UpdateTime = time.UnixMilli(now)
		moved = append(moved, storage.Moved{ID: r.task.ID, Incarnation: r.task.Incarnation,
			Generation: r.task.Generation, State: storage.StateScheduled, DueTime: time.UnixMilli(due), LastError: r.task.LastError})
	}
	if len(moved) > 0 && (!hasFirst || due < first) {
		s.publish(ns)
	}
	return moved, nil
}

// Purge deletes the dead tasks p selects.
func (s *Store) Purge(_ context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.selectDead(ns, p.IDs, p.All, p.Limit) {
		delete(s.nss[ns], r.task.ID)
		out = append(out, r.task.ID)
	}
	return out, nil
}

// DueKinds counts due tasks per kind among the first KindScanWindow, as
// duekinds.lua does.
func (s *Store) DueKinds(_ context.Context, ns string) (storage.DueKinds, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	out := storage.DueKinds{Counts: map[string]int64{}}
	n := 0
	for _, r := range sorted(s.nss[ns], storage.StateScheduled) {
		if r.due > now {
			break
		}
		if n == storage.KindScanWindow {
			out.Partial = true
			break
		}
		n++
		out.Counts[r.task.Kind]++
	}
	return out, nil
}

// Stats counts one namespace's tasks per state.
func (s *Store) Stats(_ context.Context, ns string) (storage.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	st := storage.Stats{Now: time.UnixMilli(now)}
	var oldest int64
	for _, r := range s.nss[ns] {
		switch r.task.State {
		case storage.StateScheduled:
			st.Scheduled++
			if r.due <= now {
				st.DueNow++
			}
			if oldest == 0 || r.due < oldest {
				oldest = r.due
			}
		case storage.StateDelivered:
			st.Delivered++
		case storage.StateDead:
			st.Dead++
		}
	}
	if oldest != 0 {
		st.OldestDue = time.UnixMilli(oldest)
	}
	return st, nil
}

// DropNamespace deletes every task of ns and returns how many it deleted;
// with an incarnation it ends it as the Redis index does (see Upsert).
func (s *Store) DropNamespace(_ context.Context, ns string, incarnation int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lives[ns]; incarnation > l.ended {
		l.ended = incarnation
		s.lives[ns] = l
	}
	n := int64(len(s.nss[ns]))
	delete(s.nss, ns)
	if incarnation > 0 {
		// A deleted namespace's history goes with it, as in the real stores.
		delete(s.hist, ns)
	}
	return n, nil
}

// PublishPolicyChanged tells every wake-up subscriber that ns's policy
// changed.
func (s *Store) PublishPolicyChanged(_ context.Context, ns string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publishWakeup(storage.Wakeup{Namespace: ns, PolicyChanged: true})
	return nil
}

// SubscribeWakeups calls fn with every wake-up until ctx is done; ready
// once, when the subscription is made.
func (s *Store) SubscribeWakeups(ctx context.Context, ready func(), fn func(storage.Wakeup)) error {
	ch := make(chan storage.Wakeup, 1024)
	s.mu.Lock()
	id := s.nextSb
	s.nextSb++
	s.subs[id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, id)
		s.mu.Unlock()
	}()
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case w := <-ch:
			fn(w)
		}
	}
}

// PublishWatchCopies hands each copy to the subscriptions of its namespace,
// as Redis pub/sub does: a subscription whose buffer (1,024) is full loses
// it. It answers how many subscriptions each copy reached.
func (s *Store) PublishWatchCopies(_ context.Context, copies []storage.WatchCopy) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, len(copies))
	for i, c := range copies {
		for _, ch := range s.watchers[c.Task.Namespace] {
			out[i]++
			select {
			case ch <- c:
			default:
			}
		}
	}
	return out, nil
}

// SubscribeWatchCopies subscribes to ns's copies; see storage.DeliveryFeed.
func (s *Store) SubscribeWatchCopies(ctx context.Context, ns string, ready func() error, fn func(storage.WatchCopy) error) error {
	ch := make(chan storage.WatchCopy, 1024)
	s.mu.Lock()
	if s.watchers == nil {
		s.watchers = map[string]map[int]chan storage.WatchCopy{}
	}
	if s.watchers[ns] == nil {
		s.watchers[ns] = map[int]chan storage.WatchCopy{}
	}
	id := s.nextSb
	s.nextSb++
	s.watchers[ns][id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers[ns], id)
		if len(s.watchers[ns]) == 0 {
			delete(s.watchers, ns)
		}
		s.mu.Unlock()
	}()
	if err := ready(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case c := <-ch:
			if err := fn(c); err != nil {
				return err
			}
		}
	}
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
