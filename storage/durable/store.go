// Package durable is delayd's durable mode: MySQL (or MariaDB, through
// storage/mysqlstore) is the authority for every task, and the Redis index
// (storage/redisstore) is written through after it and rebuilt from it.
//
// Store composes an Authority and an Index and implements storage.Tasks,
// storage.Deliveries, storage.DeadLetters and storage.Counter (and hands
// out the authority's storage.Registry), so the server
// and the dispatcher use it exactly as they use the index alone. What it
// promises:
//
//   - An upsert is answered OK only after MySQL committed it. MySQL decides
//     the generation; the index is then written with that exact generation,
//     so an older generation never overwrites a newer one in either store.
//     Index writes go through ordered queues of their own (indexqueue.go),
//     so a slow or hung Redis never holds MySQL commits back; a caller
//     waits for its index write only while the index is healthy and at
//     most Config.IndexWait (and half of its deadline), else it is answered
//     from MySQL. An index write that fails after the commit leaves the
//     upsert answered OK (it is durable) and the index is repaired from
//     MySQL: at once by this replica when Redis answers again, and by the
//     reconciler.
//   - Conditional writes (create-only, compare-and-set by generation and
//     incarnation) are decided by MySQL, in the group commit's transaction
//     against the rows read FOR UPDATE; a refused write touches neither
//     store. RemoveTasks deletes the versions it matched from MySQL first.
//   - Remove deletes from MySQL first, then from the index, and answers OK
//     only once the index removed the task (else storage.ErrUnavailable:
//     retry). If MySQL is down nothing is touched and the answer is
//     storage.ErrUnavailable.
//   - Ack, nack, lease expiry, dead-lettering and requeue are decided by the
//     index (it knows the delivery in flight) and written through to MySQL
//     with generation-guarded statements: an ack deletes only the acked
//     generation (or moves it to a history table).
//   - Writes from concurrent callers are group-committed: they are gathered
//     into multi-row statements in shared transactions (a few at once, never
//     two on the same task), and each task's writes reach MySQL and the
//     index in the order they were made.
//   - A reconciler (one leader at a time across replicas, a lease in Redis)
//     rebuilds each namespace whose index marker is missing (a cold start,
//     a Redis that lost everything) and, every ReconcileInterval, re-indexes
//     every task the index lacks or holds at an older generation. Ready is
//     closed once every namespace is indexed.
//   - Get and List fall back to MySQL when the index does not have the task.
//
// Pops and lease extensions stay in the index only: MySQL does not know
// which task is in flight, so after a Redis loss a delivered task is
// delivered again (at-least-once; never lost).
package durable

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// Index is the fast index durable mode writes through to; redisstore.Store
// implements it.
type Index interface {
	// Store is the task store contract. Its DropNamespace, with an
	// incarnation, also makes unchecked upserts and Restore write nothing
	// into ns until a later incarnation claims it.
	storage.Store
	// Forecaster counts the due forecast from the index's due sets.
	storage.Forecaster
	// SharedLimits are the limits counted once for every replica; the
	// durable store hands them to the index (they are not durable state).
	storage.SharedLimits

	// Restore re-indexes tasks read from the authority: each is written
	// unless the index holds the same or a newer version (with p.Repair:
	// unless it holds that very version), and never a version its ack
	// marker names. A DELIVERED task is restored as SCHEDULED at its
	// DueTime; version and attempt are kept. It returns how many it wrote.
	Restore(ctx context.Context, ns string, tasks []storage.Task, p storage.RestoreParams) (int, error)
	// Versions returns the version the index holds for each id, in order
	// (zero where it holds none), and each id's ack marker (Delivery 0
	// where there is none).
	Versions(ctx context.Context, ns string, ids []string) ([]storage.Version, []storage.Token, error)
	// Indexed reports whether ns carries the "index is complete" marker.
	Indexed(ctx context.Context, ns string) (bool, error)
	// MarkIndexed sets the marker of ns.
	MarkIndexed(ctx context.Context, ns string) error
	// TryLead takes or renews the leader lease called name for holder for
	// ttl; true if holder holds it now.
	TryLead(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// Namespaces lists the namespaces the index holds keys for.
	Namespaces(ctx context.Context) ([]string, error)
	// ClaimIncarnation fails with storage.ErrNamespaceEnded when
	// incarnation inc of ns (or a later one) has ended, and otherwise
	// records it as the latest that writes.
	ClaimIncarnation(ctx context.Context, ns string, inc int64) error

	// AckMarked acks like Ack and leaves a marker per acked task naming the
	// acked version until ClearAcked drops it; Restore never writes a
	// version its marker names, and a token matching its task's marker
	// answers OK again (a retried ack).
	AckMarked(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error)
	// ClearAcked drops the markers named (those that changed since stay).
	ClearAcked(ctx context.Context, ns string, marks []storage.Token) (int, error)
	// ScanAcked and ScanVersions page through ns's ack markers and index
	// entries (headers only) from cursor (0 = start); next 0 = done.
	ScanAcked(ctx context.Context, ns string, cursor uint64, count int) ([]storage.Token, uint64, error)
	ScanVersions(ctx context.Context, ns string, cursor uint64, count int) ([]storage.Version, uint64, error)
	// Forget removes each named version from the index if the index still
	// holds exactly that version.
	Forget(ctx context.Context, ns string, vs []storage.Version) (int, error)
	// PurgeVersions purges dead tasks like Purge, answering their versions.
	PurgeVersions(ctx context.Context, ns string, p storage.PurgeParams) ([]storage.Version, error)
	// MatchTasks walks p.Filter from p.Cursor as RemoveTasks does, without
	// deleting: it returns the version of each match and the next cursor.
	MatchTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) ([]storage.Version, string, error)
}

