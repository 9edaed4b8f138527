package daemon

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage/redisstore"
)

// Issue 11's reply and script bounds, end to end: a whole delayd over a
// real Redis, over gRPC.

// batchOf returns a BatchUpsertTasks of n tasks with payloads of size
// bytes, ids prefix + index, due in an hour (and later by index).
func batchOf(ns, prefix string, from, n, size int) *delaydv1.BatchUpsertTasksRequest {
	req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns}
	for i := from; i < from+n; i++ {
		req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{
			Id: fmt.Sprintf("%s%03d", prefix, i), Payload: bytes.Repeat([]byte{'x'}, size),
			When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour + time.Duration(i)*time.Second)},
		})
	}
	return req
}

// TestListTasksPagesFitOverRedis: ListTasks with page_size 1000 over 200
// tasks with 64 KiB payloads (13 MiB) answers pages of about 1 MiB with
// next_page_token, and paging through lists every task exactly once; the
// BASIC view lists them all at once without payloads. Before pages were
// cut by bytes the first call failed ResourceExhausted (a 13 MiB reply).
func TestListTasksPagesFitOverRedis(t *testing.T) {
	t.Parallel()
	ns := "bytes-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	r := start(t, Config{RedisURL: testRedisURL(), LogLevel: "warn"})
	ctx := ctxFor(t)
	const n = 200
	for from := 0; from < n; from += 50 {
		if _, err := r.tasks.BatchUpsertTasks(ctx, batchOf(ns, "t", from, 50, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	pages, token := 0, ""
	for {
		resp, err := r.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		pages++
		if size := proto.Size(resp); size > server.DefaultMaxListBytes+64<<10 || len(resp.GetTasks()) == 0 {
			t.Fatalf("page %d: %d tasks, %d bytes; want 1 or more within about %d", pages, len(resp.GetTasks()), size, server.DefaultMaxListBytes)
		}
		for _, task := range resp.GetTasks() {
			if len(task.GetPayload()) != 64<<10 {
				t.Fatalf("task %s: payload of %d bytes, want 64 KiB", task.GetId(), len(task.GetPayload()))
			}
			seen[task.GetId()]++
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(seen) != n || pages < 10 {
		t.Fatalf("listed %d distinct tasks in %d pages; want %d in 10 or more", len(seen), pages, n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("task %s listed %d times", id, c)
		}
	}
	resp, err := r.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, PageSize: 1000, View: delaydv1.TaskView_TASK_VIEW_BASIC})
	if err != nil || len(resp.GetTasks()) != n || resp.GetNextPageToken() != "" {
		t.Fatalf("BASIC view: %d tasks, next %q, %v; want %d in one page", len(resp.GetTasks()), resp.GetNextPageToken(), err, n)
	}
	for _, task := range resp.GetTasks() {
		if len(task.GetPayload()) != 0 {
			t.Fatalf("BASIC view: task %s carries a payload", task.GetId())
		}
	}
}

// TestBatchUpsertScriptsAreBoundedByBytes: a BatchUpsertTasks of about
// 4 MiB (60 payloads of 64 KiB) reaches Redis as several upsert script
// calls of at most --max-script-bytes each, read back from a private
// Redis's slow log (every command logged with its arguments). Before, it
// was one script call carrying all of it, holding Redis for its whole run.
func TestBatchUpsertScriptsAreBoundedByBytes(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	rdb := rs.Client()
	r := start(t, Config{RedisURL: rs.URL, LogLevel: "warn"})
	ns := "script-" + suffix()
	ctx := ctxFor(t)
	// One upsert first, so nothing of the start is in the log.
	if _, err := r.tasks.UpsertTask(ctx, upsert(ns, "warm-up")); err != nil {
		t.Fatal(err)
	}
	if err := rdb.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n, size = 60, 64 << 10
	resp, err := r.tasks.BatchUpsertTasks(ctx, batchOf(ns, "t", 0, n, size))
	if err != nil || len(resp.GetResults()) != n {
		t.Fatalf("BatchUpsertTasks: %d results, %v", len(resp.GetResults()), err)
	}
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// An upsert call: FCALL <upsert's function> <k> <k keys> <call head>
	// <wake channel> <ns> <count> ... (or EVALSHA <its digest> ...).
	names := redisstore.ScriptNames()
	perCall := redisstore.DefaultMaxScriptBytes / size
	calls, total := 0, 0
	for _, l := range logs {
		a := l.Args
		if len(a) < 3 || names[a[1]] != "upsert" {
			continue
		}
		k, err := strconv.Atoi(a[2])
		if err != nil || len(a) < 3+k {
			continue
		}
		argv := a[3+k:]
		w := slices.Index(argv, redisstore.DefaultWakeChannel)
		if w < 0 || len(argv) < w+3 || argv[w+1] != ns {
			continue
		}
		var count int
		if _, err := fmt.Sscan(argv[w+2], &count); err != nil {
			t.Fatalf("upsert call %v: count %q", a[:3+k], argv[w+2])
		}
		calls++
		total += count
		if count > perCall {
			t.Errorf("one upsert script call carried %d payloads of 64 KiB; want at most %d (%d bytes)", count, perCall, redisstore.DefaultMaxScriptBytes)
		}
	}
	if total != n || calls < n/perCall {
		t.Errorf("%d upsert script calls carried %d tasks; want %d tasks in at least %d calls", calls, total, n, n/perCall)
	}
}

// TestStaleUpsertDoesNotSurviveRecreate: replica B has namespace ns cached
// (its incarnation, the create time) when replica A force-deletes ns and
// re-creates it; B's next upsert, made through its stale cache, is refused
// (Aborted: re-created, nothing written), B's cache is refreshed, and the
// re-created namespace never holds the stale task; B's retry writes into
// the new namespace. Redis-only and durable mode. Before upserts were tied
// to the namespace incarnation, the stale task landed in the new namespace.
func TestStaleUpsertDoesNotSurviveRecreate(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"redis", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cfg := Config{RedisURL: testRedisURL(), LogLevel: "warn", RegistryCacheTTL: time.Hour}
			if mode == "durable" {
				cfg.MySQLDSN = testkit.Database(t, "delayd_stale")
			}
			ns := "stale-" + suffix()
			cleanNamespace(t, testRedisURL(), ns)
			a, b := start(t, cfg), start(t, cfg)
			ctx := ctxFor(t)
			adminA := delaydv1.NewNamespaceServiceClient(a.conn)
			if _, err := adminA.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			// B caches ns as it writes.
			if _, err := b.tasks.UpsertTask(ctx, upsert(ns, "before")); err != nil {
				t.Fatal(err)
			}
			if _, err := adminA.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := adminA.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			_, err := b.tasks.UpsertTask(ctx, upsert(ns, "stale"))
			if st, _ := status.FromError(err); st.Code() != codes.Aborted || !strings.Contains(st.Message(), "re-created") {
				t.Errorf("upsert through B's stale cache: %v; want Aborted saying the namespace was re-created", err)
			}
			list, err := a.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			for _, task := range list.GetTasks() {
				t.Errorf("the re-created namespace holds %q, written for the deleted one", task.GetId())
			}
			// B refreshed its cache: a retry writes into the new namespace.
			if _, err := b.tasks.UpsertTask(ctx, upsert(ns, "after")); err != nil {
				t.Fatalf("retry through B: %v", err)
			}
			if _, err := a.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "after"}); err != nil {
				t.Errorf("the retried task: %v", err)
			}
		})
	}
}

