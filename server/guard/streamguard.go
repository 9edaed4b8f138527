package guard

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// guardInterval is how often an open stream re-checks that its API key and
// its namespace still stand. The checks read the registry cache, whose
// lifetime (1 s by default) bounds how late a revocation or a deletion made
// on another replica is seen: a stream ends within about guardInterval +
// that lifetime. A revocation or deletion made on this replica ends its
// streams before the RPC that made it returns (streamGuard.keyRevoked,
// streamGuard.namespaceEnded).
const guardInterval = 200 * time.Millisecond

// streamGuard is the one door every server stream of the delayd services
// goes through (Subscribe, WatchDeliveries, and any streaming RPC added
// later: it is the stream interceptor, chosen by the RPC being a server
// stream, not by name). For each stream, from its first client message
// (which names the namespace) until its handler returns, it:
//
//   - holds a slot of the stream caps (subscriberLimiter): the caller's API
//     key's (Limits.MaxStreamsPerKey) and the namespace's
//     (policy.max_subscribers, across replicas with SharedLimits); a stream
//     past either is refused ResourceExhausted before its handler runs. A
//     watch (WatchDeliveries) holds slots of its own, counted apart, up to
//     the same limits (the namespace's on this replica), so watches never
//     take the slots of the namespace's subscribers;
//   - ties the stream to its key and to the namespace's incarnation (its
//     create time): when the key is revoked, or the namespace deleted (or
//     deleted and re-created), the stream's context is cancelled and every
//     later Send refused, so nothing more reaches the client, and the stream
//     ends with Unauthenticated or NotFound.
//
// Handlers read the guarded context from stream.Context() after the first
// RecvMsg (grpc-go's generated handlers of server-streaming RPCs receive the
// request before calling the method, so they always do).
type streamGuard struct {
	keys       func(ctx context.Context, id string) (storage.Key, error) // nil: no key check
	namespaces Tenancy
	limits     *subscriberLimiter
	interval   time.Duration

	mu   sync.Mutex
	open map[*guardedStream]struct{}
}

func newStreamGuard(opts Config) *streamGuard {
	g := &streamGuard{interval: guardInterval, namespaces: opts.Tenancy, open: make(map[*guardedStream]struct{}),
		limits: newSubscriberLimiter(opts.Tenancy, opts.SharedLimits, opts.Logger, opts.MaxStreamsPerKey)}
	if authEnabled(opts) {
		g.keys = opts.Tenancy.Key
	}
	return g
}

// guardStatus is the cause of a guard-ended stream's context: the status
// the stream answers.
type guardStatus struct{ st error }

func (g guardStatus) Error() string { return g.st.Error() }

func revokedStatus(keyID string) error {
	return guardStatus{status.Errorf(codes.Unauthenticated, "API key %s was revoked; the stream is closed", keyID)}
}

func deletedStatus(ns string) error {
	return guardStatus{status.Errorf(codes.NotFound, "namespace %q was deleted; the stream is closed", ns)}
}

// stream is the stream interceptor; it runs after authentication,
// authorization and the rate limit.
func (g *streamGuard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !info.IsServerStream || OpenMethod(info.FullMethod) {
		return handler(srv, ss)
	}
	gs := &guardedStream{ServerStream: ss, g: g, method: info.FullMethod,
		watch: info.FullMethod == delaydv1.DeliveryService_WatchDeliveries_FullMethodName}
	// The key's slot is taken from the headers (authentication has put the
	// principal in the context), before any message.
	if p := PrincipalFrom(ss.Context()); p != nil {
		if err := g.limits.acquireKey(p.KeyID, gs.watch); err != nil {
			return err
		}
		gs.keyID, gs.keyHeld = p.KeyID, true
		gs.checkID = g.keys != nil && p.KeyID != adminKeyID
	}
	err := handler(srv, gs)
	return gs.finish(err)
}

// keyRevoked ends this replica's streams of the key at once.
func (g *streamGuard) keyRevoked(keyID string) {
	g.end(func(s *guardedStream) bool { return s.keyID == keyID }, revokedStatus(keyID))
}

// namespaceEnded ends this replica's streams of ns at once (it was deleted).
func (g *streamGuard) namespaceEnded(ns string) {
	g.end(func(s *guardedStream) bool { return s.ns == ns }, deletedStatus(ns))
}

func (g *streamGuard) end(match func(*guardedStream) bool, why error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for s := range g.open {
		if match(s) {
			s.cancel(why)
		}
	}
}

