package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

// wait is how long a test waits for something that should happen; it is a
// bound on "never happens", not on speed.
const wait = 15 * time.Second

// quiet is how long a test watches for something that must NOT happen.
const quiet = 300 * time.Millisecond

// await waits for a signal of the dispatcher (dispatcher.Watch): what is
// waited for has happened when it returns, with no sleep to guess it.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("not within %s: %s", wait, what)
	}
}

// planned matches a round of ns's loop whose plan satisfies ok.
func planned(ns string, ok func(dispatcher.Event) bool) func(dispatcher.Event) bool {
	return func(e dispatcher.Event) bool { return e.Kind == dispatcher.EventPlanned && e.Namespace == ns && ok(e) }
}

// offsetClock is the system clock plus an offset a test moves forward: a
// rule of the form "after PolicyRefresh" is reached without sleeping.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// harness is one in-memory store (storagefake: the Redis index's semantics,
// checked by the conformance suite), a namespace and a started dispatcher.
// Dispatcher tests need no Redis: what they test is the loop above the
// store's contract; the end-to-end tests in daemon/ run it on real stores.
type harness struct {
	t     *testing.T
	store *storagefake.Store
	d     *dispatcher.Dispatcher
	ns    string
}

var nsSeq atomic.Int64

// randomSuffix names a namespace of the test's own.
func randomSuffix() string { return fmt.Sprint(nsSeq.Add(1)) }

// newHarness starts a dispatcher over a fresh in-memory store with pol for
// every namespace; edit adjusts the Config before New.
func newHarness(t *testing.T, pol storage.Policy, edit func(*dispatcher.Config)) *harness {
	t.Helper()
	h := &harness{t: t, store: storagefake.New(nil), ns: "dt-" + randomSuffix()}
	h.d = h.startDispatcher(pol, edit)
	return h
}

// startDispatcher starts another dispatcher (replica) over h's store.
func (h *harness) startDispatcher(pol storage.Policy, edit func(*dispatcher.Config)) *dispatcher.Dispatcher {
	h.t.Helper()
	cfg := dispatcher.Config{Store: h.store, Wakeups: h.store, Policies: storage.StaticPolicies{P: pol}}
	if edit != nil {
		edit(&cfg)
	}
	d, err := dispatcher.New(cfg)
	if err != nil {
		h.t.Fatalf("dispatcher.New: %v", err)
	}
	if err := d.Start(context.Background()); err != nil {
		h.t.Fatalf("Start: %v", err)
	}
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			h.t.Errorf("Stop: %v", err)
		}
	})
	return d
}

func testPolicy() storage.Policy {
	p := storage.DefaultPolicy()
	p.AckTimeout = time.Hour
	p.Backoff = storage.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	return p
}

// upsert stores tasks due after delay and tells d, as the server does.
func (h *harness) upsert(d *dispatcher.Dispatcher, delay time.Duration, ids ...string) {
	h.t.Helper()
	specs := make([]storage.UpsertSpec, len(ids))
	for i, id := range ids {
		specs[i] = storage.UpsertSpec{ID: id, Delay: delay, Payload: []byte("p-" + id)}
	}
	res, err := h.store.Upsert(context.Background(), h.ns, specs)
	if err != nil {
		h.t.Fatalf("Upsert: %v", err)
	}
	for _, r := range res {
		if r.Earliest && d != nil {
			d.Notify(h.ns)
		}
	}
}

// redisNow is the store's clock.
func (h *harness) redisNow() time.Time { return h.store.Now() }

func (h *harness) get(id string) (storage.Task, error) {
	return h.store.Get(context.Background(), h.ns, id)
}

// ack acks tokens in the store and frees their credit through d, as the
// server of replica d does.
func (h *harness) ack(d *dispatcher.Dispatcher, toks ...storage.Token) []storage.TokenStatus {
	h.t.Helper()
	st, err := h.store.Ack(context.Background(), h.ns, toks)
	if err != nil {
		h.t.Fatalf("Ack: %v", err)
	}
	settled := make([]bool, len(toks))
	for i := range toks {
		settled[i] = st[i] == storage.TokenOK
	}
	d.Settle(context.Background(), h.ns, toks, settled)
	return st
}

// sub is one subscriber served by Dispatcher.Serve in its own goroutine.
type sub struct {
	ch     chan storage.Delivery
	cancel context.CancelFunc
	done   chan error
}

// subscribe serves a subscriber whose Send never blocks (a big buffer).
func (h *harness) subscribe(d *dispatcher.Dispatcher, ns string, maxInFlight int) *sub {
	return h.subscribeWith(d, ns, maxInFlight, nil)
}

// subscribeWith serves a subscriber; block, if set, is waited on inside
// every Send before the delivery is handed over (a slow subscriber).
func (h *harness) subscribeWith(d *dispatcher.Dispatcher, ns string, maxInFlight int, block chan struct{}) *sub {
	h.t.Helper()
	return h.subscribeKinds(d, ns, maxInFlight, block, nil)
}

