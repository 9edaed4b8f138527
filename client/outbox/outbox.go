package outbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/client"
)

// Dialect is the SQL database the outbox lives in.
type Dialect int

const (
	// MySQL is MySQL 8.0+ or MariaDB 10.6+ (go-sql-driver/mysql or any
	// driver that takes "?" placeholders).
	MySQL Dialect = iota + 1
	// Postgres is PostgreSQL 9.5+ (pgx's stdlib driver, lib/pq, or any
	// driver that takes "$n" placeholders).
	Postgres
)

// String returns "mysql" or "postgres".
func (d Dialect) String() string {
	switch d {
	case MySQL:
		return "mysql"
	case Postgres:
		return "postgres"
	default:
		return "Dialect(" + strconv.Itoa(int(d)) + ")"
	}
}

// Defaults used when a Config field is zero.
const (
	// DefaultTable is the outbox table's name; the applied table is named
	// after it with "_applied".
	DefaultTable = "delayd_outbox"
	// DefaultBatchSize is the most rows one relay round takes.
	DefaultBatchSize = 100
	// DefaultPollInterval is how often an idle relay looks for new rows.
	DefaultPollInterval = 100 * time.Millisecond
	// DefaultParkFor is how far ahead a relay parks a task between its two
	// calls (see the package documentation).
	DefaultParkFor = 7 * 24 * time.Hour
	// DefaultMinBackoff and DefaultMaxBackoff bound the relay's wait after
	// a failed round (exponential, full jitter).
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
)

// MaxBatchSize is the largest Config.BatchSize: delayd's batch limit.
const MaxBatchSize = 1000

// Config says where the outbox is and how its relay runs. Only Dialect is
// required; Client is required to Start a relay.
type Config struct {
	// Dialect of the database: MySQL or Postgres. Required.
	Dialect Dialect
	// Table is the outbox table: 1-48 characters of [a-z0-9_], starting
	// with a letter or "_". The consumer's applied table is Table +
	// "_applied". One table per service: every relay of the service shares
	// it. If empty, DefaultTable.
	Table string
	// Client is the delayd client the relay sends with (its timeout and
	// retry policy apply to each call). Required by Start only.
	Client *client.Client
	// BatchSize is the most rows one relay round claims, 1-1,000. If zero,
	// DefaultBatchSize (100).
	BatchSize int
	// PollInterval is how often an idle relay looks for committed rows;
	// [Outbox.Wake] makes it look at once. If zero, DefaultPollInterval
	// (100 ms).
	PollInterval time.Duration
	// ParkFor is how far in the future (from the relay's clock) a task is
	// parked between the relay's two calls; a parked task whose relay dies
	// for longer than this fires at the parked time. It must be within the
	// namespaces' horizon (366 days unless configured). If zero,
	// DefaultParkFor (7 days).
	ParkFor time.Duration
	// MinBackoff and MaxBackoff bound the relay's wait after a round that
	// failed (delayd or the database unreachable): exponential with full
	// jitter, reset by a round that succeeds. If zero, 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives the relay's failures (WARN) and rows it gives up on
	// (ERROR). If nil, slog.Default().
	Logger *slog.Logger
	// Metrics, if set, is fed by the relay (see [NewMetrics]).
	Metrics *Metrics
	// Now is the relay's and Upsert's clock. If nil, time.Now.
	Now func() time.Time
}

// Outbox is one service's outbox table and, once started, its relay. The
// write methods (Upsert, Remove) and Once are safe for concurrent use and
// need no relay in the process; Start runs one relay, Stop ends it.
type Outbox struct {
	db      *sql.DB
	cfg     Config
	q       queries
	wake    chan struct{}
	logger  *slog.Logger
	mu      sync.Mutex
	running *relayRun

	// hook, when set (tests only), is called at the named points of a
	// relay round and of Once.
	hook func(point string)
}

