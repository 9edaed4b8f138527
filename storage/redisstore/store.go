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
// in-process miniredis (embedded mode); all of them run the same scripts.
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
	"math/rand/v2"
	"net"
	"strconv"
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
	// replica. If empty, DefaultWakeChannel ("delayd:wake") is used.
	WakeChannel string
	// NoCoalesce turns off the joining of concurrent Upsert calls, and of
	// concurrent Ack calls, of one namespace into one script call (see
	// Upsert, Ack). If false (the default), they are joined.
	NoCoalesce bool
	// AckLinger is how long an Ack call that finds no ack of its shard in
	// flight waits for others to join its script call: at a trickle (a few
	// acks per millisecond, from several streams) acks then share script
	// calls instead of making one each. It delays the answer of an ack,
	// never a delivery. If zero, no wait (acks still join while one is in
	// flight).
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
}

// Store is the Redis task index. It is safe for concurrent use; it does not
// own the client (closing the client is the caller's business).
type Store struct {
	*conn    // the client and the limits every shard shares (shard.go)
	noCo     bool
	co       *coalescer[storage.UpsertSpec, storage.UpsertResult]
	acks     *coalescer[storage.Token, storage.TokenStatus]
	shards   ShardCounter  // Options.Shards
	reapTurn atomic.Uint32 // rotates a sharded Reap's remainder
	hub      *watchHub     // the one pub/sub connection of watch channels
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
	s := &Store{conn: &conn{rdb: client, log: opts.Logger, timeout: opts.Timeout, wake: opts.WakeChannel,
		traces: opts.Traces, maxArgs: opts.MaxScriptBytes}, noCo: opts.NoCoalesce, shards: opts.Shards}
	s.co, s.acks = newUpsertCoalescer(), newAckCoalescer(opts.AckLinger)
	if s.maxArgs <= 0 {
		s.maxArgs = DefaultMaxScriptBytes
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.wake == "" {
		s.wake = DefaultWakeChannel
	}
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

// Upsert creates or replaces tasks of ns, in one round trip per MaxBatch
// specs or Options.MaxScriptBytes, whichever comes first. Due times are resolved with the Redis clock when DueTime is zero.
// Results are in spec order. When any task becomes the earliest of ns, the
// namespace is published on the wake channel. Conditional specs
// (CreateOnly, IfGeneration) are decided in the same script, against what
// is stored at that instant and what earlier specs of the call wrote.
//
// Unless Options.NoCoalesce is set, a call of fewer than CoalesceMax specs
// made while another such call of ns is in flight waits for it and then goes
// out together with the other calls that queued meanwhile, in one script
// call: it behaves as if the calls ran one after another in arrival order,
// and an error of the shared script call is every caller's error. A call
// whose ctx ends while it waits returns ctx's error, with its specs not
// written; once sent, it returns the script call's answer (see coalescer).
func (s *Store) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	for i := range specs {
		if specs[i].NamespaceIncarnation != specs[0].NamespaceIncarnation {
			return nil, fmt.Errorf("upsert: specs name namespace incarnations %d and %d; one call writes for one",
				specs[0].NamespaceIncarnation, specs[i].NamespaceIncarnation)
		}
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("upsert: %w", err)
	}
	return splitByShard(n, specs, func(i int) string { return specs[i].ID }, func(i int, part []storage.UpsertSpec) ([]storage.UpsertResult, error) {
		return s.upsertOn(ctx, s.shardOfN(ns, i, n), part)
	})
}

// upsertOn writes specs, all of shard sh: coalesced with concurrent calls
// of the same shard unless Options.NoCoalesce says otherwise, then their
// trace contexts kept (Options.Traces).
func (s *Store) upsertOn(ctx context.Context, sh shard, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	var res []storage.UpsertResult
	var err error
	if s.noCo || len(specs) == 0 || len(specs) >= CoalesceMax {
		res, err = sh.upsert(ctx, specs)
	} else {
		res, err = s.co.do(ctx, coKey{ns: sh.ns, sh: sh.i}, specs, sh.upsert)
	}
	if err == nil && s.traces {
		sh.writeTraces(ctx, specs, res)
	}
	return res, err
}

// ClaimIncarnation checks, as an upsert for incarnation inc of ns (the
// namespace's create time, ms) would, that neither it nor a later one has
// ended, and records it as the latest that writes. storage.ErrNamespaceEnded when it ended. Durable mode calls it
// before writing to MySQL.
func (s *Store) ClaimIncarnation(ctx context.Context, ns string, inc int64) error {
	if inc <= 0 {
		return nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	return fanOut(allShards(n), func(i int) error { return s.shardOfN(ns, i, n).claim(ctx, inc) })
}

// nsIncarnation is the namespace incarnation specs are written for (they
// all carry the same; Upsert checks).
func nsIncarnation(specs []storage.UpsertSpec) int64 {
	if len(specs) == 0 {
		return 0
	}
	return specs[0].NamespaceIncarnation
}

// Remove deletes the task in any state and returns the state it was in;
// storage.ErrNotFound if there was no such task. With ifVersion.Generation
// set, the task is deleted only when its stored version matches (the
// generation, and the incarnation unless ifVersion.Incarnation is zero),
// checked in the same script; otherwise a *storage.ConflictError carries
// the stored task.
func (s *Store) Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	sh, err := s.taskShard(ctx, ns, id)
	if err != nil {
		return 0, fmt.Errorf("remove: %w", err)
	}
	return sh.remove(ctx, id, ifVersion)
}

// RemoveTasks deletes p.IDs (at most MaxBatch; those that do not exist are
// skipped) in one script call, or examines at most p.Limit (clamped to
// 1..MaxBatch) tasks of the p.Filter walk from p.Cursor and deletes those
// that match, in one script call per state walked. The walk goes through
// the scheduled, then the delivered, then the dead tasks (only p.Filter.
// State's when set), each in its ZSET's order. Each match is decided and
// deleted atomically; a task that moves while the walk runs (rescheduled,
// delivered) may be missed or examined twice.
func (s *Store) RemoveTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	if len(p.IDs) > 0 {
		if len(p.IDs) > MaxBatch {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %d ids; at most %d per call", len(p.IDs), MaxBatch)
		}
		n, err := s.shardCount(ctx, ns)
		if err != nil {
			return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", err)
		}
		groups := groupIndexes(n, len(p.IDs), func(i int) string { return p.IDs[i] })
		states := make([]storage.State, len(p.IDs))
		err = fanOut(groupShards(groups), func(i int) error {
			return s.shardOfN(ns, i, n).removeIDs(ctx, p.IDs, groups[i], states)
		})
		res := storage.RemoveTasksResult{States: states}
		for _, st := range states {
			if st != storage.StateUnspecified {
				res.Removed++
			}
		}
		return res, err
	}
	vs, next, err := s.walk(ctx, ns, p, false)
	return storage.RemoveTasksResult{Removed: int64(len(vs)), Next: next}, err
}

