package metrics

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/delayd/delayd/storage"
)

// BenchmarkPerTask is what the metrics add to one task of delaybench's
// unary workload, minus the amortized batch calls (Pop, AckTasks): the
// gRPC metrics' interceptor around its UpsertTask call, the timed store
// Upsert, the lateness report of its delivery and the delivery's send on a
// Subscribe stream. Compare with the delayd CPU per task of delaybench
// (docs/BENCHMARKS.md#metrics-overhead): it is the part of the overhead that
// does not depend on the machine's load.
func BenchmarkPerTask(b *testing.B) {
	m := New(Options{})
	s := m.InstrumentStore("redis", &fakeStore{ups: []storage.UpsertResult{{}}})
	unary := m.grpc.unary
	info := &grpc.UnaryServerInfo{FullMethod: "/delayd.v1.TaskService/UpsertTask"}
	specs := make([]storage.UpsertSpec, 1)
	handler := func(ctx context.Context, req any) (any, error) {
		_, err := s.Upsert(ctx, "orders", specs)
		return req, err
	}
	var sub grpc.ServerStream
	done := make(chan struct{})
	go func() {
		_ = m.grpc.stream(nil, &fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/delayd.v1.DeliveryService/Subscribe", IsServerStream: true},
			func(_ any, ss grpc.ServerStream) error { sub = ss; close(done); return nil })
	}()
	<-done
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = unary(ctx, 1, info, handler)
		m.Delivered("orders", 3*time.Millisecond)
		_ = sub.SendMsg(nil)
	}
}
