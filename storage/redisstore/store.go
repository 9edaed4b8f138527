// Package redisstore is delayd's task index in Redis: per namespace a due
// ZSET, an inflight ZSET, a dead ZSET and a task HASH (see keys.go), changed
// only by the Lua scripts under lua/ so every operation is atomic across
// replicas and decided by one clock, the Redis server's TIME.
//
// A Store implements storage.Tasks, storage.Deliveries, storage.DeadLetters,
// storage.Counter and storage.Wakeups, plus the methods durable mode needs
// (Restore, Generations, Indexed, MarkIndexed, TryLead, Namespaces,
// MatchTasks). It works with a single Redis (redis.NewClient), Redis Cluster
// (redis.NewClusterClient: each namespace's keys share one hash tag) and an
// in-process miniredis (embedded mode); all of them run the same Lua, one
// library loaded once per server (library.go, loader.go; through EVALSHA on
// a server without Functions).
//
// Every operation costs one round trip per call (per 1,000 items for the
// batch operations) and is bounded inside Redis: no script loops over more
// than the items it was given or 1,000 tasks.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// MaxBatch is the most items one script call handles. Upsert, Ack, Nack,
// Extend, Requeue and Purge split longer lists into calls of MaxBatch (and
// Upsert, Ack, Nack, Extend and Restore into calls of at most
// Options.MaxScriptBytes as well); Pop, Reap, List and the "all" forms of
// Requeue and Purge handle at most MaxBatch tasks per call.
const MaxBatch = 1000

// DefaultMaxScriptBytes is Options.MaxScriptBytes' default: 1 MiB.
const DefaultMaxScriptBytes = 1 << 20

// itemOverhead is what an item of a script call counts beyond its id,
// kind and payload (its numbers and the protocol's framing).
const itemOverhead = 64

// ErrInvalidCursor is returned by List for a cursor it did not make (or one
// made for another state).
var ErrInvalidCursor = storage.ErrInvalidCursor

// DefaultTimeout is Options.Timeout's default.
const DefaultTimeout = 5 * time.Second

// Options configure a Store. Zero fields take the defaults given.
type Options struct {
	// Logger receives the store's warnings. If nil, logs are discarded.
	Logger *slog.Logger
	// Timeout bounds every call to Redis (one script run, one SCAN page),
	// on top of the caller's context. If unset or zero, 5 seconds is used.
	// A call that runs out of time fails with storage.ErrUnavailable.
	// go-redis applies a context deadline to socket reads and writes only
	// when the client has ContextTimeoutEnabled set; otherwise its own
	// ReadTimeout and WriteTimeout (3 s by default) bound a call to a Redis
	// that stops answering.
	Timeout time.Duration
	// WakeChannel is the pub/sub channel of wake-ups, shared by every
	// replica. If empty, DefaultWakeChannel ("delayd:wake") is used. It
	// must not contain '{' (lib.lua publish_wake reads that as a shard
	// channel). On a Redis Cluster it carries only policy changes: the
	// other wake-ups travel on each shard's own channel (wakeups.go).
	WakeChannel string
	// NoCoalesce turns off the joining of concurrent Upsert calls of one
	// namespace shard into one script call, and the riding of Ack, AckMarked
	// and Nack calls on the shard's next script call (see Upsert, Ack): each
	// call makes its own. If false (the default), they are joined.
	NoCoalesce bool
	// AckLinger is how long an Ack or Nack call that finds no script call
	// of its shard in flight and no pop coming (ExpectPop) waits for others
	// to join its script call: at a trickle (a few acks per millisecond,
	// from several streams) acks then share script calls instead of making
	// one each. It delays the answer of an ack, never a delivery. If zero,
	// no wait (acks still join a call in flight, or a pop coming).
	AckLinger time.Duration
	// Traces keeps the trace context of traced upserts (UpsertSpec.
	// TraceParent) and returns it with their deliveries and from Get (see
	// trace.go): one more pipelined write per traced upsert call, one MGET
	// per Pop, one GET per Get, and one pipelined write per Restore of
	// traced tasks. If false (the default), trace contexts are neither
	// written nor read.
	Traces bool
	// MaxScriptBytes bounds the arguments of one script call that writes
	// tasks (upsert, restore) or settles deliveries (ack, nack, extend):
	// longer lists are split into several calls of at most this many bytes
	// (ids, kinds and payloads, plus 64 bytes an item), so no single call
	// holds Redis for long. A single item larger than it goes alone. If
	// zero, DefaultMaxScriptBytes.
	MaxScriptBytes int
	// Shards tells how many shards each namespace has (shards.go). If nil,
	// every namespace has one.
	Shards ShardCounter
	// LibraryMetrics is told of every load of the Lua library into a Redis
	// server (loader.go). If nil, loads are only logged.
	LibraryMetrics LibraryMetrics
}

