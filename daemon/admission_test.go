package daemon

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// madeUpKey has the form of an API key; no such key exists.
const madeUpKey = "dk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

// TestMadeUpKeyIsRefusedBeforeTheBody (issue 32 item 2): a call with a
// well-formed but made-up key is refused Unauthenticated before its body
// is read: a call that never sends its request ends at once (it hung,
// holding a goroutine, until the connection went away), and a malformed
// body is not decoded (it answered InvalidArgument, the decoder's verdict).
func TestMadeUpKeyIsRefusedBeforeTheBody(t *testing.T) {
	t.Parallel()
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "warn"})
	ctx := asKey(ctxFor(t), madeUpKey)

	for _, method := range []string{delaydv1.TaskService_UpsertTask_FullMethodName, delaydv1.DeliveryService_Subscribe_FullMethodName} {
		stream, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
		if err == nil {
			// Headers only: the request message is never sent.
			err = stream.RecvMsg(&delaydv1.UpsertTaskResponse{})
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s with a made-up key and no body: %v; want Unauthenticated at once", method, err)
		}
	}

	err := s.conn.Invoke(ctx, delaydv1.TaskService_UpsertTask_FullMethodName, rawBytes{0xff, 0xff, 0xff}, // not protobuf
		new(delaydv1.UpsertTaskResponse), grpc.ForceCodecV2(rawBytesCodec{}))
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("a malformed body with a made-up key: %v; want Unauthenticated, before decoding", err)
	}

	// A real key still works.
	admin := asKey(ctxFor(t), guardAdminKey)
	if _, err := delaydv1.NewNamespaceServiceClient(s.conn).WhoAmI(admin, &delaydv1.WhoAmIRequest{}); err != nil {
		t.Fatalf("WhoAmI with the admin key: %v", err)
	}
}

// rawBytes is a request sent as is, whatever it holds.
type rawBytes []byte

type rawBytesCodec struct{}

func (rawBytesCodec) Name() string { return "proto" }

func (rawBytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawBytes))}, nil
}

func (rawBytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
