package server_test

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// TestNestedListsRefusedBeforeBuilding (issue 42 item 3): 16 concurrent
// StreamDeliveries streams of one consume key each open with a ~5 MiB
// message of 2.5 M nested nack tokens (10 nacks, so the top-level count is
// small). Each is refused with InvalidArgument naming nacks.tokens and the
// cap, before a token is built. What the server then holds is the
// messages' bytes as grpc-go's transport receives them (MaxMessageBytes a
// stream, before any codec can look) and a contiguous copy of the one being
// checked: the heap peak and the bytes allocated stay under twice the bytes
// sent, plus 32 MiB. Before, the codec counted top-level lists only and
// built every token: this test's heap peaked 1,358 MiB over its start,
// with 3,599 MiB allocated (the delayd process: 29 MiB to 2.8 GiB
// resident). (Not parallel: it measures the process's heap.)
func TestNestedListsRefusedBeforeBuilding(t *testing.T) {
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "nested-", nil)
	_, consume := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_CONSUME)

	// One message's bytes, shared by every stream: namespace, then 10
	// nacks of 250,000 empty tokens each (2 bytes a token on the wire).
	const nacks, perNack = 10, 250_000
	var nack []byte
	for range perNack {
		nack = protowire.AppendTag(nack, 1, protowire.BytesType)
		nack = protowire.AppendBytes(nack, nil)
	}
	var msg []byte
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, ns)
	for range nacks {
		msg = protowire.AppendTag(msg, 6, protowire.BytesType)
		msg = protowire.AppendBytes(msg, nack)
	}
	nack = nil

	const streams = 16
	runtime.GC()
	before := heapInUse()
	stop := testkit.HeapPeak()
	var wg sync.WaitGroup
	errs := make([]error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(as(consume), dlvWait)
			defer cancel()
			s, err := r.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
				delaydv1.DeliveryService_StreamDeliveries_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				errs[i] = err
				return
			}
			if err := s.SendMsg(rawMessage(msg)); err != nil {
				errs[i] = err
				return
			}
			errs[i] = s.RecvMsg(new(delaydv1.StreamDeliveriesResponse))
		}()
	}
	wg.Wait()
	peak, allocated := stop()
	grown := int64(peak) - int64(before)
	t.Logf("%d streams × %d KiB message (%d nested tokens each): heap peak %+d MiB over %d MiB, %d MiB allocated in all",
		streams, len(msg)>>10, nacks*perNack, grown>>20, before>>20, allocated>>20)
	for i, err := range errs {
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || st.Message() != "nacks.tokens has more than 1000 items in all; at most 1000 are allowed in one call" {
			t.Errorf("stream %d: %v (%q); want InvalidArgument naming nacks.tokens and the cap of 1000", i, st.Code(), st.Message())
		}
	}
	bound := int64(2*streams*len(msg) + 32<<20)
	if grown > bound || int64(allocated) > bound {
		t.Errorf("refusing %d messages of nested tokens, the heap peaked %d MiB over its start and %d MiB were allocated; want both at most %d MiB (twice the bytes sent, plus 32 MiB)",
			streams, grown>>20, allocated>>20, bound>>20)
	}
}
