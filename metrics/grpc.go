package metrics

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcMetrics are the standard gRPC server metrics, with the names and
// labels of go-grpc-middleware's Prometheus provider (which dashboards and
// alerts written for gRPC servers expect): grpc_server_started_total,
// grpc_server_handled_total (with grpc_code), grpc_server_msg_received_total
// and grpc_server_msg_sent_total, labelled grpc_type, grpc_service and
// grpc_method. Unlike the provider, the label children of a method are
// resolved once (for every registered method at start, see InitGRPC; any
// other on its first call), and those of a code on its first occurrence per
// method, so a call costs a map lookup and a few atomic adds, and allocates
// nothing (TestGRPCInterceptorsDoNotAllocate).
type grpcMetrics struct {
	started, handled, received, sent *prometheus.CounterVec

	methods atomic.Pointer[map[string]*methodChildren] // copy on write, under mu
	mu      sync.Mutex
}

// methodChildren are one method's resolved series.
type methodChildren struct {
	labels                  [3]string // grpc_type, grpc_service, grpc_method
	quiet                   bool      // a quiet stream: received and sent are nil (no series)
	started, received, sent prometheus.Counter
	handledVec              *prometheus.CounterVec
	handled                 [codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
}

func newGRPCMetrics() *grpcMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	g := &grpcMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total",
			Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total",
			Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels, "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total",
			Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total",
			Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
	}
	g.methods.Store(&map[string]*methodChildren{})
	return g
}

// Describe and Collect make grpcMetrics one prometheus.Collector.
func (g *grpcMetrics) Describe(ch chan<- *prometheus.Desc) {
	g.started.Describe(ch)
	g.handled.Describe(ch)
	g.received.Describe(ch)
	g.sent.Describe(ch)
}

func (g *grpcMetrics) Collect(ch chan<- prometheus.Metric) {
	g.started.Collect(ch)
	g.handled.Collect(ch)
	g.received.Collect(ch)
	g.sent.Collect(ch)
}

// grpcType is the provider's grpc_type label value.
func grpcType(clientStream, serverStream bool) string {
	switch {
	case !clientStream && !serverStream:
		return "unary"
	case clientStream && !serverStream:
		return "client_stream"
	case !clientStream && serverStream:
		return "server_stream"
	}
	return "bidi_stream"
}

// splitMethod splits "/pkg.Service/Method" as the provider does.
func splitMethod(fullMethod string) (service, method string) {
	fullMethod = strings.TrimPrefix(fullMethod, "/")
	if i := strings.Index(fullMethod, "/"); i >= 0 {
		return fullMethod[:i], fullMethod[i+1:]
	}
	return "unknown", "unknown"
}

// method returns fullMethod's children, resolving them on its first call
// (methods registered before InitGRPC never take this path). typ is the
// grpc_type of a call that was not resolved yet.
func (g *grpcMetrics) method(fullMethod, typ string) *methodChildren {
	if c := (*g.methods.Load())[fullMethod]; c != nil {
		return c
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.methods.Load()
	if c := old[fullMethod]; c != nil {
		return c
	}
	service, name := splitMethod(fullMethod)
	c := g.resolve(fullMethod, typ, service, name)
	next := make(map[string]*methodChildren, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[fullMethod] = c
	g.methods.Store(&next)
	return c
}

func (g *grpcMetrics) resolve(fullMethod, typ, service, method string) *methodChildren {
	c := &methodChildren{labels: [3]string{typ, service, method}, handledVec: g.handled, quiet: quietStreams[fullMethod]}
	c.started = g.started.WithLabelValues(typ, service, method)
	if !c.quiet {
		c.received = g.received.WithLabelValues(typ, service, method)
		c.sent = g.sent.WithLabelValues(typ, service, method)
	}
	return c
}

// init resolves every method of the services a gRPC server has registered.
func (g *grpcMetrics) init(services map[string]grpc.ServiceInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next := make(map[string]*methodChildren)
	for k, v := range *g.methods.Load() {
		next[k] = v
	}
	for service, info := range services {
		for _, m := range info.Methods {
			full := "/" + service + "/" + m.Name
			if next[full] == nil {
				next[full] = g.resolve(full, grpcType(m.IsClientStream, m.IsServerStream), service, m.Name)
			}
		}
	}
	g.methods.Store(&next)
}

// done counts a finished call with err's code: the code of a status error,
// else of a context error (as the gRPC server answers), else Unknown.
func (c *methodChildren) done(err error) {
	code := codes.OK
	if err != nil {
		s, ok := status.FromError(err)
		if !ok {
			s = status.FromContextError(err)
		}
		code = s.Code()
	}
	if int(code) >= len(c.handled) {
		c.handledVec.WithLabelValues(c.labels[0], c.labels[1], c.labels[2], code.String()).Inc()
		return
	}
	p := c.handled[code].Load()
	if p == nil {
		ctr := c.handledVec.WithLabelValues(c.labels[0], c.labels[1], c.labels[2], code.String())
		c.handled[code].CompareAndSwap(nil, &ctr)
		p = c.handled[code].Load()
	}
	(*p).Inc()
}

// unary counts a unary call as the provider does: started, one message
// received, one sent when it succeeded, handled with its code.
func (g *grpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := g.method(info.FullMethod, "unary")
	c.started.Inc()
	c.received.Inc()
	resp, err := handler(ctx, req)
	if err == nil {
		c.sent.Inc()
	}
	c.done(err)
	return resp, err
}

// stream counts a stream: started, handled with its code, and every message
// received and sent, except on the quiet streams (see quietStreams), whose
// handler gets the stream as it came.
func (g *grpcMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := g.method(info.FullMethod, grpcType(info.IsClientStream, info.IsServerStream))
	c.started.Inc()
	if !c.quiet {
		ss = &countedStream{ServerStream: ss, c: c}
	}
	err := handler(srv, ss)
	c.done(err)
	return err
}

// countedStream counts the messages a stream sends and receives without an
// error.
type countedStream struct {
	grpc.ServerStream
	c *methodChildren
}

func (s *countedStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.c.sent.Inc()
	}
	return err
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.c.received.Inc()
	}
	return err
}
