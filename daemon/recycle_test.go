package daemon

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// recycleRounds is how many delete-and-re-create rounds
// TestRecycledNamespaceServesNothingOfItsPredecessor runs per mode.
const recycleRounds = 20

// TestRecycledNamespaceServesNothingOfItsPredecessor: a namespace that
// keeps history is force-deleted while batch upserts (of tasks due at
// once, delivered to an acking subscriber) are in flight, and re-created
// under its name at once with a key of its own. Through that key the new
// tenant reads no event of any task id the old tenant used, lists none of
// its tasks, and the stats show no recent delivery: 20 of 20 rounds, in
// Redis-only and durable mode. Before history was kept per namespace
// incarnation, events of upserts applied just before the delete landed in
// a fresh history after the delete removed the old one, and the new tenant
// read them (about half the rounds); the recent-delivery figures were the
// old namespace's (every round). Then, in durable mode, the old tenant's
// key wrote tasks into the new namespace (a key lookup in flight at the
// delete was cached for a TTL after it), and the new tenant's own key was
// answered NotFound (a "not found" read before the re-create was served
// stale); 1 or 2 rounds in 20.
func TestRecycledNamespaceServesNothingOfItsPredecessor(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"redis", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const adminKey = "recycle-test-admin-0123456789abcdef"
			cfg := Config{RedisURL: testRedisURL(), AdminKey: adminKey, LogLevel: "warn"}
			if mode == "durable" {
				cfg.MySQLDSN = testkit.Database(t, "delayd_recycle")
			}
			s := start(t, cfg)
			admin := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+adminKey)
			failed := 0
			for round := range recycleRounds {
				ns := fmt.Sprintf("recycle-%s-%d", suffix(), round)
				cleanNamespace(t, testRedisURL(), ns)
				if leaked := recycleRound(t, s, admin, ns); leaked != "" {
					failed++
					t.Errorf("round %d: %s", round, leaked)
				}
			}
			t.Logf("%s mode: %d of %d rounds served the new tenant something of the old", mode, failed, recycleRounds)
		})
	}
}

// recycleRound runs one round on namespace ns and says what the new tenant
// was served of the old ("" = nothing).
func recycleRound(t *testing.T, s *started, admin context.Context, ns string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(admin, 3*time.Minute) // a loaded machine: a round is seconds alone
	defer cancel()
	nsAdmin := delaydv1.NewNamespaceServiceClient(s.conn)
	dlv := delaydv1.NewDeliveryServiceClient(s.conn)
	pol := &delaydv1.NamespacePolicy{HistoryRetentionBytes: 1 << 20, AckTimeout: durationpb.New(30 * time.Second)}
	keyOf := func() context.Context {
		if _, err := nsAdmin.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns, Policy: pol}}); err != nil {
			t.Fatalf("create %s: %v", ns, err)
		}
		k, err := nsAdmin.CreateKey(ctx, &delaydv1.CreateKeyRequest{Namespace: ns,
			Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE, delaydv1.KeyScope_KEY_SCOPE_CONSUME}})
		if err != nil {
			t.Fatalf("create key of %s: %v", ns, err)
		}
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+k.GetSecret())
	}
	old := keyOf()

	// The old tenant: an acking subscriber, and writers of batches of
	// tasks due at once, until the namespace is gone.
	work, stop := context.WithCancel(old)
	defer stop()
	var wg sync.WaitGroup
	stream, err := dlv.Subscribe(work, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 100})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	var delivered atomic.Int64
	wg.Go(func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			delivered.Add(1)
			_, _ = dlv.AckTasks(work, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: []string{r.GetDelivery().GetToken()}})
		}
	})
	const writers, batch = 3, 20
	var mu sync.Mutex
	var ids []string
	var batches atomic.Int64
	for w := range writers {
		wg.Go(func() {
			for n := 0; work.Err() == nil; n++ {
				req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns}
				for i := range batch {
					id := fmt.Sprintf("w%d-%d-%d", w, n, i)
					req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: id, Payload: []byte("p"),
						When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}})
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
				}
				_, _ = delaydv1.NewTaskServiceClient(s.conn).BatchUpsertTasks(work, req)
				batches.Add(1)
			}
		})
	}
	// Let the old tenant work a little, with deliveries, then delete it
	// with its writes in flight and re-create it at once.
	testkit.Eventually(t, 30*time.Second, "the old tenant's first batches and deliveries", func() bool {
		return batches.Load() >= 3*writers && delivered.Load() > 0
	})
	if _, err := nsAdmin.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true}); err != nil {
		t.Fatalf("delete %s: %v", ns, err)
	}
	fresh := keyOf()
	stop()
	wg.Wait()

	// The new tenant reads the history of every id the old one used.
	mu.Lock()
	defer mu.Unlock()
	var leaked atomic.Int64
	var example atomic.Value
	jobs := make(chan string)
	var readers sync.WaitGroup
	var readErr atomic.Value
	for range 8 {
		readers.Go(func() {
			tasks := delaydv1.NewTaskServiceClient(s.conn)
			for id := range jobs {
				r, err := tasks.GetTaskHistory(fresh, &delaydv1.GetTaskHistoryRequest{Namespace: ns, Id: id})
				if err != nil {
					readErr.Store(err)
					continue
				}
				if n := len(r.GetEvents()); n > 0 {
					leaked.Add(int64(n))
					example.Store(fmt.Sprintf("%s: %v", id, r.GetEvents()[0]))
				}
			}
		})
	}
	for _, id := range ids {
		jobs <- id
	}
	close(jobs)
	readers.Wait()
	if err, _ := readErr.Load().(error); err != nil {
		t.Fatalf("GetTaskHistory as the new tenant: %v", err)
	}
	var out string
	if n := leaked.Load(); n > 0 {
		out = fmt.Sprintf("the new tenant read %d events of the old one's %d task ids (e.g. %v); ", n, len(ids), example.Load())
	}
	list, err := delaydv1.NewTaskServiceClient(s.conn).ListTasks(fresh, &delaydv1.ListTasksRequest{Namespace: ns})
	if err != nil {
		t.Fatalf("list the new %s: %v", ns, err)
	}
	if n := len(list.GetTasks()); n > 0 {
		out += fmt.Sprintf("the new namespace holds %d of the old one's tasks (e.g. %s); ", n, list.GetTasks()[0].GetId())
	}
	st, err := nsAdmin.GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: ns})
	if err != nil {
		t.Fatalf("stats of the new %s: %v", ns, err)
	}
	if st.GetRecentDeliveryRate() != 0 || st.GetRecentLatenessP50() != nil {
		out += fmt.Sprintf("the new namespace's stats show recent deliveries (rate %v/s, p50 %v) though it delivered none (the old one delivered %d)",
			st.GetRecentDeliveryRate(), st.GetRecentLatenessP50(), delivered.Load())
	}
	return out
}

