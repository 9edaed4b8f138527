package client_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/delayd/delayd/internal/testkit"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// consume runs c.Consume in the background and returns a function that
// cancels it and returns its error (waiting for it to drain).
func consume(t *testing.T, c *client.Client, ns string, h client.Handler, opts client.ConsumeOptions) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, ns, h, opts) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = within(t, done, 30*time.Second, "Consume to return after cancel")
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func waitGone(t *testing.T, c *client.Client, ns, id string) {
	t.Helper()
	// 30 s: one Get may take the client's whole 5 s timeout when the
	// whole suite shares the machine and the Redis server (seen in CI).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.Get(t.Context(), ns, id)
		if status.Code(err) == codes.NotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still exists (err %v); want it acked and gone", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestProducerRoundTrip(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	ns := namespace(t, c)
	ctx := t.Context()

	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	res, err := c.Upsert(ctx, ns, client.TaskSpec{ID: "order-1", Kind: "order.close", Payload: []byte("p1"), When: client.At(due)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || res.Task.Generation != 1 || res.Task.State != client.StateScheduled || !res.Task.DueTime.Equal(due) {
		t.Fatalf("first upsert = %+v, want created, generation 1, scheduled at %v", res, due)
	}
	res, err = c.Upsert(ctx, ns, client.TaskSpec{ID: "order-1", Kind: "order.close", Payload: []byte("p2"), When: client.After(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created || res.Task.Generation != 2 || !res.Task.DueTime.After(due) {
		t.Fatalf("second upsert = %+v, want replaced, generation 2, due later than %v", res, due)
	}
	got, err := c.Get(ctx, ns, "order-1")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Payload) != "p2" || got.Kind != "order.close" || got.Namespace != ns {
		t.Errorf("Get = %+v, want payload p2, kind order.close", got)
	}

	specs := []client.TaskSpec{
		{ID: "b1", When: client.After(time.Hour)},
		{ID: "bad id!", When: client.After(time.Hour)},
		{ID: "b2", When: client.After(3 * time.Hour)}, // after order-1 even when both upserts fall in one millisecond
	}
	br, err := c.BatchUpsert(ctx, ns, specs)
	if err != nil {
		t.Fatal(err)
	}
	if br[0].Err != nil || br[2].Err != nil || status.Code(br[1].Err) != codes.InvalidArgument {
		t.Errorf("batch results = %+v, want items 0 and 2 ok, item 1 InvalidArgument", br)
	}

	var ids []string
	for task, err := range c.List(ctx, ns, client.ListOptions{PageSize: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	if strings.Join(ids, ",") != "b1,order-1,b2" {
		t.Errorf("List in due order = %v, want [b1 order-1 b2]", ids)
	}

	rr, err := c.Remove(ctx, ns, "order-1")
	if err != nil || !rr.Removed || rr.PreviousState != client.StateScheduled {
		t.Fatalf("Remove = %+v, %v; want removed from scheduled", rr, err)
	}
	rr, err = c.Remove(ctx, ns, "order-1")
	if err != nil || rr.Removed {
		t.Fatalf("second Remove = %+v, %v; want removed=false and no error", rr, err)
	}
	if _, err := c.Get(ctx, ns, "order-1"); status.Code(err) != codes.NotFound {
		t.Errorf("Get after Remove: %v, want NotFound", err)
	}
	if _, err := c.Get(ctx, "Bad NS", "x"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Get with a bad namespace: %v, want InvalidArgument", err)
	}
}

// verdictWatch observes the verdicts a client sends, on StreamDeliveries
// streams and by the unary calls, and the ack results it gets back.
type verdictWatch struct {
	onAck       func(tokens []string, unary bool)
	onAckResult func(rs []*delaydv1.TokenResult)
}

func (w verdictWatch) dialOptions() []grpc.DialOption {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*delaydv1.AckTasksRequest); ok && w.onAck != nil {
			w.onAck(r.GetTokens(), true)
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*delaydv1.AckTasksResponse); ok && err == nil && w.onAckResult != nil {
			w.onAckResult(r.GetResults())
		}
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		return watchedStream{ClientStream: cs, w: w}, err
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}
}

type watchedStream struct {
	grpc.ClientStream
	w verdictWatch
}

func (s watchedStream) SendMsg(m any) error {
	if r, ok := m.(*delaydv1.StreamDeliveriesRequest); ok && len(r.GetAckTokens()) > 0 && s.w.onAck != nil {
		s.w.onAck(r.GetAckTokens(), false)
	}
	return s.ClientStream.SendMsg(m)
}

func (s watchedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*delaydv1.StreamDeliveriesResponse); ok && err == nil && len(r.GetAckResults()) > 0 && s.w.onAckResult != nil {
		s.w.onAckResult(r.GetAckResults())
	}
	return err
}

// TestConsumeAcksInBatches: acks go in batches on the consumer's
// StreamDeliveries stream (issue 25 item 2), not by AckTasks calls.
func TestConsumeAcksInBatches(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	var ackCalls, ackTokens, unaryCalls atomic.Int64
	w := verdictWatch{onAck: func(toks []string, unary bool) {
		ackCalls.Add(1)
		ackTokens.Add(int64(len(toks)))
		if unary {
			unaryCalls.Add(1)
		}
	}}
	c := newClient(t, srv.addr(), client.WithDialOptions(w.dialOptions()...), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)

	const n = 200
	specs := make([]client.TaskSpec, n)
	for i := range specs {
		specs[i] = client.TaskSpec{ID: fmt.Sprintf("t%03d", i), Payload: []byte{byte(i)}, When: client.After(0)}
	}
	if _, err := c.BatchUpsert(t.Context(), ns, specs); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	all := make(chan struct{})
	stop := consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen[d.ID]++
		if len(seen) == n {
			select {
			case <-all:
			default:
				close(all)
			}
		}
		return nil
	}, client.ConsumeOptions{Concurrency: 8, MaxInFlight: 100, AckBatchSize: 50, AckFlushInterval: 20 * time.Millisecond})
	within(t, all, 30*time.Second, "all tasks to be handled")
	for i := range n {
		waitGone(t, c, ns, fmt.Sprintf("t%03d", i))
	}
	if err := stop(); err != nil {
		t.Fatalf("Consume returned %v, want nil after cancel", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, k := range seen {
		if k != 1 {
			t.Errorf("task %s handled %d times, want once (no fault happened)", id, k)
		}
	}
	if got := ackTokens.Load(); got != n {
		t.Errorf("acked %d tokens, want %d", got, n)
	}
	if calls := ackCalls.Load(); calls >= n/2 {
		t.Errorf("%d ack batches for %d acks; want them batched", calls, n)
	}
	if u := unaryCalls.Load(); u != 0 {
		t.Errorf("%d AckTasks calls with the stream up; want every ack on the stream", u)
	}
}

func TestConsumeNackRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr(), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "flaky", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan client.Delivery, 10)
	var reported atomic.Int32
	consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		deliveries <- *d
		if d.Attempt == 1 {
			return errors.New("inventory service down")
		}
		return nil
	}, client.ConsumeOptions{OnError: func(*client.Delivery, error) { reported.Add(1) }})

	first := within(t, deliveries, 20*time.Second, "first delivery")
	second := within(t, deliveries, 20*time.Second, "redelivery after the nack")
	if first.Attempt != 1 || second.Attempt != 2 {
		t.Fatalf("attempts %d then %d, want 1 then 2", first.Attempt, second.Attempt)
	}
	if second.LastError != "inventory service down" {
		t.Errorf("redelivery LastError = %q, want the nack reason", second.LastError)
	}
	if second.Token == first.Token {
		t.Error("redelivery reused the first delivery's token")
	}
	waitGone(t, c, ns, "flaky")
	if reported.Load() != 1 {
		t.Errorf("OnError called %d times, want 1", reported.Load())
	}
}

