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
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/mysqlstore"
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

// Authority is the durable side, MySQL; mysqlstore.Store implements it.
// Its errors wrap storage.ErrUnavailable when it cannot serve now.
type Authority interface {
	storage.Registry

	// Commit runs the segments, in order, in one transaction, setting the
	// writes' results.
	Commit(segs []mysqlstore.Segment) error
	// UpsertExact applies rows that name their generation in a transaction
	// of their own; see mysqlstore.Store.UpsertExact.
	UpsertExact(ctx context.Context, ns string, rows []mysqlstore.UpsertRow, nowMS int64) ([]storage.UpsertResult, []int, error)
	// Get reads one task; storage.ErrNotFound if there is none.
	Get(ctx context.Context, ns, id string) (storage.Task, error)
	// List pages through the scheduled or dead tasks of ns.
	List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error)
	// Purge deletes the named tasks that are dead and returns their ids.
	Purge(ctx context.Context, ns string, ids []string) ([]string, error)
	// DeleteVersions deletes exactly the named versions, in any state.
	DeleteVersions(ctx context.Context, ns string, vs []storage.Version) error
	// MatchVersions reads up to limit versions of the tasks of ns that f
	// selects, after id `after`, in id order.
	MatchVersions(ctx context.Context, ns string, f storage.TaskFilter, after string, limit int) ([]storage.Version, error)
	// DropTasks deletes every task of ns and returns how many there were;
	// with an incarnation it first ends it, so from then on Commit refuses
	// upserts made for it (Write.Ended).
	DropTasks(ctx context.Context, ns string, incarnation int64) (int64, error)
	// HasTasks reports whether any task of ns exists.
	HasTasks(ctx context.Context, ns string) (bool, error)
	// TaskNamespaces lists the namespaces that have tasks.
	TaskNamespaces(ctx context.Context) ([]string, error)
	// ReadVersions reads up to limit versions of ns after id, in id order.
	ReadVersions(ctx context.Context, ns, after string, limit int) ([]storage.Version, error)
	// VersionsOf reads the versions of the named tasks of ns that exist.
	VersionsOf(ctx context.Context, ns string, ids []string) ([]storage.Version, error)
	// ReadChanged reads up to limit versions updated at or after sinceMS,
	// in update order; ReadChangedAt every version updated at ms.
	ReadChanged(ctx context.Context, sinceMS int64, limit int) ([]mysqlstore.Changed, error)
	ReadChangedAt(ctx context.Context, ms int64) ([]mysqlstore.Changed, error)
	// Repair runs decide on the named tasks' rows under their locks and
	// deletes the acked versions it returns; see mysqlstore.Store.Repair.
	Repair(ctx context.Context, ns string, ids []string, decide func(ctx context.Context, held []storage.Task) ([]mysqlstore.AckRow, error)) error
	// ReadTasks reads the named tasks of ns (those that exist).
	ReadTasks(ctx context.Context, ns string, ids []string) ([]storage.Task, error)
	// PruneHistory deletes up to limit history rows acked before cutoff.
	PruneHistory(ctx context.Context, cutoff time.Time, limit int) (int64, error)
	// TaskEvents pages through one task's events (delayd_task_events);
	// PruneEvents trims a namespace's events to the newest keep (0: all).
	TaskEvents(ctx context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error)
	PruneEvents(ctx context.Context, ns string, keep int64) (int64, error)
	// DB is the connection pool (for tests and operators' tools).
	DB() *sql.DB
	// Database names the database, to scope the leader lease.
	Database() string
	// Close closes the connection pool.
	Close() error
}

// DefaultReconcileInterval is Config.ReconcileInterval's default.
const DefaultReconcileInterval = 30 * time.Second

// DefaultOpTimeout is Config.OpTimeout's default.
const DefaultOpTimeout = 10 * time.Second

// DefaultFullReconcileInterval is Config.FullReconcileInterval's default.
const DefaultFullReconcileInterval = time.Hour

