package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// gatedTasks is a TaskServiceClient that records every call (its ids, in
// order) and holds each until the test lets it go: the batcher's decisions
// (what goes alone, what coalesces, what waits) are its own and are tested
// here without a server; what delayd answers is tested in publisher_test.go.
type gatedTasks struct {
	delaydv1.TaskServiceClient // nil: other methods are not called

	mu      sync.Mutex
	calls   [][]string // ids per call; a remove is "-id"
	arrived chan struct{}
	release chan struct{}
}

func newGatedTasks() *gatedTasks {
	return &gatedTasks{arrived: make(chan struct{}, 100), release: make(chan struct{}, 100)}
}

func (g *gatedTasks) record(ids ...string) {
	g.mu.Lock()
	g.calls = append(g.calls, ids)
	g.mu.Unlock()
	g.arrived <- struct{}{}
	<-g.release
}

func (g *gatedTasks) UpsertTask(_ context.Context, r *delaydv1.UpsertTaskRequest, _ ...grpc.CallOption) (*delaydv1.UpsertTaskResponse, error) {
	g.record(r.GetId())
	return &delaydv1.UpsertTaskResponse{Task: &delaydv1.Task{Id: r.GetId()}, Created: true}, nil
}

func (g *gatedTasks) BatchUpsertTasks(_ context.Context, r *delaydv1.BatchUpsertTasksRequest, _ ...grpc.CallOption) (*delaydv1.BatchUpsertTasksResponse, error) {
	ids := make([]string, len(r.GetTasks()))
	resp := &delaydv1.BatchUpsertTasksResponse{}
	for i, t := range r.GetTasks() {
		ids[i] = t.GetId()
		resp.Results = append(resp.Results, &delaydv1.BatchUpsertTaskResult{Task: &delaydv1.Task{Id: t.GetId()}})
	}
	g.record(ids...)
	return resp, nil
}

func (g *gatedTasks) RemoveTask(_ context.Context, r *delaydv1.RemoveTaskRequest, _ ...grpc.CallOption) (*delaydv1.RemoveTaskResponse, error) {
	g.record("-" + r.GetId())
	return &delaydv1.RemoveTaskResponse{Removed: true}, nil
}

// RemoveTasks records its ids as "-id" and answers each removed, in the
// state named by its request order (1 scheduled, 2 delivered, ...).
func (g *gatedTasks) RemoveTasks(_ context.Context, r *delaydv1.RemoveTasksRequest, _ ...grpc.CallOption) (*delaydv1.RemoveTasksResponse, error) {
	ids := make([]string, len(r.GetIds()))
	resp := &delaydv1.RemoveTasksResponse{Removed: int64(len(ids))}
	for i, id := range r.GetIds() {
		ids[i] = "-" + id
		resp.Results = append(resp.Results, &delaydv1.RemoveTaskResult{Id: id, Removed: true, PreviousState: delaydv1.TaskState(1 + i%3)})
	}
	g.record(ids...)
	return resp, nil
}

// waitCall waits until the next call reached the fake (a hang guard, not a
// speed bound).
func (g *gatedTasks) waitCall(t *testing.T) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("no call reached the server")
	}
}

// queued waits until ns's queue holds n calls.
func queued(t *testing.T, p *publisher, ns string, n int) {
	t.Helper()
	for range 10_000 {
		p.mu.Lock()
		q := p.queues[ns]
		have := 0
		if q != nil {
			have = len(q.ops)
		}
		p.mu.Unlock()
		if have == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("queue of %s never held %d calls", ns, n)
}

func upsertReq(id string) *delaydv1.UpsertTaskRequest {
	return &delaydv1.UpsertTaskRequest{Id: id, Payload: make([]byte, 10)}
}

// A lone call goes at once, alone, as UpsertTask; calls made while the
// batches allowed in flight are out wait and then leave together, one
// batch of them; a second call for an id never overtakes the first.
func TestPublisherCoalescesWhileInFlight(t *testing.T) {
	g := newGatedTasks()
	p := newPublisher(g, BatchSettings{MaxOutstanding: 1})
	var wg sync.WaitGroup
	call := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := p.upsert(context.Background(), "ns", upsertReq(id)); err != nil || r.Task.ID != id {
				t.Errorf("upsert %s = %+v, %v", id, r, err)
			}
		}()
	}
	call("a") // alone: sent at once
	g.waitCall(t)
	for i, id := range []string{"b", "c", "c", "d"} { // arrive while "a" is in flight
		call(id)
		queued(t, p, "ns", i+1)
	}
	g.release <- struct{}{} // "a" answered: b and c leave; the second "c" cuts the batch
	g.waitCall(t)
	g.release <- struct{}{}
	g.waitCall(t) // c, d
	g.release <- struct{}{}
	wg.Wait()
	want := [][]string{{"a"}, {"b", "c"}, {"c", "d"}}
	if diff := cmp.Diff(want, g.calls); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}
}