// guardedStream is one stream under the guard. Its key fields are set
// before the handler runs, the others by the first RecvMsg, in the
// handler's goroutine, before the handler reads them.
type guardedStream struct {
	grpc.ServerStream
	g      *streamGuard
	method string
	watch  bool // a WatchDeliveries stream: it holds watch slots, not a subscriber's

	started bool
	err     error // the first message's refusal
	ctx     context.Context
	cancel  context.CancelCauseFunc
	ns      string
	keyID   string // "" when auth is off
	keyHeld bool   // the key's stream slot is held (from the headers)
	checkID bool   // the key is checked (not the bootstrap admin key)
	slot    string // the shared stream slot, "" when none
	held    bool   // the namespace's stream slot is held
	wg      sync.WaitGroup
	created time.Time // the namespace's incarnation; zero until known
}

// Context is the guarded context once the first message was received.
func (s *guardedStream) Context() context.Context {
	if s.ctx != nil {
		return s.ctx
	}
	return s.ServerStream.Context()
}

// SendMsg refuses to send once the guard ended the stream: what was being
// sent when the key was revoked never reaches the client.
func (s *guardedStream) SendMsg(m any) error {
	if s.ctx != nil {
		if err := context.Cause(s.ctx); err != nil {
			var gs guardStatus
			if errors.As(err, &gs) {
				return gs.st
			}
			return status.FromContextError(s.ctx.Err()).Err()
		}
	}
	return s.ServerStream.SendMsg(m)
}

func (s *guardedStream) RecvMsg(m any) error {
	if s.started && s.err != nil {
		return s.err
	}
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.started {
		s.started = true
		s.err = s.open(m)
	}
	return s.err
}

// open takes the caps' slots and starts guarding the stream.
func (s *guardedStream) open(m any) error {
	g := s.g
	ctx := s.ServerStream.Context()
	r, ok := rules[s.method]
	if !ok || r.ns == nil {
		return nil // no Namespace: authorization refused it already
	}
	ns := r.ns(m)
	if storage.ValidateNamespace(ns) != nil {
		return nil // the handler answers InvalidArgument
	}
	var slot string
	var err error
	if s.watch {
		err = g.limits.acquireWatch(ctx, ns)
	} else {
		slot, err = g.limits.acquire(ctx, ns)
	}
	if err != nil {
		return err
	}
	s.ns, s.slot, s.held = ns, slot, true
	if n, err := g.namespaces.Namespace(ctx, ns, false); err == nil {
		s.created = n.CreateTime
	}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	g.mu.Lock()
	g.open[s] = struct{}{}
	g.mu.Unlock()
	s.wg.Add(1)
	go s.loop()
	return nil
}

// loop re-checks the key and the namespace every interval until the
// stream ends.
func (s *guardedStream) loop() {
	defer s.wg.Done()
	t := time.NewTicker(s.g.interval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		// A check never waits long on the store: other requests may be
		// sharing its load (and, with the store down, it may be the probe
		// that waits the whole store timeout).
		cctx, ccancel := context.WithTimeout(s.ctx, s.g.interval/2)
		ended := s.check(cctx)
		ccancel()
		if ended != nil {
			s.cancel(ended)
			return
		}
	}
}

// check returns the guardStatus that ends the stream, or nil while its key
// and its namespace's incarnation stand (or cannot be read: the stream goes
// on, and is checked again next time). A namespace that did not exist when
// the stream opened (auto-created by the handler) is tied to the first
// incarnation seen.
func (s *guardedStream) check(ctx context.Context) error {
	if s.checkID {
		if _, err := s.g.keys(ctx, s.keyID); errors.Is(err, storage.ErrNotFound) {
			return revokedStatus(s.keyID)
		}
	}
	n, err := s.g.namespaces.Namespace(ctx, s.ns, false)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		if !s.created.IsZero() {
			return deletedStatus(s.ns)
		}
	case err != nil:
	case s.created.IsZero():
		s.created = n.CreateTime
	case !n.CreateTime.Equal(s.created):
		return deletedStatus(s.ns)
	}
	return nil
}

// finish stops guarding, gives the slots back, and returns the status the
// stream ends with: the guard's when it ended the stream.
func (s *guardedStream) finish(err error) error {
	if s.cancel != nil {
		s.g.mu.Lock()
		delete(s.g.open, s)
		s.g.mu.Unlock()
		cause := context.Cause(s.ctx)
		s.cancel(nil)
		s.wg.Wait()
		var gs guardStatus
		if errors.As(cause, &gs) {
			err = gs.st
		}
	}
	switch {
	case s.held && s.watch:
		s.g.limits.releaseWatch(s.ns)
	case s.held:
		s.g.limits.release(s.ns, s.slot)
	}
	if s.keyHeld {
		s.g.limits.releaseKey(s.keyID, s.watch)
	}
	return err
}