// Config configures a Store.
type Config struct {
	// DSN names the MySQL database: a go-sql-driver/mysql DSN such as
	// "user:pass@tcp(127.0.0.1:3306)/delayd". Required. The store adds
	// interpolateParams (one round trip per statement) and, unless the DSN
	// sets them, a 5 s dial timeout.
	DSN string
	// Index is the Redis index written through after MySQL. Required.
	Index Index
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// Clock is the local clock. The store corrects it by the offset to the
	// index's clock (Redis TIME), which decides due-ness, and resolves
	// relative delays and timestamps with the result. If nil, time.Now.
	Clock storage.Clock

	// MaxOpenConns caps the MySQL connection pool. If zero, 16.
	MaxOpenConns int
	// OpTimeout bounds every MySQL transaction and every index call the
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
	if c.MaxOpenConns <= 0 {
		c.MaxOpenConns = 16
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

// Store is the durable task store. Create it with New, then Start it; Stop
// it once. All methods are safe for concurrent use.
type Store struct {
	cfg    Config
	db     Authority
	idx    Index
	log    *slog.Logger
	leader string // leader lease name

	// committer (committer.go)
	in      chan *op
	work    chan *batch
	doneQ   chan *batch
	quit    chan struct{}
	stopped chan struct{} // closed when Stop has finished
	workers sync.WaitGroup
	// index queues (indexqueue.go), one per committer, by namespace hash
	iq []*indexQueue

	// reconciler (reconcile.go)
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	ready     chan struct{}
	readyOnce sync.Once
	repairMu  sync.Mutex
	repairs   map[taskKey]struct{}

	// namespaces whose index marker this replica has seen (true) or found
	// missing while MySQL held tasks (time of that check)
	markMu  sync.Mutex
	marked  map[string]bool
	checked map[string]time.Time

	// last time each throttled warning was logged
	warnMu sync.Mutex
	warned map[string]time.Time

	// offset of the index's clock to the local clock
	clockMu  sync.Mutex
	offset   time.Duration
	offsetAt time.Time
	probing  bool // a clock probe runs (now)
	probes   sync.WaitGroup

	// the last incarnation this replica handed out (newIncarnation)
	incMu   sync.Mutex
	lastInc int64

	startOnce sync.Once
	stopOnce  sync.Once
	started   bool
	// written counts, per namespace, the events this replica recorded
	// since it last trimmed the namespace's history (history.go).
	written sync.Map // namespace -> *atomic.Int64
}

// taskKey names a task across namespaces.
type taskKey struct{ ns, id string }

// maxRepairs bounds the failed index writes a replica remembers to repair
// itself; past it, the reconciler's periodic pass repairs the rest.
const maxRepairs = 100_000

// New connects to MySQL, applies the schema migrations (see
// mysqlstore.Migrate) and returns a Store that does nothing in the
// background until Start.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg.defaults()
	if cfg.DSN == "" {
		return nil, errors.New("durable: Config.DSN is required")
	}
	if cfg.Index == nil {
		return nil, errors.New("durable: Config.Index is required")
	}
	s := &Store{
		cfg:     cfg,
		idx:     cfg.Index,
		log:     cfg.Logger,
		in:      make(chan *op),
		work:    make(chan *batch),
		doneQ:   make(chan *batch),
		quit:    make(chan struct{}),
		stopped: make(chan struct{}),
		ready:   make(chan struct{}),
		repairs: make(map[taskKey]struct{}),
		marked:  make(map[string]bool),
		checked: make(map[string]time.Time),
		warned:  make(map[string]time.Time),
	}
	for range cfg.Committers {
		s.iq = append(s.iq, newIndexQueue())
	}
	db, err := mysqlstore.Open(ctx, mysqlstore.Config{
		DSN:              cfg.DSN,
		Logger:           cfg.Logger,
		MaxOpenConns:     cfg.MaxOpenConns,
		OpTimeout:        cfg.OpTimeout,
		MaxBatchBytes:    cfg.MaxBatchBytes,
		HistoryRetention: cfg.HistoryRetention,
		Now:              s.now,
	})
	if err != nil {
		return nil, err
	}
	s.db = db
	s.leader = leaderPrefix + db.Database()
	return s, nil
}

// DB returns the store's connection pool (for tests and operators' tools).
func (s *Store) DB() *sql.DB { return s.db.DB() }

// Registry is the namespace and API-key registry, kept in MySQL.
func (s *Store) Registry() storage.Registry { return s.db }

// Start starts the committer and the reconciler. It returns at once; ctx
// only bounds the start itself. Call it once.
func (s *Store) Start(ctx context.Context) error {
	s.startOnce.Do(func() {
		s.started = true
		rctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		s.wg.Add(3 + s.cfg.Committers + len(s.iq))
		s.workers.Add(s.cfg.Committers)
		go func() { defer s.wg.Done(); s.collect() }()
		for range s.cfg.Committers {
			go func() { defer s.wg.Done(); defer s.workers.Done(); s.worker() }()
		}
		for _, q := range s.iq {
			go func() { defer s.wg.Done(); s.indexWriter(q) }()
		}
		// The index queues close once no worker can push to them.
		go func() {
			defer s.wg.Done()
			s.workers.Wait()
			for _, q := range s.iq {
				q.close()
			}
		}()
		go func() { defer s.wg.Done(); s.reconcileLoop(rctx) }()
	})
	return nil
}

// Ready is closed once every namespace MySQL holds tasks of has a complete
// index (rebuilt from MySQL where the index marker was missing). Until
// then deliveries of those namespaces may be incomplete; the daemon
// reports NOT_SERVING. It stays closed when a later Redis loss makes the
// leader rebuild again: writes keep working meanwhile.
func (s *Store) Ready() <-chan struct{} { return s.ready }

// Stop stops the reconciler, commits and indexes every write already
// accepted, refuses new ones (storage.ErrUnavailable), waits for every
// goroutine, and closes the MySQL pool; or gives up waiting when ctx is
// done. Shutdown order: writers are refused first (quit), the collector
// dispatches what it accepted and waits for the workers to finish it, the
// workers end, the index queues close and their writers apply what they
// hold (an index write that fails then is left to the reconciler of the
// replicas that stay, or of the next start), then the pool closes.
func (s *Store) Stop(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
		close(s.quit)
		done := make(chan struct{})
		go func() {
			s.wg.Wait()
			// A barrier: once clockMu was free after quit, no probe starts,
			// and one that did has Added to probes.
			s.clockMu.Lock()
			//lint:ignore SA2001 the empty critical section is the barrier
			s.clockMu.Unlock()
			s.probes.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			err = fmt.Errorf("durable: stop: %w", ctx.Err())
		}
		if cerr := s.db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("durable: close: %w", cerr)
		}
		close(s.stopped)
	})
	return err
}

