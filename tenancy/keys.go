package tenancy

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/delayd/delayd/storage"
)

// Key lookups and made-up keys. Clients may send any key id; a lookup of
// an id the cache holds costs nothing, one it does not hold costs a store
// read. So that made-up ids cannot lock real keys out:
//
//   - the cache holds the real keys: WarmKeys reads every key of the
//     registry when the process starts, CreateKey puts each new key in, and
//     a held key is refreshed when its TTL has passed whatever the budgets
//     below say;
//   - a miss is remembered by key id (Config.MaxUnknownKeys of them, for
//     the TTL), so a repeated made-up id costs no read;
//   - the other misses are charged to their caller's budget first
//     (Config.MaxKeyMissesPerCaller; the guard names the peer's address
//     with WithCaller), then to the process's (Config.MaxKeyMisses): one
//     address flooding made-up ids spends its own budget, and the shared one
//     no faster than its own allows.

// DefaultMaxKeyMisses and DefaultMaxKeyMissesPerCaller are the miss
// budgets' defaults (lookups per second; the bursts are ten times them).
const (
	DefaultMaxKeyMisses          = 1000
	DefaultMaxKeyMissesPerCaller = 10
	defaultMaxCallers            = 10_000
)

type callerKey struct{}

// WithCaller returns ctx naming who a key lookup is made for (the guard
// passes the peer's address, or its IPv6 /64), so Key charges a lookup of
// an id the cache does not hold to that caller's budget. A lookup without
// a caller is charged to the shared budget only.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

func callerFrom(ctx context.Context) (string, bool) {
	c, ok := ctx.Value(callerKey{}).(string)
	return c, ok && c != ""
}

// missBudget is the per-caller and shared budgets of lookups the cache
// cannot answer.
type missBudget struct {
	shared    *rate.Limiter
	perCaller rate.Limit
	burst     int
	most      int

	mu       sync.Mutex
	callers  map[string]*rate.Limiter
	overflow *rate.Limiter // the callers that found no room
}

func newMissBudget(cfg Config) *missBudget {
	total, each, most := cfg.MaxKeyMisses, cfg.MaxKeyMissesPerCaller, cfg.MaxCallers
	if total <= 0 {
		total = DefaultMaxKeyMisses
	}
	if each <= 0 {
		each = DefaultMaxKeyMissesPerCaller
	}
	if most <= 0 {
		most = defaultMaxCallers
	}
	burst := int(math.Max(1, 10*each))
	return &missBudget{
		shared:    rate.NewLimiter(rate.Limit(total), int(math.Max(1, 10*total))),
		perCaller: rate.Limit(each), burst: burst, most: most,
		callers:  make(map[string]*rate.Limiter),
		overflow: rate.NewLimiter(rate.Limit(each), burst),
	}
}

// unbudgeted marks a context whose lookups ask no budget (CreateKey's read
// back of the key it created).
type unbudgeted struct{}

// allow takes one lookup from the caller's budget, then the shared one.
func (b *missBudget) allow(ctx context.Context, now time.Time) bool {
	if ctx.Value(unbudgeted{}) != nil {
		return true
	}
	if caller, ok := callerFrom(ctx); ok && !b.callerLimiter(caller, now).AllowN(now, 1) {
		return false
	}
	return b.shared.AllowN(now, 1)
}

func (b *missBudget) callerLimiter(caller string, now time.Time) *rate.Limiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.callers[caller]; l != nil {
		return l
	}
	if len(b.callers) >= b.most {
		for c, l := range b.callers {
			if l.TokensAt(now) >= float64(b.burst) { // refilled: it has not missed lately
				delete(b.callers, c)
			}
		}
		if len(b.callers) >= b.most {
			return b.overflow
		}
	}
	l := rate.NewLimiter(b.perCaller, b.burst)
	b.callers[caller] = l
	return l
}

// warmPage is how many namespaces or keys WarmKeys reads per store call.
const warmPage = 500

// WarmKeys reads every API key of the registry (each namespace's and the
// global ones) into the cache, so that after a restart every real key is
// answered from the cache, whatever made-up keys other clients try. The
// daemon calls it once at start; it returns how many keys it cached, and
// the first error that stopped it (keys read until then stay cached).
func (r *Registry) WarmKeys(ctx context.Context) (int, error) {
	n := 0
	warm := func(ns string) error {
		var after storage.KeyCursor
		for {
			keys, more, err := r.store.ListKeys(ctx, ns, after, warmPage)
			if err != nil {
				return fmt.Errorf("warm keys of %q: %w", ns, err)
			}
			now := r.clock.Now()
			for _, k := range keys {
				r.keys.put(k.ID, k, now, r)
				n++
			}
			if !more || len(keys) == 0 {
				return nil
			}
			after = storage.CursorOf(keys[len(keys)-1])
		}
	}
	if err := warm(storage.GlobalNamespace); err != nil {
		return n, err
	}
	after := ""
	for {
		nss, more, err := r.store.ListNamespaces(ctx, after, warmPage)
		if err != nil {
			return n, fmt.Errorf("warm keys: list namespaces: %w", err)
		}
		for _, ns := range nss {
			// The incarnation the keys are of: a later read of the name
			// that finds another drops them.
			r.sawNamespace(ns.Name, ns, nil)
			if err := warm(ns.Name); err != nil {
				return n, err
			}
		}
		if !more || len(nss) == 0 {
			return n, nil
		}
		after = nss[len(nss)-1].Name
	}
}
