package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// policyLookup answers a namespace's policy without creating the namespace
// (Tenancy.Namespace without create). Checks that run before the handler
// use it so that, with auto-create on, a request refused for another reason
// does not create a namespace as a side effect.
type policyLookup interface {
	Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error)
}

// limitPolicy returns ns's policy for a limit check: ok is false when there
// is none to apply (unknown namespace: the handler answers for it).
func limitPolicy(ctx context.Context, p policyLookup, ns string) (storage.Policy, bool, error) {
	if ns == "" || storage.ValidateNamespace(ns) != nil {
		return storage.Policy{}, false, nil
	}
	n, err := p.Namespace(ctx, ns, false)
	if errors.Is(err, storage.ErrNotFound) {
		return storage.Policy{}, false, nil
	}
	if err != nil {
		return storage.Policy{}, false, err
	}
	return n.Policy, true, nil
}

// adminServicePrefix starts the full method names of NamespaceService.
var adminServicePrefix = "/" + delaydv1.NamespaceService_ServiceDesc.ServiceName + "/"

// rateLimiter enforces each namespace's policy.rate_limit / rate_burst with
// a token bucket per namespace shared by every replica (in Redis:
// storage.SharedLimits), so N replicas behind a balancer still allow the
// namespace its rate once. Without shared limits, and while the shared
// bucket cannot be reached, a bucket of this replica's own
// (golang.org/x/time/rate) decides. Every TaskService and DeliveryService
// call takes one token (a Subscribe stream one when it opens, a
// StreamDeliveries stream one more for every later request carrying
// verdicts, waiting for it: see stream);
// NamespaceService calls take none, so an operator can always change the
// limits of a namespace that is being throttled. A new policy applies to
// the existing bucket at once.
type rateLimiter struct {
	policies policyLookup
	shared   storage.SharedLimits
	logger   *slog.Logger

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	warned  time.Time // last warning that the shared bucket failed
}

func newRateLimiter(policies policyLookup, shared storage.SharedLimits, logger *slog.Logger) *rateLimiter {
	return &rateLimiter{policies: policies, shared: shared, logger: logger, buckets: make(map[string]*rate.Limiter)}
}

// allow takes a token of ns's bucket, or returns ResourceExhausted naming
// the limit.
func (l *rateLimiter) allow(ctx context.Context, ns string) error {
	over, _, err := l.take(ctx, ns)
	if err != nil {
		return err
	}
	return over
}