// opCtx returns a context for one of the store's own operations.
func (s *Store) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.OpTimeout)
}

// now returns the index's clock (Redis TIME) as well as this replica knows
// it: the local clock plus an offset measured at most a second ago through
// the index. If the index cannot be asked, the last offset (at first 0) is
// used: a relative delay is then off by this replica's clock error, which
// is only the due time the task gets, never early delivery of another.
func (s *Store) now(ctx context.Context, ns string) time.Time {
	local := s.cfg.Clock.Now()
	s.clockMu.Lock()
	fresh := !s.offsetAt.IsZero() && local.Sub(s.offsetAt) < time.Second && local.Sub(s.offsetAt) >= 0
	off := s.offset
	s.clockMu.Unlock()
	if fresh {
		return local.Add(off)
	}
	s.clockMu.Lock()
	first := s.offsetAt.IsZero()
	probe := !s.probing && !first
	select {
	case <-s.quit:
		probe = false // stopped: no goroutine may start now
	default:
	}
	if probe {
		s.probing = true
		s.probes.Add(1) // under clockMu: Stop waits for probes after taking it
	}
	s.clockMu.Unlock()
	if first {
		// No offset yet: measure it now (bounded by ctx and a second).
		return s.probeClock(ctx, ns)
	}
	if probe {
		// Measure again in the background: a hung index must not hold a
		// write, which goes on with the last offset meanwhile.
		go func() {
			defer s.probes.Done()
			s.probeClock(context.Background(), ns)
			s.clockMu.Lock()
			s.probing = false
			s.clockMu.Unlock()
		}()
	}
	return local.Add(off)
}

// probeClock measures the offset of the index's clock (within a second)
// and returns the index's time by it; when the index does not answer, the
// last offset is kept and not asked again for a second.
func (s *Store) probeClock(ctx context.Context, ns string) time.Time {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	before := s.cfg.Clock.Now()
	_, remote, _, err := s.idx.NextWake(cctx, ns)
	after := s.cfg.Clock.Now()
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	if err != nil || remote.IsZero() {
		if err != nil {
			s.log.Debug("index clock unavailable; using the last known offset", "err", err)
		}
		s.offsetAt = after // do not ask again for a second
		return after.Add(s.offset)
	}
	mid := before.Add(after.Sub(before) / 2)
	s.offset, s.offsetAt = remote.Sub(mid), after
	return after.Add(s.offset)
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
	s.incMu.Lock()
	defer s.incMu.Unlock()
	if us <= s.lastInc {
		us = s.lastInc + 1
	}
	s.lastInc = us
	return us
}

// ---- storage.Tasks ----

