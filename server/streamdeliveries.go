package server

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/dispatcher"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// StreamDeliveries limits.
const (
	// DefaultStreamBatch is the most deliveries per StreamDeliveries
	// response when the first request's max_batch is 0.
	DefaultStreamBatch = 100
	// MaxStreamBatch is the largest max_batch a stream may ask for.
	MaxStreamBatch = 1000
	// StreamBatchBytes bounds the deliveries of one StreamDeliveries
	// response (storage.TaskWireSize each; a larger delivery goes alone),
	// well under gRPC's default 4 MiB message limit of clients.
	StreamBatchBytes = 1 << 20
)

// StreamDeliveries is Subscribe with batched deliveries and the verdicts on
// the same stream (see the proto). The first request opens the stream; the
// stream goes through the same interceptors as Subscribe: auth on the first
// request, and the stream guard (guard/streamguard.go), which holds the per-key
// and per-namespace stream caps and ends the stream when its key is revoked
// or its namespace deleted. The
// dispatcher's Serve sends the deliveries from this goroutine; a receiver
// goroutine applies the verdicts of each request in order and answers them
// in a response of their own. The two share the stream's Send through one
// lock, so Send is never called concurrently, and nothing is sent once the
// handler has returned. A verdict that fails in the store (or a request
// that is invalid) ends the stream with its status: the client reconnects
// and sends the verdict again; its sent deliveries stay leased meanwhile,
// as when a Subscribe stream ends.
func (s *deliveryService) StreamDeliveries(stream delaydv1.DeliveryService_StreamDeliveriesServer) error {
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err // a status: the interceptors' refusal, or the stream's end
	}
	// The guarded context, as the stream guard set it at the first message:
	// cancelled when the key is revoked or the namespace deleted.
	ctx := stream.Context()
	ns := first.GetNamespace()
	inFlight, kinds, err := s.openStream(ctx, ns, first.GetMaxInFlight(), first.GetKinds())
	if err != nil {
		return err
	}
	maxBatch := int(first.GetMaxBatch())
	switch {
	case maxBatch == 0:
		maxBatch = DefaultStreamBatch
	case maxBatch < 0 || maxBatch > MaxStreamBatch:
		return rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("max_batch", "is %d; allowed: 1-%d, or 0 for %d", maxBatch, MaxStreamBatch, DefaultStreamBatch))
	}
	out := newStreamSender(stream)
	defer out.close()
	// Verdicts of the opening request are for deliveries of earlier
	// streams: apply them before this one receives anything. Their answer
	// waits for the stream's header (Ready), which tells the client the
	// stream is registered: a response sent first would send the header
	// with it, and the header could not be sent again.
	opening, err := s.applyVerdicts(ctx, ns, first)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	credit := make(chan int, 1)
	go s.streamReceive(ctx, cancel, ns, stream, out, credit)
	err = s.opts.Subscriptions.Serve(ctx, dispatcher.Subscriber{
		Namespace:     ns,
		MaxInFlight:   inFlight,
		Kinds:         kinds,
		MaxBatch:      maxBatch,
		MaxBatchBytes: StreamBatchBytes,
		Credit:        credit,
		Ready: func() error {
			if err := out.sendHeader(); err != nil {
				return err
			}
			if opening != nil {
				return out.send(opening)
			}
			return nil
		},
		SendBatch: func(ds []storage.Delivery) error {
			resp := &delaydv1.StreamDeliveriesResponse{Deliveries: make([]*delaydv1.Delivery, len(ds))}
			for i, d := range ds {
				resp.Deliveries[i] = deliveryToProto(d)
			}
			return out.send(resp)
		},
	})
	var ended receiverEnd
	if errors.As(context.Cause(ctx), &ended) {
		if ended.err == nil {
			return nil // the client closed its side
		}
		return ended.err
	}
	return s.streamEnded(ctx, err)
}

// receiverEnd is the cause the receiver cancels a StreamDeliveries stream
// with: err nil when the client closed its side (io.EOF), else the status
// the stream ends with.
type receiverEnd struct{ err error }

func (r receiverEnd) Error() string {
	if r.err == nil {
		return "client closed the stream"
	}
	return r.err.Error()
}