func TestConsumeRetryAfter(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr(), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "later", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	const wait = 1500 * time.Millisecond
	deliveries := make(chan client.Delivery, 10)
	consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		deliveries <- *d
		if d.Attempt == 1 {
			return client.RetryAfter(wait, errors.New("rate limited downstream"))
		}
		return nil
	}, client.ConsumeOptions{})

	first := within(t, deliveries, 20*time.Second, "first delivery")
	second := within(t, deliveries, 20*time.Second, "redelivery after RetryAfter")
	// By delayd's own clock: the retry was scheduled at least wait after the
	// first delivery was made (and so after the nack).
	if gap := second.DueTime.Sub(first.UpdateTime); gap < wait {
		t.Errorf("retry due %v after the first delivery, want at least %v", gap, wait)
	}
	if !strings.Contains(second.LastError, "rate limited downstream") {
		t.Errorf("LastError = %q, want the handler's error", second.LastError)
	}
	waitGone(t, c, ns, "later")
}

func TestConsumeHandlerPanicNacksAndReports(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	ns := namespace(t, c)
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "boom", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	panics := make(chan *client.PanicError, 1)
	deliveries := make(chan client.Delivery, 10)
	consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		deliveries <- *d
		if d.Attempt == 1 {
			panic("handler blew up")
		}
		return nil
	}, client.ConsumeOptions{OnError: func(_ *client.Delivery, err error) {
		var pe *client.PanicError
		if errors.As(err, &pe) {
			panics <- pe
		}
	}})
	pe := within(t, panics, 20*time.Second, "the panic to be reported")
	if !strings.Contains(fmt.Sprint(pe.Value), "handler blew up") || len(pe.Stack) == 0 {
		t.Errorf("PanicError = %v with %d bytes of stack, want the panic value and a stack", pe.Value, len(pe.Stack))
	}
	within(t, deliveries, time.Second, "first delivery")
	second := within(t, deliveries, 20*time.Second, "redelivery after the panic")
	if second.Attempt != 2 || !strings.Contains(second.LastError, "panic") {
		t.Errorf("redelivery attempt %d, LastError %q; want attempt 2 and a reason naming the panic", second.Attempt, second.LastError)
	}
	waitGone(t, c, ns, "boom")
}