// subscribeKinds serves a subscriber of the given task kinds (nil: all).
func (h *harness) subscribeKinds(d *dispatcher.Dispatcher, ns string, maxInFlight int, block chan struct{}, kinds []string) *sub {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &sub{ch: make(chan storage.Delivery, 100000), cancel: cancel, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		s.done <- d.Serve(ctx, dispatcher.Subscriber{
			Namespace:   ns,
			MaxInFlight: maxInFlight,
			Kinds:       kinds,
			Ready:       func() error { close(ready); return nil },
			Send: func(del storage.Delivery) error {
				if block != nil {
					select {
					case <-block:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				s.ch <- del
				return nil
			},
		})
	}()
	select {
	case <-ready:
	case err := <-s.done:
		h.t.Fatalf("Serve returned before Ready: %v", err)
	}
	h.t.Cleanup(func() { s.close() })
	return s
}

// close ends the subscriber and returns what Serve returned.
func (s *sub) close() error {
	s.cancel()
	err, ok := <-s.done
	if ok {
		close(s.done)
	}
	return err
}

func (s *sub) next(t *testing.T) storage.Delivery {
	t.Helper()
	select {
	case d := <-s.ch:
		return d
	case <-time.After(wait):
		t.Fatalf("no delivery within %s", wait)
		return storage.Delivery{}
	}
}

func (s *sub) none(t *testing.T) {
	t.Helper()
	select {
	case d := <-s.ch:
		t.Fatalf("unexpected delivery of %s (attempt %d)", d.Task.ID, d.Token.Attempt)
	case <-time.After(quiet):
	}
}

func TestCreditBoundsInFlightAndAckFreesIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), nil)
	h.upsert(h.d, 0, "a", "b", "c", "d", "e")
	s := h.subscribe(h.d, h.ns, 2)

	first, second := s.next(t), s.next(t)
	s.none(t) // max_in_flight 2: nothing more until an ack.

	if st := h.ack(h.d, first.Token); st[0] != storage.TokenOK {
		t.Fatalf("ack: %v, want OK", st[0])
	}
	third := s.next(t)
	s.none(t)
	seen := map[string]bool{first.Task.ID: true, second.Task.ID: true, third.Task.ID: true}
	h.ack(h.d, second.Token, third.Token)
	for range 2 {
		d := s.next(t)
		seen[d.Task.ID] = true
		h.ack(h.d, d.Token)
	}
	if len(seen) != 5 {
		t.Fatalf("delivered %v, want a..e once each", seen)
	}
	for id := range seen {
		if _, err := h.get(id); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("after ack, Get(%s) = %v, want ErrNotFound", id, err)
		}
	}
}

// TestAckOnOtherReplicaFreesCredit (issue 15 item 4): a delivery held by a
// stream of replica A and acked through replica B frees the stream's credit
// at once: B announces it over the wake-up channel. Before, A learnt it
// only at its next lease renewal (every Liveness/3; here 20 minutes) or
// when the lease ended.
func TestAckOnOtherReplicaFreesCredit(t *testing.T) {
	t.Parallel()
	polsA := newCachedPolicies(&mutablePolicies{p: testPolicy()})
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) { c.Liveness, c.Policies = time.Hour, polsA })
	b := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { c.Liveness = time.Hour })
	s := h.subscribe(h.d, h.ns, 1)
	h.upsert(h.d, 0, "a", "b")
	first := s.next(t)
	s.none(t) // max_in_flight 1
	// A subscribes to the wake-up channel in the background: make sure it
	// hears B before B announces the ack.
	deadline := time.After(wait)
	for heard := false; !heard; {
		b.PolicyChanged(context.Background(), h.ns)
		select {
		case <-polsA.invalidated:
			heard = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("replica A never heard replica B on the wake-up channel")
		}
	}
	if st := h.ack(b, first.Token); st[0] != storage.TokenOK {
		t.Fatalf("ack through B: %v, want OK", st[0])
	}
	if second := s.next(t); second.Task.ID == first.Task.ID {
		t.Fatalf("the acked task %s came again", first.Task.ID)
	}
	// A token the store did not settle (acked twice) is not announced:
	// nothing frees credit that is in use.
	ctx, cancel := context.WithCancel(context.Background())
	settled := make(chan []storage.Token, 10)
	subscribed := make(chan error, 1)
	go func() {
		subscribed <- h.store.SubscribeWakeups(ctx, func() {}, func(w storage.Wakeup) {
			if len(w.Settled) > 0 {
				settled <- w.Settled
			}
		})
	}()
	defer func() { cancel(); <-subscribed }()
	time.Sleep(quiet) // let the subscription start
	if st := h.ack(b, first.Token); st[0] == storage.TokenOK {
		t.Fatalf("second ack of one token: %v", st[0])
	}
	select {
	case toks := <-settled:
		t.Fatalf("a token the store did not settle was announced: %+v", toks)
	case <-time.After(quiet):
	}
}

func TestNoSubscriberNoPop(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), nil)
	other := "dt-other-" + randomSuffix()

	// A subscriber of another namespace keeps the dispatcher busy there.
	s := h.subscribe(h.d, other, 10)
	h.upsert(h.d, 0, "lonely")
	s.none(t)
	task, err := h.get("lonely")
	if err != nil {
		t.Fatal(err)
	}
	if task.State != storage.StateScheduled || task.Attempt != 0 {
		t.Fatalf("task in a namespace without subscriber: state %v attempt %d, want scheduled, 0", task.State, task.Attempt)
	}
}

func TestSlowSubscriberDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), nil)
	block := make(chan struct{}) // never closed: the slow subscriber's Send hangs
	slow := h.subscribeWith(h.d, h.ns, 1, block)
	fast := h.subscribe(h.d, h.ns, 4)

	ids := make([]string, 40)
	for i := range ids {
		ids[i] = "t" + string(rune('a'+i/26)) + string(rune('a'+i%26))
	}
	h.upsert(h.d, 0, ids...)

	got := map[string]int{}
	for len(got) < len(ids)-1 {
		d := fast.next(t)
		got[d.Task.ID]++
		h.ack(h.d, d.Token)
	}
	// The one task the slow subscriber's Send never got through comes back
	// when it goes away, at once (the lease is an hour).
	if err := slow.close(); !errors.Is(err, context.Canceled) {
		t.Fatalf("slow Serve returned %v, want context.Canceled", err)
	}
	d := fast.next(t)
	got[d.Task.ID]++
	h.ack(h.d, d.Token)
	if len(got) != len(ids) {
		t.Fatalf("fast subscriber got %d distinct tasks, want %d", len(got), len(ids))
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("task %s delivered %d times to the fast subscriber", id, n)
		}
	}
}

