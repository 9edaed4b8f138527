package history_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/history"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// policies gives every namespace the same history retention.
type policies struct{ bytes int64 }

func (p policies) Namespace(_ context.Context, ns string, _ bool) (storage.Namespace, error) {
	return storage.Namespace{Name: ns, Policy: storage.Policy{HistoryRetentionBytes: p.bytes}}, nil
}

// countingSink counts RecordEvents calls before passing them on.
type countingSink struct {
	storage.History
	calls atomic.Int64
}

func (c *countingSink) RecordEvents(ctx context.Context, ns string, p storage.RecordParams) error {
	c.calls.Add(1)
	return c.History.RecordEvents(ctx, ns, p)
}

// drive upserts, pops, nacks, pops again and acks one task.
func drive(t *testing.T, s storage.Store) {
	ctx := storage.WithKeyID(t.Context(), "k1")
	if _, err := s.Upsert(ctx, "ns", []storage.UpsertSpec{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	pop := func() storage.Token {
		ds, err := s.Pop(ctx, "ns", storage.PopParams{Limit: 1, LeaseFor: time.Minute})
		if err != nil || len(ds) != 1 {
			t.Fatalf("pop: %v, %v", ds, err)
		}
		return ds[0].Token
	}
	zero := time.Duration(0)
	if _, _, err := s.Nack(ctx, "ns", []storage.Token{pop()}, storage.NackOptions{RetryAfter: &zero, MaxAttempts: 5, Reason: "no"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ack(ctx, "ns", []storage.Token{pop()}); err != nil {
		t.Fatal(err)
	}
}

// TestHistoryOffCallsNoSink: a namespace that keeps no history costs no
// history write at all.
func TestHistoryOffCallsNoSink(t *testing.T) {
	fake := storagefake.New(nil)
	sink := &countingSink{History: fake}
	drive(t, history.Wrap(fake, history.Config{Policies: policies{0}, Sink: sink}))
	if n := sink.calls.Load(); n != 0 {
		t.Errorf("history off: %d history writes, want 0", n)
	}
}

// TestHistoryOnRecordsEachCall: with history on, each call that changed
// the task writes its events once, in order, with the caller's key id.
func TestHistoryOnRecordsEachCall(t *testing.T) {
	fake := storagefake.New(nil)
	sink := &countingSink{History: fake}
	drive(t, history.Wrap(fake, history.Config{Policies: policies{1 << 20}, Sink: sink, Replica: "r1"}))
	if n := sink.calls.Load(); n != 5 {
		t.Errorf("history on: %d history writes, want 5 (one per call)", n)
	}
	evs, _, err := fake.TaskHistory(t.Context(), "ns", storage.HistoryParams{ID: "a", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	want := []storage.EventKind{storage.EventUpserted, storage.EventDelivered, storage.EventNacked, storage.EventDelivered, storage.EventAcked}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want kinds %v", evs, want)
	}
	for i, e := range evs {
		if e.Kind != want[i] {
			t.Errorf("event %d is %s, want %s", i, e.Kind, want[i])
		}
	}
	if evs[0].KeyID != "k1" || evs[1].Replica != "r1" || evs[2].Reason != "no" || evs[3].Attempt != 2 {
		t.Errorf("event details: %+v", evs)
	}
}

// clock is a storage.Clock the test moves.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// heldSink holds the history write of lease-expired events until release
// is closed, and says when one has arrived.
type heldSink struct {
	storage.History
	arrived chan struct{}
	release chan struct{}
}

func (h *heldSink) RecordEvents(ctx context.Context, ns string, p storage.RecordParams) error {
	for _, e := range p.Events {
		if e.Kind == storage.EventLeaseExpired {
			close(h.arrived)
			<-h.release
			break
		}
	}
	return h.History.RecordEvents(ctx, ns, p)
}

// TestHistoryKeepsOrderOfCallsThatSawEachOther: a requeue made after a
// GetTask showed the task dead — while the reap that killed it is still
// writing its events — has its events written after the reap's. The
// history is written after each store call; before the fix both calls
// held the namespace's ordering lock shared, and the requeue's REQUEUED
// landed before the reap's LEASE_EXPIRED and DEAD_LETTERED (the durable
// lifecycle test failed that way about once in six runs under load).
func TestHistoryKeepsOrderOfCallsThatSawEachOther(t *testing.T) {
	clk := &clock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	fake := storagefake.New(clk)
	sink := &heldSink{History: fake, arrived: make(chan struct{}), release: make(chan struct{})}
	rec := history.Wrap(fake, history.Config{Policies: policies{1 << 20}, Sink: sink, Replica: "r1"})
	ctx := storage.WithKeyID(t.Context(), "k1")
	deliverAndExpire(t, rec, clk, ctx)
	reaped := make(chan error, 1)
	go func() {
		moved, err := rec.Reap(ctx, "ns", 10, storage.NackOptions{MaxAttempts: 1})
		if err == nil && len(moved) != 1 {
			err = fmt.Errorf("reap moved %v, want a", moved)
		}
		reaped <- err
	}()
	<-sink.arrived // the reap's store call is done; its history write is held
	if got, err := rec.Get(ctx, "ns", "a"); err != nil || got.State != storage.StateDead {
		t.Fatalf("the reaped task: %v, %v; want dead", got.State, err)
	}
	// Whether or not the requeue waits for the reap's write, let the reap
	// go on once the requeue had its chance to be written first.
	requeued := requeueAside(ctx, rec)
	close(sink.release)
	if err := <-reaped; err != nil {
		t.Fatal(err)
	}
	if err := <-requeued; err != nil {
		t.Fatal(err)
	}
	want := []storage.EventKind{storage.EventUpserted, storage.EventDelivered, storage.EventLeaseExpired, storage.EventDeadLettered, storage.EventRequeued}
	got := kindsOf(t, fake, "ns", "a")
	if !slices.Equal(got, want) {
		t.Fatalf("history kinds %v, want %v", got, want)
	}
}

// heldPop is a store whose PopWake, once armed, signals entered and waits
// for release before it runs.
type heldPop struct {
	storage.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (h *heldPop) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	if h.armed.CompareAndSwap(true, false) {
		close(h.entered)
		<-h.release
	}
	return h.Store.PopWake(ctx, ns, p)
}

// TestPopAfterRequeueIsWrittenAfterIt: a pop takes its place in the
// order, then waits before its store call; meanwhile a requeue makes a dead
// task due. If the requeue's store call could run first, the pop would
// deliver the task and its delivered event — holding the earlier place —
// would be written before the requeued one (seen in a fresh-clone CI run of
// TestHistoryLifecycleRedisOnly: ... DEAD_LETTERED DELIVERED REQUEUED ...).
// A pop and a call that makes tasks due never overlap their store calls,
// so the history reads requeued, then delivered.
func TestPopAfterRequeueIsWrittenAfterIt(t *testing.T) {
	clk := &clock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	fake := storagefake.New(clk)
	held := &heldPop{Store: fake, entered: make(chan struct{}), release: make(chan struct{})}
	rec := history.Wrap(held, history.Config{Policies: policies{1 << 20}, Sink: fake, Replica: "r1"})
	ctx := storage.WithKeyID(t.Context(), "k1")
	deliverAndExpire(t, rec, clk, ctx)
	if moved, err := rec.Reap(ctx, "ns", 10, storage.NackOptions{MaxAttempts: 1}); err != nil || len(moved) != 1 {
		t.Fatalf("reap: %v, %v", moved, err)
	}
	held.armed.Store(true)
	popped := make(chan []storage.Delivery, 1)
	go func() {
		ds, err := rec.Pop(ctx, "ns", storage.PopParams{Limit: 1, LeaseFor: time.Second})
		if err != nil {
			t.Error(err)
		}
		popped <- ds
	}()
	<-held.entered // the pop has its place and waits before its store call
	// Give the requeue the chance to run its store call before the pop's.
	requeued := requeueAside(ctx, rec)
	close(held.release)
	first := <-popped
	if err := <-requeued; err != nil {
		t.Fatal(err)
	}
	if len(first) == 0 { // the requeue ran after the pop: deliver it now
		if ds, err := rec.Pop(ctx, "ns", storage.PopParams{Limit: 1, LeaseFor: time.Second}); err != nil || len(ds) != 1 {
			t.Fatalf("pop after the requeue: %v, %v", ds, err)
		}
	}
	want := []storage.EventKind{storage.EventUpserted, storage.EventDelivered, storage.EventLeaseExpired,
		storage.EventDeadLettered, storage.EventRequeued, storage.EventDelivered}
	got := kindsOf(t, fake, "ns", "a")
	if !slices.Equal(got, want) {
		t.Fatalf("history kinds %v, want %v", got, want)
	}
}

// deliverAndExpire upserts task a of namespace ns, delivers it once, and
// moves clk past its one-second lease.
func deliverAndExpire(t *testing.T, rec *history.Recorder, clk *clock, ctx context.Context) {
	t.Helper()
	if _, err := rec.Upsert(ctx, "ns", []storage.UpsertSpec{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if ds, err := rec.Pop(ctx, "ns", storage.PopParams{Limit: 1, LeaseFor: time.Second}); err != nil || len(ds) != 1 {
		t.Fatalf("pop: %v, %v", ds, err)
	}
	clk.ns.Add(int64(2 * time.Second)) // the lease runs out
}

// kindsOf is the kinds of task id's history in ns, in order.
func kindsOf(t *testing.T, h storage.History, ns, id string) []storage.EventKind {
	t.Helper()
	evs, _, err := h.TaskHistory(t.Context(), ns, storage.HistoryParams{ID: id, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	kinds := make([]storage.EventKind, len(evs))
	for i, e := range evs {
		kinds[i] = e.Kind
	}
	return kinds
}

// requeueAside requeues task "a" of "ns" on its own goroutine and returns
// once it answered or had 100 ms to; its answer is in the channel.
func requeueAside(ctx context.Context, rec *history.Recorder) chan error {
	requeued := make(chan error, 1)
	go func() {
		_, err := rec.Requeue(ctx, "ns", storage.RequeueParams{IDs: []string{"a"}})
		requeued <- err
	}()
	select {
	case err := <-requeued:
		requeued <- err
	case <-time.After(100 * time.Millisecond):
	}
	return requeued
}

// recreatable answers one namespace whose create time (its incarnation)
// the test moves, as a delete and re-create under the name would.
type recreatable struct{ created atomic.Int64 }

func (p *recreatable) Namespace(_ context.Context, ns string, _ bool) (storage.Namespace, error) {
	return storage.Namespace{Name: ns, Policy: storage.Policy{HistoryRetentionBytes: 1 << 20},
		CreateTime: time.UnixMilli(p.created.Load())}, nil
}

// TestRecreatedNamespaceStartsFresh: once the registry answers a later
// create time (the namespace was deleted and re-created under its name),
// the recorder writes the new incarnation's events to a history of their
// own, and the recent-delivery figures of the old incarnation are not
// the new one's.
func TestRecreatedNamespaceStartsFresh(t *testing.T) {
	fake := storagefake.New(nil)
	pol := &recreatable{}
	pol.created.Store(1_000)
	recent := history.NewRecent()
	rec := history.Wrap(fake, history.Config{Policies: pol, Sink: fake, Recent: recent})
	ctx := t.Context()
	if _, err := rec.Upsert(ctx, "ns", []storage.UpsertSpec{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if ds, err := rec.Pop(ctx, "ns", storage.PopParams{Limit: 1, LeaseFor: time.Minute}); err != nil || len(ds) != 1 {
		t.Fatalf("pop: %v, %v", ds, err)
	}
	if n := recent.Deliveries("ns", 1_000).Count; n != 1 {
		t.Fatalf("recent deliveries of the first incarnation: %d, want 1", n)
	}
	pol.created.Store(2_000)
	if _, err := rec.Upsert(ctx, "ns", []storage.UpsertSpec{{ID: "b"}}); err != nil {
		t.Fatal(err)
	}
	if n := recent.Deliveries("ns", 2_000).Count; n != 0 {
		t.Errorf("recent deliveries of the re-created namespace: %d, want 0 (they were the old one's)", n)
	}
	read := func(inc int64, id string) int {
		evs, _, err := fake.TaskHistory(ctx, "ns", storage.HistoryParams{Incarnation: inc, ID: id, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	if a1, a2, b2 := read(1_000, "a"), read(2_000, "a"), read(2_000, "b"); a1 != 2 || a2 != 0 || b2 != 1 {
		t.Errorf("events: a in the first incarnation %d (want 2), a in the second %d (want 0), b in the second %d (want 1)", a1, a2, b2)
	}
	// A pop made for the old incarnation after the new one delivered is not
	// counted for the new one.
	pol.created.Store(1_000)
	if _, err := rec.Pop(ctx, "ns", storage.PopParams{Limit: 1, LeaseFor: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if n := recent.Deliveries("ns", 2_000).Count; n != 0 {
		t.Errorf("a delivery made for the old incarnation counts for the new one: %d", n)
	}
}