// Upsert creates or replaces tasks of ns: MySQL first (generation decided
// there), then the index with that generation. A relative delay is resolved
// by the index against its clock (Redis TIME, which decides due-ness) when
// it writes the task, and that due time is answered; MySQL keeps this
// replica's estimate of it (see now), which only matters if the task must
// be restored from MySQL. It returns only after the
// MySQL commit; an index failure after it is logged and repaired later
// (the result then has Earliest false). Specs with an explicit Generation
// are applied as such: Stale when MySQL holds a newer one. MySQL down:
// storage.ErrUnavailable and nothing written.
func (s *Store) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	// A write through a stale view of a deleted namespace is refused
	// before it reaches MySQL (the index keeps the namespace's
	// incarnation). MySQL, the authority, checks it again in the commit's
	// transaction (mysqlstore.Write.NSInc), which covers a write that
	// passed the index just before a DeleteNamespace and every write while
	// the index cannot answer.
	if inc := specs[0].NamespaceIncarnation; inc != 0 {
		if err := s.claimIncarnation(ctx, ns, inc); errors.Is(err, storage.ErrNamespaceEnded) {
			return nil, err
		}
	}
	now := s.now(ctx, ns)
	rows := make([]mysqlstore.UpsertRow, len(specs))
	exact := false
	for i, sp := range specs {
		due := sp.DueTime
		if due.IsZero() {
			due = now.Add(sp.Delay)
		}
		payload := sp.Payload
		if payload == nil {
			payload = []byte{}
		}
		inc, exactInc := sp.Incarnation, sp.Incarnation != 0 && sp.Generation != 0
		if !exactInc {
			inc = s.newIncarnation(now)
		}
		rows[i] = mysqlstore.UpsertRow{ID: sp.ID, Kind: sp.Kind, Payload: payload, DueMS: storage.DueMilli(due), Gen: sp.Generation,
			Inc: inc, ExactInc: exactInc, Relative: sp.DueTime.IsZero(), Delay: sp.Delay, TraceParent: sp.TraceParent,
			CreateOnly: sp.CreateOnly, IfGen: max(sp.IfVersion().Generation, 0), IfInc: max(sp.IfVersion().Incarnation, 0)}
		if sp.Generation != 0 {
			exact = true
		}
	}
	s.ensureMarked(ctx, ns)
	if exact {
		return s.upsertExact(ctx, ns, rows, now.UnixMilli())
	}
	o := &op{Write: mysqlstore.Write{Kind: kindUpsert, NS: ns, NowMS: now.UnixMilli(), Rows: rows, NSInc: specs[0].NamespaceIncarnation}}
	if err := s.submit(ctx, o); err != nil {
		return nil, err
	}
	res := o.Upserts
	for i := range res {
		if res[i].Refused != storage.NotRefused && res[i].Task.ID != "" {
			res[i].Task = s.current(ctx, ns, res[i].Task)
		}
	}
	if j := o.ix; j != nil && s.awaitIndex(ctx, j) && j.err == nil {
		// The index's answers: whether the task became the earliest (to
		// wake dispatchers at once) and its own times, so a Get answers
		// the same task.
		for k, i := range j.rows {
			if !j.ok[k] {
				continue
			}
			r := j.res[k]
			res[i].Earliest = r.Earliest
			if !r.Task.DueTime.IsZero() {
				res[i].Task.DueTime = r.Task.DueTime
			}
			if !r.Task.CreateTime.IsZero() {
				res[i].Task.CreateTime = r.Task.CreateTime
			}
			if !r.Task.UpdateTime.IsZero() {
				res[i].Task.UpdateTime = r.Task.UpdateTime
			}
		}
	}
	return res, nil
}

// claimIncarnation asks the index whether the namespace incarnation inc of
// ns has ended (the namespace was deleted and re-created), without letting
// a hung index hold the write: it is skipped while the namespace's index
// queue is unhealthy and bounded by IndexWait (and half the caller's
// deadline) otherwise. When the index cannot answer, MySQL takes the
// write, as it does every write while Redis is down.
func (s *Store) claimIncarnation(ctx context.Context, ns string, inc int64) error {
	wait := s.indexBudget(ctx, ns)
	if wait <= 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return s.idx.ClaimIncarnation(cctx, ns, inc)
}

// current returns the index's copy of t (a task MySQL holds, read for a
// refused conditional write) when the index holds that very version: it
// knows the state (DELIVERED, lease, attempts) MySQL does not. Otherwise,
// or if the index cannot answer, t as MySQL holds it.
func (s *Store) current(ctx context.Context, ns string, t storage.Task) storage.Task {
	it, err := s.idx.Get(ctx, ns, t.ID)
	if err != nil || it.Incarnation != t.Incarnation || it.Generation != t.Generation {
		return t
	}
	return it
}

// upsertExact applies specs that name their generation in MySQL (see
// mysqlstore.Store.UpsertExact), then writes the applied ones to the index
// in order, each with its generation.
func (s *Store) upsertExact(ctx context.Context, ns string, rows []mysqlstore.UpsertRow, nowMS int64) ([]storage.UpsertResult, error) {
	res, applied, err := s.db.UpsertExact(ctx, ns, rows, nowMS)
	if err != nil || len(applied) == 0 {
		return res, err
	}
	specs := make([]storage.UpsertSpec, len(applied))
	results := make([]*storage.UpsertResult, len(applied))
	for j, i := range applied {
		specs[j] = indexSpec(rows[i], res[i].Task)
		results[j] = &res[i]
	}
	s.indexWrite(ctx, ns, specs, results)
	return res, nil
}

