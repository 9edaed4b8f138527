// Package tenancy answers, on the hot paths, what the namespace registry says:
// the effective policy of a namespace (server defaults filled in; the
// namespace auto-created on first use when the server runs with
// auto-create) and the API key behind a key id.
//
// Answers are cached for a short TTL (1 s unless configured), so a request
// does not cost a registry round trip, and a policy change or a key
// revocation made on any replica reaches every replica within the TTL —
// running dispatchers pick up a new policy without a restart. Changes made
// through this Registry invalidate this replica's cache at once. While one
// caller refreshes an expired answer, the others are given the cached one
// instead of waiting; when the registry cannot answer, the cached answer is
// served (up to MaxStale) and the registry asked again once per TTL, so a
// hung registry holds one call per TTL for its timeout, not every call.
package tenancy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// Config configures a Registry.
type Config struct {
	// Store is where namespaces and keys live (redisstore or mysqlstore).
	// Required.
	Store storage.Registry
	// Defaults are the server defaults a namespace's zero policy fields
	// take. Zero fields of Defaults take storage.DefaultPolicy's.
	Defaults storage.Policy
	// AutoCreate creates an unknown (validly named) namespace with the
	// default policy the first time its policy is asked for, instead of
	// answering storage.ErrNotFound. Default off; the embedded mode turns it
	// on so the quick start needs no admin call.
	AutoCreate bool
	// TTL is how long an answer (a policy, a key, or "no such namespace/key")
	// is served from the cache. If unset or zero, DefaultTTL.
	TTL time.Duration
	// MaxStale is how long an expired answer keeps being served while the
	// store cannot be reached, so a registry outage does not fail requests
	// that the cache can still answer. If unset or zero, 1 minute is used;
	// negative disables it.
	MaxStale time.Duration
	// MaxEntries bounds each cache (policies, keys). When full, expired
	// entries are swept; if it is still full, answers are not cached. If
	// unset or zero, 100,000 is used.
	MaxEntries int
	// MaxKeyMisses is how many lookups per second of key ids the cache does
	// not hold may reach the store in all (with a burst of ten times that),
	// so clients trying made-up keys cannot cost a store call each without
	// bound. Over it, Key answers ErrTooManyKeyMisses. Keys the cache holds
	// (every key of the registry once WarmKeys ran, and each key created
	// through this Registry) are answered whatever the budgets say. If
	// unset or zero, 1,000 per second.
	MaxKeyMisses float64
	// MaxKeyMissesPerCaller is how many of those lookups per second one
	// caller (WithCaller: the guard names the peer's address) may make,
	// with a burst of ten times that, before MaxKeyMisses is asked: one
	// address trying made-up keys spends its own budget, not the others'.
	// If unset or zero, 10 per second.
	MaxKeyMissesPerCaller float64
	// MaxCallers bounds the callers whose budgets are kept; when full, the
	// budgets of callers that have not missed lately are dropped, and a
	// caller that still finds no room shares one budget with the others
	// that found none. If unset or zero, 10,000.
	MaxCallers int
	// MaxUnknownKeys bounds the cache of "no such key" answers, kept apart
	// from the known keys so that made-up key ids cannot crowd them out;
	// when full, an arbitrary answer is dropped. If unset or zero, 10,000.
	MaxUnknownKeys int
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// Clock is what the cache expires entries by. If nil,
	// storage.SystemClock.
	Clock storage.Clock
}

// Registry wraps a storage.Registry with the cache. It implements
// storage.Registry (writes go to the store and invalidate this replica's
// cache) and storage.Policies. It is safe for concurrent use and has no
// goroutines of its own.
type Registry struct {
	store      storage.Registry
	defaults   storage.Policy
	autoCreate bool
	ttl        time.Duration
	maxStale   time.Duration
	logger     *slog.Logger
	clock      storage.Clock

	namespaces *cache[storage.Namespace]
	keys       *cache[storage.Key]

	// seen is, per namespace name, the incarnation (create time) this
	// replica last read from the registry (sawNamespace); bounded by
	// maxEntries.
	seenMu     sync.Mutex
	seen       map[string]time.Time
	maxEntries int
}

