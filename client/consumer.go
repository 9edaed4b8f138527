package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Handler handles one delivery. Returning nil acks it: the task is done and
// delayd deletes it. Returning an error nacks it: delayd delivers it again
// after the namespace's backoff, or after the delay of an error made with
// [RetryAfter], until the namespace's max attempts are used up and the task
// becomes a dead letter. A panic is recovered and nacks like an error (see
// [PanicError]).
//
// ctx is cancelled when the lease is lost for good (the task was upserted
// again or removed meanwhile, see [ErrLeaseLost]) or when a shutdown outlasts
// ConsumeOptions.ShutdownTimeout. It carries the values of the context given
// to Consume but is not cancelled with it: a stopping consumer lets running
// handlers finish.
//
// A handler may run more than once for the same task (delivery is
// at-least-once); make its effect idempotent.
type Handler func(ctx context.Context, d *Delivery) error

// Delivery is one push of a due task to this consumer.
type Delivery struct {
	// Task is the task, state StateDelivered, Attempt counting this delivery
	// (1 on the first).
	Task
	// Token names this delivery. Consume acks, nacks and extends it for
	// you; it is exposed for logs and for callers of the raw API.
	Token string
	// LeaseDeadline is when the lease ends by delayd's clock (Consume
	// extends it while the handler runs, so it is only the first deadline).
	LeaseDeadline time.Time
}

// ErrLeaseLost is the cause (context.Cause) of a handler context cancelled
// because delayd no longer holds the delivery for this consumer: the task was
// upserted (a new generation) or removed while the handler ran, or its lease
// ran out and it was delivered again. The handler's verdict would change
// nothing, so Consume does not send it.
var ErrLeaseLost = errors.New("delayd: lease lost: the task was rescheduled, removed or redelivered")

// RetryAfter wraps err so that the nack asks delayd to retry the task after
// d instead of the namespace's backoff (0 means at once). A nil err is
// reported as "retry requested". Use it when the handler knows better than a
// fixed schedule, e.g. a downstream service answered "retry in 30 s".
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	if d < 0 {
		d = 0
	}
	return &retryAfterError{after: d, err: err}
}

type retryAfterError struct {
	after time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.err, e.after)
}

func (e *retryAfterError) Unwrap() error { return e.err }

// RetryDelay reports the delay an error made with [RetryAfter] carries,
// anywhere in its chain.
func RetryDelay(err error) (time.Duration, bool) {
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return ra.after, true
	}
	return 0, false
}

// PanicError is what a panicking handler is reported as (to
// ConsumeOptions.OnError and the logger); the delivery is nacked.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the handler goroutine's stack at the panic.
	Stack []byte
}