// A stream that ends leaves what it was sent leased (issue 10 item 4): the
// subscriber may still be working on it and ack it over another stream or
// replica. With max_attempts 1 a stream close used to send every task in
// progress to the dead letters.
func TestStreamEndLeavesSentLeased(t *testing.T) {
	t.Parallel()
	pol := testPolicy() // lease: one hour
	pol.MaxAttempts = 1
	h := newHarness(t, pol, nil)
	a := h.subscribe(h.d, h.ns, 10)
	h.upsert(h.d, 0, "x")
	first := a.next(t)
	if first.Token.Attempt != 1 {
		t.Fatalf("first delivery attempt %d, want 1", first.Token.Attempt)
	}
	if err := a.close(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve returned %v, want context.Canceled", err)
	}
	task, err := h.get("x")
	if err != nil {
		t.Fatal(err)
	}
	if task.State != storage.StateDelivered || task.Attempt != 1 {
		t.Fatalf("after the stream ended: state %v attempt %d (%q); want delivered (still leased) attempt 1", task.State, task.Attempt, task.LastError)
	}
	b := h.subscribe(h.d, h.ns, 10)
	b.none(t)
	// The subscriber finishes the work and acks over its new stream.
	if st := h.ack(h.d, first.Token); st[0] != storage.TokenOK {
		t.Fatalf("ack after the stream ended: %v, want OK", st[0])
	}
}

// TestStreamEndSentComesBackAtItsDeadline: what a stream was sent before it
// ended and its subscriber never acks comes back once the lease deadline the
// subscriber was told has passed, and not before (the duplicate README's
// "Delivery guarantees" lists for a broken stream or a replica that shut
// down).
func TestStreamEndSentComesBackAtItsDeadline(t *testing.T) {
	t.Parallel()
	pol := testPolicy()
	pol.AckTimeout = 1500 * time.Millisecond
	h := newHarness(t, pol, nil)
	a := h.subscribe(h.d, h.ns, 10)
	h.upsert(h.d, 0, "x")
	first := a.next(t)
	if err := a.close(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve returned %v, want context.Canceled", err)
	}
	b := h.subscribe(h.d, h.ns, 10)
	again := b.next(t)
	// Redis's clock decides the deadline; this host's may differ by a
	// little from it.
	if early := time.Until(first.LeaseDeadline); early > 100*time.Millisecond {
		t.Fatalf("redelivered %v before the deadline its first subscriber was told", early)
	}
	if again.Task.ID != "x" || again.Token.Attempt != 2 || again.Token == first.Token {
		t.Fatalf("redelivery = %+v, token %+v; want x, attempt 2, a new token", again.Task, again.Token)
	}
	if st := h.ack(h.d, first.Token); st[0] == storage.TokenOK {
		t.Fatalf("the first delivery's late ack = %v; want it refused", st[0])
	}
}

// A delivery popped for a stream but never sent to it goes back without
// costing an attempt (issue 10 item 4).
func TestUnsentHandBackCostsNoAttempt(t *testing.T) {
	t.Parallel()
	pol := testPolicy()
	pol.MaxAttempts = 1
	h := newHarness(t, pol, nil)
	block := make(chan struct{}) // never closed: the first Send never completes
	a := h.subscribeWith(h.d, h.ns, 5, block)
	ids := []string{"u1", "u2", "u3", "u4", "u5"}
	h.upsert(h.d, 0, ids...)
	testkit.Eventually(t, wait, "five tasks popped for the stream", func() bool {
		st, err := h.store.Stats(context.Background(), h.ns)
		return err == nil && st.Delivered == 5
	})
	if err := a.close(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve returned %v, want context.Canceled", err)
	}
	// Four waited in the stream's queue; the fifth was in a Send that
	// failed (the stream ended): none reached the subscriber.
	for _, id := range ids {
		task, err := h.get(id)
		if err != nil {
			t.Fatal(err)
		}
		if task.State != storage.StateScheduled || task.Attempt != 0 {
			t.Errorf("%s after the stream ended: state %v attempt %d (%q); want scheduled, attempt 0", id, task.State, task.Attempt, task.LastError)
		}
	}
}

// frozenStore is the real store until frozen; then every call blocks until
// its context ends, as the store calls of a replica that hangs or died do.
type frozenStore struct {
	dispatcher.Store
	frozen atomic.Bool
}

func (f *frozenStore) wait(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *frozenStore) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	if f.frozen.Load() {
		return storage.PopResult{}, f.wait(ctx)
	}
	return f.Store.PopWake(ctx, ns, p)
}

func (f *frozenStore) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	if f.frozen.Load() {
		return nil, f.wait(ctx)
	}
	return f.Store.Extend(ctx, ns, tokens, by)
}

// The deliveries of a replica that stopped working (crashed, hung) come
// back within about the liveness lease, not after the ack timeout (an
// hour here): the replica renews the store leases of what it holds, and
// the renewals stop with it (issue 10 item 4).
//
// The liveness lease is 3 s, renewed every second: a renewal that comes
// up to 2 s late (a loaded machine running -race starves goroutines for
// hundreds of milliseconds) still keeps the lease. With 1 s (a renewal
// every 333 ms, 667 ms of slack) the test failed under load: a late
// renewal let the lease run out while the replica was alive, and the
// other replica reclaimed the tasks before the freeze.
func TestDeadReplicaLeasesComeBackSoon(t *testing.T) {
	t.Parallel()
	const liveness = 3 * time.Second
	live := func(c *dispatcher.Config) { c.Liveness = liveness }
	h := newHarness(t, testPolicy(), live)
	fs := &frozenStore{Store: h.store}
	dead := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { live(c); c.Store = fs; c.StoreTimeout = 500 * time.Millisecond })
	a := h.subscribe(dead, h.ns, 10)
	h.upsert(dead, 0, "d1", "d2")
	got := map[string]storage.Delivery{}
	for range 2 {
		d := a.next(t)
		got[d.Task.ID] = d
	}
	// Outlive the first store lease: a live replica keeps its leases, by
	// renewing them (the store's deadline moves past the pop's).
	time.Sleep(liveness + time.Second)
	// The earliest store lease of the namespace (nothing else is scheduled).
	storeLease, _, ok, err := h.store.NextWake(context.Background(), h.ns)
	if err != nil || !ok {
		t.Fatalf("next wake = %v, %v, %v", storeLease, ok, err)
	}
	for id, d := range got {
		task, err := h.get(id)
		if err != nil {
			t.Fatal(err)
		}
		if task.State != storage.StateDelivered || task.Attempt != 1 {
			t.Fatalf("%s while its replica lives: state %v attempt %d (%q), want still delivered, attempt 1", id, task.State, task.Attempt, task.LastError)
		}
		// Get shows the deadline the subscriber was told, not the short,
		// renewed store lease.
		if !task.LeaseDeadline.Equal(d.LeaseDeadline) {
			t.Errorf("%s: Get shows lease deadline %s, want the one its subscriber was told, %s", id, task.LeaseDeadline, d.LeaseDeadline)
		}
		popLease := d.LeaseDeadline.Add(-time.Hour + liveness) // the pop leased it for liveness
		if !storeLease.After(popLease) {
			t.Errorf("%s store lease ends %s, not after the pop's %s: not renewed", id, storeLease, popLease)
		}
	}
	b := h.subscribe(h.d, h.ns, 10)
	b.none(t)
	fs.frozen.Store(true)
	frozen := time.Now()
	again := map[string]bool{}
	for range 2 {
		d := b.next(t)
		again[d.Task.ID] = true
		if d.Token.Attempt != 2 {
			t.Errorf("%s reclaimed with attempt %d, want 2", d.Task.ID, d.Token.Attempt)
		}
	}
	if !again["d1"] || !again["d2"] {
		t.Fatalf("reclaimed %v, want d1 and d2", again)
	}
	// "Soon": within the wait bound (15 s), far below the hour the ack
	// timeout would take; logged, not asserted as a speed.
	t.Logf("reclaimed %s after the replica froze (liveness %s)", time.Since(frozen), liveness)
}

