package dispatcher_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// fakePusher stands for the HTTP client (package push, tested against a
// real receiver there and end to end in daemon): it records what it is
// given and answers with answer; with hold set, every push waits for it
// (or for its context).
type fakePusher struct {
	answer func(storage.Delivery) (storage.PushOutcome, error)
	hold   chan struct{}

	mu  sync.Mutex
	got []storage.Delivery
}

func (f *fakePusher) Push(ctx context.Context, target storage.PushTarget, del storage.Delivery, _ int32, _ time.Duration) (storage.PushOutcome, error) {
	f.mu.Lock()
	f.got = append(f.got, del)
	f.mu.Unlock()
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return storage.PushConnectError, ctx.Err()
		}
	}
	return f.answer(del)
}

func (f *fakePusher) pushed(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, d := range f.got {
		if d.Task.ID == id {
			n++
		}
	}
	return n
}

func pushPolicy() storage.Policy {
	p := testPolicy()
	p.MaxAttempts = 2
	p.Push = storage.PushTarget{URL: "https://hooks.example.com/x", Secret: "0123456789abcdef"}
	return p
}

// A namespace with a push target is pushed as soon as its policy change is
// announced: a 2xx acks (the task is gone), a failure nacks with the
// backoff until the task is dead; once push is removed the pusher stops
// and a Subscribe stream gets the namespace's tasks instead.
func TestPushAcksNacksAndStopsWhenRemoved(t *testing.T) {
	t.Parallel()
	fp := &fakePusher{answer: func(d storage.Delivery) (storage.PushOutcome, error) {
		if d.Task.ID == "bad" {
			return storage.PushHTTPError, errors.New("push: HTTP 500 Internal Server Error")
		}
		return storage.PushOK, nil
	}}
	pols := &mutablePolicies{p: pushPolicy()}
	var sig *dispatcher.Signals
	h := newHarness(t, pushPolicy(), func(c *dispatcher.Config) {
		c.Pusher, c.Policies, c.PushConcurrency = fp, pols, 2
		sig = dispatcher.Watch(c)
	})
	h.d.PolicyChanged(context.Background(), h.ns)
	h.upsert(h.d, 0, "ok1", "ok2", "bad")
	testkit.Eventually(t, wait, "ok1 and ok2 acked, bad dead", func() bool {
		_, e1 := h.get("ok1")
		_, e2 := h.get("ok2")
		bad, e3 := h.get("bad")
		return errors.Is(e1, storage.ErrNotFound) && errors.Is(e2, storage.ErrNotFound) && e3 == nil && bad.State == storage.StateDead
	})
	bad, _ := h.get("bad")
	if !strings.Contains(bad.LastError, "HTTP 500") || fp.pushed("bad") != 2 || fp.pushed("ok1") != 1 {
		t.Errorf("bad: last error %q, pushed %d times (want 2, max attempts); ok1 pushed %d times (want 1)", bad.LastError, fp.pushed("bad"), fp.pushed("ok1"))
	}

	// Push off: the pusher stops; a stream consumes.
	off := pushPolicy()
	off.Push = storage.PushTarget{}
	pols.set(off)
	stopped := sig.Next(func(e dispatcher.Event) bool { return e.Kind == dispatcher.EventPusherStopped && e.Namespace == h.ns })
	h.d.PolicyChanged(context.Background(), h.ns)
	await(t, stopped, "the pusher lets go of the namespace")
	s := h.subscribe(h.d, h.ns, 10)
	h.upsert(h.d, 0, "sub1")
	if d := s.next(t); d.Task.ID != "sub1" {
		t.Fatalf("stream got %s, want sub1", d.Task.ID)
	}
	if n := fp.pushed("sub1"); n != 0 {
		t.Errorf("sub1 pushed %d times after push was removed", n)
	}
}

// Stop lets a push in flight finish (its 2xx acks the task) instead of
// cutting it, within half of what is left of Stop's context.
func TestStopLetsPushInFlightFinish(t *testing.T) {
	t.Parallel()
	fp := &fakePusher{hold: make(chan struct{}), answer: func(storage.Delivery) (storage.PushOutcome, error) { return storage.PushOK, nil }}
	h := newHarness(t, testPolicy(), nil)
	var sig *dispatcher.Signals
	d := h.startDispatcher(pushPolicy(), func(c *dispatcher.Config) { c.Pusher = fp; sig = dispatcher.Watch(c) })
	d.PolicyChanged(context.Background(), h.ns)
	h.upsert(d, 0, "p1")
	testkit.Eventually(t, wait, "p1 pushed", func() bool { return fp.pushed("p1") == 1 })
	draining := sig.Next(func(e dispatcher.Event) bool { return e.Kind == dispatcher.EventDraining })
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		stopped <- d.Stop(ctx)
	}()
	await(t, draining, "Stop waits for the push in flight")
	close(fp.hold) // the endpoint answers while delayd stops
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := h.get("p1"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("p1 after a push that finished during Stop: %v, want acked (not found)", err)
	}
}