var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// New returns the outbox of cfg.Table in db. It checks cfg; it does not
// touch the database (see Migrate).
func New(db *sql.DB, cfg Config) (*Outbox, error) {
	if db == nil {
		return nil, errors.New("outbox: db is nil")
	}
	if cfg.Dialect != MySQL && cfg.Dialect != Postgres {
		return nil, fmt.Errorf("outbox: Config.Dialect is %v; use outbox.MySQL or outbox.Postgres", cfg.Dialect)
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if !tableName.MatchString(cfg.Table) {
		return nil, fmt.Errorf("outbox: Config.Table %q: 1-48 characters of [a-z0-9_], starting with a letter or _, are allowed", cfg.Table)
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > MaxBatchSize {
		return nil, fmt.Errorf("outbox: Config.BatchSize is %d; 1-%d is allowed (0 for %d)", cfg.BatchSize, MaxBatchSize, DefaultBatchSize)
	}
	if cfg.PollInterval < 0 || cfg.ParkFor < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0 {
		return nil, errors.New("outbox: Config.PollInterval, ParkFor, MinBackoff and MaxBackoff must not be negative")
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.ParkFor == 0 {
		cfg.ParkFor = DefaultParkFor
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Outbox{db: db, cfg: cfg, q: newQueries(cfg.Dialect, cfg.Table), wake: make(chan struct{}, 1),
		logger: logger.With("component", "delayd-outbox", "table", cfg.Table)}, nil
}

//go:embed schema/*.sql
var schemas embed.FS

// Schema returns the statements that create the outbox table named table
// and its applied table in dialect d, for teams that run migrations with
// their own tool. Each statement is idempotent (IF NOT EXISTS).
func Schema(d Dialect, table string) ([]string, error) {
	if !tableName.MatchString(table) {
		return nil, fmt.Errorf("outbox: table %q: 1-48 characters of [a-z0-9_], starting with a letter or _, are allowed", table)
	}
	var file string
	switch d {
	case MySQL:
		file = "schema/mysql.sql"
	case Postgres:
		file = "schema/postgres.sql"
	default:
		return nil, fmt.Errorf("outbox: dialect %v; use outbox.MySQL or outbox.Postgres", d)
	}
	b, err := schemas.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			text.WriteString(line + "\n")
		}
	}
	var stmts []string
	for s := range strings.SplitSeq(strings.ReplaceAll(text.String(), "{{table}}", table), ";\n") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts, nil
}

// Migrate creates the outbox table and its applied table if they do not
// exist. It is safe to run at every start, from every replica.
func (o *Outbox) Migrate(ctx context.Context) error {
	stmts, err := Schema(o.cfg.Dialect, o.cfg.Table)
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if _, err := o.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", o.cfg.Table, err)
		}
	}
	return nil
}

// Task is one task to create or replace through the outbox.
type Task struct {
	// ID is the task id, unique within the namespace: 1-128 characters of
	// [A-Za-z0-9._-]. Use your own key (order id, loan id...).
	ID string
	// Kind is an optional label (at most 128 printable ASCII characters).
	Kind string
	// Payload is delivered as given; at most the namespace's payload limit
	// (64 KiB unless configured otherwise). A payload over the limit is
	// only found out by the relay, which then gives the row up (see
	// [Outbox.Failed]).
	Payload []byte
	// DueAt is when the task falls due. Required. It is absolute on
	// purpose: a row the relay sends late (delayd was down) or twice still
	// falls due when the business transaction said; use
	// time.Now().Add(d) for "d from now".
	DueAt time.Time
}

const (
	opUpsert = 1
	opRemove = 2
)

var (
	namespaceRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	taskIDRE    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
)

func checkTarget(ns, id string) error {
	if !namespaceRE.MatchString(ns) {
		return fmt.Errorf("namespace %q: [a-z0-9][a-z0-9_-]{0,62} is allowed", ns)
	}
	if !taskIDRE.MatchString(id) {
		return fmt.Errorf("id %q: 1-128 characters of [A-Za-z0-9._-] are allowed", id)
	}
	return nil
}

// Upsert writes, inside tx, a row asking the relay to create or replace
// task t of namespace ns. Nothing reaches delayd unless tx commits; once it
// has, the relay sends the row (in order with the other rows of the same
// task) until delayd accepted it, however long delayd is away. t is checked
// here, so a malformed task fails the business transaction rather than the
// relay.
//
// Rows of one task are sent in the order they were inserted; two
// transactions that write the same task at the same time should also
// update a common business row (the order, the loan), so that their
// insert order is their commit order.
func (o *Outbox) Upsert(ctx context.Context, tx *sql.Tx, ns string, t Task) error {
	if err := checkTarget(ns, t.ID); err != nil {
		return fmt.Errorf("outbox upsert: %w", err)
	}
	if len(t.Kind) > 128 || strings.IndexFunc(t.Kind, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0 {
		return fmt.Errorf("outbox upsert %s/%s: kind %q: at most 128 printable ASCII characters are allowed", ns, t.ID, t.Kind)
	}
	if t.DueAt.IsZero() {
		return fmt.Errorf("outbox upsert %s/%s: DueAt is required (use time.Now().Add(d) for d from now)", ns, t.ID)
	}
	return o.insert(ctx, tx, ns, t.ID, opUpsert, t.Kind, t.Payload, t.DueAt.UnixMilli())
}

// Remove writes, inside tx, a row asking the relay to cancel task id of
// namespace ns (in any state; a task that does not exist is fine). After
// the relay sent it, the task is never delivered again, except a delivery
// already in flight.
func (o *Outbox) Remove(ctx context.Context, tx *sql.Tx, ns, id string) error {
	if err := checkTarget(ns, id); err != nil {
		return fmt.Errorf("outbox remove: %w", err)
	}
	return o.insert(ctx, tx, ns, id, opRemove, "", nil, 0)
}

func (o *Outbox) insert(ctx context.Context, tx *sql.Tx, ns, id string, op int, kind string, payload []byte, dueMS int64) error {
	if tx == nil {
		return errors.New("outbox: tx is nil: the row must be written in the business transaction")
	}
	if payload == nil {
		payload = []byte{}
	}
	if _, err := tx.ExecContext(ctx, o.q.insert, ns, id, op, kind, payload, dueMS, o.cfg.Now().UnixMicro()); err != nil {
		return fmt.Errorf("outbox write %s/%s: %w", ns, id, err)
	}
	return nil
}

// Wake makes a running relay look for rows at once instead of at its next
// poll; call it after committing a transaction that wrote to the outbox
// to save up to PollInterval of latency. It never blocks.
func (o *Outbox) Wake() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// Pending returns how many rows wait to be sent (rows the relay gave up on
// not included).
func (o *Outbox) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := o.db.QueryRowContext(ctx, o.q.pending).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox pending: %w", err)
	}
	return n, nil
}