// ensureMarked sets the index marker of a namespace MySQL holds no task of
// yet, before its first write: such an index is complete by definition, so
// the reconciler need not rebuild it. (A namespace that has tasks in MySQL
// but no marker is left to the reconciler's rebuild.) Best effort: errors
// only mean the reconciler does the work.
func (s *Store) ensureMarked(ctx context.Context, ns string) {
	now := s.cfg.Clock.Now()
	s.markMu.Lock()
	done := s.marked[ns]
	at, seen := s.checked[ns]
	s.markMu.Unlock()
	if done || (seen && now.Sub(at) >= 0 && now.Sub(at) < time.Second) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.indexWait(ctx, time.Now()))
	defer cancel()
	ok, err := s.idx.Indexed(ctx, ns)
	if err != nil {
		s.markMu.Lock()
		s.checked[ns] = now // the index is down: do not ask on every write
		s.markMu.Unlock()
		return
	}
	if !ok {
		has, err := s.db.HasTasks(ctx, ns)
		switch {
		case err == nil && !has:
			ok = s.idx.MarkIndexed(ctx, ns) == nil
		case err == nil:
			s.markMu.Lock()
			s.checked[ns] = now
			s.markMu.Unlock()
		}
	}
	if ok {
		s.markMu.Lock()
		s.marked[ns] = true
		delete(s.checked, ns)
		s.markMu.Unlock()
	}
}

// Remove deletes the task from MySQL, then from the index, and returns the
// state it was in (the index's, which knows DELIVERED; else MySQL's).
// ErrNotFound if neither had it. With ifVersion set, MySQL decides: the
// row is deleted only at that version, else a *storage.ConflictError
// carries the stored task and nothing is touched. MySQL down:
// ErrUnavailable and nothing touched. It answers only once the index
// removed the task too, so no delivery starts after it returned; when the
// index does not answer in time (see Config.IndexWait), ErrUnavailable:
// the task is gone from the authority, its index removal stays queued (and
// in the repair set if it fails), and a retry answers when the index has
// it done.
func (s *Store) Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	ifGen, ifInc := max(ifVersion.Generation, 0), max(ifVersion.Incarnation, 0)
	if ifGen == 0 {
		ifInc = 0
	}
	o := &op{Write: mysqlstore.Write{Kind: kindRemove, NS: ns, NowMS: s.cfg.Clock.Now().UnixMilli(), ID: id, IfGen: ifGen, IfInc: ifInc}}
	if err := s.submit(ctx, o); err != nil {
		return storage.StateUnspecified, err
	}
	if o.Mismatch {
		t := o.Current
		if full, err := s.db.Get(ctx, ns, id); err == nil && full.Generation == t.Generation && full.Incarnation == t.Incarnation {
			t = full
		}
		return storage.StateUnspecified, &storage.ConflictError{Err: storage.ErrGenerationMismatch, Task: s.current(ctx, ns, t),
			Expected: storage.Version{ID: id, Generation: ifGen, Incarnation: ifInc}}
	}
	j := o.ix
	if !s.awaitIndex(ctx, j) {
		return storage.StateUnspecified, fmt.Errorf("remove: deleted from mysql; the index removal is still pending (retry): %w", storage.ErrUnavailable)
	}
	if j.err != nil {
		return storage.StateUnspecified, fmt.Errorf("remove: index (the task is already deleted from mysql; retry): %w", j.err)
	}
	switch {
	case j.prev != storage.StateUnspecified:
		return j.prev, nil
	case j.mysqlPrev != storage.StateUnspecified:
		return j.mysqlPrev, nil
	}
	return storage.StateUnspecified, fmt.Errorf("remove: %w", storage.ErrNotFound)
}

// removeConcurrency bounds the removes RemoveTasks submits at once for a
// list of ids (the committer gathers them into a few transactions).
const removeConcurrency = 256

// RemoveTasks deletes the tasks p selects. Named ids go through the
// committer as removes, MySQL first (as Remove does, concurrently). A
// filter page is matched in the index (which knows every state; the
// reconciler keeps it complete), then exactly the matched versions are
// deleted from MySQL, then forgotten by the index: a task upserted since
// the match keeps its new version in both. Removed counts what the index
// deleted. MySQL down: ErrUnavailable and nothing touched; index down after
// the MySQL delete: ErrUnavailable, and the same call again finishes it.
//
// When the index has lost the namespace (no marker, no task: a Redis that
// restarted empty, before the rebuild reaches it), the filter is matched
// in MySQL instead, page by page in id order, with a cursor of its own (as
// List does); DELIVERED then matches nothing.
func (s *Store) RemoveTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	if len(p.IDs) > 0 {
		return s.removeIDs(ctx, ns, p.IDs)
	}
	if after, ok := strings.CutPrefix(p.Cursor, mysqlCursor); ok || (p.Cursor == "" && s.indexLost(ctx, ns)) {
		return s.removeMatchingMySQL(ctx, ns, p, after)
	}
	vs, next, err := s.idx.MatchTasks(ctx, ns, p)
	if err != nil || len(vs) == 0 {
		return storage.RemoveTasksResult{Next: next}, err
	}
	if err := s.db.DeleteVersions(ctx, ns, vs); err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", err)
	}
	n, err := s.idx.Forget(ctx, ns, vs)
	if err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: index (the tasks are already deleted from mysql; retry): %w", err)
	}
	return storage.RemoveTasksResult{Removed: int64(n), Next: next}, nil
}