func TestConsumeReconnectsAfterServerRestart(t *testing.T) {
	t.Parallel()
	first := startDelayd(t, "127.0.0.1:0")
	addr := first.addr()
	c := newClient(t, addr, client.WithLogger(testLogger(t)), client.WithReconnectMaxDelay(500*time.Millisecond))
	ns := namespace(t, c)
	handled := make(chan string, 10)
	stop := consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		handled <- d.ID
		return nil
	}, client.ConsumeOptions{ReconnectMaxDelay: 500 * time.Millisecond})

	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "before", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	if id := within(t, handled, 20*time.Second, "task before restart"); id != "before" {
		t.Fatalf("handled %s, want before", id)
	}
	waitGone(t, c, ns, "before")

	// Restart: stop the server (streams end with Unavailable), then start a
	// new one on the same address and the same Redis.
	first.stop()
	second := startDelayd(t, addr)
	_ = second
	// The producer's call retries Unavailable itself while the port comes
	// back.
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "after", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	if id := within(t, handled, 30*time.Second, "task after restart"); id != "after" {
		t.Fatalf("handled %s, want after", id)
	}
	waitGone(t, c, ns, "after")
	if err := stop(); err != nil {
		t.Fatalf("Consume returned %v, want nil", err)
	}
}

// TestConsumeAcksThroughRestart (issue 10 item 4): a handler is still
// running when its delayd is stopped (a rolling deploy). The delivery
// stays leased to this consumer; the handler finishes after a new delayd
// took the address, and its ack, sent through the consumer's reconnect,
// counts: the task is gone and was handled once, not redelivered when the
// stream ended nor when its lease ran out.
func TestConsumeAcksThroughRestart(t *testing.T) {
	t.Parallel()
	first := startDelayd(t, "127.0.0.1:0")
	addr := first.addr()
	c := newClient(t, addr, client.WithLogger(testLogger(t)), client.WithReconnectMaxDelay(500*time.Millisecond))
	ns := namespace(t, c)
	var mu sync.Mutex
	calls := 0
	started, release := make(chan struct{}, 1), make(chan struct{})
	stop := consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		mu.Lock()
		calls++
		mu.Unlock()
		started <- struct{}{}
		<-release
		return nil
	}, client.ConsumeOptions{ReconnectMaxDelay: 500 * time.Millisecond})
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "working", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	within(t, started, 20*time.Second, "the handler to start")
	first.stop()
	startDelayd(t, addr)
	close(release)
	waitGone(t, c, ns, "working")
	time.Sleep(time.Second) // a redelivery would start the handler again
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("handler ran %d times; want once (its ack after the restart counts)", calls)
	}
	if err := stop(); err != nil {
		t.Fatalf("Consume returned %v, want nil", err)
	}
}

