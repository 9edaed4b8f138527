package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// BatchSettings say how concurrent [Client.Upsert] calls are coalesced into
// BatchUpsertTasks calls, and concurrent [Client.Remove] calls into
// RemoveTasks calls, as Pub/Sub's client libraries batch Publish. Each call
// still blocks until delayd answered it and gets its own result and error,
// exactly as a lone UpsertTask or RemoveTask would give it (AlreadyExists
// and FailedPrecondition with the details [ConflictOf] reads,
// InvalidArgument naming the field, Removed and PreviousState); two calls
// for the same namespace and id are applied in the order they were made.
// [Client.RemoveIf] is always sent alone (RemoveTasks takes no condition).
//
// The default is "Nagle off": a call is sent at once when fewer than
// MaxOutstanding batches of its namespace are in flight, so a lone caller
// waits for nothing; the calls that arrive while batches are in flight
// wait for one to finish and then go together in one call. One call alone
// is sent as a plain UpsertTask (or RemoveTask). A batch holds calls of
// one kind: upserts and removes queued in turn go in turn.
type BatchSettings struct {
	// Disabled sends every Upsert and Remove as its own UpsertTask or
	// RemoveTask call, as before batching existed.
	Disabled bool
	// Linger is how long a batch that is not full waits for more calls
	// before it is sent, counted from its first call. If zero, no wait:
	// a batch is sent as soon as fewer than MaxOutstanding are in flight.
	Linger time.Duration
	// MaxCount is the most calls in one batch. If zero, 1,000 (delayd's
	// default --max-batch); at most 1,000.
	MaxCount int
	// MaxBytes bounds the encoded size of one batch's items. A call larger
	// than it alone is sent alone. If zero, 1 MiB (delayd accepts 4 MiB of
	// payloads per batch and 5 MiB per message by default).
	MaxBytes int
	// MaxOutstanding is the most batches of one namespace in flight at
	// once. If zero, 2.
	MaxOutstanding int
}

// withDefaults fills the zero fields.
func (s BatchSettings) withDefaults() BatchSettings {
	if s.MaxCount <= 0 || s.MaxCount > MaxBatch {
		s.MaxCount = MaxBatch
	}
	if s.MaxBytes <= 0 {
		s.MaxBytes = 1 << 20
	}
	if s.MaxOutstanding <= 0 {
		s.MaxOutstanding = 2
	}
	return s
}

// WithBatching replaces the default [BatchSettings] (on, no linger, 1,000
// calls or 1 MiB per batch, 2 batches in flight per namespace).
// WithBatching(BatchSettings{Disabled: true}) turns batching off.
func WithBatching(s BatchSettings) Option {
	return func(o *options) { o.batch = s }
}

// ErrClosed is returned by calls made after [Client.Close] began.
var ErrClosed = errors.New("delayd client: closed")

// opKind is what a queued call does.
type opKind uint8

const (
	opUpsert opKind = iota
	opRemove
)

// op is one caller's Upsert or Remove waiting in a publisher queue.
type op struct {
	ctx  context.Context
	kind opKind
	id   string
	req  *delaydv1.UpsertTaskRequest // opUpsert, namespace left empty
	size int                         // encoded size of req (opRemove: of the id)
	rm   *delaydv1.RemoveTaskRequest // opRemove
	// solo: the call's context carries a span or outgoing metadata, which
	// travel with the RPC, so it is sent alone, with its own context; or
	// it is a conditional remove, which RemoveTasks cannot carry.
	solo bool

	done     chan struct{}
	upserted *UpsertResult
	removed  RemoveResult
	err      error
}

// publisher queues the Upsert and Remove calls of one Client, one FIFO per
// namespace.
type publisher struct {
	tasks delaydv1.TaskServiceClient
	set   BatchSettings

	mu       sync.Mutex
	queues   map[string]*pubQueue
	closed   bool
	flushing int              // Flush calls running: no op lingers
	live     map[*op]struct{} // ops submitted and not yet answered
}