// DefaultTTL is Config.TTL's default: how long a registry answer is cached.
const DefaultTTL = time.Second

// ErrTooManyKeyMisses is Key's answer when more lookups of uncached key ids
// arrive than Config.MaxKeyMisses lets through: retry shortly.
var ErrTooManyKeyMisses = errors.New("tenancy: too many lookups of unknown API keys; retry shortly")

var (
	_ storage.Registry = (*Registry)(nil)
	_ storage.Policies = (*Registry)(nil)
)

// New returns a Registry over cfg.Store.
func New(cfg Config) (*Registry, error) {
	if cfg.Store == nil {
		return nil, errors.New("tenancy: Config.Store is required")
	}
	r := &Registry{
		store:      cfg.Store,
		defaults:   Effective(cfg.Defaults, storage.DefaultPolicy()),
		autoCreate: cfg.AutoCreate,
		ttl:        cfg.TTL,
		maxStale:   cfg.MaxStale,
		logger:     cfg.Logger,
		clock:      cfg.Clock,
	}
	if r.ttl <= 0 {
		r.ttl = DefaultTTL
	}
	if r.maxStale == 0 {
		r.maxStale = time.Minute
	}
	if r.maxStale < 0 {
		r.maxStale = 0
	}
	if r.logger == nil {
		r.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if r.clock == nil {
		r.clock = storage.SystemClock{}
	}
	maxEntries := cfg.MaxEntries
	if maxEntries <= 0 {
		maxEntries = 100_000
	}
	r.namespaces = newCache[storage.Namespace](maxEntries)
	r.keys = newCache[storage.Key](maxEntries)
	r.seen, r.maxEntries = make(map[string]time.Time), maxEntries
	unknown := cfg.MaxUnknownKeys
	if unknown <= 0 {
		unknown = 10_000
	}
	r.keys.misses = make(map[string]time.Time)
	r.keys.missLimit = unknown
	r.keys.admit = newMissBudget(cfg).allow
	return r, nil
}

// AutoCreate reports whether unknown namespaces are created on first use.
func (r *Registry) AutoCreate() bool { return r.autoCreate }

// Defaults returns the server default policy (every field set).
func (r *Registry) Defaults() storage.Policy { return r.defaults }

// Effective returns p with every zero field taken from defaults; see
// storage.Policy.WithDefaults.
func Effective(p, defaults storage.Policy) storage.Policy { return p.WithDefaults(defaults) }

// Policy is the effective policy of Namespace(ctx, ns, true): the
// dispatcher's storage.Policies.
func (r *Registry) Policy(ctx context.Context, ns string) (storage.Policy, error) {
	n, err := r.Namespace(ctx, ns, true)
	if err != nil {
		return storage.Policy{}, err
	}
	return n.Policy, nil
}

// Namespace is the registry's one lookup: ns with its effective policy
// (defaults filled in) and create time, from the cache when it is fresh.
// An unknown namespace is storage.ErrNotFound, unless create is set and the
// registry auto-creates (Config.AutoCreate; ns a valid name): then it is
// created. Calls that put a namespace to use (upserts, Subscribe) pass
// create; checks that must not create one as a side effect (rate limits,
// quotas, reads, verdicts, a stream's re-check) do not.
func (r *Registry) Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error) {
	n, err := r.namespaces.get(ctx, r, ns, func(ctx context.Context) (storage.Namespace, error) {
		n, err := r.store.GetNamespace(ctx, ns)
		r.sawNamespace(ns, n, err)
		if err != nil {
			return storage.Namespace{}, err
		}
		n.Policy = Effective(n.Policy, r.defaults)
		return n, nil
	})
	if !create || !errors.Is(err, storage.ErrNotFound) || !r.autoCreate || storage.ValidateNamespace(ns) != nil {
		return n, err
	}
	n, err = r.store.CreateNamespace(ctx, storage.Namespace{Name: ns})
	if err == nil {
		r.logger.LogAttrs(ctx, slog.LevelInfo, "namespace auto-created", slog.String("namespace", ns))
	} else if errors.Is(err, storage.ErrAlreadyExists) {
		n, err = r.store.GetNamespace(ctx, ns) // created concurrently elsewhere
	}
	r.sawNamespace(ns, n, err)
	r.namespaces.forget(ns) // drop the cached "not found"
	if err != nil {
		return storage.Namespace{}, err
	}
	n.Policy = Effective(n.Policy, r.defaults)
	return n, nil
}

