// Package guard is the edge's one guard: everything that stands between a
// connection and a delayd handler, built from a Config by New, in one
// place. In the order a call meets it:
//
//  1. TLS (tls.go): the listener's credentials (certificates reloaded
//     when they change on disk) and the log of refused handshakes, shared
//     with the HTTP edge;
//  2. admission (tap.go): the tap that refuses a call whose key is
//     missing, malformed or unknown before its body is read (the HTTP edge
//     asks the same through AdmitHTTP);
//  3. authentication and authorization (auth.go): the key's principal
//     (PrincipalFrom), and the rule of the method (scope, namespace);
//  4. the per-namespace request rate limit (ratelimit.go);
//  5. on streams, the stream guard (streamguard.go): streams per key and
//     per namespace (policy.max_subscribers), revocation and deletion
//     ending open streams (KeyRevoked, NamespaceEnded); on unary calls, the
//     pending-task quota (quota.go).
//
// Steps 2 and 3 are left out when auth is off. Errors reach clients through
// the one mapping, rpcerr.ToStatus. What the server does before the guard
// (connection limits, the codec's refusal of oversized messages, recovery,
// the call log) is the server's.
package guard

import (
	"context"
	"crypto/tls"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/delayd/delayd/storage"
)

// Config is what the guard is built from. server.New fills it from its
// Options, with their defaults applied: Logger, Clock, Store and Tenancy
// are required; SharedLimits and TLS may be nil.
type Config struct {
	Logger *slog.Logger
	Clock  storage.Clock
	// Store counts a namespace's pending tasks for the quota.
	Store storage.Store
	// Tenancy looks namespaces (policies, incarnations) and keys up.
	Tenancy Tenancy
	// SharedLimits holds the limits shared across replicas: request rates
	// and subscriber slots.
	SharedLimits storage.SharedLimits
	// MaxStreamsPerKey caps one key's open streams on this replica
	// (--max-streams-per-key).
	MaxStreamsPerKey int
	Auth             AuthOptions
	TLS              *tls.Config // nil: plaintext
}

// Guard is the built guard (see the package comment).
type Guard struct {
	tls     *tls.Config        // nil: plaintext
	refused *handshakeLog      // refused TLS handshakes, both listeners
	tap     tap.ServerInHandle // nil when auth is off
	streams *streamGuard       // the namespace service ends streams through it
	unary   []grpc.UnaryServerInterceptor
	stream  []grpc.StreamServerInterceptor
}

// New builds the guard from opts. It logs a warning when authentication is
// off.
func New(opts Config) *Guard {
	g := &Guard{tls: opts.TLS, refused: newHandshakeLog(opts.Logger, opts.Clock), streams: newStreamGuard(opts)}
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

// ServerOptions install the guard on a gRPC server: the admission tap,
// the interceptors in the order above, the TLS credentials.
func (g *Guard) ServerOptions() []grpc.ServerOption {
	var out []grpc.ServerOption
	if g.tap != nil {
		out = append(out, grpc.InTapHandle(g.tap))
	}
	out = append(out, grpc.ChainUnaryInterceptor(g.unary...), grpc.ChainStreamInterceptor(g.stream...))
	return append(out, tlsServerOptions(g.tls, g.refused)...)
}

// TLS is the listeners' TLS configuration; nil for plaintext.
func (g *Guard) TLS() *tls.Config { return g.tls }

// AdmitHTTP authenticates an HTTP edge request to a delayd RPC (path
// /<service>/<method>) as the gRPC tap handle does, from its headers only:
// nil when it may go on (or auth is off), otherwise the status to answer
// (Unauthenticated for a missing, malformed, unknown or revoked key).
func (g *Guard) AdmitHTTP(r *http.Request) error {
	if g.tap == nil {
		return nil
	}
	ctx := r.Context()
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)}) // as gRPC's tap sees its peer
	}
	_, err := g.tap(ctx, &tap.Info{FullMethodName: r.URL.Path, Header: metadata.MD{"authorization": r.Header.Values("Authorization")}})
	return err
}

// HTTPErrorLog is the ErrorLog for an HTTP server on a TLS listener:
// net/http reports a refused handshake there, and it goes to the same
// rate-limited WARN line as the gRPC listener's.
func (g *Guard) HTTPErrorLog(logger *slog.Logger) *log.Logger {
	return slog.NewLogLogger(httpErrorLog{refused: g.refused, logger: logger}, slog.LevelWarn)
}

// KeyRevoked ends this replica's open streams of key id at once (the
// other replicas' end within the stream guard's interval).
func (g *Guard) KeyRevoked(id string) { g.streams.keyRevoked(id) }

// NamespaceEnded ends this replica's open streams of namespace ns at once
// (deleted, or re-created under the name).
func (g *Guard) NamespaceEnded(ns string) { g.streams.namespaceEnded(ns) }

// Tenancy is what the server asks of the namespace registry: the stored
// namespaces and keys (NamespaceService), effective policies on the hot
// paths, cached key lookups for authentication, and the server defaults.
// *tenancy.Registry implements it.
type Tenancy interface {
	storage.Registry
	// Namespace is the one lookup: ns with its effective policy (defaults
	// filled in) and create time (its incarnation), from a short-lived
	// cache; storage.ErrNotFound for an unknown namespace, unless create is
	// set and the registry auto-creates. Calls that put a namespace to use
	// (upserts, Subscribe) pass create; checks that run before the handler
	// (rate limit, subscriber limit, quota), reads, verdicts and a stream's
	// re-check do not, so a request refused for another reason creates
	// nothing.
	Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error)
	// ForgetNamespace drops ns and the cached API keys of ns, so the next
	// lookups read the store (an upsert learnt that the cached incarnation
	// has ended). The registry also drops a namespace's keys by itself when
	// a refresh finds the namespace deleted or re-created.
	ForgetNamespace(ns string)
	// Key returns the API key with that id, from a short-lived cache.
	// storage.ErrNotFound if there is none.
	Key(ctx context.Context, id string) (storage.Key, error)
	// Defaults returns the server default policy: what a zero policy field
	// of a namespace means.
	Defaults() storage.Policy
}