// Error says that the handler panicked and with what.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// ConsumeOptions tune Consume. Zero fields take the defaults given.
type ConsumeOptions struct {
	// Concurrency is how many handlers run at once. If zero, 10.
	Concurrency int
	// MaxInFlight is the most unacked deliveries delayd keeps outstanding on
	// the stream: those being handled plus those whose ack is being sent.
	// 1-10,000. If zero, 2 × Concurrency, so a worker that finishes finds the
	// next delivery waiting while its ack is still on the way. More than
	// that only holds tasks no worker is free for, and a consumer that
	// stops hands them back.
	MaxInFlight int
	// Kinds, if not empty, are the only task kinds the stream receives
	// (SubscribeRequest.kinds; "" is the kind of tasks upserted without
	// one); tasks of other kinds wait for a consumer that takes them.
	// At most 32.
	Kinds []string
	// AckBatchSize is the most tokens sent in one AckTasks call; a batch is
	// sent as soon as it is full. 1-1,000. If zero, 100.
	AckBatchSize int
	// AckFlushInterval is the longest an ack (or nack) waits for others to
	// share its call. If zero, 5 ms.
	AckFlushInterval time.Duration
	// ExtendBy is how far each automatic lease extension reaches (now +
	// ExtendBy). If zero, the namespace's ack timeout.
	ExtendBy time.Duration
	// DisableLeaseExtension turns automatic extension off: a handler that
	// outlives its lease is then redelivered to another consumer while it
	// still runs.
	DisableLeaseExtension bool
	// ShutdownTimeout is how long a stopping Consume lets running handlers
	// finish before it cancels their contexts (it then still waits for them
	// to return). If zero, 30 s.
	ShutdownTimeout time.Duration
	// ReconnectMinDelay and ReconnectMaxDelay bound the wait, exponential
	// with full jitter, before re-opening a stream that broke. If zero,
	// 100 ms and 5 s.
	ReconnectMinDelay, ReconnectMaxDelay time.Duration
	// OnError, if set, is called (from the handler's goroutine, after the
	// handler returned) with every error a handler returned or panicked with
	// (*PanicError). Use it for metrics and alerts; the nack is sent either
	// way.
	//
	// It is also called with d == nil, from Consume's own goroutine, each
	// time opening the subscription fails for a reason worth retrying (a
	// wrong address, a server that is down or draining, a stream that
	// broke): err is then a gRPC status error (usually Unavailable) whose
	// message says what happened, e.g. "connection refused". Consume keeps
	// retrying; it logs the same error at WARN.
	OnError func(d *Delivery, err error)
}

func (o ConsumeOptions) withDefaults() (ConsumeOptions, error) {
	if o.Concurrency < 0 || o.MaxInFlight < 0 || o.AckBatchSize < 0 || o.AckFlushInterval < 0 ||
		o.ExtendBy < 0 || o.ShutdownTimeout < 0 || o.ReconnectMinDelay < 0 || o.ReconnectMaxDelay < 0 {
		return o, errors.New("ConsumeOptions fields must not be negative")
	}
	if o.Concurrency == 0 {
		o.Concurrency = 10
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = min(2*o.Concurrency, maxInFlight)
	}
	if o.MaxInFlight > maxInFlight {
		return o, fmt.Errorf("ConsumeOptions.MaxInFlight is %d; at most %d is allowed", o.MaxInFlight, maxInFlight)
	}
	if o.AckBatchSize == 0 {
		o.AckBatchSize = 100
	}
	if o.AckBatchSize > MaxBatch {
		return o, fmt.Errorf("ConsumeOptions.AckBatchSize is %d; at most %d is allowed", o.AckBatchSize, MaxBatch)
	}
	if o.AckFlushInterval == 0 {
		o.AckFlushInterval = 5 * time.Millisecond
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 30 * time.Second
	}
	if o.ReconnectMinDelay == 0 {
		o.ReconnectMinDelay = 100 * time.Millisecond
	}
	if o.ReconnectMaxDelay == 0 {
		o.ReconnectMaxDelay = 5 * time.Second
	}
	if o.ReconnectMaxDelay < o.ReconnectMinDelay {
		o.ReconnectMaxDelay = o.ReconnectMinDelay
	}
	return o, nil
}

const maxInFlight = 10000

