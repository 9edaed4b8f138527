// Package storetest is the conformance suite every delayd task store passes:
// table-driven tests of each operation and lifecycle transition (seeded
// state → call → wanted state, compared with go-cmp), written only against
// the storage interfaces so the Redis index and the durable store run the
// same tests.
//
// A store's own test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storage.Store { return newTestStore(t) })
//	}
//
// Every test runs in parallel in its own random namespace and removes its
// tasks when it ends. Times that depend on "now" are checked against the
// store's clock (Stats.Now) read before and after the call, so the suite
// never asserts a wall-clock bound.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// WakeupStore is a store that also carries the wake-up channel between
// replicas (storage.Wakeups): the Redis index and the fake. The durable
// store does not; delayd wires the Redis index's channel beside it.
type WakeupStore interface {
	storage.Store
	storage.Wakeups
}

// RunWakeups runs the wake-up suite as a subtest "Wakeups" of t: an
// earliest-task notice, a policy change and settled tokens each reach a
// subscription. A store that stops implementing storage.Wakeups no longer
// compiles here, instead of having the test skipped.
func RunWakeups(t *testing.T, newStore func(t *testing.T) WakeupStore) {
	t.Run("Wakeups", func(t *testing.T) { testWakeups(t, newStore) })
}

// Run runs the conformance suite as subtests of t. newStore is called once
// per subtest (from that subtest's goroutine) and may register cleanups
// with the subtest's t.
func Run(t *testing.T, newStore func(t *testing.T) storage.Store) {
	run(t, newStore)
}

// RunSharded is Run for a store that spreads each namespace over several
// shards (redisstore with Options.Shards). Two answers may differ, as the
// storage interfaces allow: UpsertResult.Earliest may also be true for a
// task that became the earliest of its shard only (a wake-up too many,
// never one too few), and the kind scan window (storage.KindScanWindow of
// Pop with Kinds and DueKinds) applies per shard.
func RunSharded(t *testing.T, newStore func(t *testing.T) storage.Store) {
	run(t, func(t *testing.T) storage.Store { return sharded{newStore(t)} })
}

// sharded marks the store of a RunSharded suite.
type sharded struct{ storage.Store }

func run(t *testing.T, newStore func(t *testing.T) storage.Store) {
	t.Run("Upsert", func(t *testing.T) { testUpsert(t, newStore) })
	t.Run("Remove", func(t *testing.T) { testRemove(t, newStore) })
	t.Run("CreateOnly", func(t *testing.T) { testCreateOnly(t, newStore) })
	t.Run("IfGeneration", func(t *testing.T) { testIfGeneration(t, newStore) })
	t.Run("RemoveTasks", func(t *testing.T) { testRemoveTasks(t, newStore) })
	t.Run("Get", func(t *testing.T) { testGet(t, newStore) })
	t.Run("List", func(t *testing.T) { testList(t, newStore) })
	t.Run("Pop", func(t *testing.T) { testPop(t, newStore) })
	t.Run("Ack", func(t *testing.T) { testAck(t, newStore) })
	t.Run("Nack", func(t *testing.T) { testNack(t, newStore) })
	t.Run("Extend", func(t *testing.T) { testExtend(t, newStore) })
	t.Run("Reap", func(t *testing.T) { testReap(t, newStore) })
	t.Run("Requeue", func(t *testing.T) { testRequeue(t, newStore) })
	t.Run("Purge", func(t *testing.T) { testPurge(t, newStore) })
	t.Run("Stats", func(t *testing.T) { testStats(t, newStore) })
	t.Run("NextWake", func(t *testing.T) { testNextWake(t, newStore) })
	t.Run("PopWake", func(t *testing.T) { testPopWake(t, newStore) })
	t.Run("SharedLimits", func(t *testing.T) { testSharedLimits(t, newStore) })
	t.Run("ConcurrentPop", func(t *testing.T) { testConcurrentPop(t, newStore) })
	t.Run("PopRate", func(t *testing.T) { testPopRate(t, newStore) })
	t.Run("PopKinds", func(t *testing.T) { testPopKinds(t, newStore) })
	t.Run("PopAgain", func(t *testing.T) { testPopAgain(t, newStore) })
	t.Run("DueKinds", func(t *testing.T) { testDueKinds(t, newStore) })
}

// Namespace returns a fresh random namespace name ("st" + 12 hex digits
// from testkit.Suffix, so testkit.Main deletes whatever a store keeps of it
// beyond its tasks, such as durable mode's index marker).
func Namespace(t testing.TB) string {
	t.Helper()
	return "st" + testkit.Suffix()
}

// Seed is one task put in place before a transition is tested.
type Seed struct {
	ID string
	// State: StateScheduled (the default), StateDelivered (popped with a 1 h
	// lease, attempt 1) or StateDead (popped, then nacked with max attempts
	// 1: attempt 1, last error "seeded").
	State storage.State
	// Due is, for a scheduled seed, its due time relative to the store's
	// now: negative means already due. Zero means one hour ahead.
	Due time.Duration
}