// MatchTasks is the walk of RemoveTasks (p.Filter from p.Cursor, at most
// p.Limit tasks examined) without deleting anything: it returns the
// version of each task that matches and the cursor of the next page.
// Durable mode deletes exactly those versions from MySQL, then forgets
// them here.
func (s *Store) MatchTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) ([]storage.Version, string, error) {
	return s.walk(ctx, ns, p, true)
}

// Get returns one task; storage.ErrNotFound if there is none.
func (s *Store) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	sh, err := s.taskShard(ctx, ns, id)
	if err != nil {
		return storage.Task{}, fmt.Errorf("get: %w", err)
	}
	return sh.get(ctx, id)
}

// List returns one page of the tasks of one state (see
// storage.ListParams): the list script stops before the byte budget
// (p.MaxBytes) and this method cuts again by the exact size, so a page
// never holds more than p.Limit (at most MaxBatch) tasks nor, past its
// first task, more than p.MaxBytes. Order: due time, lease deadline, death
// time; ties by id. The cursor is opaque; one made for another state fails
// with ErrInvalidCursor. Paging is stable: a task that stays where it is is
// listed exactly once.
func (s *Store) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, "", fmt.Errorf("list: %w", err)
	}
	if n == 1 {
		ts, _, next, err := s.shardOfN(ns, 0, 1).list(ctx, p)
		return ts, next, err
	}
	return s.listSharded(ctx, ns, n, p)
}

// Pop leases at most p.Limit (and at most MaxBatch) due tasks of ns for
// p.LeaseFor, in due order, counting the attempt; with p.MaxRate, at most
// as many as the namespace's token bucket holds, with p.Kinds only tasks
// of those kinds (lua/pop.lua). Due-ness
// is decided by the Redis clock. Nothing is deleted: a task whose stored
// header is malformed is moved to dead (and logged) instead of delivered.
func (s *Store) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("pop: %w", err)
	}
	if n == 1 {
		r, err := s.shardOfN(ns, 0, n).pop(ctx, p)
		return r.Deliveries, err
	}
	return s.popSharded(ctx, ns, n, p)
}

