package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// dlvBidi is a StreamDeliveries stream read by a goroutine into ch.
type dlvBidi struct {
	stream delaydv1.DeliveryService_StreamDeliveriesClient
	ch     chan *delaydv1.StreamDeliveriesResponse
	err    chan error
	cancel context.CancelFunc
}

// streamDeliveries opens a StreamDeliveries stream with first as its
// opening request and waits until the server registered it.
func (e *dlvEnv) streamDeliveries(r *dlvReplica, first *delaydv1.StreamDeliveriesRequest) *dlvBidi {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := r.dlv.StreamDeliveries(ctx)
	if err != nil {
		cancel()
		e.t.Fatalf("StreamDeliveries: %v", err)
	}
	if first.Namespace == "" {
		first.Namespace = e.ns
	}
	if err := stream.Send(first); err != nil {
		cancel()
		e.t.Fatalf("StreamDeliveries: send: %v", err)
	}
	if _, err := stream.Header(); err != nil {
		cancel()
		e.t.Fatalf("StreamDeliveries headers: %v", err)
	}
	b := &dlvBidi{stream: stream, ch: make(chan *delaydv1.StreamDeliveriesResponse, 10000), err: make(chan error, 1), cancel: cancel}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				b.err <- err
				close(b.ch)
				return
			}
			b.ch <- resp
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		for range b.ch {
		}
	})
	return b
}

func (b *dlvBidi) next(t *testing.T) *delaydv1.StreamDeliveriesResponse {
	t.Helper()
	select {
	case r, ok := <-b.ch:
		if !ok {
			t.Fatalf("stream ended: %v", <-b.err)
		}
		return r
	case <-time.After(dlvWait):
		t.Fatalf("no response within %s", dlvWait)
		return nil
	}
}

// deliveries reads responses until n deliveries came, and returns them
// and how many responses carried them.
func (b *dlvBidi) deliveries(t *testing.T, n int) ([]*delaydv1.Delivery, int) {
	t.Helper()
	var out []*delaydv1.Delivery
	msgs := 0
	for len(out) < n {
		r := b.next(t)
		if len(r.GetDeliveries()) > 0 {
			msgs++
			out = append(out, r.GetDeliveries()...)
		}
	}
	return out, msgs
}

// results reads responses until one carries verdict results.
func (b *dlvBidi) results(t *testing.T) *delaydv1.StreamDeliveriesResponse {
	t.Helper()
	for {
		r := b.next(t)
		if len(r.GetAckResults())+len(r.GetNackResults())+len(r.GetExtendResults()) > 0 {
			return r
		}
	}
}

func (b *dlvBidi) send(t *testing.T, req *delaydv1.StreamDeliveriesRequest) {
	t.Helper()
	if err := b.stream.Send(req); err != nil {
		t.Fatalf("StreamDeliveries: send: %v", err)
	}
}

// TestStreamDeliveriesBatchesAndVerdicts (issue 25 item 2): a backlog
// reaches a StreamDeliveries stream several deliveries per message, each
// token once; acks, nacks and extensions sent on the same stream are
// answered per token on it, and the acked tasks are gone.
func TestStreamDeliveriesBatchesAndVerdicts(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	const n = 60
	specs := make([]storage.UpsertSpec, n)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%03d", i), Payload: []byte("p"), DueTime: e.redisNow().Add(-time.Minute)}
	}
	if _, err := e.store.Upsert(context.Background(), e.ns, specs); err != nil {
		t.Fatal(err)
	}
	b := e.streamDeliveries(r, &delaydv1.StreamDeliveriesRequest{MaxInFlight: 100, MaxBatch: 25})
	dels, msgs := b.deliveries(t, n)
	if msgs >= n || msgs < 3 {
		t.Errorf("%d deliveries came in %d messages; want several per message, at most 25 each", n, msgs)
	}
	seen := map[string]bool{}
	for _, d := range dels {
		if seen[d.GetToken()] {
			t.Fatalf("token %s delivered twice", d.GetToken())
		}
		seen[d.GetToken()] = true
	}

	// Ack 40, nack 10 (retry in an hour), extend 10, plus one malformed.
	var acks []string
	for _, d := range dels[:40] {
		acks = append(acks, d.GetToken())
	}
	acks = append(acks, "not-a-token")
	var nacks, extends []string
	for _, d := range dels[40:50] {
		nacks = append(nacks, d.GetToken())
	}
	for _, d := range dels[50:] {
		extends = append(extends, d.GetToken())
	}
	b.send(t, &delaydv1.StreamDeliveriesRequest{
		AckTokens: acks,
		Nacks:     []*delaydv1.StreamNack{{Tokens: nacks, RetryAfter: durationpb.New(time.Hour), Reason: "later"}},
		Extends:   []*delaydv1.StreamExtend{{Tokens: extends, ExtendBy: durationpb.New(2 * time.Hour)}},
	})
	res := b.results(t)
	if got := dlvStatuses(res.GetAckResults()); len(got) != 41 || got[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK ||
		got[39] != delaydv1.TokenStatus_TOKEN_STATUS_OK || got[40] != delaydv1.TokenStatus_TOKEN_STATUS_MALFORMED {
		t.Errorf("ack results = %v; want 40 OK and MALFORMED", got)
	}
	for _, rs := range [][]*delaydv1.TokenResult{res.GetNackResults(), res.GetExtendResults()} {
		if got := dlvStatuses(rs); len(got) != 10 || got[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK || got[9] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
			t.Errorf("nack/extend results = %v; want 10 OK", got)
		}
	}
	if dl := res.GetExtendResults()[0].GetLeaseDeadline().AsTime(); dl.Before(e.redisNow().Add(90 * time.Minute)) {
		t.Errorf("extended lease deadline %v; want about 2 h ahead", dl)
	}
	st, err := e.store.Stats(context.Background(), e.ns)
	if err != nil || st.Scheduled != 10 || st.Delivered != 10 {
		t.Errorf("after the verdicts: %+v, %v; want 10 scheduled (nacked), 10 delivered (extended), the acked gone", st, err)
	}
	// The acked tokens answer NOT_FOUND on the unary path now: one token
	// space for both paths.
	if got := e.ack(r, acks[0]); got[0] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Errorf("unary ack of a token acked on the stream = %v, want NOT_FOUND", got)
	}
}

