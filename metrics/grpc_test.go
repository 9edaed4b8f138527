package metrics

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
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
	ic := m.streamInterceptor()
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