// pubQueue is one namespace's calls in call order. Calls leave it from the
// head only, so an op never overtakes an earlier one; one also waits while
// an op of the same id is in flight (busy), which keeps the order per id
// across the batches in flight.
type pubQueue struct {
	ns       string
	ops      []*op
	inflight int            // calls (batches or lone ops) in flight
	busy     map[string]int // ids in flight
	timer    *time.Timer    // Linger timer of the head batch
	ripe     bool           // the head batch lingered long enough
}

func newPublisher(tasks delaydv1.TaskServiceClient, s BatchSettings) *publisher {
	return &publisher{tasks: tasks, set: s.withDefaults(), queues: make(map[string]*pubQueue), live: make(map[*op]struct{})}
}

// soloContext reports whether ctx carries something that travels with its
// own RPC: a valid span (the server keeps its trace context with the task)
// or outgoing gRPC metadata.
func soloContext(ctx context.Context) bool {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return true
	}
	_, ok := metadata.FromOutgoingContext(ctx)
	return ok
}

// upsert queues one upsert and waits for its answer.
func (p *publisher) upsert(ctx context.Context, ns string, req *delaydv1.UpsertTaskRequest) (*UpsertResult, error) {
	o := &op{ctx: ctx, kind: opUpsert, id: req.GetId(), req: req, size: proto.Size(req), solo: soloContext(ctx)}
	if err := p.submit(ctx, ns, o); err != nil {
		return nil, err
	}
	return o.upserted, o.err
}

// remove queues one remove and waits for its answer. Unconditional removes
// coalesce into RemoveTasks calls (which answer each id); a conditional one
// goes alone. Either keeps its place in the namespace's order.
func (p *publisher) remove(ctx context.Context, req *delaydv1.RemoveTaskRequest) (RemoveResult, error) {
	// size: the id as one element of RemoveTasksRequest.ids
	o := &op{ctx: ctx, kind: opRemove, id: req.GetId(), rm: req, size: len(req.GetId()) + 3,
		solo: req.GetIfGeneration() != 0 || soloContext(ctx)}
	if err := p.submit(ctx, req.GetNamespace(), o); err != nil {
		return RemoveResult{}, err
	}
	return o.removed, o.err
}