func TestLeaseExpiryFreesCreditAndRedelivers(t *testing.T) {
	t.Parallel()
	pol := testPolicy()
	pol.AckTimeout = 200 * time.Millisecond
	h := newHarness(t, pol, nil)
	s := h.subscribe(h.d, h.ns, 1) // never acks
	h.upsert(h.d, 0, "held")
	for want := int32(1); want <= 3; want++ {
		d := s.next(t)
		if d.Task.ID != "held" || d.Token.Attempt != want {
			t.Fatalf("delivery %s attempt %d, want held attempt %d", d.Task.ID, d.Token.Attempt, want)
		}
		if want > 1 && d.Task.LastError != dispatcher.ReasonLeaseExpired {
			t.Errorf("redelivery last error %q, want %q", d.Task.LastError, dispatcher.ReasonLeaseExpired)
		}
	}
}

// Stop leaves what the streams were sent leased, so a rolling deploy does
// not redeliver the tasks in progress (nor, with max_attempts 1, kill
// them): their acks work on any replica (issue 10 item 4).
func TestStopLeavesSentLeasedAndEndsStreams(t *testing.T) {
	t.Parallel()
	pol := testPolicy()
	pol.MaxAttempts = 1
	h := newHarness(t, pol, nil)
	d := h.startDispatcher(pol, nil)
	s := h.subscribe(d, h.ns, 10)
	h.upsert(d, 0, "s1", "s2")
	toks := []storage.Token{s.next(t).Token, s.next(t).Token}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case err := <-s.done:
		s.done <- err
		if !errors.Is(err, dispatcher.ErrStopped) {
			t.Fatalf("Serve returned %v, want ErrStopped", err)
		}
	case <-time.After(wait):
		t.Fatal("Serve did not return after Stop")
	}
	for _, id := range []string{"s1", "s2"} {
		task, err := h.get(id)
		if err != nil {
			t.Fatal(err)
		}
		if task.State != storage.StateDelivered || task.Attempt != 1 {
			t.Errorf("%s after Stop: state %v attempt %d (%q); want delivered (still leased) attempt 1", id, task.State, task.Attempt, task.LastError)
		}
	}
	// The other replica takes the acks.
	for i, st := range h.ack(h.d, toks...) {
		if st != storage.TokenOK {
			t.Errorf("ack %d after Stop: %v, want OK", i, st)
		}
	}
	err := d.Serve(context.Background(), dispatcher.Subscriber{Namespace: h.ns, MaxInFlight: 1, Send: func(storage.Delivery) error { return nil }})
	if !errors.Is(err, dispatcher.ErrStopped) {
		t.Fatalf("Serve after Stop: %v, want ErrStopped", err)
	}
}

func TestWakeupFromAnotherReplica(t *testing.T) {
	t.Parallel()
	// The safety poll is a minute: only a pub/sub wake-up makes the
	// subscriber's replica look before the test gives up.
	slowPoll := func(c *dispatcher.Config) { c.SafetyPoll = time.Minute }
	var sig *dispatcher.Signals
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) { slowPoll(c); sig = dispatcher.Watch(c) })
	other := h.startDispatcher(testPolicy(), slowPoll)
	idle := sig.Next(planned(h.ns, func(e dispatcher.Event) bool { return e.Wait == time.Minute }))
	s := h.subscribe(h.d, h.ns, 10)
	await(t, idle, "h.d plans a one-minute sleep on the empty namespace")
	h.upsert(other, 0, "remote")
	if d := s.next(t); d.Task.ID != "remote" {
		t.Fatalf("got %s, want remote", d.Task.ID)
	}
}

// TestWakeupBeforeSubscribedIsNotMissed: a wake-up published while this
// replica's subscription is not yet made (a slow first subscribe, or the
// gap before a lost connection is re-made) never reaches it — pub/sub
// keeps nothing — so the dispatcher looks again once the subscription is
// made, instead of sleeping until the safety poll. (Before, the task
// waited for the one-minute poll; TestWakeupFromAnotherReplica failed that
// way under load when the upsert beat the background subscribe.)
func TestWakeupBeforeSubscribedIsNotMissed(t *testing.T) {
	t.Parallel()
	slowPoll := func(c *dispatcher.Config) { c.SafetyPoll = time.Minute }
	var sig *dispatcher.Signals
	gate := make(chan struct{})
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		slowPoll(c)
		sig = dispatcher.Watch(c)
		c.Wakeups = gatedWakeups{Wakeups: c.Wakeups, gate: gate}
	})
	other := h.startDispatcher(testPolicy(), slowPoll)
	idle := sig.Next(planned(h.ns, func(e dispatcher.Event) bool { return e.Wait == time.Minute }))
	s := h.subscribe(h.d, h.ns, 10)
	await(t, idle, "h.d plans a one-minute sleep on the empty namespace")
	h.upsert(other, 0, "remote") // its wake-up reaches no subscription of h.d
	close(gate)
	if d := s.next(t); d.Task.ID != "remote" {
		t.Fatalf("got %s, want remote", d.Task.ID)
	}
}