// Store is the Redis task index. It is safe for concurrent use; it does not
// own the client (closing the client is the caller's business).
type Store struct {
	*conn    // the client and the limits every shard shares (shard.go)
	noCo     bool
	co       *coalescer[storage.UpsertSpec, storage.UpsertResult]
	shards   ShardCounter  // Options.Shards
	reapTurn atomic.Uint32 // rotates a sharded Reap's remainder
	hub      *watchHub     // the one pub/sub connection of watch channels
	wakes    *wakeSet      // the namespaces served (ServeWakeups)
}

var (
	_ storage.Tasks       = (*Store)(nil)
	_ storage.Deliveries  = (*Store)(nil)
	_ storage.DeadLetters = (*Store)(nil)
	_ storage.Counter     = (*Store)(nil)
	_ storage.Wakeups     = (*Store)(nil)
)

// New returns a Store over client. It does not contact Redis.
func New(client redis.UniversalClient, opts Options) *Store {
	s := &Store{conn: &conn{rdb: client, log: opts.Logger, timeout: opts.Timeout, channel: opts.WakeChannel,
		traces: opts.Traces, maxArgs: opts.MaxScriptBytes}, noCo: opts.NoCoalesce, shards: opts.Shards}
	s.co, s.settles, s.wakes = newUpsertCoalescer(), newSettler(opts.AckLinger), newWakeSet()
	if s.maxArgs <= 0 {
		s.maxArgs = DefaultMaxScriptBytes
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.channel == "" {
		s.channel = DefaultWakeChannel
	}
	_, s.sharded = client.(*redis.ClusterClient)
	s.loader = newLoader(client, s.log, opts.LibraryMetrics, lib)
	s.hub = &watchHub{rdb: client, log: s.log, timeout: s.timeout}
	// Fail fast once Redis is known down (see breaker). Only calls that
	// waited half the store timeout (at most 1 s) count as evidence.
	// On a cluster, per slot: one dead master is not an outage of the
	// shards on the others. A probe goes through every 250 ms: one call at
	// a time, so a hung Redis sees no storm, and a Redis that answers again
	// is known up within a quarter second (with 1 s, deliveries resumed up
	// to 2 s after a SIGSTOPped Redis got SIGCONT; issue 30 item 2).
	openFor, tripAfter := 250*time.Millisecond, min(s.timeout/2, time.Second)
	if _, ok := client.(*redis.ClusterClient); ok {
		client.AddHook(clusterBreakerHook{&slotBreakers{openFor: openFor, tripAfter: tripAfter, m: map[int]*breaker{}}})
	} else {
		client.AddHook(breakerHook{&breaker{openFor: openFor, tripAfter: tripAfter}})
	}
	return s
}

// wrapErr wraps err with op, and with storage.ErrUnavailable when Redis
// could not be reached, timed out, or answered that it cannot serve now.
func wrapErr(op string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("%s: %w: %w", op, storage.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func unavailable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, storage.ErrUnavailable):
		return true
	case errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted),
		redis.IsLoadingError(err), redis.IsClusterDownError(err),
		redis.IsTryAgainError(err), redis.IsMasterDownError(err),
		redis.IsReadOnlyError(err), redis.IsMaxClientsError(err),
		redis.IsNoReplicasError(err):
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"BUSY ", "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// stateOf maps a script's state number.
func stateOf(n int64) storage.State {
	switch n {
	case 1:
		return storage.StateScheduled
	case 2:
		return storage.StateDelivered
	case 3:
		return storage.StateDead
	}
	return storage.StateUnspecified
}

// chunks calls fn with consecutive pieces of n items of at most MaxBatch.
func chunks(n int, fn func(lo, hi int) error) error {
	for lo := 0; lo < n; lo += MaxBatch {
		if err := fn(lo, min(lo+MaxBatch, n)); err != nil {
			return err
		}
	}
	return nil
}

// byteChunks calls fn with consecutive pieces of n items of at most
// MaxBatch items and at most maxBytes by size (a piece of one item may be
// larger): the script calls that carry payloads or many ids are bounded by
// bytes as well as by count.
func byteChunks(n, maxBytes int, size func(i int) int, fn func(lo, hi int) error) error {
	for lo := 0; lo < n; {
		hi, used := lo, 0
		for hi < n && hi-lo < MaxBatch {
			b := size(hi) + itemOverhead
			if hi > lo && used+b > maxBytes {
				break
			}
			used += b
			hi++
		}
		if err := fn(lo, hi); err != nil {
			return err
		}
		lo = hi
	}
	return nil
}

// tokenBytes sizes tokens for byteChunks.
func tokenBytes(tokens []storage.Token) func(int) int {
	return func(i int) int { return len(tokens[i].ID) }
}

// luaBool is a boolean script argument: "1" or "0" (Lua reads ARGV as
// strings; the scripts test == "1").
func luaBool(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