// FailedRow is a row the relay gave up on: delayd refused it as malformed
// (InvalidArgument: a payload over the namespace's limit, a due time past
// its horizon...). It stays in the table, out of the relay's way, until
// deleted by hand; later rows of the same task are sent without it.
type FailedRow struct {
	Seq       int64
	Namespace string
	ID        string
	// Remove is true for a Remove row, false for an Upsert.
	Remove bool
	// Error is delayd's answer.
	Error string
}

// Failed lists up to limit rows the relay gave up on, oldest first.
func (o *Outbox) Failed(ctx context.Context, limit int) ([]FailedRow, error) {
	rows, err := o.db.QueryContext(ctx, o.q.failed, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox failed rows: %w", err)
	}
	defer rows.Close()
	var out []FailedRow
	for rows.Next() {
		var f FailedRow
		var op int
		if err := rows.Scan(&f.Seq, &f.Namespace, &f.ID, &op, &f.Error); err != nil {
			return nil, fmt.Errorf("outbox failed rows: %w", err)
		}
		f.Remove = op == opRemove
		out = append(out, f)
	}
	return out, rows.Err()
}

// queries are the statements of one table in one dialect, placeholders
// already in the dialect's form.
type queries struct {
	dialect                     Dialect
	table, applied              string
	insert, claim, fail, bigint string
	relockPrefix, deletePrefix  string
	pending, failed             string
	applyInsert, pruneApplied   string
}

func newQueries(d Dialect, table string) queries {
	quote := func(s string) string { return "`" + s + "`" }
	if d == Postgres {
		quote = func(s string) string { return `"` + s + `"` }
	}
	t, a := quote(table), quote(table+"_applied")
	q := queries{dialect: d, table: t, applied: a}
	q.insert = "INSERT INTO " + t + " (namespace, task_id, op, kind, payload, due_ms, created_us) VALUES (?, ?, ?, ?, ?, ?, ?)"
	// The head row of each task (no earlier row of the same task waits):
	// the subquery is a plain read, so a head locked by another relay
	// keeps the rows behind it out of this claim, and SKIP LOCKED passes
	// over that head. Verified on MariaDB 10.11 and PostgreSQL 15.
	q.claim = "SELECT o.seq, o.namespace, o.task_id, o.op, o.kind, o.payload, o.due_ms, o.created_us, o.park_incarnation, o.park_generation FROM " + t + " o" +
		" WHERE o.failed = FALSE AND NOT EXISTS (SELECT 1 FROM " + t + " p WHERE p.namespace = o.namespace AND p.task_id = o.task_id AND p.seq < o.seq AND p.failed = FALSE)" +
		" ORDER BY o.seq LIMIT ? FOR UPDATE SKIP LOCKED"
	// A placeholder typed BIGINT, where the context does not type it.
	q.bigint = "CAST(? AS SIGNED)"
	if d == Postgres {
		q.bigint = "CAST(? AS BIGINT)"
	}
	q.fail = "UPDATE " + t + " SET failed = TRUE, last_error = ? WHERE seq = ?"
	q.relockPrefix = "SELECT seq, park_incarnation, park_generation FROM " + t + " WHERE seq IN "
	q.deletePrefix = "DELETE FROM " + t + " WHERE seq IN "
	q.pending = "SELECT COUNT(*) FROM " + t + " WHERE failed = FALSE"
	q.failed = "SELECT seq, namespace, task_id, op, last_error FROM " + t + " WHERE failed = TRUE ORDER BY seq LIMIT ?"
	if d == Postgres {
		q.applyInsert = "INSERT INTO " + a + " (namespace, task_id, incarnation, generation, applied_us) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
	} else {
		q.applyInsert = "INSERT IGNORE INTO " + a + " (namespace, task_id, incarnation, generation, applied_us) VALUES (?, ?, ?, ?, ?)"
	}
	q.pruneApplied = "DELETE FROM " + a + " WHERE applied_us < ?"
	for _, p := range []*string{&q.insert, &q.claim, &q.fail, &q.failed, &q.applyInsert, &q.pruneApplied} {
		*p = q.rebind(*p)
	}
	return q
}

// rebind turns "?" placeholders into "$1", "$2"... for Postgres.
func (q queries) rebind(s string) string {
	if q.dialect != Postgres {
		return s
	}
	var b strings.Builder
	n := 0
	for _, r := range s {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// in returns "(?, ?, ...)" for n values, in the dialect's form.
func (q queries) in(n int) string {
	return q.rebind("(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")")
}

// DB is the database the outbox was made with.
func (o *Outbox) DB() *sql.DB { return o.db }