// DefaultReconcileInterval is Config.ReconcileInterval's default.
const DefaultReconcileInterval = 30 * time.Second

// DefaultOpTimeout is Config.OpTimeout's default.
const DefaultOpTimeout = 10 * time.Second

// DefaultFullReconcileInterval is Config.FullReconcileInterval's default.
const DefaultFullReconcileInterval = time.Hour

// Config configures a Store.
type Config struct {
	// Index is the Redis index written through after MySQL. Required.
	Index Index
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// Clock is the local clock. The store corrects it by the offset to the
	// index's clock (Redis TIME), which decides due-ness, and resolves
	// relative delays and timestamps with the result. If nil, time.Now.
	Clock storage.Clock

	// OpTimeout bounds every authority call and every index call the
	// store makes on its own (group commits, reconciler batches). If zero,
	// 10 seconds.
	OpTimeout time.Duration

	// Committers is how many group commits (transactions) run at once;
	// concurrent commits share InnoDB's log flush. If zero, 4.
	Committers int
	// MaxBatch is the most task rows one group commit carries; a batch
	// that is full is committed at once. One call larger than it is
	// committed alone. If zero, 512.
	MaxBatch int
	// MaxBatchBytes bounds the payload bytes of one group commit and of one
	// statement (stay well under max_allowed_packet). If zero, 4 MiB.
	MaxBatchBytes int
	// IndexWait is how long a write, once MySQL committed it, waits for its
	// index write while the index is healthy (at most half of what is left
	// of the caller's deadline): past it an upsert is answered from MySQL
	// (it is durable; the index write follows) and a remove answers
	// storage.ErrUnavailable (retry: the task is still in the index). While
	// the index is failing, or an index call has run for IndexWait, writes
	// do not wait at all. If zero, 1 second.
	IndexWait time.Duration
	// Linger is how long the committer waits for more writes after the
	// first one of a batch when no more are queued. If zero, 100
	// microseconds; negative means no wait.
	Linger time.Duration

	// FullReconcileInterval is how often the leader compares every task of
	// MySQL and of the index with the other (see reconcile.go); it also
	// runs once after a replica becomes leader. If zero, 1 hour.
	FullReconcileInterval time.Duration
	// ReconcileInterval is how often the leader's incremental pass repairs
	// the tasks changed in MySQL since its last pass (by update time) whose
	// index version differs. If zero, 30 seconds.
	ReconcileInterval time.Duration
	// ReconcileBatch is the rows the reconciler and the index rebuild read
	// per step. If zero, 1,000.
	ReconcileBatch int
	// IndexCheckInterval is how often the leader looks for namespaces
	// whose index marker is missing (a Redis that lost everything), and how
	// often failed index writes are retried. If zero, 1 second.
	IndexCheckInterval time.Duration
	// LeaderTTL is the reconciler's leader lease. If zero, 10 seconds.
	LeaderTTL time.Duration
	// Holder names this replica in the leader lease. If empty, host name,
	// process id and a random suffix.
	Holder string

	// HistoryRetention, if positive, keeps every acked task in
	// delayd_task_history for that long (the leader prunes older rows).
	// If zero, an ack deletes the task's row and keeps nothing.
	HistoryRetention time.Duration

	// Metrics receives the reconciler's full passes. If nil, nothing is
	// reported.
	Metrics ReconcileMetrics
}

