package daemon

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// ownDatabase creates an empty MySQL database on the test server and drops
// it when t ends; it returns its DSN.
func ownDatabase(t *testing.T) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testkit.MySQLDSN())
	if err != nil {
		t.Fatalf("TEST_MYSQL_DSN: %v", err)
	}
	name := "delayd_import_" + suffix()
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database (MySQL must answer at TEST_MYSQL_DSN): %v", err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP DATABASE " + name)
		_ = db.Close()
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// A Redis-only deployment switched to durable mode keeps its namespaces
// (with their policies) and its API keys (the same secrets), against a real
// Redis and MySQL; the copy is made once, so a namespace deleted in durable
// mode does not come back on the next start.
func TestDurableStartImportsTheRedisOnlyRegistry(t *testing.T) {
	t.Parallel()
	const adminKey = "import-test-admin-key-0123456789"
	rds := testkit.StartRedis(t) // its own Redis: the registry is global to a Redis
	dsn := ownDatabase(t)
	ctx := ctxFor(t)
	as := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	}
	stop := func(s *started) {
		t.Helper()
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.d.Stop(sctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
	}

	// Redis-only: a namespace with a policy, a namespace key, a global key.
	redisOnly := start(t, Config{RedisURL: rds.URL, AdminKey: adminKey})
	admin := delaydv1.NewNamespaceServiceClient(redisOnly.conn)
	for _, ns := range []string{"imp-orders", "imp-loans"} {
		if _, err := admin.CreateNamespace(as(adminKey), &delaydv1.CreateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{MaxAttempts: 7}},
		}); err != nil {
			t.Fatalf("CreateNamespace(%s): %v", ns, err)
		}
	}
	nsKey, err := admin.CreateKey(as(adminKey), &delaydv1.CreateKeyRequest{Namespace: "imp-orders", Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE}})
	if err != nil {
		t.Fatal(err)
	}
	globalKey, err := admin.CreateKey(as(adminKey), &delaydv1.CreateKeyRequest{Namespace: "*", Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_ADMIN}})
	if err != nil {
		t.Fatal(err)
	}
	stop(redisOnly)

	// First durable start over that Redis: everything is there.
	durable := start(t, Config{RedisURL: rds.URL, MySQLDSN: dsn, AdminKey: adminKey})
	if !strings.Contains(durable.log.String(), "copied the Redis-only registry into MySQL") {
		t.Errorf("the first durable start did not log the import:\n%s", durable.log.String())
	}
	admin = delaydv1.NewNamespaceServiceClient(durable.conn)
	got, err := admin.GetNamespace(as(globalKey.GetSecret()), &delaydv1.GetNamespaceRequest{Namespace: "imp-orders"})
	if err != nil {
		t.Fatalf("GetNamespace with the imported global key: %v", err)
	}
	if got.GetNamespace().GetPolicy().GetMaxAttempts() != 7 {
		t.Errorf("imported policy max_attempts = %d, want 7", got.GetNamespace().GetPolicy().GetMaxAttempts())
	}
	if _, err := durable.tasks.UpsertTask(as(nsKey.GetSecret()), upsert("imp-orders", "t1")); err != nil {
		t.Fatalf("upsert with the imported namespace key: %v", err)
	}
	keys, err := admin.ListKeys(as(adminKey), &delaydv1.ListKeysRequest{Namespace: "imp-orders"})
	if err != nil || len(keys.GetKeys()) != 1 || keys.GetKeys()[0].GetId() != nsKey.GetKey().GetId() {
		t.Errorf("ListKeys(imp-orders) = %v, %v; want the one imported key %s", keys, err, nsKey.GetKey().GetId())
	}
	if _, err := admin.DeleteNamespace(as(adminKey), &delaydv1.DeleteNamespaceRequest{Namespace: "imp-loans"}); err != nil {
		t.Fatalf("DeleteNamespace(imp-loans) in durable mode: %v", err)
	}
	stop(durable)

	// The next durable start copies nothing again: the deletion stands.
	again := start(t, Config{RedisURL: rds.URL, MySQLDSN: dsn, AdminKey: adminKey})
	_, err = delaydv1.NewNamespaceServiceClient(again.conn).GetNamespace(as(adminKey), &delaydv1.GetNamespaceRequest{Namespace: "imp-loans"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("GetNamespace(imp-loans) after a restart = %v, want NotFound: a deleted namespace came back from the Redis registry", err)
	}
	if strings.Contains(again.log.String(), "copied the Redis-only registry") {
		t.Errorf("the second durable start imported again:\n%s", again.log.String())
	}
}
