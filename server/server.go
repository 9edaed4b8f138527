// Package server is delayd's gRPC edge: it validates requests, converts
// between the delayd.v1 wire types and the storage domain types, maps errors
// to status codes (one function, rpcerr.ToStatus) and serves TaskService,
// DeliveryService and NamespaceService, plus the standard health service and
// server reflection.
//
// A Server is built once with New, serves one listener with Serve, and is
// stopped once with GracefulStop.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// Defaults of Limits, used where a field is zero; the daemon's flags show
// the same values.
const (
	DefaultMaxBatch             = 1000
	DefaultMaxMessageBytes      = 5 << 20
	DefaultMaxBatchPayload      = 4 << 20
	DefaultMaxConnections       = 10000
	DefaultMaxConnectionIdle    = 5 * time.Minute
	DefaultCrowdedIdleTimeout   = 10 * time.Second
	DefaultMaxConcurrentStreams = 1000
	// DefaultMaxKeylessStreamsPerConn is Limits.MaxKeylessStreamsPerConn's
	// default.
	DefaultMaxKeylessStreamsPerConn = 4
	// DefaultMaxKeylessStreamsPerPeer is Limits.MaxKeylessStreamsPerPeer's
	// default.
	DefaultMaxKeylessStreamsPerPeer = 32
	// DefaultKeylessStreamLifetime is Limits.KeylessStreamLifetime's
	// default.
	DefaultKeylessStreamLifetime = 10 * time.Minute
	DefaultMaxInFlight           = 10000
	DefaultMaxStreamsPerKey      = 100
	DefaultMaxKeys               = 100
	DefaultDefaultInFlight       = 64
	DefaultMaxListBytes          = 1 << 20
)

// Connection keepalive. Subscribers hold long streams, so the server pings
// idle connections to find dead peers, and lets clients ping it no more
// often than keepaliveMinClientPing (a client pinging faster is sent
// GOAWAY, as gRPC's enforcement policy prescribes).
const (
	keepalivePing          = time.Minute
	keepalivePingTimeout   = 20 * time.Second
	keepaliveMinClientPing = 10 * time.Second
	// handshakeTimeout bounds how long a new connection may take to finish
	// its TLS and HTTP/2 handshake.
	handshakeTimeout = 10 * time.Second
)

// streamWorkersPerCore is how many handler goroutines grpc keeps per
// GOMAXPROCS (grpc.NumStreamWorkers; see New). An idle one costs its
// stack (a few KiB; the GC shrinks stacks that stay small).
const streamWorkersPerCore = 32

// Flow-control windows the server grants its clients (grpc.InitialWindowSize,
// grpc.InitialConnWindowSize). Setting them fixes the windows, which turns
// off grpc's BDP estimation: left on, it sends a PING after nearly every
// request message that arrives on an idle connection (an AckTasks call, a
// StreamDeliveries verdict), so a steady flow paid delayd a write and a
// read, and a wake of the connection's writer, per message for pings that
// only ever found the window big enough (issue 37 item 4;
// TestServerSendsNoPings). A stream may have streamWindow bytes unread: a
// request of MaxMessageBytes (5 MiB) crosses in five windows, about 1 GB/s
// on a 1 ms link; the connection's window (updated as data arrives, not as
// it is read) lets eight streams fill theirs at once.
const (
	streamWindow = 1 << 20
	connWindow   = 8 << 20
)

// ServiceNames returns the full names of the delayd services a Server
// registers ("delayd.v1.TaskService", ...), as the health and reflection
// services name them. Each call returns a new slice.
func ServiceNames() []string {
	return []string{
		delaydv1.TaskService_ServiceDesc.ServiceName,
		delaydv1.DeliveryService_ServiceDesc.ServiceName,
		delaydv1.NamespaceService_ServiceDesc.ServiceName,
		delaydv1.ScheduleService_ServiceDesc.ServiceName,
	}
}

// Server is delayd's gRPC server. Its methods are safe for concurrent use.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	logger *slog.Logger
	conns  *connRegistry // both listeners' connections (conns.go)

	// The HTTP edge (http.go).
	guard       *guard.Guard
	limits      Limits
	mu          sync.Mutex
	httpSrv     []*http.Server
	httpStopped bool
}