func TestConsumeDrainsOnCancel(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr(), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)
	const workers, extra = 3, 5
	specs := make([]client.TaskSpec, workers+extra)
	for i := range specs {
		specs[i] = client.TaskSpec{ID: fmt.Sprintf("t%d", i), When: client.After(0)}
	}
	if _, err := c.BatchUpsert(t.Context(), ns, specs); err != nil {
		t.Fatal(err)
	}

	started := make(chan string, len(specs))
	release := make(chan struct{})
	var mu sync.Mutex
	var finished []string
	var cancelledCtx atomic.Int32
	stop := consume(t, c, ns, func(ctx context.Context, d *client.Delivery) error {
		started <- d.ID
		<-release
		if ctx.Err() != nil {
			cancelledCtx.Add(1)
		}
		mu.Lock()
		finished = append(finished, d.ID)
		mu.Unlock()
		return nil
	}, client.ConsumeOptions{Concurrency: workers, MaxInFlight: workers + extra})

	running := map[string]bool{}
	for range workers {
		running[within(t, started, 20*time.Second, "handlers to start")] = true
	}
	// Cancel while every worker is busy; Consume must wait for them.
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		t.Fatalf("Consume returned (%v) while handlers were still running", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := within(t, stopped, 30*time.Second, "Consume to drain"); err != nil {
		t.Fatalf("Consume returned %v, want nil", err)
	}
	select {
	case id := <-started:
		t.Errorf("handler started for %s after the cancel", id)
	default:
	}
	if cancelledCtx.Load() != 0 {
		t.Errorf("%d handler contexts were cancelled during a drain within the shutdown timeout", cancelledCtx.Load())
	}
	// The acks of the running handlers were sent before Consume returned.
	for id := range running {
		if _, err := c.Get(t.Context(), ns, id); status.Code(err) != codes.NotFound {
			t.Errorf("task %s handled during the drain still exists (%v); its ack was not flushed", id, err)
		}
	}
	// The others were never handled and are still there for the next
	// consumer.
	for _, s := range specs {
		if running[s.ID] {
			continue
		}
		if _, err := c.Get(t.Context(), ns, s.ID); err != nil {
			t.Errorf("task %s, never handled, is gone: %v", s.ID, err)
		}
	}
}

func TestConsumeShutdownTimeoutCancelsHandlers(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	ns := namespace(t, c)
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "stuck", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	causes := make(chan error, 1)
	stop := consume(t, c, ns, func(ctx context.Context, d *client.Delivery) error {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}, client.ConsumeOptions{Concurrency: 1, ShutdownTimeout: 200 * time.Millisecond})
	within(t, started, 20*time.Second, "handler to start")
	if err := stop(); err != nil {
		t.Fatalf("Consume returned %v", err)
	}
	if cause := within(t, causes, time.Second, "handler to see its context end"); !errors.Is(cause, context.Canceled) {
		t.Errorf("handler context cause = %v, want context.Canceled", cause)
	}
	// Its nack went out: the task is back for another consumer.
	task, err := c.Get(t.Context(), ns, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	if task.State == client.StateDelivered {
		t.Errorf("task still DELIVERED after the drain; want it given back")
	}
}

func TestConsumeExtendsLeaseOfSlowHandler(t *testing.T) {
	t.Parallel()
	// 2 s: the extension is sent well inside the lease even when the
	// whole suite loads the machine (1 s missed it at load 16).
	const lease = 2 * time.Second
	srv := startDelayd(t, "127.0.0.1:0")
	for _, extend := range []bool{true, false} {
		t.Run(fmt.Sprintf("extend=%v", extend), func(t *testing.T) {
			t.Parallel()
			c := newClient(t, srv.addr(), client.WithLogger(testLogger(t)))
			ns := namespace(t, c)
			setPolicy(t, c, ns, &delaydv1.NamespacePolicy{
				AckTimeout:     durationpb.New(lease),
				BackoffInitial: durationpb.New(10 * time.Millisecond),
				BackoffMax:     durationpb.New(10 * time.Millisecond),
			})
			if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "slow", When: client.After(0)}); err != nil {
				t.Fatal(err)
			}
			var deliveries atomic.Int32
			done := make(chan struct{}, 10)
			stop := consume(t, c, ns, func(ctx context.Context, d *client.Delivery) error {
				deliveries.Add(1)
				// Three and a half leases of work.
				select {
				case <-time.After(lease * 7 / 2):
				case <-ctx.Done():
				}
				done <- struct{}{}
				return nil
			}, client.ConsumeOptions{Concurrency: 4, DisableLeaseExtension: !extend})
			within(t, done, 30*time.Second, "the slow handler to finish")
			if extend {
				waitGone(t, c, ns, "slow")
				if n := deliveries.Load(); n != 1 {
					t.Errorf("delivered %d times; with lease extension a slow handler keeps its delivery", n)
				}
			} else if n := deliveries.Load(); n < 2 {
				// The control: without extension the lease runs out under the
				// handler and delayd delivers the task again.
				t.Errorf("delivered %d times without lease extension; want a redelivery (the test would not catch a broken extension)", n)
			}
			_ = stop()
		})
	}
}

