package daemon

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// historyEnv is a daemon with auth on, a namespace that keeps history and
// a key for it (produce + consume), and a second namespace with a key of
// its own.
type historyEnv struct {
	s                 *started
	ns, other         string
	admin, key, stray context.Context
	keyID             string
	nsAdmin           delaydv1.NamespaceServiceClient
	dlv               delaydv1.DeliveryServiceClient
}

const historyAdminKey = "history-test-admin-0123456789abcdef"

func startHistory(t *testing.T, cfg Config, pol *delaydv1.NamespacePolicy) *historyEnv {
	t.Helper()
	cfg.RedisURL, cfg.AdminKey, cfg.LogLevel = testRedisURL(), historyAdminKey, "warn"
	e := &historyEnv{ns: "hist-" + suffix(), other: "histo-" + suffix()}
	cleanNamespace(t, testRedisURL(), e.ns)
	cleanNamespace(t, testRedisURL(), e.other)
	e.s = start(t, cfg)
	ctx := ctxFor(t)
	e.admin = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+historyAdminKey)
	e.nsAdmin = delaydv1.NewNamespaceServiceClient(e.s.conn)
	e.dlv = delaydv1.NewDeliveryServiceClient(e.s.conn)
	keyFor := func(ns string, p *delaydv1.NamespacePolicy) (context.Context, string) {
		if _, err := e.nsAdmin.CreateNamespace(e.admin, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns, Policy: p}}); err != nil {
			t.Fatal(err)
		}
		k, err := e.nsAdmin.CreateKey(e.admin, &delaydv1.CreateKeyRequest{Namespace: ns,
			Scopes: []delaydv1.KeyScope{delaydv1.KeyScope_KEY_SCOPE_PRODUCE, delaydv1.KeyScope_KEY_SCOPE_CONSUME}})
		if err != nil {
			t.Fatal(err)
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+k.GetSecret()), k.GetKey().GetId()
	}
	e.key, e.keyID = keyFor(e.ns, pol)
	e.stray, _ = keyFor(e.other, pol)
	return e
}

// history reads every kept event of task id, page by page (page size 2,
// so the paging is exercised).
func (e *historyEnv) history(t *testing.T, id string) []*delaydv1.TaskEvent {
	t.Helper()
	var out []*delaydv1.TaskEvent
	token := ""
	for range 1000 {
		r, err := e.s.tasks.GetTaskHistory(e.key, &delaydv1.GetTaskHistoryRequest{Namespace: e.ns, Id: id, PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatalf("GetTaskHistory: %v", err)
		}
		if !r.GetHistoryEnabled() {
			t.Fatal("history_enabled is false for a namespace that keeps history")
		}
		out = append(out, r.GetEvents()...)
		if token = r.GetNextPageToken(); token == "" {
			return out
		}
	}
	t.Fatal("GetTaskHistory never ended its pages")
	return nil
}

func kinds(evs []*delaydv1.TaskEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.GetKind().String()[len("TASK_EVENT_KIND_"):]
	}
	return out
}

// receive waits for the next delivery of stream.
func receive(t *testing.T, stream delaydv1.DeliveryService_SubscribeClient) *delaydv1.Delivery {
	t.Helper()
	r, err := stream.Recv()
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return r.GetDelivery()
}