// New builds a Server from opts: interceptors (panic recovery first, then
// request logging without payloads), message and stream limits, keepalive
// enforcement, the three delayd services, the health service (starting
// NOT_SERVING until SetServing(true)) and, with opts.Reflection, server
// reflection. Zero Limits take their documented defaults.
func New(opts Options) (*Server, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("server: Options.Store is required")
	case opts.Tenancy == nil:
		return nil, errors.New("server: Options.Tenancy is required")
	case opts.Subscriptions == nil:
		return nil, errors.New("server: Options.Subscriptions is required")
	case opts.History == nil:
		return nil, errors.New("server: Options.History is required")
	case opts.Schedules == nil:
		return nil, errors.New("server: Options.Schedules is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// The one place Limits' defaults are applied: every part built from
	// opts below reads opts.Limits as it is.
	opts.Limits = opts.Limits.withDefaults()
	if opts.Clock == nil {
		opts.Clock = storage.SystemClock{}
	}

	codec := newAdmissionCodec(opts.Limits.MaxBatch)
	unary, stream := interceptors(opts.Logger, opts.CallLog, codec)
	conns := &connRegistry{keyless: keylessLimits{
		perConn: opts.Limits.MaxKeylessStreamsPerConn, perPeer: opts.Limits.MaxKeylessStreamsPerPeer,
		life: opts.Limits.KeylessStreamLifetime,
	}}
	serverOpts := append([]grpc.ServerOption{}, opts.Instrumentation...)
	serverOpts = append(serverOpts,
		grpc.ForceServerCodecV2(codec),
		// A fixed pool of goroutines runs the handlers: each call reuses a
		// grown stack instead of starting a goroutine whose stack grows
		// again (runtime.morestack was ~12% of a unary call's CPU). A call
		// that finds every worker busy gets a new goroutine, and handlers
		// spend most of their time waiting for Redis, so the pool is sized
		// for concurrent calls, not cores: with GOMAXPROCS workers,
		// morestack was still ~9% of the unary workload's profile (32
		// producers), and delayd CPU per 100,000 unary upserts fell from
		// 6.0-7.0 s to 4.9-6.0 s with 32 per core (three alternating
		// pairs; docs/BENCHMARKS.md, "Cost per task").
		grpc.NumStreamWorkers(uint32(streamWorkersPerCore*runtime.GOMAXPROCS(0))),
		grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{conns.unary}, unary...)...),
		grpc.ChainStreamInterceptor(append([]grpc.StreamServerInterceptor{conns.stream}, stream...)...),
		grpc.MaxRecvMsgSize(opts.Limits.MaxMessageBytes),
		grpc.MaxSendMsgSize(opts.Limits.MaxMessageBytes),
		grpc.MaxConcurrentStreams(opts.Limits.MaxConcurrentStreams),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: keepalivePing, Timeout: keepalivePingTimeout,
			MaxConnectionIdle: opts.Limits.MaxConnectionIdle,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinClientPing, PermitWithoutStream: true}),
	)
	// The guard (package guard) runs inside recovery and logging (chained
	// interceptors accumulate in order).
	g := guard.New(guard.Config{
		Logger: opts.Logger, Clock: opts.Clock, Store: opts.Store, Tenancy: opts.Tenancy,
		SharedLimits: opts.SharedLimits, MaxStreamsPerKey: opts.Limits.MaxStreamsPerKey,
		Auth: opts.Auth, TLS: opts.TLS,
	})
	serverOpts = append(serverOpts, g.ServerOptions()...)
	gs := grpc.NewServer(serverOpts...)

	delaydv1.RegisterTaskServiceServer(gs, newTaskService(opts))
	delaydv1.RegisterDeliveryServiceServer(gs, newDeliveryService(opts))
	delaydv1.RegisterNamespaceServiceServer(gs, newNamespaceService(opts, g))
	delaydv1.RegisterScheduleServiceServer(gs, newScheduleService(opts))

	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	if opts.Reflection {
		reflection.Register(gs)
	}

	s := &Server{grpc: gs, health: hs, logger: opts.Logger, conns: conns,
		guard: g, limits: opts.Limits}
	s.SetServing(false)
	return s, nil
}