// sawNamespace records what the registry answered for ns (a namespace, or
// err storage.ErrNotFound; any other error teaches nothing). When it is
// not the incarnation this replica read last — the name was deleted, or
// deleted and re-created elsewhere — the cached keys of the name go: they
// were the old incarnation's (deleted with it), and must not reach the
// new one, however the namespace's own entry left the cache (expired,
// refreshed, or dropped by Invalidate when a policy change was announced).
func (r *Registry) sawNamespace(ns string, n storage.Namespace, err error) {
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return
	}
	r.seenMu.Lock()
	last, had := r.seen[ns]
	switch {
	case err != nil:
		delete(r.seen, ns)
	case had || len(r.seen) < r.maxEntries:
		r.seen[ns] = n.CreateTime
	}
	r.seenMu.Unlock()
	if had && (err != nil || !n.CreateTime.Equal(last)) {
		r.keys.forgetIf(func(k storage.Key) bool { return k.Namespace == ns })
	}
}

// Invalidate drops this replica's cached answer for ns, so the next
// Namespace reads the registry: a dispatcher calls it when another replica
// announces that ns's policy changed, and the server when an upsert was
// refused because the cached namespace incarnation has ended.
func (r *Registry) Invalidate(ns string) { r.namespaces.forget(ns) }

// ForgetNamespace drops ns and every cached API key of ns from the cache:
// the server calls it when a write was refused because the cached
// incarnation of ns has ended (the namespace was deleted on some replica),
// so neither the namespace nor its old keys are served from the cache
// again.
func (r *Registry) ForgetNamespace(ns string) {
	r.namespaces.forget(ns)
	r.keys.forgetIf(func(k storage.Key) bool { return k.Namespace == ns })
}

// Key returns the API key with id, from the cache when it is fresh.
// storage.ErrNotFound if there is none (or it was revoked);
// ErrTooManyKeyMisses when too many uncached ids are being looked up.
func (r *Registry) Key(ctx context.Context, id string) (storage.Key, error) {
	return r.keys.get(ctx, r, id, func(ctx context.Context) (storage.Key, error) {
		return r.store.GetKey(ctx, id)
	})
}

// CreateNamespace implements storage.Registry.
func (r *Registry) CreateNamespace(ctx context.Context, ns storage.Namespace) (storage.Namespace, error) {
	n, err := r.store.CreateNamespace(ctx, ns)
	r.namespaces.forget(ns.Name)
	return n, err
}

// GetNamespace implements storage.Registry: it reads the store (no cache)
// and returns the policy as stored (zero fields = server default).
func (r *Registry) GetNamespace(ctx context.Context, name string) (storage.Namespace, error) {
	return r.store.GetNamespace(ctx, name)
}

// ListNamespaces implements storage.Registry (no cache).
func (r *Registry) ListNamespaces(ctx context.Context, after string, limit int) ([]storage.Namespace, bool, error) {
	return r.store.ListNamespaces(ctx, after, limit)
}

// UpdateNamespace implements storage.Registry and drops the namespace from
// this replica's cache; other replicas see the change within the TTL.
func (r *Registry) UpdateNamespace(ctx context.Context, name string, update func(storage.Policy) (storage.Policy, error)) (storage.Namespace, error) {
	n, err := r.store.UpdateNamespace(ctx, name, update)
	r.namespaces.forget(name)
	return n, err
}