// MaxBytes cuts batches; a Remove keeps its place after the upserts of its
// id.
func TestPublisherLimitsAndRemoveOrder(t *testing.T) {
	g := newGatedTasks()
	size := proto.Size(upsertReq("x"))
	p := newPublisher(g, BatchSettings{MaxOutstanding: 1, MaxBytes: 2*size + 1})
	var wg sync.WaitGroup
	run := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	up := func(id string) func() {
		return func() { _, _ = p.upsert(context.Background(), "ns", upsertReq(id)) }
	}
	run(up("x"))
	g.waitCall(t)
	run(up("y"))
	queued(t, p, "ns", 1)
	run(func() { _, _ = p.remove(context.Background(), &delaydv1.RemoveTaskRequest{Namespace: "ns", Id: "y"}) })
	queued(t, p, "ns", 2)
	for i, id := range []string{"p", "q", "r"} {
		run(up(id))
		queued(t, p, "ns", 3+i)
	}
	for range 5 {
		g.release <- struct{}{}
	}
	wg.Wait()
	at := func(ids ...string) int {
		for i, c := range g.calls {
			if cmp.Equal(c, ids) {
				return i
			}
		}
		t.Fatalf("no call of %v in %v", ids, g.calls)
		return -1
	}
	if len(g.calls) != 5 || at("x") != 0 || at("y") != 1 || at("-y") < 2 || at("p", "q") > at("r") {
		t.Fatalf("calls %v; want x, y, then -y beside [p q] before [r]", g.calls)
	}
}

// With a Linger, a batch waits for more calls; Flush sends it at once, and
// after Close calls are refused.
func TestPublisherFlushAndClose(t *testing.T) {
	g := newGatedTasks()
	close(g.release) // every call answers at once
	p := newPublisher(g, BatchSettings{Linger: time.Hour})
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.upsert(context.Background(), "ns", upsertReq(fmt.Sprint(i)))
		}()
		queued(t, p, "ns", i+1)
	}
	if err := p.close(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(g.calls) != 1 || len(g.calls[0]) != 3 {
		t.Fatalf("calls %v; want one batch of 3, sent by Close's flush", g.calls)
	}
	if _, err := p.upsert(context.Background(), "ns", upsertReq("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("upsert after close: %v; want ErrClosed", err)
	}
}

// A caller whose context ends while its call waits gets the context's error
// and its call is not sent.
func TestPublisherCancelledCallIsDropped(t *testing.T) {
	g := newGatedTasks()
	p := newPublisher(g, BatchSettings{MaxOutstanding: 1})
	done := make(chan struct{})
	go func() { _, _ = p.upsert(context.Background(), "ns", upsertReq("a")); close(done) }()
	g.waitCall(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := p.upsert(ctx, "ns", upsertReq("b")); errc <- err }()
	queued(t, p, "ns", 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled upsert: %v", err)
	}
	g.release <- struct{}{}
	<-done
	if err := p.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(g.calls, [][]string{{"a"}}) {
		t.Fatalf("calls %v; want only a", g.calls)
	}
}

// A call whose context carries outgoing metadata (or a span) is sent alone,
// with its own context, in its place in the queue: the calls before it
// leave first, and the ones after it wait for it when they share its id.
func TestPublisherSoloContextGoesAloneInOrder(t *testing.T) {
	g := newGatedTasks()
	p := newPublisher(g, BatchSettings{MaxOutstanding: 1})
	var wg sync.WaitGroup
	run := func(ctx context.Context, id string) {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = p.upsert(ctx, "ns", upsertReq(id)) }()
	}
	bg := context.Background()
	run(bg, "a")
	g.waitCall(t)
	run(bg, "b")
	queued(t, p, "ns", 1)
	run(metadata.AppendToOutgoingContext(bg, "x-tenant", "7"), "c")
	queued(t, p, "ns", 2)
	run(bg, "d")
	queued(t, p, "ns", 3)
	run(bg, "e")
	queued(t, p, "ns", 4)
	for range 4 {
		g.release <- struct{}{}
	}
	wg.Wait()
	want := [][]string{{"a"}, {"b"}, {"c"}, {"d", "e"}}
	if diff := cmp.Diff(want, g.calls); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}
}

// Concurrent removes coalesce into one RemoveTasks and each caller gets its
// own id's result; a batch holds one kind of call, and a conditional
// remove (RemoveIf) goes alone, in its place.
func TestPublisherCoalescesRemoves(t *testing.T) {
	g := newGatedTasks()
	p := newPublisher(g, BatchSettings{MaxOutstanding: 1})
	var wg sync.WaitGroup
	results := map[string]RemoveResult{}
	var mu sync.Mutex
	rm := func(id string, ifGen int64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := p.remove(context.Background(), &delaydv1.RemoveTaskRequest{Namespace: "ns", Id: id, IfGeneration: ifGen})
			if err != nil {
				t.Errorf("remove %s: %v", id, err)
			}
			mu.Lock()
			results[id] = r
			mu.Unlock()
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = p.upsert(context.Background(), "ns", upsertReq("a")) }()
	g.waitCall(t)
	n := 0
	step := func(f func()) { f(); n++; queued(t, p, "ns", n) }
	step(func() { rm("b", 0) })
	step(func() { rm("c", 0) })
	step(func() { rm("d", 1) }) // RemoveIf: alone
	step(func() { rm("e", 0) })
	step(func() { rm("h", 0) })
	step(func() {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = p.upsert(context.Background(), "ns", upsertReq("f")) }()
	})
	step(func() { rm("g", 0) })
	for range 5 {
		g.release <- struct{}{}
		g.waitCall(t)
	}
	g.release <- struct{}{}
	wg.Wait()
	want := [][]string{{"a"}, {"-b", "-c"}, {"-d"}, {"-e", "-h"}, {"f"}, {"-g"}}
	if diff := cmp.Diff(want, g.calls); diff != "" {
		t.Fatalf("calls (-want +got):\n%s", diff)
	}
	// each caller got its own id's answer (the fake answers the i-th id of
	// a RemoveTasks in state 1+i%3)
	if results["b"].PreviousState != StateScheduled || results["c"].PreviousState != StateDelivered || results["h"].PreviousState != StateDelivered || !results["d"].Removed {
		t.Fatalf("results %+v; want each id's own", results)
	}
}