// interceptors returns the server's interceptor chains, outermost first:
// panic recovery (logs the panic and its stack, answers Internal with a
// generic message), the request log (see CallLog: quiet at INFO for calls
// that succeed; never a payload), then the answer to requests the codec
// refused (admissionCodec).
func interceptors(logger *slog.Logger, cl CallLog, codec *admissionCodec) ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	recoverOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		logger.ErrorContext(ctx, "panic in handler", "grpc.method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, rpcerr.MsgInternal)
	})
	calls := newCallLogger(logger, cl)
	unary := []grpc.UnaryServerInterceptor{
		recovery.UnaryServerInterceptor(recoverOpt),
		calls.unary,
		codec.decodeCheckUnary,
	}
	stream := []grpc.StreamServerInterceptor{
		recovery.StreamServerInterceptor(recoverOpt),
		calls.stream,
		codec.decodeCheckStream,
	}
	return unary, stream
}

// withDefaults fills zero fields with their documented defaults.
func (l Limits) withDefaults() Limits {
	if l.MaxBatch <= 0 {
		l.MaxBatch = DefaultMaxBatch
	}
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if l.MaxBatchPayloadBytes <= 0 {
		l.MaxBatchPayloadBytes = DefaultMaxBatchPayload
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxConnectionIdle <= 0 {
		l.MaxConnectionIdle = DefaultMaxConnectionIdle
	}
	if l.IdlePerPeer <= 0 {
		l.IdlePerPeer = max(l.MaxConnections/16, 4)
	}
	if l.CrowdedIdleTimeout <= 0 {
		l.CrowdedIdleTimeout = DefaultCrowdedIdleTimeout
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if l.MaxKeylessStreamsPerConn <= 0 {
		l.MaxKeylessStreamsPerConn = DefaultMaxKeylessStreamsPerConn
	}
	if l.MaxKeylessStreamsPerPeer <= 0 {
		l.MaxKeylessStreamsPerPeer = DefaultMaxKeylessStreamsPerPeer
	}
	if l.KeylessStreamLifetime <= 0 {
		l.KeylessStreamLifetime = DefaultKeylessStreamLifetime
	}
	if l.MaxStreamsPerKey <= 0 {
		l.MaxStreamsPerKey = DefaultMaxStreamsPerKey
	}
	if l.MaxKeys <= 0 {
		l.MaxKeys = DefaultMaxKeys
	}
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = DefaultMaxInFlight
	}
	if l.DefaultInFlight <= 0 {
		l.DefaultInFlight = DefaultDefaultInFlight
	}
	if l.MaxListBytes <= 0 {
		l.MaxListBytes = DefaultMaxListBytes
	}
	if l.HTTPBodyTimeout <= 0 {
		l.HTTPBodyTimeout = DefaultHTTPBodyTimeout
	}
	// A page's first task is always sent (at most a 4 MiB payload), and the
	// rest must leave it room within the message limit.
	l.MaxListBytes = min(l.MaxListBytes, l.MaxMessageBytes/2)
	return l
}

// GetServiceInfo reports the services and methods registered on the gRPC
// server, as (*grpc.Server).GetServiceInfo does (metrics.InitGRPC resolves
// its label children from it).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }

// SetServing sets the health status of the whole server ("") and of every
// delayd service: SERVING when serving is true, NOT_SERVING otherwise. The
// daemon reports NOT_SERVING while it starts or rebuilds its index and once
// shutdown begins. After GracefulStop has begun, the status stays NOT_SERVING.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	for _, name := range ServiceNames() {
		s.health.SetServingStatus(name, st)
	}
}

// Serve accepts connections on lis until GracefulStop, at most
// Limits.MaxConnections at a time (more are closed as soon as accepted,
// unless a peer holds more than its share idle: see conns.go). It returns
// nil after a stop and the listener's error otherwise.
func (s *Server) Serve(lis net.Listener) error {
	if err := s.grpc.Serve(newLimitListener(lis, s.limits, s.conns)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// GracefulStop reports NOT_SERVING, stops accepting connections and waits
// for running calls to finish; when ctx ends first, it closes every
// connection at once (calls still running fail with Unavailable). It returns
// when the server has stopped; the error is ctx's when the drain was cut short.
func (s *Server) GracefulStop(ctx context.Context) error {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.logger.Warn("graceful stop timed out; closing remaining connections", "reason", ctx.Err())
		s.grpc.Stop()
		<-done
		return fmt.Errorf("graceful stop: %w", ctx.Err())
	}
}