// removeMatchingMySQL is RemoveTasks of a filter matched in MySQL: up to
// p.Limit (1..1,000) matching tasks after id `after`, deleted by exact
// version, then forgotten by the index (in case the rebuild re-indexed
// them meanwhile). Removed counts the versions matched.
func (s *Store) removeMatchingMySQL(ctx context.Context, ns string, p storage.RemoveTasksParams, after string) (storage.RemoveTasksResult, error) {
	limit := p.Limit
	if limit <= 0 || limit > s.cfg.ReconcileBatch {
		limit = min(s.cfg.ReconcileBatch, 1000)
	}
	vs, err := s.db.MatchVersions(ctx, ns, p.Filter, after, limit)
	if err != nil || len(vs) == 0 {
		return storage.RemoveTasksResult{}, err
	}
	if err := s.db.DeleteVersions(ctx, ns, vs); err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: %w", err)
	}
	if _, err := s.idx.Forget(ctx, ns, vs); err != nil {
		return storage.RemoveTasksResult{}, fmt.Errorf("remove tasks: index (the tasks are already deleted from mysql; retry): %w", err)
	}
	res := storage.RemoveTasksResult{Removed: int64(len(vs))}
	if len(vs) == limit {
		res.Next = mysqlCursor + vs[len(vs)-1].ID
	}
	return res, nil
}

// removeIDs removes each id as Remove does, at most removeConcurrency at
// once, and answers the state each was in (States) and how many existed.
// The first failure is returned (with the results of the others).
func (s *Store) removeIDs(ctx context.Context, ns string, ids []string) (storage.RemoveTasksResult, error) {
	var (
		mu     sync.Mutex
		first  error
		wg     sync.WaitGroup
		sem    = make(chan struct{}, removeConcurrency)
		states = make([]storage.State, len(ids))
		seen   = make(map[string]bool, len(ids))
	)
	for i, id := range ids {
		if seen[id] {
			continue // a repeat answers StateUnspecified, as the index does
		}
		seen[id] = true
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			st, err := s.Remove(ctx, ns, id, storage.Version{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				states[i] = st
			case errors.Is(err, storage.ErrNotFound):
			case first == nil:
				first = err
			}
		}()
	}
	wg.Wait()
	res := storage.RemoveTasksResult{States: states}
	for _, st := range states {
		if st != storage.StateUnspecified {
			res.Removed++
		}
	}
	if first != nil {
		return res, fmt.Errorf("remove tasks: %w", first)
	}
	return res, nil
}

// Get returns the task from the index or, when the index does not have it
// (or cannot be reached), from MySQL.
func (s *Store) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	t, err := s.idx.Get(ctx, ns, id)
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrUnavailable) {
		return storage.Task{}, err
	}
	mt, merr := s.db.Get(ctx, ns, id)
	if merr != nil {
		if errors.Is(merr, storage.ErrNotFound) && errors.Is(err, storage.ErrUnavailable) {
			return storage.Task{}, err
		}
		return storage.Task{}, merr
	}
	return mt, nil
}

// mysqlCursor prefixes the cursors of pages read from MySQL.
const mysqlCursor = "m:"

// List pages through the index. It reads MySQL instead when the index
// cannot be reached, or when the index holds no task of the namespace at
// all and has no index marker for it (Redis lost its data and the rebuild
// has not reached the namespace yet). MySQL does not know which tasks are
// in flight: a MySQL page of StateDelivered is empty and tasks in flight
// are listed as scheduled. A cursor from one source continues in that
// source.
func (s *Store) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	if strings.HasPrefix(p.Cursor, mysqlCursor) {
		p.Cursor = p.Cursor[len(mysqlCursor):]
		return s.listMySQL(ctx, ns, p)
	}
	state := p.State
	if state == storage.StateUnspecified {
		state = storage.StateScheduled
	}
	ts, next, err := s.idx.List(ctx, ns, p)
	if p.Cursor != "" || state == storage.StateDelivered {
		return ts, next, err
	}
	p.State = state
	if err != nil {
		if errors.Is(err, storage.ErrUnavailable) {
			return s.listMySQL(ctx, ns, p)
		}
		return ts, next, err
	}
	if len(ts) == 0 && s.indexLost(ctx, ns) {
		return s.listMySQL(ctx, ns, p)
	}
	return ts, next, nil
}

// listMySQL pages through MySQL (within the same byte budget); its cursors
// carry the mysqlCursor prefix.
func (s *Store) listMySQL(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	ts, next, err := s.db.List(ctx, ns, p)
	if next != "" {
		next = mysqlCursor + next
	}
	return ts, next, err
}

// indexLost reports whether the index holds nothing of ns and no marker
// says that is complete.
func (s *Store) indexLost(ctx context.Context, ns string) bool {
	if ok, err := s.idx.Indexed(ctx, ns); err != nil || ok {
		return false
	}
	st, err := s.idx.Stats(ctx, ns)
	return err == nil && st.Scheduled+st.Delivered+st.Dead == 0
}

