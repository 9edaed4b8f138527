package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// watch opens a WatchDeliveries stream and waits until the server
// registered it; copies arrive on the returned channel.
func (e *dlvEnv) watch(r *dlvReplica) <-chan *delaydv1.WatchDeliveriesResponse {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := r.dlv.WatchDeliveries(ctx, &delaydv1.WatchDeliveriesRequest{Namespace: e.ns})
	if err != nil {
		cancel()
		e.t.Fatalf("WatchDeliveries: %v", err)
	}
	if md, err := stream.Header(); err != nil || md == nil {
		cancel()
		_, rerr := stream.Recv()
		e.t.Fatalf("WatchDeliveries headers: %v %v", err, rerr)
	}
	ch := make(chan *delaydv1.WatchDeliveriesResponse, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			ch <- resp
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done })
	return ch
}

// TestWatchDeliveriesDoesNotConsume: a watcher sees a copy of every
// delivery, while the subscriber still gets every task on its first
// attempt and acks it; a watcher alone takes nothing.
func TestWatchDeliveriesDoesNotConsume(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()

	// A watcher without a subscriber pops nothing.
	watched := e.watch(r)
	e.upsert(r, "alone", 0)
	time.Sleep(dlvQuiet)
	if got := e.mustGet(r, "alone"); got.GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED || got.GetAttempt() != 0 {
		t.Fatalf("with only a watcher, task is %v attempt %d; want SCHEDULED attempt 0", got.GetState(), got.GetAttempt())
	}
	select {
	case w := <-watched:
		t.Fatalf("watcher got %v before any subscriber", w)
	default:
	}

	sub := e.subscribe(r, 10)
	ids := []string{"alone", "w1", "w2", "w3"}
	for _, id := range ids[1:] {
		e.upsert(r, id, 0)
	}
	got := map[string]*delaydv1.Delivery{}
	for len(got) < len(ids) {
		select {
		case d := <-sub.ch:
			if d.GetTask().GetAttempt() != 1 {
				t.Errorf("subscriber got %s on attempt %d, want 1", d.GetTask().GetId(), d.GetTask().GetAttempt())
			}
			got[d.GetTask().GetId()] = d
		case <-time.After(dlvWait):
			t.Fatalf("subscriber got %d of %d tasks", len(got), len(ids))
		}
	}
	seen := map[string]bool{}
	for len(seen) < len(ids) {
		select {
		case w := <-watched:
			id := w.GetTask().GetId()
			d := got[id]
			if d == nil {
				t.Fatalf("watcher saw %q, which the subscriber never got", id)
			}
			if w.GetTask().GetAttempt() != 1 || string(w.GetTask().GetPayload()) != "payload-"+id ||
				!w.GetLeaseDeadline().AsTime().Equal(d.GetLeaseDeadline().AsTime()) || w.GetDeliveryTime() == nil {
				t.Errorf("watcher copy of %s = %v, want the delivery %v", id, w, d)
			}
			if w.GetMissed() != 0 {
				t.Errorf("watcher missed %d copies", w.GetMissed())
			}
			seen[id] = true
		case <-time.After(dlvWait):
			t.Fatalf("watcher saw %d of %d deliveries", len(seen), len(ids))
		}
	}
	for id, d := range got {
		if st := e.ack(r, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
			t.Errorf("ack of %s: %v, want OK (the watcher must not have taken it)", id, st)
		}
		if _, err := e.getTask(r, id); status.Code(err) != codes.NotFound {
			t.Errorf("GetTask(%s) after ack: %v, want NotFound", id, err)
		}
	}
}

// TestWatchDeliveriesValidates: a bad or unknown namespace is refused.
func TestWatchDeliveriesValidates(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	stream, err := r.dlv.WatchDeliveries(context.Background(), &delaydv1.WatchDeliveriesRequest{Namespace: "Bad Name"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("WatchDeliveries(bad name): %v, want InvalidArgument", err)
	}
}

// TestWatchDeliveriesSeesEveryReplica (issue 14): a watcher connected to
// one replica sees the deliveries another replica makes (the dispatchers
// share copies over the store's DeliveryFeed; here storagefake's, the Redis
// one end to end in ctl's TestTailSeesEveryReplica), each once; a watcher on the
// delivering replica sees each once too. Before the feed, the watcher on
// r1 saw nothing: only r2, which had the subscriber, delivered.
func TestWatchDeliveriesSeesEveryReplica(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r1, r2 := e.replica(), e.replica()
	far := e.watch(r1)  // no subscriber on r1: r1 delivers nothing
	near := e.watch(r2) // on the replica that delivers
	sub := e.subscribe(r2, 10)
	ids := []string{"x1", "x2", "x3", "x4", "x5"}
	for _, id := range ids {
		e.upsert(r1, id, 0)
	}
	for range ids {
		d := sub.next(t)
		if st := e.ack(r2, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
			t.Errorf("ack of %s: %v", d.GetTask().GetId(), st)
		}
	}
	for name, ch := range map[string]<-chan *delaydv1.WatchDeliveriesResponse{"watcher on the other replica": far, "watcher on the delivering replica": near} {
		seen := map[string]int{}
		for len(seen) < len(ids) {
			select {
			case w := <-ch:
				seen[w.GetTask().GetId()]++
				if w.GetTask().GetNamespace() != e.ns || w.GetTask().GetAttempt() != 1 || string(w.GetTask().GetPayload()) != "payload-"+w.GetTask().GetId() ||
					w.GetLeaseDeadline() == nil || w.GetDeliveryTime() == nil {
					t.Errorf("%s: copy %v", name, w)
				}
			case <-time.After(dlvWait):
				t.Fatalf("%s saw %v of %d deliveries", name, seen, len(ids))
			}
		}
		time.Sleep(dlvQuiet)
		for len(ch) > 0 {
			seen[(<-ch).GetTask().GetId()]++
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("%s saw %s %d times, want once", name, id, n)
			}
		}
	}
}