// Consume receives the due tasks of namespace ns and runs h on each, at most
// opts.Concurrency at a time, until ctx is cancelled or a permanent error
// occurs. It blocks; run it in its own goroutine for each namespace.
//
// Consume acks the deliveries whose handler returned nil in batches
// (opts.AckBatchSize, or after opts.AckFlushInterval), nacks the others at
// once (with the error text as the reason), and extends the lease of
// handlers that run long, before it ends. When the stream breaks, the server
// drains (Unavailable) or is restarted, Consume reconnects with exponential
// backoff; deliveries the old stream sent stay leased to this consumer, so
// the running handlers' acks (retried through the reconnect) still count.
//
// When ctx is cancelled Consume stops taking deliveries, waits for running
// handlers (opts.ShutdownTimeout, then cancels their contexts and waits on),
// sends their acks and nacks, closes the stream and returns nil. Deliveries
// delayd had sent but no handler started stay leased until their lease
// deadline, then are delivered again (to another consumer).
//
// It returns an error, after the same drain, when delayd refuses the
// subscription for good (InvalidArgument, NotFound, Unauthenticated,
// PermissionDenied, Unimplemented, FailedPrecondition) or the Client is
// closed. A Consume that cannot reach delayd (a wrong address, delayd down)
// never fails silently: it keeps retrying with backoff, reports every
// failed attempt to the logger (WARN) and to opts.OnError (with a nil
// Delivery), and when ctx ends while it is still not subscribed it returns
// the last of those errors instead of nil. [Client.ConnState] says whether the
// connection is up.
func (c *Client) Consume(ctx context.Context, ns string, h Handler, opts ConsumeOptions) error {
	if h == nil {
		return errors.New("delayd consume: handler is nil")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return fmt.Errorf("delayd consume %s: %w", ns, err)
	}
	cs := newConsumer(c, ns, h, opts)
	return cs.run(ctx)
}

// consumer is one Consume call.
//
// Goroutines: one receiver per stream (the Recv loop), opts.Concurrency
// workers (handlers), one acker (batched verdicts), one leaser (extensions).
// Shutdown order, senders before receivers: stop handing deliveries to
// workers → workers finish (their verdicts go to the acker, their leases
// leave the leaser) → stop the leaser → close the acker's input, which
// flushes → cancel the stream (what the server sent stays leased; what it
// had not sent it takes back) → wait for the receiver.
type consumer struct {
	c      *Client
	ns     string
	h      Handler
	opts   ConsumeOptions
	logger *slog.Logger

	jobs        chan job      // receiver → workers, unbuffered: the server's credit is the buffer
	stopWorkers chan struct{} // closed: workers return after their current job
	line        *verdictLine
	acker       *acker
	leaser      *leaser
	tracer      trace.Tracer
}

type job struct {
	d    *Delivery
	recv time.Time // local time it arrived
}

func newConsumer(c *Client, ns string, h Handler, opts ConsumeOptions) *consumer {
	logger := c.opts.logger.With("namespace", ns)
	line := newVerdictLine(c.delivery, ns)
	return &consumer{
		c:           c,
		ns:          ns,
		h:           h,
		opts:        opts,
		logger:      logger,
		jobs:        make(chan job),
		stopWorkers: make(chan struct{}),
		line:        line,
		acker:       newAcker(line, opts.AckBatchSize, opts.AckFlushInterval, logger),
		leaser:      newLeaser(line, opts.ExtendBy, logger),
		tracer:      c.opts.tracer.Tracer("github.com/delayd/delayd/client"),
	}
}

