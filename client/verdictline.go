package client

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// verdictLine carries a consumer's acks, nacks and lease extensions to
// delayd: on the consumer's open StreamDeliveries stream when there is one
// (one message per batch, answered on the stream), else, and whenever the
// stream ends before answering, with the unary AckTasks, NackTasks and
// ExtendLease. Tokens are valid on any stream and any replica, so a verdict
// sent again after a stream broke is applied once (a repeat answers
// NOT_FOUND or STALE and changes nothing).
//
// The stream's Send is called under mu only (the acker and the leaser
// share it); the server answers the verdict requests of a stream one
// response each, in order, which answer pairs with pending's head.
type verdictLine struct {
	rpc delaydv1.DeliveryServiceClient
	ns  string

	// sendMu serializes Sends (held across one); mu guards the fields
	// below and is never held across a Send, so the stream's receiver,
	// which hands answers over under mu, never waits on a Send that waits
	// on flow control.
	sendMu  sync.Mutex
	mu      sync.Mutex
	stream  delaydv1.DeliveryService_StreamDeliveriesClient // nil: none open
	pending []chan *delaydv1.StreamDeliveriesResponse       // sent, unanswered, in order
}

// errLineLost: the stream ended before it answered.
var errLineLost = errors.New("delivery stream ended before answering")

func newVerdictLine(rpc delaydv1.DeliveryServiceClient, ns string) *verdictLine {
	return &verdictLine{rpc: rpc, ns: ns}
}

// attach makes s the stream verdicts go on.
func (l *verdictLine) attach(s delaydv1.DeliveryService_StreamDeliveriesClient) {
	l.mu.Lock()
	l.stream = s
	l.mu.Unlock()
}

// detach stops sending on s (if it is the current stream) and fails what
// it left unanswered, so those verdicts go again by the unary calls.
func (l *verdictLine) detach(s delaydv1.DeliveryService_StreamDeliveriesClient) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream != s {
		return
	}
	l.stream = nil
	for _, ch := range l.pending {
		close(ch)
	}
	l.pending = nil
}

// answered hands a verdict response of the current stream to the oldest
// request waiting for one.
func (l *verdictLine) answered(s delaydv1.DeliveryService_StreamDeliveriesClient, resp *delaydv1.StreamDeliveriesResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream != s || len(l.pending) == 0 {
		return
	}
	ch := l.pending[0]
	l.pending[0] = nil
	l.pending = l.pending[1:]
	ch <- resp
}

// send sends req on the current stream and waits for its answer; it
// returns errLineLost when there is no stream or it ended first.
func (l *verdictLine) send(ctx context.Context, req *delaydv1.StreamDeliveriesRequest) (*delaydv1.StreamDeliveriesResponse, error) {
	ch := make(chan *delaydv1.StreamDeliveriesResponse, 1)
	l.sendMu.Lock()
	l.mu.Lock()
	s := l.stream
	if s == nil {
		l.mu.Unlock()
		l.sendMu.Unlock()
		return nil, errLineLost
	}
	// Queued before the Send, so an answer never arrives before its
	// request is waiting for it; a failed Send means the stream broke, and
	// detach closes ch.
	l.pending = append(l.pending, ch)
	l.mu.Unlock()
	err := s.Send(req)
	l.sendMu.Unlock()
	if err != nil {
		return nil, errLineLost
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, errLineLost
		}
		return resp, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ack acks tokens; one result per token.
func (l *verdictLine) ack(ctx context.Context, toks []string) ([]*delaydv1.TokenResult, error) {
	if resp, err := l.send(ctx, &delaydv1.StreamDeliveriesRequest{AckTokens: toks}); err == nil {
		return resp.GetAckResults(), nil
	} else if !errors.Is(err, errLineLost) {
		return nil, err
	}
	resp, err := l.rpc.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: l.ns, Tokens: toks})
	return resp.GetResults(), err
}

// nack nacks tokens with one retry delay (nil: the namespace's backoff)
// and reason; one result per token.
func (l *verdictLine) nack(ctx context.Context, toks []string, retryAfter *durationpb.Duration, reason string) ([]*delaydv1.TokenResult, error) {
	n := &delaydv1.StreamNack{Tokens: toks, RetryAfter: retryAfter, Reason: reason}
	if resp, err := l.send(ctx, &delaydv1.StreamDeliveriesRequest{Nacks: []*delaydv1.StreamNack{n}}); err == nil {
		return resp.GetNackResults(), nil
	} else if !errors.Is(err, errLineLost) {
		return nil, err
	}
	resp, err := l.rpc.NackTasks(ctx, &delaydv1.NackTasksRequest{Namespace: l.ns, Tokens: toks, RetryAfter: retryAfter, Reason: reason})
	return resp.GetResults(), err
}

// extend extends the leases of toks by extendBy (nil: the namespace's ack
// timeout); one result per token.
func (l *verdictLine) extend(ctx context.Context, toks []string, extendBy *durationpb.Duration) ([]*delaydv1.TokenResult, error) {
	e := &delaydv1.StreamExtend{Tokens: toks, ExtendBy: extendBy}
	if resp, err := l.send(ctx, &delaydv1.StreamDeliveriesRequest{Extends: []*delaydv1.StreamExtend{e}}); err == nil {
		return resp.GetExtendResults(), nil
	} else if !errors.Is(err, errLineLost) {
		return nil, err
	}
	resp, err := l.rpc.ExtendLease(ctx, &delaydv1.ExtendLeaseRequest{Namespace: l.ns, Tokens: toks, ExtendBy: extendBy})
	return resp.GetResults(), err
}