// A push still in flight when Stop's drain time is up is cut and handed
// back without costing an attempt.
func TestStopCutsPushPastItsDrainTime(t *testing.T) {
	t.Parallel()
	fp := &fakePusher{hold: make(chan struct{}), answer: func(storage.Delivery) (storage.PushOutcome, error) { return storage.PushOK, nil }}
	h := newHarness(t, testPolicy(), nil)
	d := h.startDispatcher(pushPolicy(), func(c *dispatcher.Config) { c.Pusher = fp })
	d.PolicyChanged(context.Background(), h.ns)
	h.upsert(d, 0, "p1")
	testkit.Eventually(t, wait, "p1 pushed", func() bool { return fp.pushed("p1") == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	task, err := h.get("p1")
	if err != nil || task.State != storage.StateScheduled || task.Attempt != 0 || task.LastError != dispatcher.ReasonPushStopping {
		t.Errorf("p1 after Stop cut its push: %+v %v; want scheduled, attempt 0, %q", task, err, dispatcher.ReasonPushStopping)
	}
}

// At most PushConcurrency pushes of a namespace are in flight on a
// replica: with 2 and an endpoint that does not answer, 2 of 5 due tasks
// are pushed; the others wait (scheduled) until an answer frees a slot.
func TestPushConcurrencyIsBounded(t *testing.T) {
	t.Parallel()
	fp := &fakePusher{hold: make(chan struct{}), answer: func(storage.Delivery) (storage.PushOutcome, error) { return storage.PushOK, nil }}
	h := newHarness(t, pushPolicy(), func(c *dispatcher.Config) { c.Pusher, c.PushConcurrency = fp, 2 })
	h.d.PolicyChanged(context.Background(), h.ns)
	h.upsert(h.d, 0, "c1", "c2", "c3", "c4", "c5")
	total := func() int {
		fp.mu.Lock()
		defer fp.mu.Unlock()
		return len(fp.got)
	}
	testkit.Eventually(t, wait, "two pushes in flight", func() bool { return total() == 2 })
	time.Sleep(quiet)
	if n := total(); n != 2 {
		t.Fatalf("%d pushes started with concurrency 2 and none answered", n)
	}
	st, err := h.store.Stats(context.Background(), h.ns)
	if err != nil || st.Delivered != 2 || st.Scheduled != 3 {
		t.Fatalf("stats %+v %v; want 2 delivered (leased to the pushes), 3 scheduled", st, err)
	}
	close(fp.hold) // answers come: the rest is pushed
	testkit.Eventually(t, wait, "all five pushed and acked", func() bool {
		st, err := h.store.Stats(context.Background(), h.ns)
		return err == nil && total() == 5 && st.Scheduled+st.Delivered == 0
	})
}

// failingPolicies answers like mutablePolicies until fail is set, then
// fails every read, as a registry that cannot be reached does.
type failingPolicies struct {
	mutablePolicies
	fail atomic.Bool
}

func (f *failingPolicies) Policy(ctx context.Context, ns string) (storage.Policy, error) {
	if f.fail.Load() {
		return storage.Policy{}, errors.New("registry unreachable")
	}
	return f.mutablePolicies.Policy(ctx, ns)
}

// A policy read that fails does not turn push off: pushes go on with the
// policy last read.
func TestPushKeepsGoingWhenPolicyReadFails(t *testing.T) {
	t.Parallel()
	fp := &fakePusher{answer: func(storage.Delivery) (storage.PushOutcome, error) { return storage.PushOK, nil }}
	pols := &failingPolicies{}
	pols.set(pushPolicy())
	h := newHarness(t, pushPolicy(), func(c *dispatcher.Config) { c.Pusher, c.Policies = fp, pols })
	h.d.PolicyChanged(context.Background(), h.ns)
	h.upsert(h.d, 0, "before")
	testkit.Eventually(t, wait, "before pushed and acked", func() bool {
		_, err := h.get("before")
		return errors.Is(err, storage.ErrNotFound)
	})
	pols.fail.Store(true)
	h.upsert(h.d, 0, "during")
	testkit.Eventually(t, wait, "during pushed and acked while the policy cannot be read", func() bool {
		_, err := h.get("during")
		return errors.Is(err, storage.ErrNotFound)
	})
}