// DeleteNamespace implements storage.Registry and drops the namespace and
// its keys from this replica's cache.
func (r *Registry) DeleteNamespace(ctx context.Context, name string) error {
	err := r.store.DeleteNamespace(ctx, name)
	r.namespaces.forget(name)
	r.keys.forgetIf(func(k storage.Key) bool { return k.Namespace == name })
	return err
}

// CreateKey implements storage.Registry. The new key is read back into
// this replica's cache, so its first use costs no lookup and no miss
// budget.
func (r *Registry) CreateKey(ctx context.Context, k storage.Key) error {
	err := r.store.CreateKey(ctx, k)
	r.keys.forget(k.ID)
	if err == nil {
		// Read back as any lookup is (a delete of its namespace meanwhile
		// keeps it out of the cache), with no miss budget asked.
		_, _ = r.Key(context.WithValue(ctx, unbudgeted{}, true), k.ID)
	}
	return err
}

// GetKey implements storage.Registry (no cache).
func (r *Registry) GetKey(ctx context.Context, id string) (storage.Key, error) {
	return r.store.GetKey(ctx, id)
}

// ListKeys implements storage.Registry (no cache).
func (r *Registry) ListKeys(ctx context.Context, ns string, after storage.KeyCursor, limit int) ([]storage.Key, bool, error) {
	return r.store.ListKeys(ctx, ns, after, limit)
}

// RevokeKey implements storage.Registry. The key stops working on this
// replica at once and on the others within the TTL.
func (r *Registry) RevokeKey(ctx context.Context, id string) error {
	err := r.store.RevokeKey(ctx, id)
	r.keys.forget(id)
	return err
}

// cache is a map of answers with expiry. Concurrent misses of one key share
// one load. Both values and storage.ErrNotFound are cached; other errors are
// not (an expired value is served instead, up to maxStale).
type cache[V any] struct {
	limit int
	// missLimit > 0 keeps "not found" answers in misses (at most
	// missLimit, expiry by key) instead of entries.
	missLimit int
	// admit, if set, is asked before loading a key the cache holds no
	// entry for (a refresh of a held entry is not asked); false answers
	// ErrTooManyKeyMisses without a load.
	admit func(ctx context.Context, now time.Time) bool

	mu      sync.Mutex
	entries map[string]*entry[V]
	misses  map[string]time.Time
}

type entry[V any] struct {
	// done is closed when the load in progress finishes; nil when none is.
	done    chan struct{}
	val     V
	err     error // nil or storage.ErrNotFound once loaded
	loaded  bool
	expires time.Time
	stale   time.Time // served on a store error until then
	// invalid is set when the entry is forgotten while a load is in flight:
	// that load may have read the store before the change.
	invalid bool
}

func newCache[V any](limit int) *cache[V] {
	return &cache[V]{limit: limit, entries: make(map[string]*entry[V])}
}

