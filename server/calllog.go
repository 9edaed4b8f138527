package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/storage"
)

// DefaultSlowCall is the duration past which a unary call is logged as slow
// when CallLog.SlowCall is zero.
const DefaultSlowCall = time.Second

// CallLog configures the request log: one line per finished call (method,
// namespace, code, duration, peer; never a payload or a task id), written
// only when its level is enabled on the logger. The levels are chosen so
// that the default INFO level is quiet under load:
//
//   - DEBUG: calls that succeeded (or were canceled by the client, or
//     answered NotFound / AlreadyExists, which are ordinary answers), unless
//     slow. `--log-level debug` shows every call.
//   - INFO: other client errors (InvalidArgument, PermissionDenied,
//     Unauthenticated, ResourceExhausted, FailedPrecondition, ...).
//   - WARN: unary calls that took SlowCall or longer ("slow call"), and
//     Unavailable / DeadlineExceeded.
//   - ERROR: Internal, Unknown, DataLoss.
//
// A call whose level is off costs two clock reads and a comparison: no
// field is built and nothing is allocated.
type CallLog struct {
	// SlowCall is the duration from which a unary call is logged at WARN
	// whatever its outcome. Streams (Subscribe) are exempt: they last as
	// long as the subscriber stays. If zero, DefaultSlowCall (1 s);
	// negative: never.
	SlowCall time.Duration
}

// callLogger writes the request log.
type callLogger struct {
	log  *slog.Logger
	slow time.Duration
}

func newCallLogger(l *slog.Logger, cfg CallLog) *callLogger {
	slow := cfg.SlowCall
	if slow == 0 {
		slow = DefaultSlowCall
	}
	return &callLogger{log: l, slow: slow}
}

// codeLevel is the level of a finished call's line by its code.
func codeLevel(c codes.Code) slog.Level {
	switch c {
	case codes.OK, codes.Canceled, codes.NotFound, codes.AlreadyExists:
		return slog.LevelDebug
	case codes.Unavailable, codes.DeadlineExceeded:
		return slog.LevelWarn
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// level returns the level of a finished call and its message.
func (c *callLogger) level(code codes.Code, took time.Duration, unary bool) (slog.Level, string) {
	lvl := codeLevel(code)
	if unary && c.slow > 0 && took >= c.slow && lvl < slog.LevelWarn {
		return slog.LevelWarn, "slow call"
	}
	return lvl, "finished call"
}

// write logs one finished call; the caller has checked the level is on.
func (c *callLogger) write(ctx context.Context, lvl slog.Level, msg, fullMethod, ns string, err error, took time.Duration) {
	service, method := splitMethod(fullMethod)
	st := status.Convert(err)
	attrs := make([]slog.Attr, 0, 7)
	attrs = append(attrs,
		slog.String("grpc.service", service),
		slog.String("grpc.method", method))
	if ns != "" {
		attrs = append(attrs, slog.String("namespace", ns))
	}
	attrs = append(attrs,
		slog.String("grpc.code", st.Code().String()),
		slog.Float64("grpc.time_ms", float64(took.Microseconds())/1000))
	if err != nil {
		attrs = append(attrs, slog.String("grpc.error", truncateUTF8(st.Message(), maxLoggedError)))
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer.address", p.Addr.String()))
	}
	c.log.LogAttrs(ctx, lvl, msg, attrs...)
}

// splitMethod splits "/pkg.Service/Method" into its service and method.
func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "", full
}

// namespaced is any request that names a namespace.
type namespaced interface{ GetNamespace() string }

// namespaceOf is the namespace a request names, for the log line: as sent
// when it is a valid name, else only its length. It is read before
// validation, and a client must not decide what the log holds.
func namespaceOf(m any) string {
	r, ok := m.(namespaced)
	if !ok || r.GetNamespace() == "" {
		return ""
	}
	ns := r.GetNamespace()
	if storage.ValidateNamespace(ns) != nil && ns != storage.GlobalNamespace {
		return fmt.Sprintf("(invalid, %d bytes)", len(ns))
	}
	return ns
}

// maxLoggedError bounds the grpc.error field of a log line: a status
// message may quote what a client sent.
const maxLoggedError = 512

// unary is the unary request-log interceptor.
func (c *callLogger) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	took := time.Since(start)
	lvl, msg := c.level(status.Code(err), took, true)
	if c.log.Enabled(ctx, lvl) {
		c.write(ctx, lvl, msg, info.FullMethod, namespaceOf(req), err, took)
	}
	return resp, err
}

// stream is the stream request-log interceptor; the namespace is the one
// the stream's first message names.
func (c *callLogger) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	ns := &namespaceStream{ServerStream: ss}
	err := handler(srv, ns)
	took := time.Since(start)
	lvl, msg := c.level(status.Code(err), took, false)
	if ctx := ss.Context(); c.log.Enabled(ctx, lvl) {
		c.write(ctx, lvl, msg, info.FullMethod, ns.ns, err, took)
	}
	return err
}

// namespaceStream remembers the namespace of a stream's first message.
type namespaceStream struct {
	grpc.ServerStream
	seen bool
	ns   string
}

func (s *namespaceStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.seen {
		s.seen = true
		s.ns = namespaceOf(m)
	}
	return err
}
