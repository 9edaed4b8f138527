package server

import (
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/tap"
)

// guard is the edge's one guard: everything that stands between a
// connection and a handler, built from Options by newGuard, in one place.
// In the order a call meets it:
//
//  1. TLS (tls.go): the listener's credentials (certificates reloaded
//     when they change on disk) and the log of refused handshakes, shared
//     with the HTTP edge;
//  2. admission (admission.go): the tap that refuses a call whose key is
//     missing, malformed or unknown before its body is read;
//  3. authentication and authorization (auth.go): the key's principal, and
//     the rule of the method (scope, namespace);
//  4. the per-namespace request rate limit (ratelimit.go);
//  5. on streams, the stream guard (streamguard.go): streams per key and
//     per namespace (policy.max_subscribers), revocation and deletion
//     ending open streams; on unary calls, the pending-task quota
//     (quota.go).
//
// Steps 2 and 3 are left out when auth is off. The codec's refusal of
// oversized messages (admissionCodec) is New's, as it is the server's codec.
type guard struct {
	tls     *tls.Config        // nil: plaintext
	refused *handshakeLog      // refused TLS handshakes, both listeners
	tap     tap.ServerInHandle // nil when auth is off
	streams *streamGuard       // the namespace service ends streams through it
	unary   []grpc.UnaryServerInterceptor
	stream  []grpc.StreamServerInterceptor
}

// newGuard builds the guard from opts (Limits already defaulted by New).
// It logs a warning when authentication is off.
func newGuard(opts Options) *guard {
	g := &guard{tls: opts.TLS, refused: newHandshakeLog(opts.Logger, opts.Clock), streams: newStreamGuard(opts)}
	if authEnabled(opts) {
		authn := newAuthenticator(opts)
		g.tap = tapAuth(authn)
		g.unary, g.stream = authInterceptors(authn, &authorizer{registry: opts.Tenancy, logger: opts.Logger})
	} else {
		opts.Logger.Warn("authentication is off: every client may do everything in every namespace; " +
			"set --admin-key (DELAYD_ADMIN_KEY) to turn it on")
	}
	rate := newRateLimiter(opts.Tenancy, opts.SharedLimits, opts.Logger)
	quota := newPendingQuota(opts)
	g.unary = append(g.unary, rate.unary, quota.unary)
	g.stream = append(g.stream, rate.stream, g.streams.stream)
	return g
}

// serverOptions install the guard on the gRPC server: the admission tap,
// the interceptors in the order above, the TLS credentials.
func (g *guard) serverOptions() []grpc.ServerOption {
	var out []grpc.ServerOption
	if g.tap != nil {
		out = append(out, grpc.InTapHandle(g.tap))
	}
	out = append(out, grpc.ChainUnaryInterceptor(g.unary...), grpc.ChainStreamInterceptor(g.stream...))
	return append(out, tlsServerOptions(g.tls, g.refused)...)
}