func TestConsumeLeaseLostCancelsHandler(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr(), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)
	setPolicy(t, c, ns, &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(time.Second)})
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "moved", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	causes := make(chan error, 1)
	consume(t, c, ns, func(ctx context.Context, d *client.Delivery) error {
		if d.Attempt != 1 || d.Generation != 1 {
			return nil
		}
		started <- struct{}{}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}, client.ConsumeOptions{})
	within(t, started, 20*time.Second, "handler to start")
	// The producer reschedules the task while it is being handled: a new
	// generation, so this delivery's lease can no longer be extended.
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "moved", When: client.After(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if cause := within(t, causes, 20*time.Second, "the handler's context to be cancelled"); !errors.Is(cause, client.ErrLeaseLost) {
		t.Errorf("cause = %v, want ErrLeaseLost", cause)
	}
	task, err := c.Get(t.Context(), ns, "moved")
	if err != nil || task.Generation != 2 || task.State != client.StateScheduled {
		t.Errorf("task after the lost lease = %+v, %v; want generation 2 still scheduled", task, err)
	}
}

func TestStaleAckAfterUpsertChangesNothing(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	ackResults := make(chan delaydv1.TokenStatus, 10)
	w := verdictWatch{onAckResult: func(rs []*delaydv1.TokenResult) {
		for _, res := range rs {
			ackResults <- res.GetStatus()
		}
	}}
	c := newClient(t, srv.addr(), client.WithDialOptions(w.dialOptions()...))
	ns := namespace(t, c)
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "renewed", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	handled := make(chan int64, 2)
	consume(t, c, ns, func(_ context.Context, d *client.Delivery) error {
		handled <- d.Generation
		<-release
		return nil // acks generation 1 after generation 2 exists
	}, client.ConsumeOptions{DisableLeaseExtension: true})
	if g := within(t, handled, 20*time.Second, "delivery"); g != 1 {
		t.Fatalf("generation %d delivered, want 1", g)
	}
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "renewed", When: client.After(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if st := within(t, ackResults, 20*time.Second, "the old delivery's ack"); st != delaydv1.TokenStatus_TOKEN_STATUS_STALE {
		t.Errorf("ack of the pre-upsert delivery answered %v, want STALE", st)
	}
	task, err := c.Get(t.Context(), ns, "renewed")
	if err != nil {
		t.Fatalf("renewed task is gone after the stale ack: %v", err)
	}
	if task.Generation != 2 || task.State != client.StateScheduled {
		t.Errorf("task = gen %d %v, want gen 2 scheduled", task.Generation, task.State)
	}
}

func TestConsumeFailsOnPermanentError(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	err := c.Consume(t.Context(), "Not A Namespace", func(context.Context, *client.Delivery) error { return nil }, client.ConsumeOptions{})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Consume with an invalid namespace = %v, want InvalidArgument", err)
	}
}