func (cs *consumer) run(ctx context.Context) error {
	// Background work must outlive ctx until the drain is over, so it runs
	// on a context that keeps ctx's values but not its cancellation.
	bg := context.WithoutCancel(ctx)
	// handlerCtx is cancelled when a shutdown outlasts ShutdownTimeout.
	handlerCtx, hardStop := context.WithCancel(bg)
	defer hardStop()

	var workers sync.WaitGroup
	for range cs.opts.Concurrency {
		workers.Go(func() { cs.work(handlerCtx) })
	}
	leaserCtx, stopLeaser := context.WithCancel(bg)
	leaserDone := make(chan struct{})
	go func() { defer close(leaserDone); cs.leaser.run(leaserCtx) }()
	ackerDone := make(chan struct{})
	go func() { defer close(ackerDone); cs.acker.run(bg) }()

	var line *streamRun
	// lastErr is the last failure to subscribe since the last stream that
	// was subscribed (nil once one is): what Consume returns when ctx ends
	// before it could subscribe again.
	var lastErr error
	// stopped is what Consume returns when ctx ends: nil when it is
	// subscribed or never saw a failure, else the failure.
	stopped := func() error {
		if line != nil && line.subscribed.Load() || lastErr == nil {
			return nil
		}
		return fmt.Errorf("delayd consume %s: stopped without a subscription to delayd at %q: %w", cs.ns, cs.c.conn.Target(), lastErr)
	}
	// drain stops everything in the documented order.
	drain := func() {
		if line != nil {
			line.stopHanding()
		}
		close(cs.stopWorkers)
		done := make(chan struct{})
		go func() { workers.Wait(); close(done) }()
		t := time.NewTimer(cs.opts.ShutdownTimeout)
		select {
		case <-done:
		case <-t.C:
			cs.logger.Warn("delayd consumer: handlers still running after the shutdown timeout; cancelling them",
				"timeout", cs.opts.ShutdownTimeout)
			hardStop()
			<-done
		}
		t.Stop()
		stopLeaser()
		<-leaserDone
		cs.acker.close()
		<-ackerDone
		if line != nil {
			line.close()
		}
	}

	bo := reconnectBackoff{min: cs.opts.ReconnectMinDelay, max: cs.opts.ReconnectMaxDelay}
	for {
		line = cs.open(bg)
		var end error
		select {
		case <-ctx.Done():
			err := stopped()
			drain()
			return err
		case <-line.finished:
			end = line.err
		}
		line.close()
		if line.healthy() {
			bo.reset()
		}
		if fatal(end) {
			line = nil
			drain()
			return fmt.Errorf("delayd consume %s: %w", cs.ns, end)
		}
		wait := bo.next()
		lastErr = end
		if line.subscribed.Load() {
			cs.logger.Info("delayd consumer: stream ended; reconnecting", "error", end, "after", wait)
		} else {
			cs.logger.Warn("delayd consumer: cannot subscribe; retrying", "target", cs.c.conn.Target(), "error", end, "after", wait)
		}
		if cs.opts.OnError != nil {
			cs.opts.OnError(nil, end)
		}
		line = nil
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			err := stopped()
			drain()
			return err
		case <-t.C:
		}
	}
}

// fatal reports whether a stream error means "stop trying".
func fatal(err error) bool {
	if errors.Is(err, io.EOF) {
		return false
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.Unauthenticated, codes.PermissionDenied,
		codes.Unimplemented, codes.FailedPrecondition, codes.Canceled:
		return true
	}
	return false
}

// streamRun is one Subscribe stream and its receiver goroutine.
type streamRun struct {
	cancel   context.CancelFunc
	finished chan struct{} // closed when the receiver returned; err is set then
	err      error         // io.EOF or the stream's error
	stop     chan struct{} // closed: hand nothing more to workers
	stopOnce sync.Once
	start    time.Time
	received bool // set by the receiver; read after finished
	// subscribed is set once delayd confirmed the subscription (the
	// stream's header arrived).
	subscribed atomic.Bool
}

func (cs *consumer) open(bg context.Context) *streamRun {
	sctx, cancel := context.WithCancel(bg)
	r := &streamRun{cancel: cancel, finished: make(chan struct{}), stop: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(r.finished)
		r.err = cs.receive(sctx, r)
	}()
	return r
}

func (r *streamRun) stopHanding() { r.stopOnce.Do(func() { close(r.stop) }) }

// close ends the stream and waits for its receiver. What the server sent
// stays leased until its deadline; what it had not sent it takes back.
func (r *streamRun) close() {
	r.stopHanding()
	r.cancel()
	<-r.finished
}

// healthy reports whether the stream worked for a while, so the next
// reconnect need not wait long.
func (r *streamRun) healthy() bool { return r.received || time.Since(r.start) > 5*time.Second }