// TestDeletedNamespaceSeriesLeaveMetrics: a namespace with upserts on two
// replicas and deliveries to a subscriber of the second is force-deleted
// through the first. The deleting replica's /metrics has none of its
// per-namespace series at once; the other replica's has none within its
// sweep interval (the stream it served ends, its gauge counts down, and
// the scrape drops what the registry no longer has); the name re-created,
// neither shows the old one's counts. Before, every series of a deleted
// namespace stayed in /metrics for the life of the process, and a
// namespace re-created under the name continued the old counters.
func TestDeletedNamespaceSeriesLeaveMetrics(t *testing.T) {
	t.Parallel()
	cfg := Config{RedisURL: testRedisURL(), LogLevel: "warn", OpsListen: "127.0.0.1:0"}
	ns := "gone-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	a, b := start(t, cfg), start(t, cfg)
	// Not ctxFor's 20 s: the calls after the 45 s wait below use it too,
	// and on a loaded machine the wait (the other replica's sweep, the
	// index read every 10 s) ran past 20 s, so the re-create failed with
	// DeadlineExceeded instead of checking anything.
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancelAll)
	admin := delaydv1.NewNamespaceServiceClient(a.conn)
	if _, err := admin.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	sub, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := delaydv1.NewDeliveryServiceClient(b.conn).Subscribe(sub, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range []*started{a, b} {
		now := upsert(ns, fmt.Sprint("t", i))
		now.When = &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}
		if _, err := s.tasks.UpsertTask(ctx, now); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	series := func(s *started) []string {
		code, body := httpGet(t, "http://"+s.d.OpsAddr()+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics = %d", code)
		}
		var out []string
		for _, l := range strings.Split(body, "\n") {
			if strings.Contains(l, `namespace="`+ns+`"`) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
			}
		}
		return out
	}
	latenessOf := `delayd_delivery_lateness_seconds_count{namespace="` + ns + `"} 2`
	waitFor(t, "b's lateness series to count both deliveries", func() bool { return slices.Contains(series(b), latenessOf) })
	if got := series(a); len(got) == 0 {
		t.Fatal("a has no series of the namespace before the delete")
	}

	if _, err := admin.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true}); err != nil {
		t.Fatal(err)
	}
	for _, l := range series(a) {
		if !strings.HasPrefix(l, "delayd_tasks") { // read from the index every 10 s (TaskCounts)
			t.Errorf("right after the delete, the deleting replica still serves %s", l)
		}
	}
	testkit.Eventually(t, 45*time.Second, "every series of the deleted namespace to leave both replicas' /metrics", func() bool {
		return len(series(a)) == 0 && len(series(b)) == 0
	})
	if _, err := admin.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*started{a, b} {
		for _, l := range series(s) {
			t.Errorf("the re-created namespace shows %s", l)
		}
	}
}