// ---- storage.Deliveries ----

// Pop is the index's: pops are not written to MySQL.
func (s *Store) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	return s.idx.Pop(ctx, ns, p)
}

// PopWake is the index's: pops are not written to MySQL.
func (s *Store) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	return s.idx.PopWake(ctx, ns, p)
}

// Ack acks in the index (which checks incarnation, generation and
// delivery) leaving an ack marker per acked task, then deletes each acked
// version from MySQL (or moves it to the history table when
// HistoryRetention is set), then drops the markers. A newer version's row
// is never deleted. If the MySQL delete fails, the statuses are returned
// with an ErrUnavailable error and the markers stay: the task is not
// delivered again (the reconciler never restores a version a marker names;
// it deletes the row itself once MySQL answers and drops the marker), and
// a retry of the same ack answers OK again (the marker matches its token)
// and retries the delete.
func (s *Store) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	st, err := s.idx.AckMarked(ctx, ns, tokens)
	if err != nil {
		return st, err
	}
	var acks []mysqlstore.AckRow
	var marks []storage.Token
	for i, t := range tokens {
		if i < len(st) && st[i] == storage.TokenOK {
			acks = append(acks, mysqlstore.AckRow{ID: t.ID, Inc: t.Incarnation, Gen: t.Generation, Attempt: t.Attempt})
			marks = append(marks, t)
		}
	}
	if len(acks) == 0 {
		return st, nil
	}
	o := &op{Write: mysqlstore.Write{Kind: kindAck, NS: ns, NowMS: s.cfg.Clock.Now().UnixMilli(), Acks: acks}}
	if err := s.submit(ctx, o); err != nil {
		return st, fmt.Errorf("ack: write through: %w", err)
	}
	// Best effort: a marker left behind only costs memory until the
	// reconciler's full pass drops it.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	if _, err := s.idx.ClearAcked(cctx, ns, marks); err != nil {
		s.warn("clear-acked", "could not drop ack markers; the reconciler will", "namespace", ns, "err", err)
	}
	return st, nil
}

// Nack is the index's, written through to MySQL (generation-guarded). A
// failed write-through returns the index's answers with an error; MySQL
// then lags (the task may come back with an older attempt count after a
// Redis loss).
func (s *Store) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	st, moved, err := s.idx.Nack(ctx, ns, tokens, opts)
	if err != nil || len(moved) == 0 {
		return st, moved, err
	}
	return st, moved, s.writeMoved(ctx, ns, moved, "nack")
}

// Extend is the index's: leases are not written to MySQL.
func (s *Store) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	return s.idx.Extend(ctx, ns, tokens, by)
}

// Reap is the index's, written through to MySQL like Nack.
func (s *Store) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	moved, err := s.idx.Reap(ctx, ns, limit, opts)
	if err != nil || len(moved) == 0 {
		return moved, err
	}
	return moved, s.writeMoved(ctx, ns, moved, "reap")
}

// NextWake is the index's.
func (s *Store) NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error) {
	return s.idx.NextWake(ctx, ns)
}

// ---- storage.DeadLetters ----

// Requeue is the index's, written through to MySQL.
func (s *Store) Requeue(ctx context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	moved, err := s.idx.Requeue(ctx, ns, p)
	if err != nil || len(moved) == 0 {
		return moved, err
	}
	return moved, s.writeMoved(ctx, ns, moved, "requeue")
}

// Purge deletes dead tasks from the index, then exactly the versions the
// index deleted from MySQL (whatever state MySQL still records: a death
// whose write-through lags is still a death). Named ids the index holds in
// no state (a namespace not rebuilt yet) are purged from MySQL when MySQL
// holds them dead. A named task the index holds in another state (say,
// requeued, while MySQL still records it dead) is left alone in both. It
// returns every id deleted from either store.
func (s *Store) Purge(ctx context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	vs, err := s.idx.PurgeVersions(ctx, ns, p)
	if err != nil {
		return nil, err
	}
	purged := make([]string, len(vs))
	seen := make(map[string]bool, len(vs))
	for i, v := range vs {
		purged[i] = v.ID
		seen[v.ID] = true
	}
	if len(vs) > 0 {
		if err := s.db.DeleteVersions(ctx, ns, vs); err != nil {
			return purged, err
		}
	}
	if p.All {
		return purged, nil
	}
	var rest []string
	for _, id := range p.IDs {
		if !seen[id] {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return purged, nil
	}
	have, _, err := s.idx.Versions(ctx, ns, rest)
	if err != nil {
		return purged, err
	}
	var absent []string
	for i, v := range have {
		if v.Incarnation == 0 && v.Generation == 0 {
			absent = append(absent, rest[i])
		}
	}
	if len(absent) == 0 {
		return purged, nil
	}
	deleted, err := s.db.Purge(ctx, ns, absent)
	if err != nil {
		return purged, err
	}
	for _, id := range deleted {
		if !seen[id] {
			seen[id] = true
			purged = append(purged, id)
		}
	}
	return purged, nil
}

// ---- storage.Counter ----

// Stats is the index's.
func (s *Store) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	return s.idx.Stats(ctx, ns)
}