// Row is a task as the suite compares it: every field that does not depend
// on the clock.
type Row struct {
	ID         string
	State      storage.State
	Generation int64
	Attempt    int32
	Kind       string
	Payload    string
	LastError  string
}

// env is one test's store, namespace and seeded deliveries.
type env struct {
	t   *testing.T
	s   storage.Store
	ns  string
	ctx context.Context
	// tok holds the token of every seeded delivery (for a dead seed the
	// delivery it died of), by task id.
	tok map[string]storage.Token
	// sharded: see RunSharded.
	sharded bool
}

func newEnv(t *testing.T, newStore func(t *testing.T) storage.Store) *env {
	t.Helper()
	e := &env{t: t, s: newStore(t), ns: Namespace(t), ctx: context.Background(), tok: map[string]storage.Token{}}
	if sh, ok := e.s.(sharded); ok {
		e.s, e.sharded = sh.Store, true
	}
	t.Cleanup(e.clear)
	return e
}

// clear removes every task of the namespace.
func (e *env) clear() {
	for _, st := range []storage.State{storage.StateScheduled, storage.StateDelivered, storage.StateDead} {
		for range 1000 {
			tasks, _, err := e.s.List(e.ctx, e.ns, storage.ListParams{State: st, Limit: 1000})
			if err != nil {
				e.t.Errorf("cleanup: list: %v", err)
				return
			}
			if len(tasks) == 0 {
				break
			}
			for _, task := range tasks {
				if _, err := e.s.Remove(e.ctx, e.ns, task.ID, storage.Version{}); err != nil && !errors.Is(err, storage.ErrNotFound) {
					e.t.Errorf("cleanup: remove: %v", err)
					return
				}
			}
		}
	}
}

func payloadOf(id string) []byte { return []byte("p:" + id) }

// row is the Row of a seeded task that kept its kind and payload.
func row(id string, st storage.State, gen int64, attempt int32, lastErr string) Row {
	return Row{ID: id, State: st, Generation: gen, Attempt: attempt, Payload: string(payloadOf(id)), LastError: lastErr}
}

// seedReason is the last error of seeded dead tasks.
const seedReason = "seeded"

// seed puts the seeds in place: delivered and dead ones first (due long
// ago, popped), then scheduled ones.
func (e *env) seed(seeds ...Seed) {
	e.t.Helper()
	now := e.now()
	var leased []storage.UpsertSpec
	var dead []string
	for i, sd := range seeds {
		switch sd.State {
		case storage.StateDelivered, storage.StateDead:
			leased = append(leased, storage.UpsertSpec{ID: sd.ID, Payload: payloadOf(sd.ID), DueTime: now.Add(-2*time.Hour + time.Duration(i)*time.Millisecond)})
			if sd.State == storage.StateDead {
				dead = append(dead, sd.ID)
			}
		}
	}
	if len(leased) > 0 {
		e.upsert(leased...)
		ds, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{Limit: len(leased), LeaseFor: time.Hour})
		if err != nil || len(ds) != len(leased) {
			e.t.Fatalf("seed: pop %d: got %d, %v", len(leased), len(ds), err)
		}
		var deadTok []storage.Token
		for _, d := range ds {
			if slices.Contains(dead, d.Task.ID) {
				deadTok = append(deadTok, d.Token)
			}
			e.tok[d.Task.ID] = d.Token // for a dead seed: the delivery it died of
		}
		if len(deadTok) > 0 {
			st, _, err := e.s.Nack(e.ctx, e.ns, deadTok, storage.NackOptions{MaxAttempts: 1, Reason: seedReason})
			if err != nil {
				e.t.Fatalf("seed: nack: %v", err)
			}
			for i, s := range st {
				if s != storage.TokenOK {
					e.t.Fatalf("seed: nack %s: %v", deadTok[i].ID, s)
				}
			}
		}
	}
	var sched []storage.UpsertSpec
	for _, sd := range seeds {
		if sd.State == storage.StateScheduled || sd.State == storage.StateUnspecified {
			due := sd.Due
			if due == 0 {
				due = time.Hour
			}
			sched = append(sched, storage.UpsertSpec{ID: sd.ID, Payload: payloadOf(sd.ID), DueTime: now.Add(due)})
		}
	}
	if len(sched) > 0 {
		e.upsert(sched...)
	}
}

// now is the store's clock.
func (e *env) now() time.Time {
	e.t.Helper()
	st, err := e.s.Stats(e.ctx, e.ns)
	if err != nil {
		e.t.Fatalf("stats: %v", err)
	}
	if st.Now.IsZero() {
		e.t.Fatal("Stats.Now is zero")
	}
	return st.Now
}

