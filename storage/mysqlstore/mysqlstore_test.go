package mysqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/mysqlstore"
	"github.com/delayd/delayd/storage/registrytest"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// TestRegistryConformance runs the shared registry suite against the MySQL
// registry, each subtest on a database of its own (the suite lists every
// namespace).
func TestRegistryConformance(t *testing.T) {
	registrytest.Run(t, func(t *testing.T) storage.Registry {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := mysqlstore.Open(ctx, mysqlstore.Config{DSN: testkit.Database(t, "delayd_test"), Logger: testkit.Logger(t)})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestMigrateIdempotent: migrating again changes nothing, and a schema left
// dirty by a failed migration is repaired.
func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	dsn := testkit.Database(t, "delayd_test")
	ctx := context.Background()
	for range 2 {
		if err := mysqlstore.Migrate(ctx, dsn, nil); err != nil {
			t.Fatal(err)
		}
	}
	db := testkit.DB(t, dsn)
	if _, err := db.Exec("UPDATE delayd_schema_migrations SET dirty = 1"); err != nil {
		t.Fatal(err)
	}
	if err := mysqlstore.Migrate(ctx, dsn, nil); err != nil {
		t.Fatalf("migrate a dirty schema: %v", err)
	}
	var version, dirty int
	if err := db.QueryRow("SELECT version, dirty FROM delayd_schema_migrations").Scan(&version, &dirty); err != nil {
		t.Fatal(err)
	}
	if version != mysqlstore.SchemaVersion || dirty != 0 {
		t.Fatalf("schema version %d dirty %d, want %d clean", version, dirty, mysqlstore.SchemaVersion)
	}
}