func (cs *consumer) receive(ctx context.Context, r *streamRun) error {
	// Fail fast (no WaitForReady): while delayd cannot be reached, opening
	// fails with the dial error ("connection refused", "no such host"),
	// which run reports and retries with backoff, instead of waiting
	// silently for a connection that may never come.
	stream, err := cs.c.delivery.StreamDeliveries(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&delaydv1.StreamDeliveriesRequest{
		Namespace:   cs.ns,
		MaxInFlight: int32(cs.opts.MaxInFlight),
		Kinds:       cs.opts.Kinds,
		MaxBatch:    int32(min(cs.opts.MaxInFlight, maxStreamBatch)),
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return err // io.EOF: the stream's error comes from Recv
	}
	// delayd sends the header once the subscription is registered; a
	// refusal (auth, validation) comes as the stream's error instead.
	// (A stream that ends without one has a nil header; Recv returns its
	// error.)
	md, err := stream.Header()
	if err != nil {
		return err
	}
	if md != nil {
		r.subscribed.Store(true)
	}
	// Verdicts go on this stream from now on; when it ends, what it left
	// unanswered goes again by the unary calls.
	cs.line.attach(stream)
	defer cs.line.detach(stream)
	// The receiver never waits for a worker (see inbox): box holds what
	// the workers have not taken yet.
	box := newInbox()
	forwarded := make(chan struct{})
	defer func() { <-forwarded }()
	go func() {
		defer close(forwarded)
		cs.forward(ctx, r, box)
	}()
	defer box.close()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		if len(resp.GetAckResults())+len(resp.GetNackResults())+len(resp.GetExtendResults()) > 0 {
			cs.line.answered(stream, resp)
		}
		for _, pd := range resp.GetDeliveries() {
			r.received = true
			d := &Delivery{Task: taskFromProto(pd.GetTask()), Token: pd.GetToken(), LeaseDeadline: timeFromProto(pd.GetLeaseDeadline())}
			box.put(job{d: d, recv: time.Now()})
		}
	}
}

// inbox holds what a stream received and the workers have not taken yet,
// in order. The receiver never waits on it: answers to verdicts arrive on
// the stream behind deliveries, and the acker and the leaser wait for them
// — a lease extension held up behind a full buffer let its slow handler's
// lease run out, and the task ran twice
// (TestConsumeSlowHandlerKeepsItsLeaseWhileOthersQueue). The server's
// credit keeps it about MaxInFlight long, but not below: a delivery that
// waited here past its lease frees its credit and delayd sends another.
// So put drops what has run out of its lease (delayd takes it back and
// delivers it again; a handler for this copy could only be told STALE),
// which bounds the inbox by the live deliveries.
type inbox struct {
	mu     sync.Mutex
	q      []job
	closed bool
	more   chan struct{} // a value after put or close (1-buffered)
}

func newInbox() *inbox { return &inbox{more: make(chan struct{}, 1)} }

// put appends j, dropping the deliveries whose lease ran out meanwhile.
func (b *inbox) put(j job) {
	b.mu.Lock()
	b.q = slices.DeleteFunc(b.q, func(o job) bool { return leaseRanOut(o, j.recv) })
	b.q = append(b.q, j)
	b.mu.Unlock()
	b.signal()
}

// close says nothing more comes; what the inbox holds can still be taken.
func (b *inbox) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.signal()
}

func (b *inbox) signal() {
	select {
	case b.more <- struct{}{}:
	default:
	}
}

// take returns the oldest job (ok), or whether the inbox is closed and
// empty (done).
func (b *inbox) take() (j job, ok, done bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.q) == 0 {
		return job{}, false, b.closed
	}
	j = b.q[0]
	b.q[0] = job{}
	b.q = b.q[1:]
	return j, true, false
}

// leaseRanOut reports whether j's lease had run out at now, by delayd's
// clock (leaseLength) counted from its arrival; never for a delivery
// without a lease deadline.
func leaseRanOut(j job, now time.Time) bool {
	return !j.d.LeaseDeadline.IsZero() && !now.Before(j.recv.Add(leaseLength(j.d, j.recv)))
}

// maxStreamBatch is the most deliveries the consumer asks per stream
// message (the server's limit).
const maxStreamBatch = 1000

