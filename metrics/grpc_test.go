package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// fakeStream is a server stream whose sends go nowhere.
type fakeStream struct {
	grpc.ServerStream
	sent int
}

func (s *fakeStream) Context() context.Context { return context.Background() }
func (s *fakeStream) SendMsg(any) error        { s.sent++; return nil }

// TestSubscribeDeliveriesAreNotCountedPerMessage: a Subscribe stream is
// counted as started and handled, but its handler sends on the stream as it
// came (no per-message label lookup, no allocation), and its messages are
// not in grpc_server_msg_sent_total; other streams' messages still are.
func TestSubscribeDeliveriesAreNotCountedPerMessage(t *testing.T) {
	m := New(Options{})
	ic := m.grpc.stream
	run := func(method string, sends int) (*fakeStream, grpc.ServerStream) {
		ss := &fakeStream{}
		var got grpc.ServerStream
		err := ic(nil, ss, &grpc.StreamServerInfo{FullMethod: method, IsServerStream: true},
			func(_ any, s grpc.ServerStream) error {
				got = s
				for range sends {
					if err := s.SendMsg(nil); err != nil {
						return err
					}
				}
				if method == "/delayd.v1.DeliveryService/Subscribe" {
					if n := testing.AllocsPerRun(100, func() { _ = s.SendMsg(nil) }); n != 0 {
						t.Errorf("Subscribe SendMsg allocates %v times, want 0", n)
					}
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		return ss, got
	}
	sub, subGot := run("/delayd.v1.DeliveryService/Subscribe", 5)
	if subGot != grpc.ServerStream(sub) {
		t.Errorf("Subscribe handler got %T, want the stream as it came", subGot)
	}
	if _, watchGot := run("/delayd.v1.DeliveryService/WatchDeliveries", 3); watchGot == nil {
		t.Fatal("WatchDeliveries handler not called")
	}

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for series, want := range map[string]bool{
		`grpc_server_started_total{grpc_method="Subscribe",grpc_service="delayd.v1.DeliveryService",grpc_type="server_stream"} 1`:                true,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Subscribe",grpc_service="delayd.v1.DeliveryService",grpc_type="server_stream"} 1`: true,
		`grpc_server_msg_sent_total{grpc_method="Subscribe"`:                                                                                     false,
		`grpc_server_msg_sent_total{grpc_method="WatchDeliveries",grpc_service="delayd.v1.DeliveryService",grpc_type="server_stream"} 3`:         true,
		`grpc_server_handling_seconds`: false,
	} {
		if got := strings.Contains(body, series); got != want {
			t.Errorf("exposition contains %s: %v, want %v", series, got, want)
		}
	}
}

// scrape returns m's exposition in the text format.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// healthServer is a real gRPC server with the health service registered, for
// InitGRPC.
func healthServer(t *testing.T) *grpc.Server {
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	t.Cleanup(gs.Stop)
	return gs
}

// TestGRPCInterceptorsDoNotAllocate: once InitGRPC has resolved a server's
// methods, the metrics' part of a successful unary call allocates nothing
// (go-grpc-middleware's provider allocated twice and looked four label
// children up per call), nor does a message of a counted stream.
func TestGRPCInterceptorsDoNotAllocate(t *testing.T) {
	m := New(Options{})
	m.InitGRPC(healthServer(t))
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _, _ = m.grpc.unary(ctx, nil, info, handler) }); n != 0 {
		t.Errorf("a unary call's metrics allocate %v times, want 0", n)
	}
	err := m.grpc.stream(nil, &fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/grpc.health.v1.Health/Watch", IsServerStream: true},
		func(_ any, ss grpc.ServerStream) error {
			if n := testing.AllocsPerRun(1000, func() { _ = ss.SendMsg(nil) }); n != 0 {
				t.Errorf("a stream message's metrics allocate %v times, want 0", n)
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	body := scrape(t, m)
	for _, want := range []string{
		`grpc_server_started_total{grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"} 1001`,
		`grpc_server_msg_sent_total{grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 1001`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("exposition lacks %s:\n%s", want, body)
		}
	}
}

// recvStream is a client stream that receives n messages, then io.EOF.
type recvStream struct {
	fakeStream
	n int
}

func (s *recvStream) RecvMsg(any) error {
	if s.n == 0 {
		return io.EOF
	}
	s.n--
	return nil
}

// TestGRPCMetricsSeries: the gRPC metrics keep go-grpc-middleware's
// provider's names, labels and counting (dashboards and alerts query them):
// a unary call counts started, one message received, one sent if it
// succeeded, and handled with its code (a status error's code, a context
// error's code, else Unknown); a stream counts every message it receives
// and sends without error; the registered methods' series exist at 0 from
// InitGRPC on; a method no server registered is counted all the same.
func TestGRPCMetricsSeries(t *testing.T) {
	m := New(Options{})
	m.InitGRPC(healthServer(t))
	ctx := context.Background()
	call := func(method string, err error) {
		_, _ = m.grpc.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return nil, err })
	}
	call("/delayd.v1.TaskService/UpsertTask", nil)
	call("/delayd.v1.TaskService/UpsertTask", nil)
	call("/delayd.v1.TaskService/UpsertTask", status.Error(codes.NotFound, "no"))
	call("/delayd.v1.TaskService/UpsertTask", fmt.Errorf("wrapped: %w", context.DeadlineExceeded))
	call("/delayd.v1.TaskService/UpsertTask", context.Canceled)
	call("/delayd.v1.TaskService/UpsertTask", errors.New("plain"))
	call("/delayd.v1.TaskService/UpsertTask", status.Error(codes.Code(42), "beyond the known codes"))
	if err := m.grpc.stream(nil, &recvStream{n: 4}, &grpc.StreamServerInfo{FullMethod: "/x.Up/Load", IsClientStream: true},
		func(_ any, ss grpc.ServerStream) error {
			for ss.RecvMsg(nil) == nil {
			}
			return ss.SendMsg(nil)
		}); err != nil {
		t.Fatal(err)
	}

	body := scrape(t, m)
	const up = `grpc_method="UpsertTask",grpc_service="delayd.v1.TaskService",grpc_type="unary"`
	for _, want := range []string{
		`grpc_server_started_total{` + up + `} 7`,
		`grpc_server_msg_received_total{` + up + `} 7`,
		`grpc_server_msg_sent_total{` + up + `} 2`,
		`grpc_server_handled_total{grpc_code="OK",` + up + `} 2`,
		`grpc_server_handled_total{grpc_code="NotFound",` + up + `} 1`,
		`grpc_server_handled_total{grpc_code="DeadlineExceeded",` + up + `} 1`,
		`grpc_server_handled_total{grpc_code="Canceled",` + up + `} 1`,
		`grpc_server_handled_total{grpc_code="Unknown",` + up + `} 1`,
		`grpc_server_handled_total{grpc_code="Code(42)",` + up + `} 1`,
		`grpc_server_started_total{grpc_method="Load",grpc_service="x.Up",grpc_type="client_stream"} 1`,
		`grpc_server_msg_received_total{grpc_method="Load",grpc_service="x.Up",grpc_type="client_stream"} 4`,
		`grpc_server_msg_sent_total{grpc_method="Load",grpc_service="x.Up",grpc_type="client_stream"} 1`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Load",grpc_service="x.Up",grpc_type="client_stream"} 1`,
		// Registered, never called: present at 0; handled has no code yet.
		`grpc_server_started_total{grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"} 0`,
		`grpc_server_msg_sent_total{grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 0`,
		"# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.",
		"# TYPE grpc_server_msg_received_total counter",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("exposition lacks %s", want)
		}
	}
	if strings.Contains(body, `grpc_server_handled_total{grpc_code="OK",grpc_method="Check"`) {
		t.Error("a handled series exists for a code that never happened")
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", body)
	}
}