// TestDeletedNamespaceKeyCannotWriteIntoItsRecreation: a produce key of a
// namespace is deleted with it; on a replica that still caches the key and
// the old namespace, its upsert after a force delete and re-create writes
// nothing (Aborted), and its retry is Unauthenticated instead of writing
// into the new namespace: the refused write dropped the namespace's cached
// keys with it.
func TestDeletedNamespaceKeyCannotWriteIntoItsRecreation(t *testing.T) {
	t.Parallel()
	const adminKey = "stale-key-test-admin-key-0123456789abcdef"
	cfg := Config{RedisURL: testRedisURL(), LogLevel: "warn", AdminKey: adminKey, RegistryCacheTTL: time.Hour}
	ns := "stalekey-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	a, b := start(t, cfg), start(t, cfg)
	ctx := ctxFor(t)
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+adminKey)
	adminA := delaydv1.NewNamespaceServiceClient(a.conn)
	if _, err := adminA.CreateNamespace(admin, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	key, err := adminA.CreateKey(admin, &delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE}})
	if err != nil {
		t.Fatal(err)
	}
	producer := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key.GetSecret())
	if _, err := b.tasks.UpsertTask(producer, upsert(ns, "before")); err != nil {
		t.Fatal(err)
	}
	if _, err := adminA.DeleteNamespace(admin, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminA.CreateNamespace(admin, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	_, err = b.tasks.UpsertTask(producer, upsert(ns, "stale"))
	if status.Code(err) != codes.Aborted {
		t.Errorf("upsert with the deleted namespace's key through B's stale cache: %v; want Aborted", err)
	}
	_, err = b.tasks.UpsertTask(producer, upsert(ns, "retry"))
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("retry with the deleted namespace's key: %v; want Unauthenticated", err)
	}
	list, err := a.tasks.ListTasks(admin, &delaydv1.ListTasksRequest{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range list.GetTasks() {
		t.Errorf("the re-created namespace holds %q, written with the deleted namespace's key", task.GetId())
	}
}