// forward hands what the stream received to the workers, until box is
// closed and empty or the stream stops handing out. Stopping: no handler
// takes the deliveries left; they stay leased until their deadline and are
// then delivered again.
func (cs *consumer) forward(ctx context.Context, r *streamRun, box *inbox) {
	for {
		j, ok, done := box.take()
		if done {
			return
		}
		if !ok {
			select {
			case <-box.more:
			case <-r.stop:
				return
			case <-ctx.Done():
				return
			}
			continue
		}
		select {
		case <-r.stop:
			return
		default:
		}
		select {
		case cs.jobs <- j:
		case <-r.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (cs *consumer) work(handlerCtx context.Context) {
	for {
		select {
		case <-cs.stopWorkers:
			return
		default:
		}
		select {
		case <-cs.stopWorkers:
			return
		case j := <-cs.jobs:
			cs.handle(handlerCtx, j)
		}
	}
}

func (cs *consumer) handle(handlerCtx context.Context, j job) {
	ctx, span := cs.startSpan(handlerCtx, j.d)
	defer span.End()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !cs.opts.DisableLeaseExtension {
		cs.leaser.add(j.d, j.recv, cancel)
	}
	err := cs.call(ctx, j.d)
	if !cs.opts.DisableLeaseExtension {
		cs.leaser.remove(j.d.Token)
	}
	if err != nil {
		var pe *PanicError
		if errors.As(err, &pe) {
			cs.logger.Error("delayd consumer: handler panicked; nacking", "id", j.d.ID, "attempt", j.d.Attempt,
				"panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
		} else {
			cs.logger.Warn("delayd consumer: handler failed; nacking", "id", j.d.ID, "attempt", j.d.Attempt, "error", err)
		}
		if cs.opts.OnError != nil {
			cs.opts.OnError(j.d, err)
		}
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, reason(err))
	}
	if errors.Is(context.Cause(ctx), ErrLeaseLost) {
		cs.logger.Info("delayd consumer: lease lost while the handler ran; its verdict is dropped", "id", j.d.ID)
		return
	}
	v := verdict{token: j.d.Token, id: j.d.ID}
	if err != nil {
		v.nack = true
		v.reason = reason(err)
		if d, ok := RetryDelay(err); ok {
			v.retryAfter, v.hasRetryAfter = d, true
		}
	}
	cs.acker.add(v)
}

// startSpan starts the handler's span: a consumer span of its own trace
// (the producer's ended long ago), linked to the producer's span through
// the trace context delayd kept with the task.
func (cs *consumer) startSpan(ctx context.Context, d *Delivery) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithNewRoot(),
		trace.WithAttributes(
			attribute.String("messaging.system", "delayd"),
			attribute.String("messaging.destination.name", cs.ns),
			attribute.String("messaging.message.id", d.ID),
			attribute.Int("messaging.delayd.attempt", int(d.Attempt)),
		),
	}
	if d.TraceParent != "" {
		producer := trace.SpanContextFromContext(propagator.Extract(context.Background(),
			propagation.MapCarrier{"traceparent": d.TraceParent}))
		if producer.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: producer}))
		}
	}
	return cs.tracer.Start(ctx, "delayd.deliver "+cs.ns, opts...)
}

// call runs the handler, turning a panic into a *PanicError.
func (cs *consumer) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return cs.h(ctx, d)
}

// maxReason is the longest nack reason delayd keeps.
const maxReason = 1024

func reason(err error) string {
	s := err.Error()
	if len(s) <= maxReason {
		return s
	}
	cut := maxReason
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut]
}

// reconnectBackoff is exponential backoff with full jitter: attempt n waits
// a random time in [min, min(max, min·2^n)].
type reconnectBackoff struct {
	min, max time.Duration
	n        int
}

func (b *reconnectBackoff) next() time.Duration {
	ceil := b.min << min(b.n, 20)
	if ceil > b.max || ceil <= 0 {
		ceil = b.max
	}
	b.n++
	return b.min + rand.N(ceil-b.min+1)
}

func (b *reconnectBackoff) reset() { b.n = 0 }