// ReconcileMetrics receives what the reconciler does (package metrics
// implements it).
type ReconcileMetrics interface {
	// ReconcilePass reports one full pass of the leader: how long it took,
	// how many tasks it re-indexed, and its error if it failed.
	ReconcilePass(took time.Duration, repaired int, err error)
}

type noMetrics struct{}

func (noMetrics) ReconcilePass(time.Duration, int, error) {}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.Clock == nil {
		c.Clock = storage.SystemClock{}
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.Committers <= 0 {
		c.Committers = 4
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = 4 << 20
	}
	if c.IndexWait <= 0 {
		c.IndexWait = time.Second
	}
	if c.Linger == 0 {
		c.Linger = 100 * time.Microsecond
	}
	if c.FullReconcileInterval <= 0 {
		c.FullReconcileInterval = DefaultFullReconcileInterval
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.ReconcileBatch <= 0 {
		c.ReconcileBatch = 1000
	}
	if c.IndexCheckInterval <= 0 {
		c.IndexCheckInterval = time.Second
	}
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = 10 * time.Second
	}
	if c.Holder == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Holder = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
}

// leaderPrefix starts the name of the leader lease the reconcilers of all
// replicas share; the MySQL database name follows, so deployments with
// different databases sharing one Redis elect one leader each.
const leaderPrefix = "mysqlstore-reconciler:"

// errStopped is returned to writes that arrive after Stop.
var errStopped = fmt.Errorf("durable: store stopped: %w", storage.ErrUnavailable)

// Store is the durable task store: the write path (tasks.go,
// deliveries.go, history.go) over five components, each with its own
// fields and lifecycle:
//
//	indexClock   (clock.go)      the index's clock as this replica knows it
//	committer    (committer.go)  group commits to the authority
//	indexWriters (indexqueue.go) the index side of committed writes, in order
//	reconciler   (reconcile.go)  leader lease, passes, rebuilds, repairs, pruning
//	repairSet    (repair.go)     failed index writes, shared by the two above
//
// Create it with New, then Start it; Stop it once. All methods are safe
// for concurrent use.
type Store struct {
	cfg  Config
	db   authority.Authority
	idx  Index
	log  *slog.Logger
	warn *throttle

	clock   *indexClock
	writers *indexWriters
	commit  *committer
	recon   *reconciler
	repairs *repairSet

	// namespaces whose index marker this replica has seen (ensureMarked)
	marks struct {
		mu      sync.Mutex
		marked  map[string]bool      // seen set
		checked map[string]time.Time // found missing while MySQL held tasks, at
	}
	// the last incarnation this replica handed out (newIncarnation)
	incs struct {
		mu   sync.Mutex
		last int64
	}
	// written is, per namespace, what this replica's event writes need
	// to know (history.go).
	written  sync.Map // namespace -> *eventLog
	stopOnce sync.Once
}

// taskKey names a task across namespaces.
type taskKey struct{ ns, id string }