// gatedWakeups makes its subscription only once gate is closed.
type gatedWakeups struct {
	storage.Wakeups
	gate <-chan struct{}
}

func (g gatedWakeups) SubscribeWakeups(ctx context.Context, ready func(), fn func(storage.Wakeup)) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Wakeups.SubscribeWakeups(ctx, ready, fn)
}

// mutablePolicies serves one policy that a test may change.
type mutablePolicies struct {
	mu sync.Mutex
	p  storage.Policy
}

func (m *mutablePolicies) Policy(context.Context, string) (storage.Policy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.p, nil
}

func (m *mutablePolicies) set(p storage.Policy) {
	m.mu.Lock()
	m.p = p
	m.mu.Unlock()
}

func (m *mutablePolicies) Invalidate(string) {}

// cachedPolicies is one replica's view of a shared policy (src) through a
// cache that never expires on its own, as tenancy's would with an endless
// TTL: only Invalidate makes it read src again. invalidated receives a
// value per Invalidate.
type cachedPolicies struct {
	src         *mutablePolicies
	mu          sync.Mutex
	cached      *storage.Policy
	invalidated chan struct{}
}

func newCachedPolicies(src *mutablePolicies) *cachedPolicies {
	return &cachedPolicies{src: src, invalidated: make(chan struct{}, 100)}
}

func (c *cachedPolicies) Policy(ctx context.Context, ns string) (storage.Policy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cached == nil {
		p, _ := c.src.Policy(ctx, ns)
		c.cached = &p
	}
	return *c.cached, nil
}

func (c *cachedPolicies) Invalidate(string) {
	c.mu.Lock()
	c.cached = nil
	c.mu.Unlock()
	c.invalidated <- struct{}{}
}

// TestPauseAndResumeApplyAtOnceOnEveryReplica: a pause or resume announced
// on replica A (PolicyChanged) reaches replica B's loop through the
// wake-up channel at once, though B's cached policy never expires and its
// refresh and safety poll are an hour away; while paused, nothing is
// delivered, the held lease stays held and can be acked.
func TestPauseAndResumeApplyAtOnceOnEveryReplica(t *testing.T) {
	t.Parallel()
	src := &mutablePolicies{p: testPolicy()}
	slow := func(pols *cachedPolicies) func(*dispatcher.Config) {
		return func(c *dispatcher.Config) {
			c.Policies = pols
			c.PolicyRefresh = time.Hour
			c.SafetyPoll = time.Hour
		}
	}
	polsA, polsB := newCachedPolicies(src), newCachedPolicies(src)
	h := newHarness(t, testPolicy(), slow(polsA))
	var sigB *dispatcher.Signals
	dB := h.startDispatcher(testPolicy(), func(c *dispatcher.Config) { slow(polsB)(c); sigB = dispatcher.Watch(c) })
	s := h.subscribe(dB, h.ns, 10) // only B has a subscriber

	h.upsert(dB, 0, "before")
	held := s.next(t)

	// Pause on A.
	paused := testPolicy()
	paused.Paused = true
	src.set(paused)
	announce := func() {
		t.Helper()
		for len(polsB.invalidated) > 0 {
			<-polsB.invalidated
		}
		// The replicas subscribe to the wake-up channel in the background:
		// announce again until B has heard it (a wake-up published before
		// B subscribed is lost, as with Redis pub/sub).
		deadline := time.After(wait)
		for {
			h.d.PolicyChanged(context.Background(), h.ns)
			select {
			case <-polsB.invalidated:
				return
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				t.Fatalf("replica B was not told of the policy change within %s", wait)
			}
		}
	}
	pausedRound := sigB.Next(planned(h.ns, func(e dispatcher.Event) bool { return e.Policy.Paused }))
	announce()
	await(t, pausedRound, "B's loop runs a round with the paused policy")
	h.upsert(dB, 0, "p1", "p2")
	s.none(t)
	for _, id := range []string{"p1", "p2"} {
		if task, err := h.get(id); err != nil || task.State != storage.StateScheduled || task.Attempt != 0 {
			t.Fatalf("%s while paused: %+v, %v; want scheduled, attempt 0", id, task, err)
		}
	}
	if st := h.ack(dB, held.Token); st[0] != storage.TokenOK {
		t.Fatalf("ack of a delivery made before the pause: %v, want OK", st[0])
	}
	s.none(t) // the freed credit pops nothing while paused

	// Resume on A: B delivers at once (its own refresh is an hour away).
	src.set(testPolicy())
	announce()
	got := map[string]bool{}
	for range 2 {
		got[s.next(t).Task.ID] = true
	}
	if !got["p1"] || !got["p2"] {
		t.Fatalf("after resume delivered %v, want p1 and p2", got)
	}
}

func TestPolicyChangeAppliesWithoutRestart(t *testing.T) {
	t.Parallel()
	pols := &mutablePolicies{p: testPolicy()} // lease: one hour
	clock := &offsetClock{}
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		c.Policies = pols
		c.PolicyRefresh = 50 * time.Millisecond
		c.Clock = clock
	})
	s := h.subscribe(h.d, h.ns, 10)
	h.upsert(h.d, 0, "p1")
	if d := s.next(t); d.LeaseDeadline.Sub(h.redisNow()) < 30*time.Minute {
		t.Fatalf("first lease ends %s from now, want about an hour", d.LeaseDeadline.Sub(h.redisNow()))
	}
	short := testPolicy()
	short.AckTimeout = 150 * time.Millisecond
	pols.set(short)
	clock.advance(2 * 50 * time.Millisecond) // the cached policy is now past PolicyRefresh
	h.upsert(h.d, 0, "p2")
	d := s.next(t)
	if d.Task.ID != "p2" {
		t.Fatalf("got %s, want p2", d.Task.ID)
	}
	if lease := d.LeaseDeadline.Sub(h.redisNow()); lease > time.Minute {
		t.Fatalf("lease after the policy change ends %s from now, want at most 150ms", lease)
	}
	// And the short lease is enforced: p2 comes back.
	if again := s.next(t); again.Task.ID != "p2" || again.Token.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want p2 attempt 2", again.Task.ID, again.Token.Attempt)
	}
}