// PopWake is Pop that also answers the Redis clock and the namespace's
// next wake (see storage.Deliveries): one script call for an unsharded
// namespace, whose pop.lua reads the heads of due and inflight after the
// move; a sharded namespace pops, then asks every shard's next wake. With
// p.Limit <= 0 it only asks the next wake.
func (s *Store) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.PopResult{}, fmt.Errorf("pop: %w", err)
	}
	if n == 1 {
		if p.Limit <= 0 {
			// the script pops nothing and answers the heads
			p.Limit, p.Kinds, p.MaxRate = 0, nil, 0
		}
		return s.shardOfN(ns, 0, n).pop(ctx, p)
	}
	var r storage.PopResult
	if p.Limit > 0 {
		if r.Deliveries, err = s.popSharded(ctx, ns, n, p); err != nil {
			return storage.PopResult{}, err
		}
	}
	r.Next, r.Now, r.HasNext, err = s.nextWakeSharded(ctx, ns, n)
	if err != nil && len(r.Deliveries) > 0 {
		// What was popped is leased: hand it over, and look again soon.
		r.Now = time.Now()
		r.Next, r.HasNext, err = r.Now.Add(shardRetry), true, nil
	}
	return r, err
}

// tokenArgs appends id, incarnation, generation, delivery per token
// (tokenArity values), the numbers in hexadecimal as headers hold them
// (appendHex: 0 is ""), so the scripts compare them as strings (see
// token_check in lua/lib.lua). A token of another namespace is sent with an
// id no task has, so it answers NOT_FOUND; so does one with delivery 0 (the
// scripts never match it).
func tokenArgs(args []any, ns string, tokens []storage.Token) []any {
	// one buffer for every token's numbers; each argument is a slice of it
	// (a full slice expression, so nothing appends into another's bytes)
	buf := make([]byte, 0, 40*len(tokens))
	for _, t := range tokens {
		if t.Namespace != "" && t.Namespace != ns {
			args = append(args, "", "", "", "")
			continue
		}
		a := len(buf)
		buf = appendHex(buf, t.Incarnation)
		b := len(buf)
		buf = appendHex(buf, t.Generation)
		c := len(buf)
		buf = appendHex(buf, t.Delivery)
		d := len(buf)
		args = append(args, t.ID, buf[a:b:b], buf[b:c:c], buf[c:d:d])
	}
	return args
}

// tokenArity is how many ARGV values tokenArgs sends per token.
const tokenArity = 4

func tokenStatus(v any) storage.TokenStatus {
	n, _ := replyInt(v)
	switch n {
	case 1:
		return storage.TokenOK
	case 2:
		return storage.TokenStale
	default:
		return storage.TokenNotFound
	}
}

// Ack deletes each task whose token still names the delivery in flight
// (same incarnation, generation and delivery): OK. A token whose task has
// since been upserted or redelivered answers STALE, one whose task is gone,
// re-created since (another incarnation) or not in flight NOT_FOUND; both
// change nothing. A token of another namespace answers NOT_FOUND. One round
// trip per MaxBatch tokens (or Options.MaxScriptBytes of their ids); calls
// of fewer than CoalesceMax tokens made while another ack of the namespace
// is in flight are joined into one script call, as Upsert's are.
func (s *Store) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	return s.ack(ctx, ns, tokens, false)
}

// AckMarked is Ack for durable mode: each acked task leaves an ack marker
// naming the acked delivery until ClearAcked drops it (once MySQL has
// deleted that version). While the marker is there, Restore never writes
// that version back, and a token that matches the marker answers OK again
// (an ack retried after its write-through failed).
func (s *Store) AckMarked(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	return s.ack(ctx, ns, tokens, true)
}

