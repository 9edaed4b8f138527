package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// The store is two layers. A shard (this file, and shard_*.go by concern)
// owns one hash-tag slot of a namespace: its keys (keys.go), the script
// calls made on them and the decoding of their replies (reply.go). The
// Store above (store_*.go, by the same concerns: tasks, delivery, dead
// letters, stats; shards.go holds the shard count and the fan-out
// helpers) only counts a namespace's shards, splits a call's items by
// shard, fans the call out and merges the answers; coalescing
// (coalesce.go) and trace contexts (trace.go) wrap a shard call.

// conn is what every shard shares: the client, the per-call timeout, the
// wake channel and the size bound of one script call.
type conn struct {
	rdb     redis.UniversalClient
	log     *slog.Logger
	timeout time.Duration
	channel string // Options.WakeChannel
	// sharded: wake-ups travel on the shards' own channels (a Redis
	// Cluster; wakeups.go), not on channel.
	sharded bool
	maxArgs int  // Options.MaxScriptBytes
	traces  bool // Options.Traces
	loader  *loader
	settles *settler // the acks and nacks waiting on each shard (settle.go)
}

// shard is shard i of namespace ns (of n; keysForN): its keys, and the
// script calls on them.
type shard struct {
	*conn
	ns string
	i  int
	k  nsKeys
}

// shardOfN is shard i of the n shards of ns.
func (c *conn) shardOfN(ns string, i, n int) shard {
	return shard{conn: c, ns: ns, i: i, k: keysForN(ns, i, n)}
}

// wakeChannel is the channel this shard's scripts publish its wake-ups on
// (lib.lua publish_wake): its own shard channel on a Redis Cluster, the one
// channel of every namespace otherwise.
func (sh shard) wakeChannel() string {
	if sh.sharded {
		return sh.k.wake
	}
	return sh.channel
}

// The call head (docs/ARCHITECTURE.md, "The Lua library"; lib.lua): every
// entry that changes a task opens its KEYS with the record of its request
// and the shard's history stream, and its ARGV with request id, record
// window (ms), history keep, key id and replica. Until issue 38 fills
// them, there is no request id and no history in the call.

// headArity is how many ARGV values the call head takes.
const headArity = 5

// headKeys are the call head's keys followed by keys. The history stream
// is built for incarnation 0, a stream never written: issue 38 passes the
// incarnation the call is made for (historyOf).
func (sh shard) headKeys(keys ...string) []string {
	return append([]string{sh.k.requestKey(""), sh.k.historyOf(0)}, keys...)
}

// headArgs returns an argument list that holds the call head, with room
// for n more values.
func headArgs(n int) []any {
	return append(make([]any, 0, headArity+n), "", 0, 0, "", "")
}

// run runs an entry of the Lua library with the per-call timeout and
// classifies its error: the one place scripts are called.
func (s *conn) run(ctx context.Context, op string, e *entry, keys []string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := s.loader.call(ctx, e, keys, args)
	if err != nil {
		s.reloadOnFailure(err)
		return nil, wrapErr(op, err)
	}
	return v, nil
}

// reloadOnFailure asks a ClusterClient to reload the slot map when a call
// could not reach a node: go-redis reloads it on its own only on a MOVED
// reply (which a dead master never sends) or every minute, so without this
// the calls of a failed-over slot keep going to the dead master long after
// its replica was promoted. Reloads are throttled by go-redis (one at a
// time, 200 ms apart).
func (s *conn) reloadOnFailure(err error) {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok && unavailable(err) {
		cc.ReloadState(context.Background())
	}
}

// runSlice runs a script that answers an array.
func (s *conn) runSlice(ctx context.Context, op string, e *entry, keys []string, args ...any) ([]any, error) {
	v, err := s.run(ctx, op, e, keys, args...)
	if err != nil {
		return nil, err
	}
	a, err := replySlice(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return a, nil
}

// decodeTask builds a task from a script's (header, state, score, payload)
// reply.
func decodeTask(ns, id string, hdrV, stateV, scoreV, payloadV any) (storage.Task, error) {
	h, err := replyString(hdrV)
	if err != nil {
		return storage.Task{}, err
	}
	st, err := replyInt(stateV)
	if err != nil {
		return storage.Task{}, err
	}
	score, err := replyInt(scoreV)
	if err != nil {
		return storage.Task{}, err
	}
	payload, err := replyString(payloadV)
	if err != nil {
		return storage.Task{}, err
	}
	r, err := decodeRecord(h, payload)
	if err != nil {
		return storage.Task{}, fmt.Errorf("task %q: %w", id, err)
	}
	return r.task(ns, id, stateOf(st), score), nil
}