func TestNewRequiresStore(t *testing.T) {
	if _, err := dispatcher.New(dispatcher.Config{}); err == nil {
		t.Fatal("New without Store succeeded")
	}
}

func TestSweepReapsNamespacesWithoutSubscriber(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		c.Namespaces = nil // this replica: none
	})
	// A lease taken by a replica that then vanished (popped directly).
	h.upsert(nil, 0, "orphan")
	if dels, err := h.store.Pop(context.Background(), h.ns, storage.PopParams{Limit: 10, LeaseFor: 50 * time.Millisecond}); err != nil || len(dels) != 1 {
		t.Fatalf("Pop: %v, %v", dels, err)
	}
	// A replica with no subscriber of h.ns, sweeping every namespace.
	h.startDispatcher(testPolicy(), func(c *dispatcher.Config) {
		c.Namespaces = h.store
		c.SweepInterval = 100 * time.Millisecond
	})
	var task storage.Task
	testkit.Eventually(t, wait, "the sweep reaps the expired lease", func() bool {
		var err error
		task, err = h.get("orphan")
		return err == nil && task.State == storage.StateScheduled
	})
	if task.LastError != dispatcher.ReasonLeaseExpired || task.Attempt != 1 {
		t.Fatalf("swept task: last error %q attempt %d, want %q, 1", task.LastError, task.Attempt, dispatcher.ReasonLeaseExpired)
	}
}

// overlapStore is the real store with Pop instrumented: it counts Pops in
// flight at once, and until two have overlapped it holds each Pop for up to
// a second so that pops issued together are sure to meet.
type overlapStore struct {
	dispatcher.Store
	mu       sync.Mutex
	inflight int
	limits   []int
	met      chan struct{}
	metOnce  sync.Once
}

func (o *overlapStore) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	o.mu.Lock()
	o.inflight++
	o.limits = append(o.limits, p.Limit)
	if o.inflight >= 2 {
		o.metOnce.Do(func() { close(o.met) })
	}
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.inflight--
		o.mu.Unlock()
	}()
	select {
	case <-o.met:
	case <-time.After(time.Second):
	}
	return o.Store.PopWake(ctx, ns, p)
}

func (o *overlapStore) overlapped() bool {
	select {
	case <-o.met:
		return true
	default:
		return false
	}
}

// TestConcurrentPopsKeepCreditExact: with free credit above PopBatch the
// namespace pops in several calls at once, yet no stream is ever given more
// than its credit and no task is popped twice (an over-pop would be handed
// back and come again as attempt 2).
func TestConcurrentPopsKeepCreditExact(t *testing.T) {
	t.Parallel()
	var ov *overlapStore
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		ov = &overlapStore{Store: c.Store, met: make(chan struct{})}
		c.Store = ov
		c.PopBatch = 3
		c.PopConcurrency = 4
	})
	const tasks = 40
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = string(rune('A'+i/26)) + string(rune('a'+i%26))
	}
	h.upsert(h.d, 0, ids...)
	subs := []*sub{h.subscribe(h.d, h.ns, 5), h.subscribe(h.d, h.ns, 5)}

	seen := map[string]int{}
	for len(seen) < tasks {
		var toks []storage.Token
		for _, s := range subs {
			// Each stream gets its full credit, then nothing until an ack.
			for range 5 {
				if len(seen) == tasks {
					break
				}
				d := s.next(t)
				if d.Token.Attempt != 1 {
					t.Fatalf("%s delivered as attempt %d, want 1 (popped twice or handed back)", d.Task.ID, d.Token.Attempt)
				}
				seen[d.Task.ID]++
				toks = append(toks, d.Token)
			}
		}
		for _, s := range subs {
			s.none(t)
		}
		for i, st := range h.ack(h.d, toks...) {
			if st != storage.TokenOK {
				t.Fatalf("ack %s: %v, want OK", toks[i].ID, st)
			}
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times, want once", id, n)
		}
	}
	if !ov.overlapped() {
		t.Error("never two Pops in flight at once with free credit 10 > PopBatch 3")
	}
	ov.mu.Lock()
	defer ov.mu.Unlock()
	for _, l := range ov.limits {
		if l > 3 {
			t.Errorf("a Pop asked for %d tasks, more than PopBatch 3", l)
		}
	}
}

// countStore is the real store with Reap and Pop counted, and the most Pops
// in flight at once recorded.
type countStore struct {
	dispatcher.Store
	mu             sync.Mutex
	reaps, pops    int
	nextWakes      int
	inflight, peak int
}

func (c *countStore) NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error) {
	c.mu.Lock()
	c.nextWakes++
	c.mu.Unlock()
	return c.Store.NextWake(ctx, ns)
}

func (c *countStore) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	c.mu.Lock()
	c.reaps++
	c.mu.Unlock()
	return c.Store.Reap(ctx, ns, limit, opts)
}

func (c *countStore) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	c.mu.Lock()
	c.pops++
	c.inflight++
	c.peak = max(c.peak, c.inflight)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.inflight--
		c.mu.Unlock()
	}()
	return c.Store.PopWake(ctx, ns, p)
}