func (c *cache[V]) get(ctx context.Context, r *Registry, k string, load func(context.Context) (V, error)) (V, error) {
	for {
		now := r.clock.Now()
		c.mu.Lock()
		if exp, ok := c.misses[k]; ok {
			if now.Before(exp) {
				c.mu.Unlock()
				var zero V
				return zero, storage.ErrNotFound
			}
			delete(c.misses, k)
		}
		e := c.entries[k]
		if e != nil && e.loaded && now.Before(e.expires) {
			v, err := e.val, e.err
			c.mu.Unlock()
			return v, err
		}
		if e != nil && e.done != nil && e.loaded && now.Before(e.stale) && !e.invalid {
			// Another caller is refreshing the entry: answer with what it
			// holds rather than wait for a store that may hang for its
			// whole timeout.
			v, err := e.val, e.err
			c.mu.Unlock()
			return v, err
		}
		if e != nil && e.done != nil {
			done := e.done
			c.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				var zero V
				return zero, fmt.Errorf("tenancy: %w", ctx.Err())
			}
		}
		if e == nil {
			if c.admit != nil && !c.admit(ctx, now) {
				c.mu.Unlock()
				var zero V
				return zero, ErrTooManyKeyMisses
			}
			e = &entry[V]{}
			if !c.makeRoomLocked(now) {
				c.mu.Unlock()
				return load(ctx) // cache full of live entries: answer uncached
			}
			c.entries[k] = e
		}
		e.done = make(chan struct{})
		c.mu.Unlock()

		v, err := load(ctx)

		c.mu.Lock()
		close(e.done)
		e.done = nil
		switch {
		case err == nil || errors.Is(err, storage.ErrNotFound):
			if err != nil {
				var zero V
				v, err = zero, storage.ErrNotFound
			}
			e.val, e.err, e.loaded = v, err, true
			e.expires = now.Add(r.ttl)
			e.stale = now.Add(r.ttl + r.maxStale)
			if e.invalid {
				// Read before a change: it answers this load's callers
				// and is never served again, not even stale while the
				// next load is in flight or the store is down.
				e.expires, e.stale = time.Time{}, time.Time{}
			}
			if err != nil && c.misses != nil {
				if !e.invalid {
					c.rememberMissLocked(k, e.expires)
				}
				if c.entries[k] == e {
					delete(c.entries, k)
				}
			}
		case e.loaded && now.Before(e.stale) && ctx.Err() == nil:
			r.logger.LogAttrs(ctx, slog.LevelWarn, "registry unreachable; serving a cached answer",
				slog.String("key", k), slog.String("error", err.Error()))
			v, err = e.val, e.err
			// Ask the store again after another TTL, not on the next call:
			// while it is down, callers are answered from the cache at once.
			if !e.invalid {
				e.expires = r.clock.Now().Add(r.ttl)
			}
		default:
			if !e.loaded && c.entries[k] == e {
				delete(c.entries, k)
			}
		}
		e.invalid = false
		c.mu.Unlock()
		return v, err
	}
}

// makeRoomLocked reports whether one more entry fits, sweeping entries that
// are past their stale time when the cache is full.
func (c *cache[V]) makeRoomLocked(now time.Time) bool {
	if len(c.entries) < c.limit {
		return true
	}
	for k, e := range c.entries {
		if e.done == nil && (!e.loaded || !now.Before(e.stale)) {
			delete(c.entries, k)
		}
	}
	return len(c.entries) < c.limit
}

// rememberMissLocked keeps a "not found" answer for k until exp, dropping
// an arbitrary one when misses is full.
func (c *cache[V]) rememberMissLocked(k string, exp time.Time) {
	if len(c.misses) >= c.missLimit {
		for old := range c.misses {
			delete(c.misses, old)
			break
		}
	}
	c.misses[k] = exp
}

// put stores v as k's fresh answer, unless a load of k is in flight (it
// answers soon enough) or the cache is full. Only WarmKeys puts, at start,
// before the server serves: no delete of this replica can run meanwhile
// (a lookup's load is what keeps a key read before a delete out).
func (c *cache[V]) put(k string, v V, now time.Time, r *Registry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.misses, k)
	if e := c.entries[k]; e != nil && e.done != nil {
		return
	}
	if _, held := c.entries[k]; !held && !c.makeRoomLocked(now) {
		return
	}
	c.entries[k] = &entry[V]{val: v, loaded: true, expires: now.Add(r.ttl), stale: now.Add(r.ttl + r.maxStale)}
}

func (c *cache[V]) forget(k string) {
	c.mu.Lock()
	delete(c.misses, k)
	if e := c.entries[k]; e != nil && e.done == nil {
		delete(c.entries, k)
	} else if e != nil {
		e.invalid = true // a load in flight may predate the change
	}
	c.mu.Unlock()
}

// forgetIf drops the entries whose value matches, and keeps every load in
// flight from being cached: what it will hold is not known yet, and it may
// have read the store before the change (a key of a namespace being
// deleted, read before the delete, would otherwise be served for a TTL
// after it — and, the name re-created, into the new namespace).
func (c *cache[V]) forgetIf(match func(V) bool) {
	c.mu.Lock()
	for k, e := range c.entries {
		switch {
		case e.done != nil:
			e.invalid = true
		case e.loaded && match(e.val):
			delete(c.entries, k)
		}
	}
	c.mu.Unlock()
}