func (e *env) upsert(specs ...storage.UpsertSpec) []storage.UpsertResult {
	e.t.Helper()
	res, err := e.s.Upsert(e.ctx, e.ns, specs)
	if err != nil {
		e.t.Fatalf("upsert: %v", err)
	}
	if len(res) != len(specs) {
		e.t.Fatalf("upsert: %d results for %d specs", len(res), len(specs))
	}
	return res
}

func (e *env) get(id string) storage.Task {
	e.t.Helper()
	task, err := e.s.Get(e.ctx, e.ns, id)
	if err != nil {
		e.t.Fatalf("get %s: %v", id, err)
	}
	return task
}

func (e *env) pop(limit int, lease time.Duration) []storage.Delivery {
	e.t.Helper()
	ds, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{Limit: limit, LeaseFor: lease})
	if err != nil {
		e.t.Fatalf("pop: %v", err)
	}
	return ds
}

// listAll pages through one state with the given page size.
func (e *env) listAll(st storage.State, size int) []storage.Task {
	e.t.Helper()
	var all []storage.Task
	cursor := ""
	for range 10000 {
		page, next, err := e.s.List(e.ctx, e.ns, storage.ListParams{State: st, Limit: size, Cursor: cursor})
		if err != nil {
			e.t.Fatalf("list %v: %v", st, err)
		}
		if len(page) > size {
			e.t.Fatalf("list %v: page of %d for size %d", st, len(page), size)
		}
		all = append(all, page...)
		if next == "" {
			return all
		}
		cursor = next
	}
	e.t.Fatal("list: no last page")
	return nil
}

// rows is every task of the namespace, by state then id.
func (e *env) rows() []Row {
	e.t.Helper()
	var out []Row
	for _, st := range []storage.State{storage.StateScheduled, storage.StateDelivered, storage.StateDead} {
		for _, task := range e.listAll(st, 100) {
			if task.State != st {
				e.t.Errorf("list %v returned %s in state %v", st, task.ID, task.State)
			}
			if task.Namespace != e.ns {
				e.t.Errorf("task %s has namespace %q, want %q", task.ID, task.Namespace, e.ns)
			}
			out = append(out, rowOf(task))
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].State != out[j].State {
			return out[i].State < out[j].State
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func rowOf(task storage.Task) Row {
	return Row{ID: task.ID, State: task.State, Generation: task.Generation, Attempt: task.Attempt,
		Kind: task.Kind, Payload: string(task.Payload), LastError: task.LastError}
}

// within checks lo <= got <= hi.
func (e *env) within(what string, got, lo, hi time.Time) {
	e.t.Helper()
	if got.Before(lo) || got.After(hi) {
		e.t.Errorf("%s = %v, want within [%v, %v]", what, got.UTC(), lo.UTC(), hi.UTC())
	}
}

// transition is one table row: seeded state → call → wanted state.
type transition struct {
	name  string
	seeds []Seed
	run   func(e *env)
	want  []Row
}

func runTable(t *testing.T, newStore func(t *testing.T) storage.Store, cases []transition) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			e.seed(tc.seeds...)
			tc.run(e)
			if diff := cmp.Diff(tc.want, e.rows()); diff != "" {
				t.Errorf("tasks after the call (-want +got):\n%s", diff)
			}
		})
	}
}

func statuses(ss ...storage.TokenStatus) []storage.TokenStatus { return ss }

func (e *env) wantStatuses(op string, got, want []storage.TokenStatus) {
	e.t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		e.t.Errorf("%s statuses (-want +got):\n%s", op, diff)
	}
}

func (e *env) ack(tokens ...storage.Token) []storage.TokenStatus {
	e.t.Helper()
	st, err := e.s.Ack(e.ctx, e.ns, tokens)
	if err != nil {
		e.t.Fatalf("ack: %v", err)
	}
	return st
}

func (e *env) nack(opts storage.NackOptions, tokens ...storage.Token) ([]storage.TokenStatus, []storage.Moved) {
	e.t.Helper()
	st, mv, err := e.s.Nack(e.ctx, e.ns, tokens, opts)
	if err != nil {
		e.t.Fatalf("nack: %v", err)
	}
	return st, mv
}

func dur(d time.Duration) *time.Duration { return &d }

// noJitter is a backoff without jitter, so delays are exact.
func noJitter(initial, maxDelay time.Duration) storage.Backoff {
	return storage.Backoff{Initial: initial, Max: maxDelay, Multiplier: 2}
}

func (e *env) wantNotFound(id string) {
	e.t.Helper()
	if _, err := e.s.Get(e.ctx, e.ns, id); !errors.Is(err, storage.ErrNotFound) {
		e.t.Errorf("get %s: err = %v, want ErrNotFound", id, err)
	}
}

// poll calls f until it reports done or about 20 s have passed.
func poll(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}