// streamReceive reads the stream's requests after the first until it
// ends, applying each one's verdicts and credit in order; it cancels the
// stream with a receiverEnd when the client closes its side, a request is
// invalid or a verdict fails.
func (s *deliveryService) streamReceive(ctx context.Context, cancel context.CancelCauseFunc, ns string,
	stream delaydv1.DeliveryService_StreamDeliveriesServer, out *streamSender, credit chan int) {
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				cancel(receiverEnd{})
			} else {
				cancel(err) // the stream broke: Serve ends with ctx
			}
			return
		}
		if n := req.GetNamespace(); n != "" && n != ns {
			cancel(receiverEnd{rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("namespace", "is %q on a stream opened for %q; allowed: empty or the stream's namespace", n, ns))})
			return
		}
		if m := req.GetMaxInFlight(); m != 0 {
			v, err := s.inFlight(m)
			if err != nil {
				cancel(receiverEnd{rpcerr.ToStatus(ctx, s.logger, err)})
				return
			}
			select { // the latest value wins
			case <-credit:
			default:
			}
			credit <- v
		}
		if err := s.streamVerdicts(ctx, ns, req, out); err != nil {
			cancel(receiverEnd{err})
			return
		}
	}
}

// streamVerdicts applies the acks, nacks and extensions of one request (as
// AckTasks, NackTasks and ExtendLease do) and sends their results in one
// response; nothing is sent for a request without verdicts. It returns a
// status error that ends the stream.
func (s *deliveryService) streamVerdicts(ctx context.Context, ns string, req *delaydv1.StreamDeliveriesRequest, out *streamSender) error {
	resp, err := s.applyVerdicts(ctx, ns, req)
	if err != nil || resp == nil {
		return err
	}
	if err := out.send(resp); err != nil {
		return status.FromContextError(err).Err()
	}
	return nil
}

// applyVerdicts applies the verdicts of one request and returns the
// response that answers them (nil for a request without verdicts), or a
// status error that ends the stream.
func (s *deliveryService) applyVerdicts(ctx context.Context, ns string, req *delaydv1.StreamDeliveriesRequest) (*delaydv1.StreamDeliveriesResponse, error) {
	total := len(req.GetAckTokens())
	for _, n := range req.GetNacks() {
		total += len(n.GetTokens())
	}
	for _, e := range req.GetExtends() {
		total += len(e.GetTokens())
	}
	if total == 0 {
		return nil, nil
	}
	if total > s.limits.MaxBatch {
		return nil, rpcerr.ToStatus(ctx, s.logger, rpcerr.Invalidf("ack_tokens", "with nacks and extends has %d tokens; allowed: at most %d per request", total, s.limits.MaxBatch))
	}
	resp := &delaydv1.StreamDeliveriesResponse{}
	if toks := req.GetAckTokens(); len(toks) > 0 {
		res, err := s.ack(ctx, ns, toks)
		if err != nil {
			return nil, err
		}
		resp.AckResults = res
	}
	for _, n := range req.GetNacks() {
		if len(n.GetTokens()) == 0 {
			continue
		}
		res, err := s.nack(ctx, ns, n.GetTokens(), n.GetRetryAfter(), n.GetReason())
		if err != nil {
			return nil, err
		}
		resp.NackResults = append(resp.NackResults, res...)
	}
	for _, e := range req.GetExtends() {
		if len(e.GetTokens()) == 0 {
			continue
		}
		res, err := s.extend(ctx, ns, e.GetTokens(), e.GetExtendBy())
		if err != nil {
			return nil, err
		}
		resp.ExtendResults = append(resp.ExtendResults, res...)
	}
	return resp, nil
}

// streamSender serializes the Sends of a StreamDeliveries stream (the
// dispatcher's deliveries and the receiver's verdict answers), holds every
// response until the stream's header is sent (grpc sends the header with
// the first message, and SendHeader fails once it went), and refuses them
// once the handler has returned.
type streamSender struct {
	mu     sync.Mutex
	stream delaydv1.DeliveryService_StreamDeliveriesServer
	closed bool
	header chan struct{} // closed once the header is sent
	gone   chan struct{} // closed when the handler returns
}

// errStreamClosed is send's error once the handler has returned.
var errStreamClosed = errors.New("stream closed")

func newStreamSender(stream delaydv1.DeliveryService_StreamDeliveriesServer) *streamSender {
	return &streamSender{stream: stream, header: make(chan struct{}), gone: make(chan struct{})}
}

// sendHeader sends the stream's header (the client's sign that the stream
// is registered) and lets the responses through.
func (o *streamSender) sendHeader() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errStreamClosed
	}
	if err := o.stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	close(o.header)
	return nil
}

// send sends resp once the header went (waiting for it: a verdict answered
// before the stream is registered), or refuses it once the handler returned.
func (o *streamSender) send(resp *delaydv1.StreamDeliveriesResponse) error {
	select {
	case <-o.header:
	case <-o.gone:
		return errStreamClosed
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errStreamClosed
	}
	return o.stream.Send(resp)
}

func (o *streamSender) close() {
	o.mu.Lock()
	if !o.closed {
		o.closed = true
		close(o.gone)
	}
	o.mu.Unlock()
}