// DueKinds counts due tasks per kind from the index (see storage.Counter).
func (s *Store) DueKinds(ctx context.Context, ns string) (storage.DueKinds, error) {
	return s.idx.DueKinds(ctx, ns)
}

// DropNamespace deletes every task of ns and returns how many there were
// (the larger of the index's and MySQL's counts). DeleteNamespace uses it.
// With an incarnation (the namespace's create time, ms) the index ends it
// first, so from then on no write of that incarnation lands in either
// store (the durable Upsert claims its incarnation from the index before
// writing MySQL, and Restore writes nothing into an ended namespace);
// then MySQL ends it too, under the registry row's lock that every group
// commit of an upsert for it reads (so a write that was past the index's
// check is either committed before the drop or refused), then MySQL's rows
// go (in batches of 10,000), then the index is dropped once more for any
// write that was past its check when the first drop ran.
func (s *Store) DropNamespace(ctx context.Context, ns string, incarnation int64) (int64, error) {
	inIndex, err := s.idx.DropNamespace(ctx, ns, incarnation)
	if err != nil {
		return 0, fmt.Errorf("drop namespace: index: %w", err)
	}
	deleted, err := s.db.DropTasks(ctx, ns, incarnation)
	if err != nil {
		return max(deleted, inIndex), err
	}
	if incarnation > 0 {
		// A deleted namespace's history goes with it.
		if _, err := s.db.PruneEvents(ctx, ns, 0); err != nil {
			return max(deleted, inIndex), fmt.Errorf("drop namespace: history: %w", err)
		}
	}
	n, err := s.idx.DropNamespace(ctx, ns, incarnation)
	if err != nil {
		return max(deleted, inIndex), fmt.Errorf("drop namespace: index: %w", err)
	}
	return max(deleted, inIndex+n), nil
}

// TakeRequestToken implements storage.SharedLimits on the index.
func (s *Store) TakeRequestToken(ctx context.Context, ns string, rate float64, burst int) (bool, error) {
	return s.idx.TakeRequestToken(ctx, ns, rate, burst)
}

// AcquireSubscriber implements storage.SharedLimits on the index.
func (s *Store) AcquireSubscriber(ctx context.Context, ns, id string, most int, lease time.Duration) (bool, int, error) {
	return s.idx.AcquireSubscriber(ctx, ns, id, most, lease)
}

// RenewSubscribers implements storage.SharedLimits on the index.
func (s *Store) RenewSubscribers(ctx context.Context, ns string, ids []string, lease time.Duration) error {
	return s.idx.RenewSubscribers(ctx, ns, ids, lease)
}

// ReleaseSubscriber implements storage.SharedLimits on the index.
func (s *Store) ReleaseSubscriber(ctx context.Context, ns, id string) error {
	return s.idx.ReleaseSubscriber(ctx, ns, id)
}

var _ storage.SharedLimits = (*Store)(nil)

// writeMoved writes index transitions through to MySQL.
func (s *Store) writeMoved(ctx context.Context, ns string, moved []storage.Moved, what string) error {
	o := &op{Write: mysqlstore.Write{Kind: kindMoved, NS: ns, NowMS: s.cfg.Clock.Now().UnixMilli(), Moved: moved}}
	if err := s.submit(ctx, o); err != nil {
		return fmt.Errorf("%s: write through: %w", what, err)
	}
	return nil
}

// warnThrottle is how often one kind of repeated warning is logged; the
// repeats in between go to Debug.
const warnThrottle = 30 * time.Second

// warn logs msg at Warn at most every warnThrottle per key (at Debug
// otherwise), so an outage does not flood the log.
func (s *Store) warn(key, msg string, args ...any) {
	now := time.Now()
	s.warnMu.Lock()
	last, ok := s.warned[key]
	loud := !ok || now.Sub(last) >= warnThrottle
	if loud {
		s.warned[key] = now
	}
	s.warnMu.Unlock()
	if loud {
		s.log.Warn(msg, args...)
	} else {
		s.log.Debug(msg, args...)
	}
}

// requestRepair remembers tasks whose index write failed, so this replica
// re-indexes them from MySQL as soon as the index answers again.
func (s *Store) requestRepair(ns string, ids []string) {
	s.repairMu.Lock()
	defer s.repairMu.Unlock()
	for _, id := range ids {
		if len(s.repairs) >= maxRepairs {
			return
		}
		s.repairs[taskKey{ns, id}] = struct{}{}
	}
}

// Interface checks.
var _ storage.Store = (*Store)(nil)