// TestStreamDeliveriesCredit: acks on the stream give credit back, and a
// later request's max_in_flight changes the credit: a stream of 5 in
// flight receives 5, then the next 5 after acking them, then 10 at once
// after raising its max_in_flight.
func TestStreamDeliveriesCredit(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	specs := make([]storage.UpsertSpec, 20)
	for i := range specs {
		specs[i] = storage.UpsertSpec{ID: fmt.Sprintf("t%03d", i), DueTime: e.redisNow().Add(-time.Minute)}
	}
	if _, err := e.store.Upsert(context.Background(), e.ns, specs); err != nil {
		t.Fatal(err)
	}
	b := e.streamDeliveries(r, &delaydv1.StreamDeliveriesRequest{MaxInFlight: 5})
	first, _ := b.deliveries(t, 5)
	quiet := func() {
		t.Helper()
		select {
		case resp := <-b.ch:
			if len(resp.GetDeliveries()) > 0 {
				t.Fatalf("%d deliveries beyond the stream's credit", len(resp.GetDeliveries()))
			}
		case <-time.After(dlvQuiet):
		}
	}
	quiet()
	var toks []string
	for _, d := range first {
		toks = append(toks, d.GetToken())
	}
	b.send(t, &delaydv1.StreamDeliveriesRequest{AckTokens: toks})
	second, _ := b.deliveries(t, 5)
	quiet()
	toks = toks[:0]
	for _, d := range second {
		toks = append(toks, d.GetToken())
	}
	b.send(t, &delaydv1.StreamDeliveriesRequest{AckTokens: toks, MaxInFlight: 15})
	if third, _ := b.deliveries(t, 10); len(third) != 10 {
		t.Errorf("after raising max_in_flight: %d deliveries, want 10", len(third))
	}
}

// TestStreamDeliveriesRefusesOtherNamespace: a later request naming
// another namespace ends the stream with INVALID_ARGUMENT naming the
// field; the stream's deliveries are not acked by it.
func TestStreamDeliveriesRefusesOtherNamespace(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	b := e.streamDeliveries(r, &delaydv1.StreamDeliveriesRequest{})
	b.send(t, &delaydv1.StreamDeliveriesRequest{Namespace: "other-ns", AckTokens: []string{"x"}})
	for range b.ch {
	}
	err := <-b.err
	if status.Code(err) != codes.InvalidArgument || !containsAll(err.Error(), "namespace", "other-ns") {
		t.Errorf("stream ended with %v; want INVALID_ARGUMENT naming namespace", err)
	}
}

// TestStreamDeliveriesValidatesOpening: the opening request is validated
// as Subscribe's is, and max_batch names its range.
func TestStreamDeliveriesValidatesOpening(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	for _, tc := range []struct {
		req   *delaydv1.StreamDeliveriesRequest
		field string
	}{
		{&delaydv1.StreamDeliveriesRequest{Namespace: "Bad NS"}, "namespace"},
		{&delaydv1.StreamDeliveriesRequest{Namespace: e.ns, MaxInFlight: -1}, "max_in_flight"},
		{&delaydv1.StreamDeliveriesRequest{Namespace: e.ns, MaxBatch: 1001}, "max_batch"},
	} {
		stream, err := r.dlv.StreamDeliveries(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(tc.req); err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		if status.Code(err) != codes.InvalidArgument || !containsAll(err.Error(), tc.field) {
			t.Errorf("%v: %v; want INVALID_ARGUMENT naming %s", tc.req, err, tc.field)
		}
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestStreamDeliveriesOpeningVerdicts: the opening request may carry
// verdicts for deliveries of an earlier stream (a client reconnecting with
// what it could not send); they are answered, and the stream then goes on
// delivering like any other.
func TestStreamDeliveriesOpeningVerdicts(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	specs := []storage.UpsertSpec{{ID: "a", DueTime: e.redisNow().Add(-time.Minute)}, {ID: "b", DueTime: e.redisNow().Add(-time.Minute)}}
	if _, err := e.store.Upsert(context.Background(), e.ns, specs); err != nil {
		t.Fatal(err)
	}
	first := e.streamDeliveries(r, &delaydv1.StreamDeliveriesRequest{MaxInFlight: 10})
	dels, _ := first.deliveries(t, 2)
	first.cancel()

	var toks []string
	for _, d := range dels {
		toks = append(toks, d.GetToken())
	}
	second := e.streamDeliveries(r, &delaydv1.StreamDeliveriesRequest{MaxInFlight: 10, AckTokens: toks})
	res := second.results(t)
	if got := dlvStatuses(res.GetAckResults()); len(got) != 2 || got[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK || got[1] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Errorf("opening acks answered %v; want 2 OK", got)
	}
	if _, err := e.store.Upsert(context.Background(), e.ns, []storage.UpsertSpec{{ID: "c", DueTime: e.redisNow().Add(-time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	r.d.Notify(e.ns)
	if got, _ := second.deliveries(t, 1); got[0].GetTask().GetId() != "c" {
		t.Errorf("after the opening verdicts the stream delivered %v, want task c", got[0].GetTask().GetId())
	}
}
