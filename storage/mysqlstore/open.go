// Package mysqlstore is delayd's MySQL adapter for durable mode: the
// schema (versioned migrations embedded in the binary, see Migrate), the
// SQL on delayd_tasks, and the namespace and API-key registry in MySQL.
//
// It decides nothing about the index: storage/durable composes it with the
// Redis index (write-through, group commit, the reconciler and its leader
// lease). Every statement runs on MySQL 8 and MariaDB 10.11; connections
// are READ COMMITTED (see readCommittedConnector). Errors that mean MySQL
// cannot serve now wrap storage.ErrUnavailable.
package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delayd/delayd/storage/authority"
)

// Config configures a Store.
type Config struct {
	// DSN names the MySQL database: a go-sql-driver/mysql DSN such as
	// "user:pass@tcp(127.0.0.1:3306)/delayd". Required. The store adds
	// interpolateParams (one round trip per statement) and, unless the DSN
	// sets them, a 5 s dial timeout and read and write timeouts of
	// OpTimeout (the migrations at Open run without the latter).
	DSN string
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// MaxOpenConns caps the MySQL connection pool. If zero, 16.
	MaxOpenConns int
	// OpTimeout bounds every statement the store runs on its own behalf
	// (reads, the registry) and every transaction Commit runs. If zero,
	// 10 seconds.
	OpTimeout time.Duration
	// MaxBatchBytes bounds the payload bytes of one multi-row statement
	// (stay well under max_allowed_packet). If zero, 4 MiB.
	MaxBatchBytes int
	// HistoryRetention, if positive, makes an ack copy the task to
	// delayd_task_history before deleting it.
	HistoryRetention time.Duration
	// Now tells the time registry rows are stamped with (durable mode
	// passes the index's clock). If nil, time.Now.
	Now func(ctx context.Context, ns string) time.Time
}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxOpenConns <= 0 {
		c.MaxOpenConns = 16
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = 10 * time.Second
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = 4 << 20
	}
	if c.Now == nil {
		c.Now = func(context.Context, string) time.Time { return time.Now() }
	}
}

// Store is the MySQL adapter: a connection pool over a migrated database.
// Open it, Close it once. All methods are safe for concurrent use.
type Store struct {
	cfg  Config
	db   *sql.DB
	log  *slog.Logger
	name string // database name
}

// Open connects to MySQL, applies the schema migrations (see Migrate) and
// returns a Store.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg.defaults()
	if cfg.DSN == "" {
		return nil, errors.New("mysqlstore: Config.DSN is required")
	}
	mcfg, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: parse dsn: %w", err)
	}
	if mcfg.DBName == "" {
		return nil, errors.New("mysqlstore: the DSN names no database (user@tcp(host:port)/DBNAME)")
	}
	mcfg.InterpolateParams = true
	mcfg.MultiStatements = false
	if mcfg.Timeout == 0 {
		mcfg.Timeout = 5 * time.Second
	}
	if err := Migrate(ctx, mcfg.FormatDSN(), cfg.Logger); err != nil {
		return nil, err
	}
	// A MySQL that accepts connections but answers nothing (hung, or a
	// partition that drops packets) must not hold a connection forever: the
	// driver reads the server's greeting without heeding the context, so a
	// new connection would wait as long as the hang lasts, and with it every
	// write queued behind it. Every statement is bounded by OpTimeout
	// anyway, so no single read or write needs longer.
	if mcfg.ReadTimeout == 0 {
		mcfg.ReadTimeout = cfg.OpTimeout
	}
	if mcfg.WriteTimeout == 0 {
		mcfg.WriteTimeout = cfg.OpTimeout
	}
	connector, err := mysql.NewConnector(mcfg)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: %w", err)
	}
	db := sql.OpenDB(readCommittedConnector{connector})
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxOpenConns)
	db.SetConnMaxLifetime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, classify("mysqlstore: connect", err)
	}
	return &Store{cfg: cfg, db: db, log: cfg.Logger, name: mcfg.DBName}, nil
}

// DB returns the store's connection pool (for tests and operators' tools).
func (s *Store) DB() *sql.DB { return s.db }

// Database is the name of the database the DSN named.
func (s *Store) Database() string { return s.name }

// Close closes the connection pool.
func (s *Store) Close() error { return s.db.Close() }

// UseClock sets the time registry rows are stamped with (durable mode
// passes the index's clock); call it before any other method.
func (s *Store) UseClock(now func(ctx context.Context, ns string) time.Time) { s.cfg.Now = now }

var _ authority.Authority = (*Store)(nil)

// now is the time registry rows are stamped with.
func (s *Store) now(ctx context.Context, ns string) time.Time { return s.cfg.Now(ctx, ns) }
