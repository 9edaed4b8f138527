package server

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Streams that need no key. The health service and server reflection
// answer without an API key (guard.OpenMethod), so anyone who reaches the
// port may open their streams, and each costs a handler goroutine and the
// transport's stream for as long as it lasts: a health Watch until its
// client leaves, a reflection stream until its client closes it. So such
// streams are held to:
//
//   - Limits.MaxKeylessStreamsPerConn per connection and
//     Limits.MaxKeylessStreamsPerPeer per peer (as conns.go counts peers)
//     on each listener: one more is refused ResourceExhausted when its
//     headers arrive, before its handler runs;
//   - Limits.KeylessStreamLifetime: then the stream ends with Unavailable
//     (its client opens another);
//   - their connection's idleness: they do not make a connection busy, so
//     a connection whose only calls are such streams is idle for the
//     per-peer share (conns.go) and may be closed for a newcomer from
//     another address, or for being crowded.
//
// Unary calls of these services (health Check) are short and are counted
// as any call is.

// keylessLimits are the bounds above, with their defaults applied.
type keylessLimits struct {
	perConn, perPeer int
	life             time.Duration
}

// keylessStream serves a stream of a method that needs no key, on c (nil
// for a connection the registry does not track: then only the lifetime
// applies).
func (r *connRegistry) keylessStream(c *limitConn, srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	if c != nil {
		if err := c.t.takeKeyless(c, r.keyless); err != nil {
			return err
		}
		defer c.t.releaseKeyless(c)
	}
	return withLifetime(srv, ss, handler, r.keyless.life)
}

// takeKeyless counts one more keyless stream on c, or refuses it.
func (t *connTable) takeKeyless(c *limitConn, l keylessLimits) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.keyless >= l.perConn {
		return status.Errorf(codes.ResourceExhausted,
			"this connection already holds %d streams of methods that need no API key (health Watch, reflection); "+
				"at most %d per connection (--max-keyless-streams-per-conn): close one", c.keyless, l.perConn)
	}
	if n := t.keyless[c.peer]; n >= l.perPeer {
		return status.Errorf(codes.ResourceExhausted,
			"your address already holds %d streams of methods that need no API key (health Watch, reflection); "+
				"at most %d per address (--max-keyless-streams-per-peer): close one", n, l.perPeer)
	}
	c.keyless++
	t.keyless[c.peer]++
	return nil
}

func (t *connTable) releaseKeyless(c *limitConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c.keyless--
	if t.keyless[c.peer] <= 1 {
		delete(t.keyless, c.peer)
	} else {
		t.keyless[c.peer]--
	}
}

// withLifetime runs handler for at most life. The handler runs on a
// goroutine of its own, with a context that ends after life: a handler
// that returns when its context ends (health Watch) is done then; one
// blocked receiving (reflection) is left to end when grpc finishes the
// stream, which it does as soon as withLifetime returns (the client has
// not half-closed, so the stream is reset and the receive fails). Nothing
// the handler sends after that reaches the client.
func withLifetime(srv any, ss grpc.ServerStream, handler grpc.StreamHandler, life time.Duration) error {
	ctx, cancel := context.WithTimeout(ss.Context(), life)
	defer cancel()
	ls := &lifetimeStream{ServerStream: ss, ctx: ctx}
	done := make(chan error, 1)
	go func() { done <- handler(srv, ls) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	ls.end()
	if err := ss.Context().Err(); err != nil {
		return status.FromContextError(err).Err() // the client left first
	}
	return status.Errorf(codes.Unavailable,
		"this stream needs no API key and reached its lifetime (%s, --keyless-stream-lifetime); open another", life)
}

// lifetimeStream is a stream whose context ends with its lifetime, and
// which sends nothing once ended (its handler may still be running when
// grpc writes the stream's status). A send already under way then is not
// waited for: it may be blocked on the client's flow control, and grpc's
// transport refuses it once the stream is finished.
type lifetimeStream struct {
	grpc.ServerStream
	ctx   context.Context
	ended atomic.Bool
}

var errLifetimeEnded = status.Error(codes.Unavailable, "the stream reached its lifetime")

func (s *lifetimeStream) Context() context.Context { return s.ctx }

func (s *lifetimeStream) end() { s.ended.Store(true) }

func (s *lifetimeStream) SendMsg(m any) error {
	if s.ended.Load() {
		return errLifetimeEnded
	}
	return s.ServerStream.SendMsg(m)
}

func (s *lifetimeStream) SendHeader(md metadata.MD) error {
	if s.ended.Load() {
		return errLifetimeEnded
	}
	return s.ServerStream.SendHeader(md)
}
