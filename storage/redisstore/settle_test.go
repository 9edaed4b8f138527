package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// settleEnv is a namespace with n tasks in flight on the test Redis, and a
// store whose script calls are counted (and, with hold, the first one held).
type settleEnv struct {
	t    *testing.T
	s    *Store
	g    *scriptGate
	ns   string
	dels []storage.Delivery
}

func newSettleEnv(t *testing.T, n int, hold bool, opts Options) *settleEnv {
	t.Helper()
	setup := New(testRedisClient(t), Options{})
	loadScripts(t, setup)
	ns := testkit.Namespace(t, "ride")
	dropNS(t, setup, ns)
	specs := make([]storage.UpsertSpec, n)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%03d", i), Delay: -time.Minute}
	}
	ctx := context.Background()
	if _, err := setup.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	dels, err := setup.Pop(ctx, ns, storage.PopParams{Limit: n, LeaseFor: time.Hour})
	if err != nil || len(dels) != n {
		t.Fatalf("pop: %d, %v", len(dels), err)
	}
	c := testRedisClient(t)
	g := newScriptGate(hold)
	c.AddHook(g)
	return &settleEnv{t: t, s: New(c, opts), g: g, ns: ns, dels: dels}
}

// waitQueued waits until n acks or nacks wait on the namespace's shard.
func (e *settleEnv) waitQueued(n int) {
	e.t.Helper()
	key := settleKey{ns: e.ns}
	deadline := time.Now().Add(20 * time.Second)
	for e.s.settles.queued(key) != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d calls wait, want %d", e.s.settles.queued(key), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// settleOut is one Ack or Nack caller's answer.
type settleOut struct {
	st    []storage.TokenStatus
	moved []storage.Moved
	err   error
}

// TestAcksRideThePop (issue 37 item 3): acks and nacks that arrive while
// the dispatcher has said it pops soon (ExpectPop) wait for that pop and
// settle in its script call: one script call for the wake's acks, nacks
// and pop. Each caller gets its own statuses; a nack with no delay makes
// its task due at once, and the same pop delivers it again.
func TestAcksRideThePop(t *testing.T) {
	t.Parallel()
	e := newSettleEnv(t, 4, false, Options{})
	ctx := context.Background()
	e.s.ExpectPop(e.ns, time.Hour) // a bound; the pop below comes first
	out := make([]settleOut, 4)
	var wg sync.WaitGroup
	zero := time.Duration(0)
	for i := range 4 {
		wg.Go(func() {
			if i == 3 {
				out[i].st, out[i].moved, out[i].err = e.s.Nack(ctx, e.ns, []storage.Token{e.dels[i].Token},
					storage.NackOptions{RetryAfter: &zero, Reason: "again"})
				return
			}
			toks := []storage.Token{e.dels[i].Token}
			if i == 2 {
				toks = append(toks, e.dels[0].Token) // acked twice in one wake
			}
			out[i].st, out[i].err = e.s.Ack(ctx, e.ns, toks)
		})
		e.waitQueued(i + 1)
	}
	if n := e.g.calls.Load(); n != 0 {
		t.Fatalf("%d script calls before the pop; the acks were to wait for it", n)
	}
	r, err := e.s.PopWake(ctx, e.ns, storage.PopParams{Limit: 10, LeaseFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := e.g.calls.Load(); n != 1 {
		t.Errorf("the wake made %d script calls, want 1 (the pop carrying the acks and the nack)", n)
	}
	for i, o := range out[:3] {
		if o.err != nil || len(o.st) == 0 || o.st[0] != storage.TokenOK {
			t.Errorf("ack %d = %v, %v; want OK", i, o.st, o.err)
		}
	}
	if st := out[2].st; len(st) != 2 || st[1] != storage.TokenNotFound {
		t.Errorf("the second ack of delivery 0 in the same pop = %v, want NOT_FOUND", st)
	}
	if o := out[3]; o.err != nil || len(o.st) != 1 || o.st[0] != storage.TokenOK || len(o.moved) != 1 || o.moved[0].State != storage.StateScheduled {
		t.Errorf("nack = %+v; want OK, moved to scheduled", o)
	}
	if len(r.Deliveries) != 1 || r.Deliveries[0].Task.ID != e.dels[3].Task.ID || r.Deliveries[0].Token.Attempt != 2 ||
		r.Deliveries[0].Task.LastError != "again" {
		t.Errorf("the pop delivered %+v; want the nacked task again, attempt 2", r.Deliveries)
	}
	if !e.s.settles.idle() {
		t.Error("settle queues not idle after the pop")
	}
	st, err := e.s.Stats(ctx, e.ns)
	if err != nil || st.Delivered != 1 || st.Scheduled != 0 {
		t.Errorf("after the pop: %+v, %v; want only the redelivered task, in flight", st, err)
	}
}

// An ack waits for the pop it was told of only until the time given: when
// no pop comes it settles on its own; and a store told that no pop is
// coming (ExpectPop 0) sends what waits at once.
func TestAcksWaitForThePopOnlyAsLongAsSaid(t *testing.T) {
	t.Parallel()
	e := newSettleEnv(t, 2, false, Options{})
	ctx := context.Background()
	// No pop comes within the ride (a bound for a loaded machine: what is
	// checked is that the ack waited, then went alone).
	e.s.ExpectPop(e.ns, 300*time.Millisecond)
	done := make(chan settleOut, 1)
	go func() {
		st, err := e.s.Ack(ctx, e.ns, []storage.Token{e.dels[0].Token})
		done <- settleOut{st: st, err: err}
	}()
	e.waitQueued(1)
	if n := e.g.calls.Load(); n != 0 {
		t.Fatalf("%d script calls while the ack waited for the pop", n)
	}
	if o := <-done; o.err != nil || o.st[0] != storage.TokenOK {
		t.Fatalf("ack after the ride = %v, %v; want OK", o.st, o.err)
	}
	if n := e.g.calls.Load(); n != 1 {
		t.Fatalf("the ack made %d script calls, want 1 of its own", n)
	}
	// Told of a pop an hour away, then that none is coming: the ack goes.
	e.s.ExpectPop(e.ns, time.Hour)
	go func() {
		st, err := e.s.Ack(ctx, e.ns, []storage.Token{e.dels[1].Token})
		done <- settleOut{st: st, err: err}
	}()
	e.waitQueued(1)
	e.s.ExpectPop(e.ns, 0)
	if o := <-done; o.err != nil || o.st[0] != storage.TokenOK {
		t.Fatalf("ack once no pop is coming = %v, %v; want OK", o.st, o.err)
	}
	if n := e.g.calls.Load(); n != 2 {
		t.Errorf("%d script calls, want 2: one per ack", n)
	}
}

// A lone ack (no call of its shard in flight, no pop coming) goes out at
// once; acks that arrive while a pop is in flight wait for it to end and
// then settle together in one call.
func TestAcksFollowThePopInFlight(t *testing.T) {
	t.Parallel()
	e := newSettleEnv(t, 3, true, Options{})
	ctx := context.Background()
	// The pop (held by the gate) is in flight.
	popped := make(chan error, 1)
	go func() {
		_, err := e.s.PopWake(ctx, e.ns, storage.PopParams{Limit: 1, LeaseFor: time.Hour})
		popped <- err
	}()
	<-e.g.held
	out := make([]settleOut, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { out[i].st, out[i].err = e.s.Ack(ctx, e.ns, []storage.Token{e.dels[i].Token}) })
		e.waitQueued(i + 1)
	}
	e.g.open()
	if err := <-popped; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, o := range out {
		if o.err != nil || o.st[0] != storage.TokenOK {
			t.Errorf("ack %d = %v, %v; want OK", i, o.st, o.err)
		}
	}
	if n := e.g.calls.Load(); n != 2 {
		t.Errorf("%d script calls, want 2: the pop, then the three acks together", n)
	}
	// Nothing in flight and no pop coming: an ack does not wait.
	e2 := newSettleEnv(t, 1, false, Options{})
	if st, err := e2.s.Ack(ctx, e2.ns, []storage.Token{e2.dels[0].Token}); err != nil || st[0] != storage.TokenOK {
		t.Fatalf("lone ack = %v, %v", st, err)
	}
	if n := e2.g.calls.Load(); n != 1 || e2.s.settles.queued(settleKey{ns: e2.ns}) != 0 {
		t.Errorf("a lone ack made %d script calls, want 1 at once", n)
	}
}

// Durable mode's acks (AckMarked) ride the pop too, and leave their ack
// markers; an ack whose context ends while it waits leaves unapplied.
func TestAckMarkedRidesThePop(t *testing.T) {
	t.Parallel()
	e := newSettleEnv(t, 2, false, Options{})
	ctx := context.Background()
	e.s.ExpectPop(e.ns, time.Hour)
	done := make(chan settleOut, 1)
	go func() {
		st, err := e.s.AckMarked(ctx, e.ns, []storage.Token{e.dels[0].Token})
		done <- settleOut{st: st, err: err}
	}()
	e.waitQueued(1)
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := e.s.Ack(cctx, e.ns, []storage.Token{e.dels[1].Token})
		gaveUp <- err
	}()
	e.waitQueued(2)
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("an ack whose context ended while it waited returned no error")
	}
	if _, err := e.s.PopWake(ctx, e.ns, storage.PopParams{Limit: 10, LeaseFor: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if o := <-done; o.err != nil || o.st[0] != storage.TokenOK {
		t.Fatalf("marked ack = %v, %v; want OK", o.st, o.err)
	}
	k := keysFor(e.ns, 0)
	if m, _ := e.s.rdb.HGet(ctx, k.acked, e.dels[0].Task.ID).Result(); m == "" {
		t.Error("the ack carried by the pop left no ack marker")
	}
	if g, err := e.s.Get(ctx, e.ns, e.dels[1].Task.ID); err != nil || g.State != storage.StateDelivered {
		t.Errorf("the given-up ack's task = %+v, %v; want still delivered", g, err)
	}
}

// A ride the dispatcher extends (its next ExpectPop, as every round of a
// steady flow says one) moves the waiting acks' timer to the new end,
// instead of letting it fire at the old end only to be set again; the
// acks still ride the pop (issue 37 item 4).
func TestARideExtendedMovesTheWait(t *testing.T) {
	t.Parallel()
	e := newSettleEnv(t, 1, false, Options{})
	ctx := context.Background()
	e.s.ExpectPop(e.ns, time.Minute)
	done := make(chan settleOut, 1)
	go func() {
		st, err := e.s.Ack(ctx, e.ns, []storage.Token{e.dels[0].Token})
		done <- settleOut{st: st, err: err}
	}()
	e.waitQueued(1)
	timerAt := func() time.Time {
		e.s.settles.mu.Lock()
		defer e.s.settles.mu.Unlock()
		return e.s.settles.queues[settleKey{ns: e.ns}].timerAt
	}
	first := timerAt()
	e.s.ExpectPop(e.ns, time.Hour)
	if moved := timerAt(); moved.Sub(first) < 50*time.Minute {
		t.Errorf("the waiting ack's timer is at %v after the ride moved an hour ahead (it was at %v); want it moved with the ride",
			moved, first)
	}
	if _, err := e.s.PopWake(ctx, e.ns, storage.PopParams{Limit: 1, LeaseFor: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if o := <-done; o.err != nil || o.st[0] != storage.TokenOK {
		t.Fatalf("ack = %v, %v; want OK", o.st, o.err)
	}
	if n := e.g.calls.Load(); n != 1 {
		t.Errorf("%d script calls, want 1: the pop carrying the ack", n)
	}
}
