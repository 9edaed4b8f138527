package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// policyLookup answers a namespace's policy without creating the namespace
// (Tenancy.LookupPolicy). Checks that run before the handler use it so that,
// with auto-create on, a request refused for another reason does not create
// a namespace as a side effect.
type policyLookup interface {
	LookupPolicy(ctx context.Context, ns string) (storage.Policy, error)
}

// limitPolicy returns ns's policy for a limit check: ok is false when there
// is none to apply (unknown namespace: the handler answers for it).
func limitPolicy(ctx context.Context, p policyLookup, ns string) (storage.Policy, bool, error) {
	if ns == "" || storage.ValidateNamespace(ns) != nil {
		return storage.Policy{}, false, nil
	}
	pol, err := p.LookupPolicy(ctx, ns)
	if errors.Is(err, storage.ErrNotFound) {
		return storage.Policy{}, false, nil
	}
	if err != nil {
		return storage.Policy{}, false, err
	}
	return pol, true, nil
}

// adminServicePrefix starts the full method names of NamespaceService.
var adminServicePrefix = "/" + delaydv1.NamespaceService_ServiceDesc.ServiceName + "/"

// rateLimiter enforces each namespace's policy.rate_limit / rate_burst with
// a token bucket (golang.org/x/time/rate) per namespace, on this replica:
// with N replicas behind a balancer a namespace gets up to N times its rate.
// Every TaskService and DeliveryService call takes one token (a Subscribe
// stream one when it opens); NamespaceService calls take none, so an
// operator can always change the limits of a namespace that is being
// throttled. A new policy applies to the existing bucket at once.
type rateLimiter struct {
	policies policyLookup
	logger   *slog.Logger

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

func newRateLimiter(policies policyLookup, logger *slog.Logger) *rateLimiter {
	return &rateLimiter{policies: policies, logger: logger, buckets: make(map[string]*rate.Limiter)}
}

// allow takes a token of ns's bucket, or returns ResourceExhausted naming
// the limit.
func (l *rateLimiter) allow(ctx context.Context, ns string) error {
	pol, ok, err := limitPolicy(ctx, l.policies, ns)
	if err != nil {
		return toStatus(ctx, l.logger, fmt.Errorf("rate limit: %w", err))
	}
	if !ok || pol.RateLimit <= 0 || math.IsInf(pol.RateLimit, 1) {
		l.mu.Lock()
		delete(l.buckets, ns) // unlimited (again): drop any old bucket
		l.mu.Unlock()
		return nil
	}
	burst := pol.RateBurst
	if burst <= 0 {
		burst = int(math.Max(1, math.Ceil(pol.RateLimit)))
	}
	l.mu.Lock()
	b := l.buckets[ns]
	if b == nil {
		b = rate.NewLimiter(rate.Limit(pol.RateLimit), burst)
		l.buckets[ns] = b
	} else if b.Limit() != rate.Limit(pol.RateLimit) || b.Burst() != burst {
		b.SetLimit(rate.Limit(pol.RateLimit))
		b.SetBurst(burst)
	}
	l.mu.Unlock()
	if !b.Allow() {
		return status.Errorf(codes.ResourceExhausted,
			"namespace %q is over its request rate limit (policy.rate_limit %g/s, policy.rate_burst %d, per server replica); retry later",
			ns, pol.RateLimit, burst)
	}
	return nil
}

// requestNamespace is the namespace a rate limit or quota is charged to: the
// namespace the RPC's request names, "" if none.
func requestNamespace(ctx context.Context, method string, req any) string {
	if strings.HasPrefix(method, adminServicePrefix) {
		// An operator's global key is never limited, so it can always
		// lift a limit; a namespace's own admin key is, like its others.
		p := principalFrom(ctx)
		if p == nil || p.global() {
			return ""
		}
		return p.namespace
	}
	r, ok := rules[method]
	if !ok || r.ns == nil {
		return ""
	}
	ns := r.ns(req)
	if ns == storage.GlobalNamespace {
		return ""
	}
	return ns
}

func (l *rateLimiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if ns := requestNamespace(ctx, info.FullMethod, req); ns != "" {
		if err := l.allow(ctx, ns); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

func (l *rateLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &firstMessageStream{ServerStream: ss, check: func(m any) error {
		if ns := requestNamespace(ss.Context(), info.FullMethod, m); ns != "" {
			return l.allow(ss.Context(), ns)
		}
		return nil
	}})
}

// subscriberLimiter enforces policy.max_subscribers (the most concurrent
// Subscribe streams of a namespace on this replica) and
// Limits.MaxStreamsPerKey (the most of one API key, across namespaces). A
// stream holds its slots from its first message until its handler returns.
type subscriberLimiter struct {
	policies policyLookup
	logger   *slog.Logger
	perKey   int

	mu     sync.Mutex
	active map[string]int // by namespace
	byKey  map[string]int // by API key id
}

func newSubscriberLimiter(policies policyLookup, logger *slog.Logger, perKey int) *subscriberLimiter {
	return &subscriberLimiter{policies: policies, logger: logger, perKey: perKey,
		active: make(map[string]int), byKey: make(map[string]int)}
}

// acquire takes a stream slot of ns and of key (the caller's key id; "" when
// auth is off), or returns ResourceExhausted naming the limit. release must
// be called once for every successful acquire.
func (l *subscriberLimiter) acquire(ctx context.Context, ns, key string) error {
	pol, ok, err := limitPolicy(ctx, l.policies, ns)
	if err != nil {
		return toStatus(ctx, l.logger, fmt.Errorf("subscriber limit: %w", err))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok && pol.MaxSubscribers > 0 && l.active[ns] >= pol.MaxSubscribers {
		return status.Errorf(codes.ResourceExhausted,
			"namespace %q already has %d Subscribe streams on this server replica (policy.max_subscribers %d); close one or raise the limit",
			ns, l.active[ns], pol.MaxSubscribers)
	}
	if key != "" && l.perKey > 0 && l.byKey[key] >= l.perKey {
		return status.Errorf(codes.ResourceExhausted,
			"API key %s already holds %d Subscribe streams on this server replica (at most %d per key); close one or use another key",
			key, l.byKey[key], l.perKey)
	}
	l.active[ns]++
	if key != "" {
		l.byKey[key]++
	}
	return nil
}

func (l *subscriberLimiter) release(ns, key string) {
	l.mu.Lock()
	decrement(l.active, ns)
	if key != "" {
		decrement(l.byKey, key)
	}
	l.mu.Unlock()
}

// decrement lowers m[k] by one, dropping it at zero.
func decrement(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
	} else {
		m[k]--
	}
}

func (l *subscriberLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != delaydv1.DeliveryService_Subscribe_FullMethodName {
		return handler(srv, ss)
	}
	var held, key string
	if p := principalFrom(ss.Context()); p != nil {
		key = p.keyID
	}
	err := handler(srv, &firstMessageStream{ServerStream: ss, check: func(m any) error {
		ns := requestNamespace(ss.Context(), info.FullMethod, m)
		if ns == "" {
			return nil // invalid request: the handler answers InvalidArgument
		}
		if err := l.acquire(ss.Context(), ns, key); err != nil {
			return err
		}
		held = ns
		return nil
	}})
	if held != "" {
		l.release(held, key)
	}
	return err
}