// New returns a Store over db, the authority (mysqlstore.Open opens MySQL
// and applies its migrations), that does nothing in the background until
// Start. It hands db the index's clock (UseClock) for the rows it stamps.
// Stop closes db.
func New(db authority.Authority, cfg Config) (*Store, error) {
	cfg.defaults()
	if db == nil {
		return nil, errors.New("durable: an authority is required")
	}
	if cfg.Index == nil {
		return nil, errors.New("durable: Config.Index is required")
	}
	s := &Store{cfg: cfg, db: db, idx: cfg.Index, log: cfg.Logger, warn: newThrottle(cfg.Logger), repairs: newRepairSet()}
	s.marks.marked = make(map[string]bool)
	s.marks.checked = make(map[string]time.Time)
	s.clock = newIndexClock(cfg.Clock, cfg.Index, cfg.Logger)
	s.writers = newIndexWriters(cfg.Index, s.repairs, s.warn, cfg)
	s.commit = newCommitter(db, s.writers, cfg)
	s.recon = &reconciler{db: db, idx: cfg.Index, log: cfg.Logger, warn: s.warn, metrics: cfg.Metrics, clock: cfg.Clock,
		lease:     &leaderLease{idx: cfg.Index, name: leaderPrefix + db.Database(), holder: cfg.Holder, ttl: cfg.LeaderTTL, opTimeout: cfg.OpTimeout},
		repair:    &repairer{db: db, idx: cfg.Index, log: cfg.Logger, set: s.repairs, batch: cfg.ReconcileBatch, opTimeout: cfg.OpTimeout},
		prune:     &pruner{db: db, clock: cfg.Clock, log: cfg.Logger, warn: s.warn, retention: cfg.HistoryRetention, opTimeout: cfg.OpTimeout},
		opTimeout: cfg.OpTimeout, fullInterval: cfg.FullReconcileInterval, interval: cfg.ReconcileInterval,
		checkInterval: cfg.IndexCheckInterval, batch: cfg.ReconcileBatch, ready: make(chan struct{})}
	db.UseClock(s.clock.now)
	return s, nil
}

// DB returns the store's connection pool (for tests and operators' tools).
func (s *Store) DB() *sql.DB { return s.db.DB() }

// Registry is the namespace and API-key registry, kept in MySQL.
func (s *Store) Registry() storage.Registry { return s.db }

// Start starts the components: the index writers before the committer
// that feeds them, the clock's background probes, and the reconciler. It
// returns at once; ctx only bounds the start itself. Call it once.
func (s *Store) Start(ctx context.Context) error {
	for _, c := range []interface{ Start(context.Context) error }{s.writers, s.commit, s.clock, s.recon} {
		if err := c.Start(ctx); err != nil {
			return fmt.Errorf("durable: start: %w", err)
		}
	}
	return nil
}

// Ready is closed once every namespace MySQL holds tasks of has a complete
// index (rebuilt from MySQL where the index marker was missing). Until
// then deliveries of those namespaces may be incomplete; the daemon
// reports NOT_SERVING. It stays closed when a later Redis loss makes the
// leader rebuild again: writes keep working meanwhile.
func (s *Store) Ready() <-chan struct{} { return s.recon.ready }

// Stop stops the reconciler, commits and indexes every write already
// accepted, refuses new ones (storage.ErrUnavailable), waits for every
// goroutine, and closes the authority; or gives up waiting when ctx is
// done. Shutdown order (senders before receivers): the reconciler ends,
// the committer refuses writers, dispatches what it accepted and waits for
// its workers; then the index queues close and their writers apply what
// they hold (an index write that fails then is left to the reconciler of
// the replicas that stay, or of the next start); then the clock's probes
// end; then the pool closes.
func (s *Store) Stop(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		bg := context.Background()
		err = waitCtx(ctx, func() {
			_ = s.recon.Stop(bg)
			_ = s.commit.Stop(bg)
			_ = s.writers.Stop(bg)
			_ = s.clock.Stop(bg)
		})
		if err != nil {
			err = fmt.Errorf("durable: stop: %w", err)
		}
		if cerr := s.db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("durable: close: %w", cerr)
		}
	})
	return err
}

// newIncarnation returns an incarnation for a task a write may create: the
// index's clock as this replica knows it (see now), in microseconds, and
// above every incarnation this replica handed out before. A task re-created
// after a remove or an ack so gets a larger incarnation than its previous
// life had, unless replicas' clock estimates differ by more than the time
// between the two lives (then the index answers "stale" to the new one and
// the task is repaired from MySQL at once; see indexWrite). A row that
// exists keeps its own incarnation.
func (s *Store) newIncarnation(now time.Time) int64 {
	us := now.UnixMicro()
	s.incs.mu.Lock()
	defer s.incs.mu.Unlock()
	if us <= s.incs.last {
		us = s.incs.last + 1
	}
	s.incs.last = us
	return us
}

// now is the index's clock as this replica knows it (see indexClock).
func (s *Store) now(ctx context.Context, ns string) time.Time { return s.clock.now(ctx, ns) }

var _ storage.Store = (*Store)(nil)