// wait takes a token of ns's bucket, waiting for one while the bucket is
// empty (asking again every refill interval, 5 ms to 1 s), until ctx ends.
func (l *rateLimiter) wait(ctx context.Context, ns string) error {
	for {
		over, every, err := l.take(ctx, ns)
		if err != nil || over == nil {
			return err
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
}

// take takes a token of ns's bucket. When the bucket is empty, over is the
// ResourceExhausted naming the limit and every the time one token takes to
// come back (at least 5 ms, at most 1 s); err is a failure to look the
// limit up.
func (l *rateLimiter) take(ctx context.Context, ns string) (over error, every time.Duration, err error) {
	pol, ok, err := limitPolicy(ctx, l.policies, ns)
	if err != nil {
		return nil, 0, rpcerr.ToStatus(ctx, l.logger, fmt.Errorf("rate limit: %w", err))
	}
	if !ok || pol.RateLimit <= 0 || math.IsInf(pol.RateLimit, 1) {
		l.mu.Lock()
		delete(l.buckets, ns) // unlimited (again): drop any old bucket
		l.mu.Unlock()
		return nil, 0, nil
	}
	burst := pol.RateBurst
	if burst <= 0 {
		burst = int(math.Max(1, math.Ceil(pol.RateLimit)))
	}
	every = min(max(time.Duration(float64(time.Second)/pol.RateLimit), 5*time.Millisecond), time.Second)
	refuse := func(scope string) (error, time.Duration, error) {
		return status.Errorf(codes.ResourceExhausted,
			"namespace %q is over its request rate limit (policy.rate_limit %g/s, policy.rate_burst %d, %s); retry later",
			ns, pol.RateLimit, burst, scope), every, nil
	}
	if l.shared != nil {
		took, err := l.shared.TakeRequestToken(ctx, ns, pol.RateLimit, burst)
		if err == nil {
			if !took {
				return refuse("across all replicas")
			}
			return nil, 0, nil
		}
		l.warn(ctx, ns, err)
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
		return refuse("per server replica")
	}
	return nil, 0, nil
}

// warn logs, at most every 10 s, that the shared bucket failed and this
// replica's own decides.
func (l *rateLimiter) warn(ctx context.Context, ns string, err error) {
	l.mu.Lock()
	now := time.Now()
	quiet := now.Sub(l.warned) < 10*time.Second
	if !quiet {
		l.warned = now
	}
	l.mu.Unlock()
	if !quiet && l.logger != nil {
		l.logger.LogAttrs(ctx, slog.LevelWarn, "rate limit: the shared bucket failed; this replica's own bucket decides meanwhile",
			slog.String("namespace", ns), slog.String("error", err.Error()))
	}
}

// requestNamespace is the namespace a rate limit or quota is charged to: the
// namespace the RPC's request names, "" if none.
func requestNamespace(ctx context.Context, method string, req any) string {
	if strings.HasPrefix(method, adminServicePrefix) {
		// An operator's global key is never limited, so it can always
		// lift a limit; a namespace's own admin key is, like its others.
		p := PrincipalFrom(ctx)
		if p == nil || p.Global() {
			return ""
		}
		return p.Namespace
	}
	r, ok := rules[method]
	if !ok || r.ns == nil {
		return ""
	}
	ns := r.ns(req)
	if ns == storage.GlobalNamespace || storage.ValidateNamespace(ns) != nil {
		// Invalid: the handler answers InvalidArgument; no limit (and no
		// shared count in Redis) is asked about a name that cannot exist.
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

// stream charges a stream's first message (the stream's opening) and,
// of a StreamDeliveries stream, every later request that carries verdicts
// (verdictsPay): those stand for the unary AckTasks, NackTasks and
// ExtendLease calls they replace. Over the limit, the opening is refused;
// a later request waits for a token (back-pressure: the stream reads
// nothing meanwhile, so the client's sends back up), and the stream stays
// open.
func (l *rateLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	var ns string
	first := &firstMessageStream{ServerStream: ss, check: func(m any) error {
		if ns = requestNamespace(ss.Context(), info.FullMethod, m); ns != "" {
			return l.allow(ss.Context(), ns)
		}
		return nil
	}}
	if info.FullMethod != delaydv1.DeliveryService_StreamDeliveries_FullMethodName {
		return handler(srv, first)
	}
	return handler(srv, &verdictsPay{firstMessageStream: first, limiter: l, ns: &ns})
}

// verdictsPay charges every StreamDeliveries request after the first that
// carries verdicts to the namespace of the stream (ns, set by the first).
type verdictsPay struct {
	*firstMessageStream
	limiter *rateLimiter
	ns      *string
}

func (s *verdictsPay) RecvMsg(m any) error {
	later := s.done
	if err := s.firstMessageStream.RecvMsg(m); err != nil || !later || *s.ns == "" {
		return err
	}
	req, ok := m.(*delaydv1.StreamDeliveriesRequest)
	if !ok || len(req.GetAckTokens())+len(req.GetNacks())+len(req.GetExtends()) == 0 {
		return nil
	}
	return s.limiter.wait(s.Context(), *s.ns)
}

// subscriberLease is how long a Subscribe stream's slot in the shared count
// lasts without renewal: the streams of a replica that dies stop counting
// within it. Each replica renews its streams' slots every third of it.
const subscriberLease = 15 * time.Second

// subscriberLimiter enforces policy.max_subscribers (the most concurrent
// streams of a namespace — Subscribe, WatchDeliveries, every stream the
// streamGuard admits — across all replicas when SharedLimits
// is set: each stream holds a leased slot in Redis that this replica
// renews; otherwise, and while the shared count cannot be reached, on this
// replica) and Limits.MaxStreamsPerKey (the most of one API key, across
// namespaces, on this replica). A stream holds its slots from its first
// message until its handler returns (streamGuard).
type subscriberLimiter struct {
	policies policyLookup
	shared   storage.SharedLimits
	logger   *slog.Logger
	perKey   int
	prefix   string // starts the shared ids of this replica's streams

	mu     sync.Mutex
	active map[string]int // by namespace, on this replica
	byKey  map[string]int // by API key id
	seq    uint64
	renew  map[string]*renewal // by Namespace: this replica's shared slots
	// Watches (WatchDeliveries) hold slots of their own, so that watching
	// a namespace can never take the slots its subscribers need: by
	// namespace on this replica (policy.max_subscribers again) and by key.
	watchNS  map[string]int
	watchKey map[string]int
}

// renewal is the shared slots of one namespace's streams on this replica,
// renewed by one goroutine until the last is released.
type renewal struct {
	ids  map[string]bool
	stop chan struct{}
}

func newSubscriberLimiter(policies policyLookup, shared storage.SharedLimits, logger *slog.Logger, perKey int) *subscriberLimiter {
	return &subscriberLimiter{policies: policies, shared: shared, logger: logger, perKey: perKey,
		prefix: strconv.FormatUint(rand.Uint64(), 36) + "-",
		active: make(map[string]int), byKey: make(map[string]int), renew: make(map[string]*renewal),
		watchNS: make(map[string]int), watchKey: make(map[string]int)}
}

// acquireKey takes a stream slot of key (the caller's key id) on this
// replica, or returns ResourceExhausted naming the limit: a watch slot when
// watch is set, else a subscriber stream's (the two are counted apart, each
// up to the limit). A stream takes it when its headers arrive, before its
// first message: a stream that never sends one still counts. releaseKey
// gives it back.
func (l *subscriberLimiter) acquireKey(key string, watch bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	held, what := l.keySlots(watch), "streams (Subscribe, StreamDeliveries)"
	if watch {
		what = "watches (WatchDeliveries)"
	}
	if l.perKey > 0 && held[key] >= l.perKey {
		return status.Errorf(codes.ResourceExhausted,
			"API key %s already holds %d %s on this server replica "+
				"(at most %d per key, --max-streams-per-key; watches and subscriber streams are counted apart); close one or use another key",
			key, held[key], what, l.perKey)
	}
	held[key]++
	return nil
}

// releaseKey gives back a slot acquireKey took.
func (l *subscriberLimiter) releaseKey(key string, watch bool) {
	l.mu.Lock()
	decrement(l.keySlots(watch), key)
	l.mu.Unlock()
}

// keySlots is the slots held by key id: watches' or subscriber streams'.
func (l *subscriberLimiter) keySlots(watch bool) map[string]int {
	if watch {
		return l.watchKey
	}
	return l.byKey
}

// acquireWatch takes a watch slot of ns on this replica, or returns
// ResourceExhausted naming the limit: policy.max_subscribers watches,
// counted apart from the namespace's subscriber streams. releaseWatch
// gives it back.
func (l *subscriberLimiter) acquireWatch(ctx context.Context, ns string) error {
	pol, ok, err := limitPolicy(ctx, l.policies, ns)
	if err != nil {
		return rpcerr.ToStatus(ctx, l.logger, fmt.Errorf("watch limit: %w", err))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok && pol.MaxSubscribers > 0 && l.watchNS[ns] >= pol.MaxSubscribers {
		return status.Errorf(codes.ResourceExhausted,
			"namespace %q already has %d watches (WatchDeliveries) on this server replica (policy.max_subscribers %d, counted apart from its subscribers); close one or raise the limit",
			ns, l.watchNS[ns], pol.MaxSubscribers)
	}
	l.watchNS[ns]++
	return nil
}

// releaseWatch gives back a slot acquireWatch took.
func (l *subscriberLimiter) releaseWatch(ns string) {
	l.mu.Lock()
	decrement(l.watchNS, ns)
	l.mu.Unlock()
}

// acquire takes a stream slot of ns, or returns ResourceExhausted naming
// the limit. release must be called once for every successful acquire,
// with the id it returned (the stream's shared slot; "" when it holds
// none).
func (l *subscriberLimiter) acquire(ctx context.Context, ns string) (string, error) {
	pol, ok, err := limitPolicy(ctx, l.policies, ns)
	if err != nil {
		return "", rpcerr.ToStatus(ctx, l.logger, fmt.Errorf("subscriber limit: %w", err))
	}
	most := 0
	if ok && pol.MaxSubscribers > 0 {
		most = pol.MaxSubscribers
	}
	l.mu.Lock()
	if l.shared == nil && most > 0 && l.active[ns] >= most {
		n := l.active[ns]
		l.mu.Unlock()
		return "", status.Errorf(codes.ResourceExhausted,
			"namespace %q already has %d streams (Subscribe, WatchDeliveries) on this server replica (policy.max_subscribers %d); close one or raise the limit",
			ns, n, most)
	}
	l.active[ns]++
	l.seq++
	id := l.prefix + strconv.FormatUint(l.seq, 36)
	l.mu.Unlock()
	if l.shared == nil {
		return "", nil
	}
	taken, held, err := l.shared.AcquireSubscriber(ctx, ns, id, most, subscriberLease)
	switch {
	case err != nil:
		// The shared count cannot be reached: this replica's decides.
		l.mu.Lock()
		n := l.active[ns] - 1
		l.mu.Unlock()
		if most > 0 && n >= most {
			l.release(ns, "")
			return "", status.Errorf(codes.ResourceExhausted,
				"namespace %q already has %d streams (Subscribe, WatchDeliveries) on this server replica (policy.max_subscribers %d); close one or raise the limit",
				ns, n, most)
		}
		if l.logger != nil {
			l.logger.LogAttrs(ctx, slog.LevelWarn, "subscriber limit: the shared count failed; this replica's own count decided",
				slog.String("namespace", ns), slog.String("error", err.Error()))
		}
		return "", nil
	case !taken:
		l.release(ns, "")
		return "", status.Errorf(codes.ResourceExhausted,
			"namespace %q already has %d streams (Subscribe, WatchDeliveries) across all replicas (policy.max_subscribers %d); close one or raise the limit",
			ns, held, most)
	}
	l.mu.Lock()
	r := l.renew[ns]
	if r == nil {
		r = &renewal{ids: map[string]bool{}, stop: make(chan struct{})}
		l.renew[ns] = r
		go l.renewLoop(ns, r)
	}
	r.ids[id] = true
	l.mu.Unlock()
	return id, nil
}

// renewLoop renews the shared slots of r (ns's streams on this replica)
// every third of their lease until r.stop is closed.
func (l *subscriberLimiter) renewLoop(ns string, r *renewal) {
	tick := time.NewTicker(subscriberLease / 3)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		l.mu.Lock()
		ids := make([]string, 0, len(r.ids))
		for id := range r.ids {
			ids = append(ids, id)
		}
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), subscriberLease/3)
		err := l.shared.RenewSubscribers(ctx, ns, ids, subscriberLease)
		cancel()
		if err != nil && l.logger != nil {
			l.logger.Warn("subscriber limit: renewing this replica's streams in the shared count failed; retrying",
				"namespace", ns, "streams", len(ids), "error", err)
		}
	}
}

// release gives back what acquire took: the slot of ns on this replica,
// and the shared slot id ("" when none).
func (l *subscriberLimiter) release(ns, id string) {
	l.mu.Lock()
	decrement(l.active, ns)
	if r := l.renew[ns]; r != nil && id != "" {
		delete(r.ids, id)
		if len(r.ids) == 0 {
			close(r.stop)
			delete(l.renew, ns)
		}
	}
	l.mu.Unlock()
	if id == "" || l.shared == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.shared.ReleaseSubscriber(ctx, ns, id); err != nil && l.logger != nil {
		l.logger.Warn("subscriber limit: releasing a stream in the shared count failed; it stops counting when its lease ends",
			"namespace", ns, "error", err, "lease", subscriberLease)
	}
}

// decrement lowers m[k] by one, dropping it at zero.
func decrement(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
	} else {
		m[k]--
	}
}