// runHistoryLifecycle takes one task through upsert → reschedule →
// delivery → nack → delivery → lease expiry → dead → requeue → delivery →
// ack, and checks that its history holds every event, in order, with who
// made it and when by the store's clock; that it can be read after the
// task is gone; and that another namespace's key cannot read it.
func runHistoryLifecycle(t *testing.T, cfg Config) {
	e := startHistory(t, cfg, &delaydv1.NamespacePolicy{
		HistoryRetentionBytes: 1 << 20, MaxAttempts: 2,
		AckTimeout: durationpb.New(time.Second), BackoffInitial: durationpb.New(10 * time.Millisecond),
	})
	t0 := time.Now()
	if _, err := e.s.tasks.UpsertTask(e.key, upsert(e.ns, "loan-1")); err != nil {
		t.Fatal(err)
	}
	renew := upsert(e.ns, "loan-1")
	renew.When = &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}
	if _, err := e.s.tasks.UpsertTask(e.key, renew); err != nil {
		t.Fatal(err)
	}
	stream, err := e.dlv.Subscribe(e.key, &delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	d1 := receive(t, stream)
	if _, err := e.dlv.NackTasks(e.key, &delaydv1.NackTasksRequest{Namespace: e.ns, Tokens: []string{d1.GetToken()},
		Reason: "downstream 503", RetryAfter: durationpb.New(20 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	d2 := receive(t, stream)
	if d2.GetTask().GetAttempt() != 2 {
		t.Fatalf("second delivery has attempt %d, want 2", d2.GetTask().GetAttempt())
	}
	// d2 is never acked: its lease runs out, and attempt 2 of 2 → dead.
	testkit.Eventually(t, time.Minute, "loan-1 dead", func() bool {
		got, err := e.s.tasks.GetTask(e.key, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "loan-1"})
		return err == nil && got.GetTask().GetState() == delaydv1.TaskState_TASK_STATE_DEAD
	})
	if _, err := e.nsAdmin.RequeueDeadLetters(e.admin, &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns, Ids: []string{"loan-1"}}); err != nil {
		t.Fatal(err)
	}
	d3 := receive(t, stream)
	if _, err := e.dlv.AckTasks(e.key, &delaydv1.AckTasksRequest{Namespace: e.ns, Tokens: []string{d3.GetToken()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.tasks.GetTask(e.key, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "loan-1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetTask after the ack: %v, want NotFound (the history must outlive the task)", err)
	}

	evs := e.history(t, "loan-1")
	want := []string{"UPSERTED", "RESCHEDULED", "DELIVERED", "NACKED", "DELIVERED", "LEASE_EXPIRED", "DEAD_LETTERED", "REQUEUED", "DELIVERED", "ACKED"}
	if got := kinds(evs); !slices.Equal(got, want) {
		t.Fatalf("history kinds = %v\nwant %v", got, want)
	}
	// The details each kind carries.
	check := func(i int, what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("event %d (%s): %s; event = %v", i, want[i], what, evs[i])
		}
	}
	check(0, "key id of the producer, generation 1", evs[0].GetKeyId() == e.keyID && evs[0].GetGeneration() == 1 && evs[0].GetDueTime() != nil)
	check(1, "key id, generation 2", evs[1].GetKeyId() == e.keyID && evs[1].GetGeneration() == 2)
	check(2, "attempt 1, a replica, a lateness", evs[2].GetAttempt() == 1 && evs[2].GetReplica() != "" && evs[2].GetLateness() != nil)
	check(3, "attempt 1, reason, retry_after", evs[3].GetAttempt() == 1 && evs[3].GetReason() == "downstream 503" &&
		evs[3].GetRetryAfter().AsDuration() == 20*time.Millisecond && evs[3].GetKeyId() == e.keyID)
	check(4, "attempt 2", evs[4].GetAttempt() == 2)
	check(5, "attempt 2", evs[5].GetAttempt() == 2)
	check(6, "reason lease expired", evs[6].GetReason() == "lease expired")
	check(7, "the admin key's id", evs[7].GetKeyId() == "admin-key")
	check(8, "attempt 1 again", evs[8].GetAttempt() == 1)
	check(9, "attempt 1, the key id", evs[9].GetAttempt() == 1 && evs[9].GetKeyId() == e.keyID)
	prev := t0.Add(-time.Minute)
	for i, ev := range evs {
		at := ev.GetTime().AsTime()
		check(i, "a time, not before the previous event's", ev.GetTime() != nil && !at.Before(prev) && at.Before(time.Now().Add(time.Minute)))
		prev = at
		for _, s := range []string{ev.GetKeyId(), ev.GetReason(), ev.GetReplica()} {
			if len(s) > 20 && s[:3] == "dk_" {
				t.Errorf("event %d carries what looks like a key secret: %q", i, s)
			}
		}
	}

	// The stats show this replica's recent deliveries: three, with their
	// lateness percentiles.
	st, err := e.nsAdmin.GetNamespaceStats(e.admin, &delaydv1.GetNamespaceStatsRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	if w := st.GetRecentWindow().AsDuration(); w <= 0 || st.GetRecentDeliveryRate()*w.Seconds() < 2.99 || st.GetRecentLatenessP50() == nil || st.GetRecentLatenessP99() == nil {
		t.Errorf("recent deliveries: rate %v over %v, p50 %v, p99 %v; want 3 deliveries", st.GetRecentDeliveryRate(), st.GetRecentWindow(), st.GetRecentLatenessP50(), st.GetRecentLatenessP99())
	}

	// Another namespace's key cannot read it.
	_, err = e.s.tasks.GetTaskHistory(e.stray, &delaydv1.GetTaskHistoryRequest{Namespace: e.ns, Id: "loan-1"})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("GetTaskHistory with another namespace's key: %v, want PermissionDenied", err)
	}
	// The other namespace (same task id) has no history of it.
	r, err := e.s.tasks.GetTaskHistory(e.stray, &delaydv1.GetTaskHistoryRequest{Namespace: e.other, Id: "loan-1"})
	if err != nil || len(r.GetEvents()) != 0 {
		t.Errorf("the other namespace's history of loan-1: %v, %v; want none", r.GetEvents(), err)
	}
}

// TestHistoryLifecycleRedisOnly: every event kind, in order, kept in the
// namespace's Redis stream.
func TestHistoryLifecycleRedisOnly(t *testing.T) {
	t.Parallel()
	runHistoryLifecycle(t, Config{})
}

// TestHistoryOffWritesNothing: a namespace whose policy keeps no history
// answers history_enabled false and no stream key is ever created.
func TestHistoryOffWritesNothing(t *testing.T) {
	t.Parallel()
	e := startHistory(t, Config{}, nil)
	for i := range 3 {
		if _, err := e.s.tasks.UpsertTask(e.key, upsert(e.ns, fmt.Sprint("t", i))); err != nil {
			t.Fatal(err)
		}
	}
	r, err := e.s.tasks.GetTaskHistory(e.key, &delaydv1.GetTaskHistoryRequest{Namespace: e.ns, Id: "t0"})
	if err != nil || r.GetHistoryEnabled() || len(r.GetEvents()) != 0 {
		t.Fatalf("GetTaskHistory with history off = %v, %v; want an empty page, history_enabled false", r, err)
	}
	rdb := redisClient(t)
	keys, err := rdb.Keys(context.Background(), "delayd:{"+e.ns+"#*}:history*").Result()
	if err != nil || len(keys) != 0 {
		t.Errorf("history keys with history off: %v, %v; want none", keys, err)
	}
	// The forecast counts the three tasks (due in an hour, less the
	// moments since) in hour 0 and in its last minute.
	st, err := e.nsAdmin.GetNamespaceStats(e.admin, &delaydv1.GetNamespaceStatsRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetDuePerMinute()) != 60 || len(st.GetDuePerHour()) != 24 || st.GetDuePerHour()[0] != 3 || st.GetDuePerMinute()[59] != 3 || st.GetForecastTime() == nil {
		t.Errorf("forecast: per minute %v, per hour %v, at %v; want 3 in hour 0 and minute 59", st.GetDuePerMinute(), st.GetDuePerHour(), st.GetForecastTime())
	}
}

// TestHistoryRetentionCapRedis: the stream of a namespace stays near its
// cap (history_retention_bytes / 128 events; MAXLEN ~ trims whole stream
// nodes, so somewhat more may stay), and the oldest events go first.
func TestHistoryRetentionCapRedis(t *testing.T) {
	t.Parallel()
	const capBytes = 64 << 10 // 512 events
	e := startHistory(t, Config{}, &delaydv1.NamespacePolicy{HistoryRetentionBytes: capBytes})
	for b := range 4 {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns}
		for i := range 500 {
			req.Tasks = append(req.Tasks, upsert("", fmt.Sprintf("t%d-%d", b, i)))
		}
		if _, err := e.s.tasks.BatchUpsertTasks(e.key, req); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redisClient(t)
	keys, err := rdb.Keys(context.Background(), "delayd:{"+e.ns+"#*}:history:[0-9]*[0-9]").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("history streams: %v, %v; want one", keys, err)
	}
	n, err := rdb.XLen(context.Background(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if keep := int64(capBytes / 128); n < keep || n > keep+200 {
		t.Errorf("the stream holds %d events after 2,000; want about %d (the cap)", n, keep)
	}
	if evs := e.history(t, "t0-0"); len(evs) != 0 {
		t.Errorf("the first task's events outlived the cap: %v", kinds(evs))
	}
	if evs := e.history(t, "t3-499"); !slices.Equal(kinds(evs), []string{"UPSERTED"}) {
		t.Errorf("the last task's events = %v, want [UPSERTED]", kinds(evs))
	}
}

// redisClient is a client of the test Redis, closed when t ends.
func redisClient(t *testing.T) *redis.Client {
	opt, err := redis.ParseURL(testRedisURL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestHistoryLifecycleDurable: the same lifecycle in durable mode, with
// the events kept in MySQL (delayd_task_events), none in Redis.
func TestHistoryLifecycleDurable(t *testing.T) {
	t.Parallel()
	dsn := testkit.Database(t, "delayd_hist")
	runHistoryLifecycle(t, Config{MySQLDSN: dsn})
	var n int
	if err := testkit.DB(t, dsn).QueryRow("SELECT COUNT(*) FROM delayd_task_events").Scan(&n); err != nil || n != 10 {
		t.Errorf("delayd_task_events holds %d rows (%v), want the 10 events", n, err)
	}
}