// TestSteadyFlowCostsOnePopPerWake: tasks falling due one by one (a steady
// flow) are each fetched by one Pop and no Reap, and the Pop's own answer
// plans the next wake: no NextWake call (issue 25 item 3: one store call per
// wake). Reaping on every planned wake and fanning out PopConcurrency Pops
// whenever free credit exceeded PopBatch used to cost three extra Redis
// calls per delivery (a reap and three empty pops), and a NextWake after
// every pop one more.
func TestSteadyFlowCostsOnePopPerWake(t *testing.T) {
	t.Parallel()
	var cs *countStore
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		cs = &countStore{Store: c.Store}
		c.Store = cs
		c.PopBatch = 16
		c.PopConcurrency = 4
		c.SafetyPoll = 30 * time.Second // periodic reaps every 3 s: none in this test
	})
	s := h.subscribe(h.d, h.ns, 1000) // free credit 1000 > PopBatch 16
	const tasks = 30
	for i := range tasks {
		h.upsert(h.d, 100*time.Millisecond+time.Duration(i)*20*time.Millisecond, fmt.Sprintf("t%02d", i))
	}
	for range tasks {
		d := s.next(t)
		h.ack(h.d, d.Token)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.peak != 1 {
		t.Errorf("%d Pops in flight at once with nothing backlogged, want 1", cs.peak)
	}
	// The first tick reaps; a lease or a late timer may add one or two.
	if cs.reaps > 4 {
		t.Errorf("%d Reaps for %d tasks falling due one by one (%d Pops), want at most 4: a reap per wake", cs.reaps, tasks, cs.pops)
	}
	if cs.nextWakes > 0 {
		t.Errorf("%d NextWake calls beside %d Pops for %d tasks: the pops answer the next wake themselves", cs.nextWakes, cs.pops, tasks)
	}
	// One Pop per task falling due, and a few for the subscription's
	// first credit and the upserts that put a task at the head.
	if cs.pops > tasks+5 {
		t.Errorf("%d Pops for %d tasks falling due one by one, want at most %d", cs.pops, tasks, tasks+5)
	}
}

// jitterStore is the real store with every Pop delayed by a random few
// milliseconds, so concurrent Pops run in Redis in any order.
type jitterStore struct {
	dispatcher.Store
}

func (j jitterStore) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	time.Sleep(time.Duration(mrand.IntN(20)) * time.Millisecond)
	return j.Store.PopWake(ctx, ns, p)
}

// TestStreamReceivesDueOrder (issue 10 item 6): a backlog drained by
// concurrent Pops (free credit above PopBatch) still reaches a stream in
// due order: the batches of one round are merged before they are
// distributed.
func TestStreamReceivesDueOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		c.Store = jitterStore{c.Store}
		c.PopBatch = 5
		c.PopConcurrency = 4
	})
	const tasks = 200
	now := h.redisNow()
	specs := make([]storage.UpsertSpec, tasks)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%03d", i), DueTime: now.Add(-time.Minute + time.Duration(i)*time.Millisecond)}
	}
	if _, err := h.store.Upsert(context.Background(), h.ns, specs); err != nil {
		t.Fatal(err)
	}
	s := h.subscribe(h.d, h.ns, tasks)
	var last time.Time
	for i := range tasks {
		d := s.next(t)
		if d.Task.DueTime.Before(last) {
			t.Fatalf("delivery %d (%s, due %v) arrived after one due %v", i, d.Task.ID, d.Task.DueTime, last)
		}
		last = d.Task.DueTime
	}
}

// skewClock is the system clock moved by off (a test jumps it forward).
type skewClock struct{ off atomic.Int64 }

func (c *skewClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// popLog is the real store with every popped token recorded.
type popLog struct {
	dispatcher.Store
	mu     sync.Mutex
	popped []storage.Token
}

func (l *popLog) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	r, err := l.Store.PopWake(ctx, ns, p)
	l.mu.Lock()
	for _, d := range r.Deliveries {
		l.popped = append(l.popped, d.Token)
	}
	l.mu.Unlock()
	return r, err
}

func (p *popLog) tokens() []storage.Token {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]storage.Token(nil), p.popped...)
}

// TestExpiredLeaseIsNotSent (issue 10 item 6): a delivery that waited in
// its stream's queue (the stream's Send was stuck) until its lease ran out
// — by the store's clock as the dispatcher knows it — is not sent: by then
// the store may have handed the task to another subscriber, and the token
// would be stale. It is handed back instead, without costing an attempt,
// and delivered afresh with a new token.
//
// Deterministic: the dispatcher's clock jumps past the lease while the
// store's lease (an hour, no renewals) still runs, so the test does not
// depend on timing; what is asserted is that the dispatcher, not the
// store, noticed.
func TestExpiredLeaseIsNotSent(t *testing.T) {
	t.Parallel()
	clock := &skewClock{}
	var log *popLog
	h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
		log = &popLog{Store: c.Store}
		c.Store = log
		c.Clock = clock
		c.Liveness = -1 // the store lease is the ack timeout (an hour)
	})
	entered := make(chan storage.Delivery, 10)
	release := make(chan struct{})
	got := make(chan storage.Delivery, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	first := true
	go func() {
		done <- h.d.Serve(ctx, dispatcher.Subscriber{Namespace: h.ns, MaxInFlight: 2, Send: func(d storage.Delivery) error {
			if first {
				first = false
				entered <- d
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			got <- d
			return nil
		}})
	}()
	t.Cleanup(func() { cancel(); <-done })
	h.upsert(h.d, 0, "a", "b")
	stuck := <-entered
	testkit.Eventually(t, wait, "both tasks popped for the stream", func() bool { return len(log.tokens()) == 2 })
	var queued storage.Token
	for _, tok := range log.tokens() {
		if tok.ID != stuck.Task.ID {
			queued = tok
		}
	}
	// The queued delivery's lease (an hour) runs out while Send is stuck.
	clock.off.Store(int64(2 * time.Hour))
	close(release)
	if d := <-got; d.Token != stuck.Token {
		t.Fatalf("first delivery %+v, want the stuck one %+v", d.Token, stuck.Token)
	}
	var again storage.Delivery
	select {
	case again = <-got:
	case <-time.After(wait):
		t.Fatalf("%s was not delivered again within %s (its expired delivery was dropped, not handed back)", queued.ID, wait)
	}
	if again.Token == queued {
		t.Fatalf("the delivery whose lease had run out was sent: %+v", again.Token)
	}
	if again.Task.ID != queued.ID || again.Token.Attempt != 1 || again.Token.Delivery <= queued.Delivery {
		t.Fatalf("redelivery %+v; want %s again as attempt 1 (handed back unsent) with a later delivery than %d", again.Token, queued.ID, queued.Delivery)
	}
}

// records is a slog.Handler that keeps every record it is given.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// late returns the "delivered late" warnings logged so far.
func (r *records) late() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.all {
		if rec.Level == slog.LevelWarn && strings.Contains(rec.Message, "delivered late") {
			out = append(out, rec)
		}
	}
	return out
}

