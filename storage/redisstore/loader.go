package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// LibraryMetrics is told of every load of delayd's Lua library into a
// Redis server (Options.LibraryMetrics; *metrics.Metrics implements it).
// Its method is called from the goroutine of the call that loaded it.
type LibraryMetrics interface {
	// LibraryLoaded counts one FUNCTION LOAD that put the library on a
	// server: reason is LoadAtStart (Store.LoadLibrary) or LoadMissing (a
	// call found it missing: a restart without persistence, FUNCTION
	// FLUSH, a node added to a cluster).
	LibraryLoaded(reason string)
}

// The reasons LibraryMetrics.LibraryLoaded is given.
const (
	LoadAtStart = "start"
	LoadMissing = "missing"
)

// loader runs the library's entries on one client (one per Store): FCALL or
// FCALL_RO while the server has Functions, the EVALSHA builds once a server
// has said it has none (found out by the first call, then kept). A call
// that finds the library missing loads it on the node that answered (on a
// cluster: the master the client maps the call's slot to) and is retried
// once; concurrent misses of one node share one load. On a cluster whose
// slot map the client had not caught up with yet, the retry can miss
// again: then the library is loaded on every master and the call retried
// one last time.
type loader struct {
	rdb     redis.UniversalClient
	log     *slog.Logger
	metrics LibraryMetrics // nil: loads are only logged
	lib     *library
	evalsha atomic.Bool // the server has no Functions

	mu      sync.Mutex
	loading map[string]*loadCall // node address -> its load in flight
}

// loadCall is one load in flight, which the misses of its node wait for.
type loadCall struct {
	done chan struct{}
	err  error // set before done is closed
}

func newLoader(rdb redis.UniversalClient, log *slog.Logger, m LibraryMetrics, l *library) *loader {
	return &loader{rdb: rdb, log: log, metrics: m, lib: l, loading: map[string]*loadCall{}}
}

// call runs entry e with keys and args.
func (l *loader) call(ctx context.Context, e *entry, keys []string, args []any) (any, error) {
	if l.evalsha.Load() {
		return e.script.Run(ctx, l.rdb, keys, args...).Result()
	}
	v, err := l.fcall(ctx, e, keys, args)
	switch {
	case err == nil:
		return v, nil
	case noFunctions(err):
		l.useEvalsha(err)
		return e.script.Run(ctx, l.rdb, keys, args...).Result()
	case functionMissing(err):
		if lerr := l.reload(ctx, keys); lerr != nil {
			return nil, lerr
		}
		v, err = l.fcall(ctx, e, keys, args)
		if _, cluster := l.rdb.(*redis.ClusterClient); cluster && functionMissing(err) {
			// The client's slot map was stale (a slot just moved to a
			// new node answered through a MOVED redirect): the load went
			// to the slot's old master. Load on every master it knows
			// now, and retry once more.
			if lerr := l.loadAll(ctx, LoadMissing); lerr != nil {
				return nil, lerr
			}
			v, err = l.fcall(ctx, e, keys, args)
		}
	}
	return v, err
}

// fcall calls e's function: FCALL_RO for a read-only entry.
func (l *loader) fcall(ctx context.Context, e *entry, keys []string, args []any) (any, error) {
	if e.readOnly {
		return l.rdb.FCallRO(ctx, e.fn, keys, args...).Result()
	}
	return l.rdb.FCall(ctx, e.fn, keys, args...).Result()
}

// useEvalsha switches the client to the EVALSHA builds, for good; why is
// the server's answer that made it (nil: a test's choice).
func (l *loader) useEvalsha(why error) {
	if l.evalsha.CompareAndSwap(false, true) && why != nil {
		answer := why.Error()
		if len(answer) > 100 { // a server may echo the arguments: the library
			answer = answer[:100] + "..."
		}
		l.log.Info("the Lua library runs as EVALSHA scripts: this Redis has no Functions (the embedded store, or Redis before 7), or this Redis user may not run FUNCTION LOAD, FCALL and FCALL_RO",
			"answer", answer)
	}
}