func (s *Store) ack(ctx context.Context, ns string, tokens []storage.Token, marks bool) ([]storage.TokenStatus, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	out := make([]storage.TokenStatus, len(tokens))
	err = byTokenShard(n, tokens, func(sh int, idx []int, part []storage.Token) error {
		st, err := s.ackOn(ctx, s.shardOfN(ns, sh, n), part, marks)
		for i, v := range st {
			out[idx[i]] = v
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ackOn acks tokens of shard sh: coalesced with concurrent acks of the
// same shard and mode (from every stream and AckTasks call of this
// replica) unless Options.NoCoalesce says otherwise, one script call per
// batch, as for upserts.
func (s *Store) ackOn(ctx context.Context, sh shard, tokens []storage.Token, marks bool) ([]storage.TokenStatus, error) {
	if s.noCo || len(tokens) == 0 || len(tokens) >= CoalesceMax {
		return sh.ack(ctx, tokens, marks)
	}
	return s.acks.do(ctx, coKey{ns: sh.ns, sh: sh.i, marks: marks}, tokens, func(ctx context.Context, tokens []storage.Token) ([]storage.TokenStatus, error) {
		return sh.ack(ctx, tokens, marks)
	})
}

// retryArgs are ARGV[3..10] of nack.lua and reap.lua.
func retryArgs(retryAfter *time.Duration, opts storage.NackOptions) []any {
	after := ""
	if retryAfter != nil {
		after = strconv.FormatInt(max(retryAfter.Milliseconds(), 0), 10)
	}
	b := opts.Backoff
	capMS := b.Max.Milliseconds()
	if capMS <= 0 {
		capMS = 1 << 50 // no cap given: a delay no task reaches
	}
	mult := b.Multiplier
	if mult < 1 {
		mult = 1
	}
	jitter := min(max(b.Jitter, 0), 1)
	return []any{
		after, max(opts.MaxAttempts, 0), max(b.Initial.Milliseconds(), 0), capMS,
		strconv.FormatFloat(mult, 'g', -1, 64), strconv.FormatFloat(jitter, 'g', -1, 64),
		strconv.FormatFloat(rand.Float64(), 'g', -1, 64), opts.Reason,
	}
}

// moved builds a storage.Moved from a script's state and time.
func moved(id string, inc, gen int64, attempt int32, state int64, at int64, reason string) storage.Moved {
	m := storage.Moved{ID: id, Incarnation: inc, Generation: gen, Attempt: attempt, State: stateOf(state), LastError: reason}
	if m.State == storage.StateDead {
		m.DeadTime = msTime(at)
	} else {
		m.DueTime = msTime(at)
	}
	return m
}

// Nack puts each delivery its token still names back to scheduled, due
// after opts.RetryAfter or the backoff for its attempt, or to dead when its
// attempt has reached opts.MaxAttempts (0 = no limit); opts.Reason becomes
// its last error. Statuses are as for Ack; Moved lists where each applied
// token's task went, in token order. One round trip per MaxBatch tokens
// (or Options.MaxScriptBytes of their ids).
func (s *Store) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, nil, fmt.Errorf("nack: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).nack(ctx, tokens, opts)
	}
	statuses := make([]storage.TokenStatus, len(tokens))
	movedOf := make([]*storage.Moved, len(tokens))
	err = byTokenShard(n, tokens, func(sh int, idx []int, part []storage.Token) error {
		st, mv, err := s.shardOfN(ns, sh, n).nack(ctx, part, opts)
		m := 0
		for i, v := range st {
			statuses[idx[i]] = v
			if v == storage.TokenOK && m < len(mv) {
				movedOf[idx[i]] = &mv[m]
				m++
			}
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	var movedTasks []storage.Moved
	for _, m := range movedOf {
		if m != nil {
			movedTasks = append(movedTasks, *m)
		}
	}
	return statuses, movedTasks, nil
}

// Extend sets the lease of each delivery its token still names to the
// Redis clock's now + by. Statuses are as for Ack; LeaseDeadline is set for
// OK. One round trip per MaxBatch tokens (or Options.MaxScriptBytes of
// their ids).
func (s *Store) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("extend: %w", err)
	}
	out := make([]storage.ExtendResult, len(tokens))
	err = byTokenShard(n, tokens, func(sh int, idx []int, part []storage.Token) error {
		rs, err := s.shardOfN(ns, sh, n).extend(ctx, part, by)
		for i, r := range rs {
			out[idx[i]] = r
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Reap takes at most limit (and at most MaxBatch) expired leases of ns back
// to scheduled after the backoff for their attempt (or opts.RetryAfter), or
// to dead when their attempt has reached opts.MaxAttempts; opts.Reason
// becomes their last error. Atomic per call, so every replica may reap at
// once; each expired lease is moved by exactly one of them.
func (s *Store) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	if limit <= 0 {
		return nil, nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).reap(ctx, limit, opts)
	}
	return s.reapSharded(ctx, ns, n, limit, opts)
}

// NextWake returns the earlier of ns's first due time and first lease
// deadline, and the Redis clock's now; ok is false when ns has neither.
func (s *Store) NextWake(ctx context.Context, ns string) (next, now time.Time, ok bool, err error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return time.Time{}, time.Time{}, false, fmt.Errorf("next wake: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).nextWake(ctx)
	}
	return s.nextWakeSharded(ctx, ns, n)
}

// Requeue moves dead tasks back to scheduled, due after p.Delay by the
// Redis clock, with attempts reset to 0 (generation and last error kept):
// p.IDs (those not dead are skipped), or with p.All the oldest p.Limit dead
// tasks (clamped to 1..MaxBatch). Returns where each moved task went.
func (s *Store) Requeue(ctx context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("requeue: %w", err)
	}
	var out []storage.Moved
	err = eachShardOf(n, p.All, p.Limit, p.IDs, func(sh int, ids []string, limit int) (int, error) {
		q := p
		q.IDs, q.Limit = ids, limit
		ms, err := s.shardOfN(ns, sh, n).requeue(ctx, q)
		out = append(out, ms...)
		return len(ms), err
	})
	return out, err
}

// Purge deletes dead tasks: p.IDs (those not dead are skipped), or with
// p.All the oldest p.Limit dead tasks (clamped to 1..MaxBatch). Returns the
// ids deleted.
func (s *Store) Purge(ctx context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	vs, err := s.PurgeVersions(ctx, ns, p)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.ID
	}
	return out, nil
}

// PurgeVersions is Purge answering the version of each task it deleted
// (durable mode deletes exactly those versions from MySQL).
func (s *Store) PurgeVersions(ctx context.Context, ns string, p storage.PurgeParams) ([]storage.Version, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", err)
	}
	var out []storage.Version
	err = eachShardOf(n, p.All, p.Limit, p.IDs, func(sh int, ids []string, limit int) (int, error) {
		q := p
		q.IDs, q.Limit = ids, limit
		vs, err := s.shardOfN(ns, sh, n).purge(ctx, q)
		out = append(out, vs...)
		return len(vs), err
	})
	return out, err
}

// eachChunk runs call once with no ids when all is set, else once per
// MaxBatch-sized chunk of ids.
func eachChunk(all bool, ids []string, call func(ids []string) error) error {
	if all {
		return call(nil)
	}
	return chunks(len(ids), func(lo, hi int) error { return call(ids[lo:hi]) })
}

// luaBool is a boolean script argument: "1" or "0" (Lua reads ARGV as
// strings; the scripts test == "1").
func luaBool(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Stats counts ns's tasks per state, how many scheduled tasks are due by
// the Redis clock, and the earliest due time.
func (s *Store) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.Stats{}, fmt.Errorf("stats: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).stats(ctx)
	}
	return s.statsSharded(ctx, ns, n)
}

// DueKinds counts ns's due tasks per kind among the first
// storage.KindScanWindow of them, by the Redis clock (lua/duekinds.lua).
func (s *Store) DueKinds(ctx context.Context, ns string) (storage.DueKinds, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.DueKinds{}, fmt.Errorf("due kinds: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).dueKinds(ctx)
	}
	return s.dueKindsSharded(ctx, ns, n)
}

// SubscribeWakeups calls fn with every wake-up published by any replica
// (an upsert, nack, reap, requeue or restore that put an earlier task at
// the head of a namespace; a policy change, PublishPolicyChanged) until
// ctx is done, and then returns ctx.Err(). It fails with
// storage.ErrUnavailable when the subscription cannot be made. fn runs on
// the subscribing goroutine, one call at a time, and should not block.
// After a connection loss the subscription is re-made in the background;
// wake-ups published meanwhile are lost, and ready is called again once
// Redis confirms the new subscription (see storage.Wakeups).
func (s *Store) SubscribeWakeups(ctx context.Context, ready func(), fn func(storage.Wakeup)) error {
	// The context of Subscribe only bounds the first connection; later
	// reconnections are go-redis's own.
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	sub := s.rdb.Subscribe(rctx, s.wake)
	defer sub.Close()
	_, err := sub.Receive(rctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return wrapErr("subscribe wakeups", err)
	}
	ready()
	// With subscriptions: go-redis re-subscribes after a lost connection
	// and Redis confirms it, which is when wake-ups reach us again.
	ch := sub.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-ch:
			if !ok {
				return fmt.Errorf("subscribe wakeups: %w: subscription closed", storage.ErrUnavailable)
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					ready()
				}
			case *redis.Message:
				fn(parseWakeMessage(m.Payload))
			}
		}
	}
}

// PublishPolicyChanged publishes on the wake-up channel that ns's policy
// changed, so every replica's dispatcher re-reads it at once.
func (s *Store) PublishPolicyChanged(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Publish(ctx, s.wake, policyWakeMessage(ns)).Err(); err != nil {
		return wrapErr("publish policy change", err)
	}
	return nil
}