// TestLateDeliveriesAreLogged (issue 20): a stall is never silent. Tasks
// delivered LateWarn or more past their due time are logged at WARN with
// the namespace, how many and the worst, at most once per namespace every
// 10 s however many there are, naming no subscriber as the commonest
// cause; a negative LateWarn turns it off.
func TestLateDeliveriesAreLogged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		lateWarn time.Duration
		want     int
	}{{"every delivery late, one line", time.Nanosecond, 1}, {"off", -1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &records{}
			h := newHarness(t, testPolicy(), func(c *dispatcher.Config) {
				c.Logger = slog.New(logs)
				c.LateWarn = tc.lateWarn
			})
			s := h.subscribe(h.d, h.ns, 10)
			h.upsert(h.d, 0, "a", "b", "c", "d", "e")
			for range 5 {
				h.ack(h.d, s.next(t).Token)
			}
			got := logs.late()
			if len(got) != tc.want {
				t.Fatalf("%d late-delivery warnings for 5 late deliveries, want %d", len(got), tc.want)
			}
			for _, rec := range got {
				var ns string
				rec.Attrs(func(a slog.Attr) bool {
					if a.Key == "namespace" {
						ns = a.Value.String()
					}
					return true
				})
				if ns != h.ns {
					t.Errorf("warning names namespace %q, want %q", ns, h.ns)
				}
				// The commonest cause first: tasks that fell due while no
				// subscriber was connected are delivered late when one comes.
				if !strings.Contains(rec.Message, "no subscriber") {
					t.Errorf("warning %q does not name the commonest cause, no subscriber", rec.Message)
				}
			}
		})
	}
}

// upsertKind stores tasks of one kind, due now, and tells d.
func (h *harness) upsertKind(d *dispatcher.Dispatcher, kind string, ids ...string) {
	h.t.Helper()
	specs := make([]storage.UpsertSpec, len(ids))
	for i, id := range ids {
		specs[i] = storage.UpsertSpec{ID: id, Kind: kind, Payload: []byte("p-" + id)}
	}
	if _, err := h.store.Upsert(context.Background(), h.ns, specs); err != nil {
		h.t.Fatalf("Upsert: %v", err)
	}
	d.Notify(h.ns)
}

// TestKindsRouteTasks: a stream with kinds receives only tasks of those
// kinds; credit holds per set of kinds (a full stream of one kind does not
// hold up another kind); a task whose kind no stream wants stays scheduled
// until a stream that takes it (here one of every kind) subscribes.
func TestKindsRouteTasks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, testPolicy(), nil)
	a := h.subscribeKinds(h.d, h.ns, 1, nil, []string{"kind.a"})
	b := h.subscribeKinds(h.d, h.ns, 10, nil, []string{"kind.b", "kind.b"})
	h.upsertKind(h.d, "kind.a", "a1", "a2")
	h.upsertKind(h.d, "kind.b", "b1", "b2")
	h.upsertKind(h.d, "kind.c", "c1")

	first := a.next(t)
	if first.Task.Kind != "kind.a" {
		t.Fatalf("stream of kind.a received %s (kind %q)", first.Task.ID, first.Task.Kind)
	}
	a.none(t) // max_in_flight 1
	for range 2 {
		if d := b.next(t); d.Task.Kind != "kind.b" {
			t.Fatalf("stream of kind.b received %s (kind %q)", d.Task.ID, d.Task.Kind)
		}
	}
	b.none(t)
	if task, err := h.get("c1"); err != nil || task.State != storage.StateScheduled || task.Attempt != 0 {
		t.Fatalf("c1, a kind nobody takes: %+v, %v; want scheduled, attempt 0", task, err)
	}
	h.ack(h.d, first.Token)
	if d := a.next(t); d.Task.Kind != "kind.a" {
		t.Fatalf("stream of kind.a received %s (kind %q) after an ack", d.Task.ID, d.Task.Kind)
	}
	all := h.subscribe(h.d, h.ns, 10)
	if d := all.next(t); d.Task.ID != "c1" {
		t.Fatalf("stream of every kind received %s, want c1", d.Task.ID)
	}
	a.none(t)
	b.none(t)
}

// popCounter counts Pop calls.
type popCounter struct {
	dispatcher.Store
	pops atomic.Int64
}

func (c *popCounter) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	c.pops.Add(1)
	return c.Store.PopWake(ctx, ns, p)
}

// TestRateCapWaitsForTokens: with a dispatch-rate cap, deliveries follow
// the cap, and a loop whose bucket is empty waits for the next token
// instead of polling the store: a backlog of 10 at 10/s (burst 1) takes
// about one Pop per token, far fewer than the ~40 per second the idle
// backoff alone would make. (A slow machine makes fewer calls, never more.)
func TestRateCapWaitsForTokens(t *testing.T) {
	t.Parallel()
	pol := testPolicy()
	pol.MaxDispatchRate = 10
	pc := &popCounter{}
	h := newHarness(t, pol, func(c *dispatcher.Config) {
		pc.Store = c.Store
		c.Store = pc
	})
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
	}
	h.upsert(h.d, 0, ids...)
	s := h.subscribe(h.d, h.ns, 100)
	start := time.Now()
	var first, last time.Time
	for i := range ids {
		d := s.next(t)
		popped := d.LeaseDeadline.Add(-pol.AckTimeout)
		if i == 0 {
			first = popped
		}
		last = popped
	}
	// Burst 1 at 10/s: the 10th pop is at least 0.9 s after the first (store clock).
	if span := last.Sub(first); span < 850*time.Millisecond {
		t.Errorf("10 deliveries at 10/s popped within %s, want at least 0.9 s", span)
	}
	if n := pc.pops.Load(); n > 30 {
		t.Errorf("%d Pop calls for 10 deliveries at 10/s over %s; want about one per token (at most 30)", n, time.Since(start))
	}
	t.Logf("%d Pop calls for 10 deliveries at 10/s", pc.pops.Load())
}