// reload loads the library where a call of keys found it missing: the
// client's server, or on a cluster the master that serves keys' slot.
func (l *loader) reload(ctx context.Context, keys []string) error {
	var node redis.Cmdable = l.rdb
	addr := clientAddr(l.rdb)
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		if len(keys) == 0 {
			return l.loadAll(ctx, LoadMissing)
		}
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return fmt.Errorf("loading the Lua library: %w", err)
		}
		node, addr = m, m.Options().Addr
	}
	l.mu.Lock()
	if c := l.loading[addr]; c != nil {
		l.mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := &loadCall{done: make(chan struct{})}
	l.loading[addr] = c
	l.mu.Unlock()
	c.err = l.loadOn(ctx, node, addr, LoadMissing)
	l.mu.Lock()
	delete(l.loading, addr)
	l.mu.Unlock()
	close(c.done)
	return c.err
}

// loadAll loads the library on the client's server, or on every master of
// a cluster.
func (l *loader) loadAll(ctx context.Context, reason string) error {
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return l.loadOn(ctx, c, c.Options().Addr, reason)
		})
	}
	return l.loadOn(ctx, l.rdb, clientAddr(l.rdb), reason)
}

// loadOn runs FUNCTION LOAD on one server. A library already there (loaded
// by another replica, or by this one before) is success; a server without
// Functions switches the client to EVALSHA.
func (l *loader) loadOn(ctx context.Context, node redis.Cmdable, addr, reason string) error {
	err := node.FunctionLoad(ctx, l.lib.text).Err()
	switch {
	case err == nil:
		if l.metrics != nil {
			l.metrics.LibraryLoaded(reason)
		}
		if reason == LoadMissing {
			l.log.Warn("Redis lacked delayd's Lua library (a restart without persistence, FUNCTION FLUSH, or a new node); loaded it",
				"library", l.lib.name, "node", addr)
		} else {
			l.log.Info("loaded delayd's Lua library", "library", l.lib.name, "node", addr)
		}
	case libraryExists(err):
	case noFunctions(err):
		l.useEvalsha(err)
		return nil
	default:
		return wrapErr("loading the Lua library "+l.lib.name+" on "+addr, err)
	}
	if reason == LoadAtStart {
		l.logOthers(ctx, node, addr)
	}
	return nil
}

// logOthers logs the other delayd library versions a server holds: delayd
// never deletes one (a replica of another version may still call it), so
// the operator is told which there are.
func (l *loader) logOthers(ctx context.Context, node redis.Cmdable, addr string) {
	libs, err := node.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "delayd_*"}).Result()
	if err != nil {
		return
	}
	var others []string
	for _, x := range libs {
		if x.Name != l.lib.name {
			others = append(others, x.Name)
		}
	}
	if len(others) > 0 {
		slices.Sort(others)
		l.log.Info("this Redis also holds other delayd versions' Lua libraries; once no replica runs a version, FUNCTION DELETE its library",
			"node", addr, "library", l.lib.name, "others", others)
	}
}

// clientAddr is a plain client's server address, for logs.
func clientAddr(c redis.UniversalClient) string {
	if cl, ok := c.(*redis.Client); ok {
		return cl.Options().Addr
	}
	return "redis"
}

// LoadLibrary loads delayd's Lua library (LibraryName) on the store's Redis,
// or on every master of a Redis Cluster, unless it is there already, and
// finds out whether the server has Functions at all (the embedded store and
// Redis before 7 run the same Lua through EVALSHA). Calls load the library
// themselves where they find it missing; calling this at start makes a
// Redis that refuses it fail the start, and logs the other delayd versions'
// libraries the server holds. Bounded by Options.Timeout.
func (s *Store) LoadLibrary(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.loader.loadAll(ctx, LoadAtStart)
}
