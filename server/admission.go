package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/delayd/delayd/internal/items"
)

// Admission: what a client must get right before the server spends memory
// or a store call on it. In the order a call meets them:
//
//  1. the listener: at most Limits.MaxConnections connections, and a
//     peer's idle ones beyond its share closed first (conns.go);
//  2. the HTTP/2 header list: at most maxHeaderListBytes decoded bytes, so
//     HPACK-compressed floods of metadata cannot pin memory;
//  3. the guard's tap handle (guard/tap.go): with auth on, a call to a delayd service is
//     authenticated before its stream is accepted — the bearer key looked
//     up (the registry's cache first) and its secret compared — so a call
//     with no key, a malformed one or a made-up one is refused with
//     Unauthenticated before a byte of its body is read or buffered, and
//     a stream is ended at once (health and reflection stay open);
//  4. the codec (admissionCodec): a request with more items of one
//     repeated field than a call may carry — counted at every depth, a
//     nested list's items added up over the message, a packed list's
//     elements one by one (internal/items) — is refused before they are
//     built, and
//     malformed protobuf (including invalid UTF-8 in a string field) is
//     refused as InvalidArgument instead of grpc-go's Internal;
//  5. then authentication proper (the principal put in the context, from
//     the cache the tap filled), authorization, limits.

// maxHeaderListBytes is the largest decoded header list (all metadata of
// one call) the server accepts. A well-formed call needs well under 1 KiB:
// the bearer key is 63 bytes, tracing headers a few hundred.
const maxHeaderListBytes = 8 << 10

// admissionCodec is the server's codec: grpc-go's protobuf codec for
// replies, and for requests a decoder that refuses what must not be built.
// grpc-go answers every codec error with Internal; a client's bad message
// must answer InvalidArgument, so Unmarshal records the refusal (keyed by
// the message it was asked to fill) and returns nil, and the first
// interceptor (decodeCheckUnary / decodeCheckStream) answers it before
// anything reads the message.
type admissionCodec struct {
	base     encoding.CodecV2
	maxItems int // most items of one repeated field of a request, at every depth (internal/items)

	refused sync.Map // proto.Message -> error
}

func newAdmissionCodec(maxItems int) *admissionCodec {
	return &admissionCodec{base: encoding.GetCodecV2("proto"), maxItems: maxItems}
}

// Name implements encoding.CodecV2: the content subtype stays "proto".
func (c *admissionCodec) Name() string { return c.base.Name() }

// replyPool holds the buffers of marshalled replies in power-of-two sizes
// from 1 KiB to 8 MiB. grpc-go's default pool has tiers of 4, 16 and 32
// KiB and then 1 MiB, so a reply of 33 KiB (a delivery of a 32 KiB
// payload) took a 1 MiB buffer for as long as the transport held it: a
// watch that stopped reading held ~4 of them (issue 42 item 6).
var replyPool = func() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23)
	if err != nil {
		panic(err)
	}
	return p
}()

// Marshal implements encoding.CodecV2, as grpc-go's protobuf codec does but
// with replyPool's buffers.
func (c *admissionCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.base.Marshal(v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // the size was just computed
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := replyPool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		replyPool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, replyPool)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (c *admissionCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if err := items.Wire(b, m.ProtoReflect().Descriptor(), c.maxItems); err != nil {
		c.refused.Store(m, status.Error(codes.InvalidArgument, err.Error()))
		return nil
	}
	if err := proto.Unmarshal(b, m); err != nil {
		c.refused.Store(m, status.Errorf(codes.InvalidArgument,
			"the request is not a valid %s message: %v", m.ProtoReflect().Descriptor().FullName(), err))
		return nil
	}
	return nil
}

// take returns (and forgets) the refusal recorded for m, if any.
func (c *admissionCodec) take(m any) error {
	if err, ok := c.refused.LoadAndDelete(m); ok {
		return err.(error)
	}
	return nil
}

// decodeCheckUnary answers a unary request the codec refused.
func (c *admissionCodec) decodeCheckUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := c.take(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// decodeCheckStream answers a stream message the codec refused.
func (c *admissionCodec) decodeCheckStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &decodeCheckedStream{ServerStream: ss, codec: c})
}

type decodeCheckedStream struct {
	grpc.ServerStream
	codec *admissionCodec
}

func (s *decodeCheckedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.codec.take(m)
}