// submit queues o and waits until it is answered or ctx ends. A caller whose
// context ends first gets ctx's error; if its op was sent already, the
// write may still apply, as with a unary call cancelled in flight.
func (p *publisher) submit(ctx context.Context, ns string, o *op) error {
	o.done = make(chan struct{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	q := p.queues[ns]
	if q == nil {
		q = &pubQueue{ns: ns, busy: make(map[string]int)}
		p.queues[ns] = q
	}
	p.live[o] = struct{}{}
	q.ops = append(q.ops, o)
	p.dispatch(q)
	p.mu.Unlock()
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dispatch sends what may leave q's head now. Called with p.mu held.
func (p *publisher) dispatch(q *pubQueue) {
	for len(q.ops) > 0 {
		head := q.ops[0]
		if head.ctx.Err() != nil {
			// Its caller has gone: nothing to send.
			q.ops = q.ops[1:]
			p.answerLocked(head, head.ctx.Err())
			continue
		}
		if q.busy[head.id] > 0 {
			return // an op of the same id is in flight: the head waits
		}
		if q.inflight >= p.set.MaxOutstanding {
			return
		}
		if head.solo {
			q.inflight++
			q.ops = q.ops[1:]
			q.busy[head.id]++
			go p.sendOne(q, head)
			continue
		}
		n, full := p.cut(q)
		if n == 0 {
			return
		}
		if !full && p.set.Linger > 0 && !q.ripe && p.flushing == 0 && !p.closed {
			if q.timer == nil {
				q.timer = time.AfterFunc(p.set.Linger, func() {
					p.mu.Lock()
					q.timer, q.ripe = nil, true
					p.dispatch(q)
					p.mu.Unlock()
				})
			}
			return
		}
		if q.timer != nil {
			q.timer.Stop()
			q.timer = nil
		}
		q.ripe = false
		batch := make([]*op, n)
		copy(batch, q.ops[:n])
		q.ops = q.ops[n:]
		for _, o := range batch {
			q.busy[o.id]++
		}
		q.inflight++
		switch {
		case n == 1:
			go p.sendOne(q, batch[0])
		case batch[0].kind == opRemove:
			go p.sendRemoveBatch(q, batch)
		default:
			go p.sendBatch(q, batch)
		}
	}
	if len(q.ops) == 0 && q.inflight == 0 && len(q.busy) == 0 && q.timer == nil {
		delete(p.queues, q.ns)
	}
}

// cut returns how many ops from q's head form the next batch, and whether
// it is full (by count or bytes, or cut short by an op that cannot join).
// A batch is a run of coalescible ops of the head's kind with no id in
// flight and no id twice (a second call for an id waits for the first
// one's answer).
func (p *publisher) cut(q *pubQueue) (n int, full bool) {
	bytes := 0
	var seen map[string]bool
	kind := q.ops[0].kind
	for _, o := range q.ops {
		if n == p.set.MaxCount {
			return n, true
		}
		if o.kind != kind || o.solo || q.busy[o.id] > 0 || seen[o.id] {
			return n, n > 0
		}
		if n > 0 && bytes+o.size > p.set.MaxBytes {
			return n, true
		}
		if seen == nil {
			seen = make(map[string]bool)
		}
		seen[o.id] = true
		bytes += o.size
		n++
	}
	return n, n == p.set.MaxCount
}

// finish releases ops' ids and their call's slot and dispatches what waited.
func (p *publisher) finish(q *pubQueue, ops []*op) {
	p.mu.Lock()
	for _, o := range ops {
		if q.busy[o.id]--; q.busy[o.id] <= 0 {
			delete(q.busy, o.id)
		}
	}
	q.inflight--
	p.dispatch(q)
	p.mu.Unlock()
}

// answer wakes o's caller with err (nil: o's result fields are set).
func (p *publisher) answer(o *op, err error) {
	p.mu.Lock()
	p.answerLocked(o, err)
	p.mu.Unlock()
}

// answerLocked is answer with p.mu held.
func (p *publisher) answerLocked(o *op, err error) {
	o.err = err
	close(o.done)
	delete(p.live, o)
}

// rpcContext is the context a queued call is sent with: the caller's values
// (span, metadata) without its cancellation, which only ends the caller's
// wait. The Client's timeout bounds the call (its service config).
func rpcContext(o *op) context.Context { return context.WithoutCancel(o.ctx) }

// sendOne sends o alone, as the unary RPC it stands for.
func (p *publisher) sendOne(q *pubQueue, o *op) {
	ctx := rpcContext(o)
	switch o.kind {
	case opUpsert:
		req := proto.Clone(o.req).(*delaydv1.UpsertTaskRequest)
		req.Namespace = q.ns
		resp, err := p.tasks.UpsertTask(ctx, req)
		p.finish(q, []*op{o})
		if err != nil {
			p.answer(o, err)
			return
		}
		o.upserted = &UpsertResult{Task: taskFromProto(resp.GetTask()), Created: resp.GetCreated()}
		p.answer(o, nil)
	case opRemove:
		resp, err := p.tasks.RemoveTask(ctx, o.rm)
		p.finish(q, []*op{o})
		p.answerRemove(o, resp, err)
	}
}

// answerRemove answers o with what RemoveTask answered.
func (p *publisher) answerRemove(o *op, resp *delaydv1.RemoveTaskResponse, err error) {
	if err != nil {
		p.answer(o, err)
		return
	}
	o.removed = RemoveResult{Removed: resp.GetRemoved(), PreviousState: State(resp.GetPreviousState())}
	p.answer(o, nil)
}

// sendRemoveBatch sends ops (unconditional removes) in one RemoveTasks call
// and answers each with its id's result. RemoveTasks checks every id before
// it removes anything, so when it refuses the call as a whole with
// InvalidArgument (one id is malformed), each op is sent again alone and
// gets the answer RemoveTask gives it; any other failure fails every op
// with its error, as each unary call would have failed.
func (p *publisher) sendRemoveBatch(q *pubQueue, ops []*op) {
	req := &delaydv1.RemoveTasksRequest{Namespace: q.ns, Ids: make([]string, len(ops))}
	for i, o := range ops {
		req.Ids[i] = o.id
	}
	resp, err := p.tasks.RemoveTasks(rpcContext(ops[0]), req)
	if status.Code(err) == codes.InvalidArgument {
		for _, o := range ops {
			r, err := p.tasks.RemoveTask(rpcContext(o), o.rm)
			p.answerRemove(o, r, err)
		}
		p.finish(q, ops)
		return
	}
	p.finish(q, ops)
	if err == nil && len(resp.GetResults()) != len(ops) {
		// A delayd from before RemoveTasks answered each id: the ids are
		// removed, but which existed is not known.
		err = status.Errorf(codes.Unimplemented, "server answered %d results for %d ids (RemoveTasks results need a newer delayd; %d of the ids were removed)",
			len(resp.GetResults()), len(ops), resp.GetRemoved())
	}
	if err != nil {
		for _, o := range ops {
			p.answer(o, err)
		}
		return
	}
	for i, r := range resp.GetResults() {
		ops[i].removed = RemoveResult{Removed: r.GetRemoved(), PreviousState: State(r.GetPreviousState())}
		p.answer(ops[i], nil)
	}
}

// sendBatch sends ops in one BatchUpsertTasks call and answers each with its
// item. A call that fails as a whole fails every op with its error, as each
// unary call would have failed (the namespace, the key, a store that is down)
// — except InvalidArgument: BatchUpsertTasks checks each item on its own and
// answers it in its result, so a refusal of the whole call is about the
// batch (more items or payload bytes than the server's --max-batch or
// --max-batch-payload-bytes, which may be lower than BatchSettings assume),
// and each op is sent again alone to get the answer UpsertTask gives it.
func (p *publisher) sendBatch(q *pubQueue, ops []*op) {
	req := &delaydv1.BatchUpsertTasksRequest{Namespace: q.ns, Tasks: make([]*delaydv1.UpsertTaskRequest, len(ops))}
	for i, o := range ops {
		req.Tasks[i] = o.req
	}
	resp, err := p.tasks.BatchUpsertTasks(rpcContext(ops[0]), req)
	if status.Code(err) == codes.InvalidArgument {
		for _, o := range ops {
			ureq := proto.Clone(o.req).(*delaydv1.UpsertTaskRequest)
			ureq.Namespace = q.ns
			r, err := p.tasks.UpsertTask(rpcContext(o), ureq)
			if err != nil {
				p.answer(o, err)
				continue
			}
			o.upserted = &UpsertResult{Task: taskFromProto(r.GetTask()), Created: r.GetCreated()}
			p.answer(o, nil)
		}
		p.finish(q, ops) // after: the ids stay busy, so later calls for them wait their turn
		return
	}
	p.finish(q, ops)
	if err == nil && len(resp.GetResults()) != len(ops) {
		err = status.Errorf(codes.Internal, "server answered %d results for %d items", len(resp.GetResults()), len(ops))
	}
	if err != nil {
		for _, o := range ops {
			p.answer(o, err)
		}
		return
	}
	for i, r := range resp.GetResults() {
		o := ops[i]
		if e := r.GetError(); e != nil {
			e = &delaydv1.ItemError{Code: e.GetCode(), Message: strings.ReplaceAll(e.GetMessage(), fmt.Sprintf("tasks[%d].", i), "")}
			p.answer(o, itemError(e, r.GetTask(), Version{Generation: o.req.GetIfGeneration(), Incarnation: o.req.GetIfIncarnation()}))
			continue
		}
		o.upserted = &UpsertResult{Task: taskFromProto(r.GetTask()), Created: r.GetCreated()}
		p.answer(o, nil)
	}
}

// flush sends every queued batch now, without waiting for Linger, and waits
// until every call made before it was answered or ctx ends.
func (p *publisher) flush(ctx context.Context) error {
	p.mu.Lock()
	p.flushing++
	waits := make([]chan struct{}, 0, len(p.live))
	for o := range p.live {
		waits = append(waits, o.done)
	}
	for _, q := range p.queues {
		p.dispatch(q)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.flushing--
		p.mu.Unlock()
	}()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// close refuses new calls, then flushes.
func (p *publisher) close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return p.flush(ctx)
}