func TestAPIKeyAgainstRealServer(t *testing.T) {
	t.Parallel()
	const adminKey = "client-test-admin-key-0123456789"
	srv := startDelaydWith(t, daemon.Config{AdminKey: adminKey})
	admin := newClient(t, srv.addr(), client.WithAPIKey(adminKey))
	ns := namespace(t, admin)
	setPolicy(t, admin, ns, &delaydv1.NamespacePolicy{})
	other := namespace(t, admin)
	setPolicy(t, admin, other, &delaydv1.NamespacePolicy{})
	keys := delaydv1.NewNamespaceServiceClient(admin.Conn())
	created, err := keys.CreateKey(t.Context(), &delaydv1.CreateKeyRequest{
		Namespace: ns,
		Scopes:    []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE, delaydv1.KeyScope_KEY_SCOPE_CONSUME},
	})
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *client.Delivery) error { return nil }
	spec := client.TaskSpec{ID: "a", When: client.After(time.Hour)}

	anon := newClient(t, srv.addr())
	if _, err := anon.Upsert(t.Context(), ns, spec); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Upsert without a key = %v, want Unauthenticated", err)
	}
	if err := anon.Consume(t.Context(), ns, nop, client.ConsumeOptions{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Consume without a key = %v, want Unauthenticated (and to return, not retry)", err)
	}

	team := newClient(t, srv.addr(), client.WithAPIKey(created.GetSecret()))
	if _, err := team.Upsert(t.Context(), ns, spec); err != nil {
		t.Errorf("Upsert with the namespace's key: %v", err)
	}
	if _, err := team.Upsert(t.Context(), other, spec); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Upsert into another namespace = %v, want PermissionDenied", err)
	}
	if err := team.Consume(t.Context(), other, nop, client.ConsumeOptions{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Consume of another namespace = %v, want PermissionDenied", err)
	}
}

// A consumer pointed at an address where nothing listens (a typo) must not
// look healthy: every failed attempt reaches OnError (with a nil Delivery)
// and the logger, the client's connection state is not Ready, and Consume
// returns the failure when its context ends instead of nil.
func TestConsumeAtAWrongAddressIsNotSilent(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close() // nothing listens there now: connections are refused
	var logs testkit.SyncBuffer
	c, err := client.New(addr, client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	failures := make(chan error, 100)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, "orders", func(context.Context, *client.Delivery) error { return nil },
			client.ConsumeOptions{OnError: func(d *client.Delivery, err error) {
				if d != nil {
					t.Errorf("OnError got a delivery %+v for a connection failure", d)
				}
				select {
				case failures <- err:
				default:
				}
			}})
	}()
	first := within(t, failures, 60*time.Second, "OnError to report the failed connection")
	if status.Code(first) != codes.Unavailable {
		t.Errorf("OnError got %v, want an Unavailable status", first)
	}
	if st := c.ConnState(); st == connectivity.Ready {
		t.Errorf("ConnState() = %v with nothing listening at %s", st, addr)
	}
	cancel()
	err = within(t, done, 30*time.Second, "Consume to return after cancel")
	if err == nil || status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), addr) {
		t.Errorf("Consume returned %v, want the Unavailable connection error naming %s", err, addr)
	}
	if l := logs.String(); !strings.Contains(l, "cannot subscribe") || !strings.Contains(l, addr) {
		t.Errorf("the logger got %q, want a WARN line saying it cannot subscribe to %s", l, addr)
	}
}

// A consumer that is subscribed when its context ends returns nil, and its
// client's connection is Ready meanwhile.
func TestConsumeSubscribedReturnsNilAndIsReady(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	ns := namespace(t, c)
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "one", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 1)
	var failures atomic.Int32
	stop := consume(t, c, ns, func(context.Context, *client.Delivery) error {
		got <- struct{}{}
		return nil
	}, client.ConsumeOptions{OnError: func(*client.Delivery, error) { failures.Add(1) }})
	within(t, got, 30*time.Second, "the delivery")
	if st := c.ConnState(); st != connectivity.Ready {
		t.Errorf("ConnState() = %v while a delivery arrived, want READY", st)
	}
	if err := stop(); err != nil {
		t.Errorf("Consume returned %v after a clean stop, want nil", err)
	}
	if n := failures.Load(); n != 0 {
		t.Errorf("OnError called %d times without a failure", n)
	}
}

// TestListNoPayload: ListOptions.NoPayload lists tasks without their
// payloads (TASK_VIEW_BASIC); by default they come with them.
func TestListNoPayload(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr())
	ns := namespace(t, c)
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		if _, err := c.Upsert(ctx, ns, client.TaskSpec{ID: id, Payload: []byte("payload of " + id), When: client.After(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, noPayload := range []bool{false, true} {
		page, err := c.ListPage(ctx, ns, client.ListOptions{NoPayload: noPayload})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Tasks) != 2 {
			t.Fatalf("NoPayload %v: %d tasks, want 2", noPayload, len(page.Tasks))
		}
		for _, task := range page.Tasks {
			if got := len(task.Payload) != 0; got == noPayload {
				t.Errorf("NoPayload %v: task %s has payload %q", noPayload, task.ID, task.Payload)
			}
		}
	}
}
