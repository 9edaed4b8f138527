package mysqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"

	"github.com/go-sql-driver/mysql"
	"github.com/golang-migrate/migrate/v4"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

// migrationFS holds the schema: migrations/NNNN_name.up.sql, applied in
// order. Every migration is idempotent (CREATE ... IF NOT EXISTS and the
// like), so re-applying one after a crash half way through is safe.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// SchemaVersion is the schema version this binary migrates a database to.
const SchemaVersion = 7

// migrationsTable is golang-migrate's bookkeeping table.
const migrationsTable = "delayd_schema_migrations"

// Migrate applies the embedded migrations to the database dsn names (a
// go-sql-driver/mysql DSN, user:pass@tcp(host:port)/db) up to
// SchemaVersion. It is idempotent: a database already at SchemaVersion is
// left alone. Replicas starting at once serialize on a MySQL advisory lock
// (GET_LOCK), so it is safe to call from every replica. A database left
// dirty by a migration that failed half way is re-migrated from the version
// before (every migration is idempotent). A database newer than this binary
// is an error.
func Migrate(ctx context.Context, dsn string, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("migrate: parse dsn: %w", err)
	}
	// Migration files hold several statements; the store's own pool never
	// sets this.
	cfg.MultiStatements = true
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return classify("migrate: connect", err)
	}

	src, err := iofs.New(migrationFS, "migrations")
	if err != nil {
		return fmt.Errorf("migrate: read embedded migrations: %w", err)
	}
	drv, err := migratemysql.WithInstance(db, &migratemysql.Config{MigrationsTable: migrationsTable})
	if err != nil {
		return classify("migrate: open", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "mysql", drv)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer m.Close()

	// golang-migrate takes no context: stop it gracefully when ctx ends.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			m.GracefulStop <- true
		case <-done:
		}
	}()

	from, dirty, err := m.Version()
	switch {
	case errors.Is(err, migrate.ErrNilVersion):
		from = 0
	case err != nil:
		return classify("migrate: read version", err)
	}
	if from > SchemaVersion {
		return fmt.Errorf("migrate: database schema is version %d, newer than this binary's %d: upgrade delayd", from, SchemaVersion)
	}
	if dirty {
		// The migration to `from` failed half way. Ours are idempotent,
		// so run it again from the version before.
		logger.Warn("mysql schema is dirty; re-applying the last migration", "version", from)
		prev := int(from) - 1
		if prev == 0 {
			prev = -1 // golang-migrate's "no version"
		}
		if err := m.Force(prev); err != nil {
			return classify("migrate: reset dirty version", err)
		}
	}
	if err := m.Migrate(SchemaVersion); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return classify("migrate: apply", err)
	}
	if from < SchemaVersion || dirty {
		logger.Info("mysql schema migrated", "from", from, "to", SchemaVersion)
	}
	return ctx.Err()
}
