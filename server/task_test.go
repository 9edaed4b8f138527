package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/delayd/delayd/dispatcher"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// TaskService tests: every RPC over real gRPC on loopback TCP, backed by the
// real Redis (TEST_REDIS_URL). Each test has its own namespace.

// countingTasks is the real store with a count of Upsert calls (it
// delegates every call; nothing is faked).
type countingTasks struct {
	storage.Store
	upserts atomic.Int32
}

func (c *countingTasks) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	c.upserts.Add(1)
	return c.Store.Upsert(ctx, ns, specs)
}

// tskEnv is one delayd server (dispatcher + gRPC server over the real
// Redis store) on 127.0.0.1:0, a client, and a fresh namespace.
type tskEnv struct {
	ns     string
	clock  *storagefake.Store
	store  *countingTasks
	tasks  delaydv1.TaskServiceClient
	conn   *grpc.ClientConn
	server *server.Server
}

type tskOpts struct {
	limits     server.Limits
	policy     *storage.Policy // nil: storage.DefaultPolicy
	reflection bool
}

func newTskEnv(t *testing.T, o tskOpts) *tskEnv {
	t.Helper()
	store := storagefake.New(nil)
	pol := storage.DefaultPolicy()
	if o.policy != nil {
		pol = *o.policy
	}
	pols := storage.StaticPolicies{P: pol}
	d, err := dispatcher.New(dispatcher.Config{Store: store, Wakeups: store, Policies: pols})
	if err != nil {
		t.Fatal(err)
	}
	e := &tskEnv{ns: "tsk-" + testkit.Suffix(), clock: store, store: &countingTasks{Store: store}}
	e.server, err = server.New(server.Options{
		Store: e.store, Tenancy: staticTenancy{policy: pol}, Subscriptions: d, History: store,
		Schedules: newScheduler(t, store, staticTenancy{policy: pol}),
		Auth:      guard.AuthOptions{Disabled: true}, Limits: o.limits, Reflection: o.reflection,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = e.server.Serve(lis)
	}()
	e.server.SetServing(true)
	e.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.tasks = delaydv1.NewTaskServiceClient(e.conn)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = e.conn.Close()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("dispatcher Stop: %v", err)
		}
		if err := e.server.GracefulStop(ctx); err != nil {
			t.Errorf("GracefulStop: %v", err)
		}
		<-served
	})
	return e
}

func tskCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func inDelay(d time.Duration) *delaydv1.UpsertTaskRequest_Delay {
	return &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(d)}
}

func atTime(t time.Time) *delaydv1.UpsertTaskRequest_DueTime {
	return &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(t)}
}

// redisNow is the store's clock, which decides due-ness.
func (e *tskEnv) redisNow(*testing.T) time.Time { return e.clock.Now() }

// wantStatus fails t unless err has code and its message starts with prefix.
func wantStatus(t *testing.T, err error, code codes.Code, prefix string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.HasPrefix(st.Message(), prefix) {
		t.Fatalf("got %v %q; want %v starting with %q", st.Code(), st.Message(), code, prefix)
	}
}

func TestUpsertTaskWithDelayThenGet(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)

	before := e.redisNow(t)
	resp, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{
		Namespace: e.ns, Id: "order-1", Kind: "order.close", Payload: []byte(`{"order":1}`), When: inDelay(30 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	after := e.redisNow(t)
	task := resp.GetTask()
	if !resp.GetCreated() || task.GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED || task.GetGeneration() != 1 ||
		task.GetAttempt() != 0 || task.GetNamespace() != e.ns || task.GetId() != "order-1" || task.GetKind() != "order.close" ||
		string(task.GetPayload()) != `{"order":1}` {
		t.Fatalf("upsert response = %v", resp)
	}
	// The delay is resolved with the store's clock: due = store now + 30 s,
	// rounded up to the millisecond (never early).
	due := task.GetDueTime().AsTime()
	if due.Before(before.Add(30*time.Second)) || due.After(after.Add(30*time.Second).Truncate(time.Millisecond).Add(time.Millisecond)) {
		t.Fatalf("due_time %v not within Redis [%v, %v] + 30s", due, before, after)
	}
	if task.GetCreateTime() == nil || task.GetUpdateTime() == nil {
		t.Fatalf("create_time/update_time unset: %v", task)
	}

	got, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !got.GetTask().GetDueTime().AsTime().Equal(due) || string(got.GetTask().GetPayload()) != `{"order":1}` ||
		got.GetTask().GetGeneration() != 1 || got.GetTask().GetKind() != "order.close" {
		t.Fatalf("GetTask = %v, want the upserted task", got.GetTask())
	}
}

func TestUpsertTaskReplacesWithDueTime(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)

	if _, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "loan.7", Payload: []byte("v1"), When: inDelay(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(48 * time.Hour).Truncate(time.Millisecond)
	resp, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "loan.7", Kind: "loan.overdue", Payload: []byte("v2"), When: atTime(due)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCreated() || resp.GetTask().GetGeneration() != 2 || !resp.GetTask().GetDueTime().AsTime().Equal(due) ||
		string(resp.GetTask().GetPayload()) != "v2" || resp.GetTask().GetKind() != "loan.overdue" {
		t.Fatalf("replace = %v, want created=false generation 2 due %v payload v2", resp, due)
	}
	got, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "loan.7"})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetTask().GetGeneration() != 2 || string(got.GetTask().GetPayload()) != "v2" {
		t.Fatalf("GetTask after replace = %v", got.GetTask())
	}
}

func TestBatchUpsertTasksPerItemResults(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)

	resp, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: "a", Payload: []byte("1"), When: inDelay(time.Minute)},
		{Id: "bad id!", When: inDelay(time.Minute)},
		{Namespace: e.ns, Id: "b", When: inDelay(2 * time.Minute)},
		{Id: "c", When: inDelay(-time.Second)},
		{Id: "a", Payload: []byte("2"), When: inDelay(3 * time.Minute)}, // replaces item 0
		{Namespace: "someone-else", Id: "d", When: inDelay(time.Minute)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rs := resp.GetResults()
	if len(rs) != 6 {
		t.Fatalf("%d results, want 6", len(rs))
	}
	if n := e.store.upserts.Load(); n != 1 {
		t.Fatalf("%d store Upsert calls for one batch, want 1", n)
	}
	type want struct {
		created bool
		gen     int64
		errCode codes.Code
		errMsg  string // prefix
	}
	wants := []want{
		{created: true, gen: 1},
		{errCode: codes.InvalidArgument, errMsg: "tasks[1].id has ' ' at position 3"},
		{created: true, gen: 1},
		{errCode: codes.InvalidArgument, errMsg: "tasks[3].delay is -1s; it must not be negative"},
		{created: false, gen: 2},
		{errCode: codes.InvalidArgument, errMsg: `tasks[5].namespace is "someone-else"; it must be empty or equal the batch namespace`},
	}
	for i, w := range wants {
		r := rs[i]
		if w.errCode != codes.OK {
			if r.GetTask() != nil || codes.Code(r.GetError().GetCode()) != w.errCode || !strings.HasPrefix(r.GetError().GetMessage(), w.errMsg) {
				t.Errorf("result %d = %v, want error %v %q", i, r, w.errCode, w.errMsg)
			}
			continue
		}
		if r.GetError() != nil || r.GetCreated() != w.created || r.GetTask().GetGeneration() != w.gen {
			t.Errorf("result %d = %v, want created=%v generation %d", i, r, w.created, w.gen)
		}
	}
	got, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "a"})
	if err != nil || string(got.GetTask().GetPayload()) != "2" {
		t.Fatalf("task a after batch = %v, %v; want the later item's payload", got, err)
	}
	for _, id := range []string{"c", "d"} {
		if _, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: id}); status.Code(err) != codes.NotFound {
			t.Errorf("invalid item %q was stored: %v", id, err)
		}
	}
}

func TestBatchUpsertAllInvalidCallsNoStore(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	resp, err := e.tasks.BatchUpsertTasks(tskCtx(t), &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: ""}, {Id: "x"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n := e.store.upserts.Load(); n != 0 {
		t.Fatalf("%d store calls for a batch without a valid item", n)
	}
	for i, r := range resp.GetResults() {
		if codes.Code(r.GetError().GetCode()) != codes.InvalidArgument || !strings.HasPrefix(r.GetError().GetMessage(), fmt.Sprintf("tasks[%d].", i)) {
			t.Errorf("result %d = %v", i, r)
		}
	}
}

func TestRemoveTask(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	if _, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "dev-9", When: inDelay(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "dev-9"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetRemoved() || resp.GetPreviousState() != delaydv1.TaskState_TASK_STATE_SCHEDULED {
		t.Fatalf("remove = %v, want removed from SCHEDULED", resp)
	}
	_, err = e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "dev-9"})
	wantStatus(t, err, codes.NotFound, `task "dev-9" not found in namespace "`+e.ns+`"`)

	// Removing again is not an error.
	resp, err = e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "dev-9"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRemoved() || resp.GetPreviousState() != delaydv1.TaskState_TASK_STATE_UNSPECIFIED {
		t.Fatalf("second remove = %v, want removed=false", resp)
	}
}

func TestGetTaskNotFound(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	_, err := e.tasks.GetTask(tskCtx(t), &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "never"})
	wantStatus(t, err, codes.NotFound, `task "never" not found in namespace "`+e.ns+`"`)
}

func TestListTasksPagesInDueOrder(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)

	// 25 tasks, upserted in reverse due order so list order is the store's.
	base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	var items []*delaydv1.UpsertTaskRequest
	for i := 24; i >= 0; i-- {
		items = append(items, &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("t%02d", i), When: atTime(base.Add(time.Duration(i) * time.Second))})
	}
	if _, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: items}); err != nil {
		t.Fatal(err)
	}

	var ids []string
	var pages []int
	token := ""
	for range 10 {
		resp, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns, PageSize: 10, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, len(resp.GetTasks()))
		for _, task := range resp.GetTasks() {
			if task.GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED {
				t.Fatalf("listed %v", task)
			}
			ids = append(ids, task.GetId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		if ids[0] == "t00" && len(ids) == 10 {
			// A token is bound to its namespace and state.
			_, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns + "x", PageToken: token})
			wantStatus(t, err, codes.InvalidArgument, "page_token was issued for another namespace or state")
			_, err = e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns, State: delaydv1.TaskState_TASK_STATE_DEAD, PageToken: token})
			wantStatus(t, err, codes.InvalidArgument, "page_token was issued for another namespace or state")
		}
	}
	if len(ids) != 25 {
		t.Fatalf("listed %d tasks over pages %v, want 25", len(ids), pages)
	}
	for i, id := range ids {
		if id != fmt.Sprintf("t%02d", i) {
			t.Fatalf("list order %v, want due order t00..t24", ids)
		}
	}
	if pages[0] != 10 || pages[1] != 10 {
		t.Fatalf("page sizes %v, want 10, 10, ...", pages)
	}

	// Other states are empty; page_size 0 means 100.
	dead, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns, State: delaydv1.TaskState_TASK_STATE_DEAD})
	if err != nil || len(dead.GetTasks()) != 0 || dead.GetNextPageToken() != "" {
		t.Fatalf("dead list = %v, %v; want empty", dead, err)
	}
	all, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns})
	if err != nil || len(all.GetTasks()) != 25 || all.GetNextPageToken() != "" {
		t.Fatalf("default page = %d tasks, token %q, %v; want all 25 and no token", len(all.GetTasks()), all.GetNextPageToken(), err)
	}
}

func TestListTasksDefaultPageSizeIs100(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	items := make([]*delaydv1.UpsertTaskRequest, 130)
	for i := range items {
		items[i] = &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("p%03d", i), When: inDelay(time.Hour)}
	}
	if _, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: items}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTasks()) != 100 || resp.GetNextPageToken() == "" {
		t.Fatalf("page of %d tasks, token %q; want 100 and a token", len(resp.GetTasks()), resp.GetNextPageToken())
	}
	rest, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: e.ns, PageToken: resp.GetNextPageToken()})
	if err != nil || len(rest.GetTasks()) != 30 {
		t.Fatalf("second page = %d tasks, %v; want 30", len(rest.GetTasks()), err)
	}
}

// TestInvalidArguments sends bad input for each validation rule to each RPC
// it applies to: the answer is InvalidArgument naming the field and what is
// allowed, and nothing reaches the store.
func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	pol := storage.DefaultPolicy()
	pol.MaxPayloadBytes = 16
	e := newTskEnv(t, tskOpts{limits: server.Limits{MaxBatch: 3}, policy: &pol})
	ns := e.ns
	long := strings.Repeat("n", 64)
	ok := func(id string) *delaydv1.UpsertTaskRequest {
		return &delaydv1.UpsertTaskRequest{Id: id, When: inDelay(time.Second)}
	}
	up := func(r *delaydv1.UpsertTaskRequest) func(context.Context) error {
		if r.Namespace == "" {
			r.Namespace = ns
		}
		return func(ctx context.Context) error { _, err := e.tasks.UpsertTask(ctx, r); return err }
	}
	tests := []struct {
		name string
		call func(context.Context) error
		want string // message prefix: the field, then what is wrong
	}{
		{"upsert namespace empty", func(ctx context.Context) error {
			_, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Id: "a", When: inDelay(0)})
			return err
		}, "namespace is required: 1-63 characters of [a-z0-9_-]"},
		{"upsert namespace upper case", up(&delaydv1.UpsertTaskRequest{Namespace: "Orders", Id: "a", When: inDelay(0)}), "namespace has 'O' at position 0; allowed: [a-z0-9][a-z0-9_-]{0,62}"},
		{"upsert namespace hash tag", up(&delaydv1.UpsertTaskRequest{Namespace: "a{b}", Id: "a", When: inDelay(0)}), "namespace has '{' at position 1"},
		{"upsert namespace too long", up(&delaydv1.UpsertTaskRequest{Namespace: long, Id: "a", When: inDelay(0)}), "namespace is 64 characters long; at most 63"},
		{"upsert id empty", up(&delaydv1.UpsertTaskRequest{When: inDelay(0)}), "id is required: 1-128 characters of [A-Za-z0-9._-]"},
		{"upsert id colon", up(&delaydv1.UpsertTaskRequest{Id: "a:b", When: inDelay(0)}), "id has ':' at position 1; allowed: 1-128 characters of [A-Za-z0-9._-]"},
		{"upsert id too long", up(&delaydv1.UpsertTaskRequest{Id: strings.Repeat("i", 129), When: inDelay(0)}), "id is 129 characters long; at most 128"},
		{"upsert kind too long", up(&delaydv1.UpsertTaskRequest{Id: "a", Kind: strings.Repeat("k", 129), When: inDelay(0)}), "kind is 129 characters long; at most 128 printable characters"},
		{"upsert kind control char", up(&delaydv1.UpsertTaskRequest{Id: "a", Kind: "order\nclose", When: inDelay(0)}), "kind has the non-printable character U+000A"},
		{"upsert payload too big", up(&delaydv1.UpsertTaskRequest{Id: "a", Payload: make([]byte, 17), When: inDelay(0)}), "payload is 17 bytes; at most 16 bytes"},
		{"upsert no when", up(&delaydv1.UpsertTaskRequest{Id: "a"}), "due_time or delay is required: set exactly one of them"},
		{"upsert negative delay", up(&delaydv1.UpsertTaskRequest{Id: "a", When: inDelay(-time.Minute)}), "delay is -1m0s; it must not be negative"},
		{"upsert delay past horizon", up(&delaydv1.UpsertTaskRequest{Id: "a", When: inDelay(367 * 24 * time.Hour)}), "delay is 367 days; at most 366 days"},
		{"upsert due past horizon", up(&delaydv1.UpsertTaskRequest{Id: "a", When: atTime(time.Now().Add(400 * 24 * time.Hour))}), "due_time is " + time.Now().Add(400*24*time.Hour).UTC().Format("2006-01-02")},
		{"upsert due invalid", up(&delaydv1.UpsertTaskRequest{Id: "a", When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: &timestamppb.Timestamp{Seconds: 1 << 40}}}), "due_time is not a valid timestamp"},
		{"batch namespace", func(ctx context.Context) error {
			_, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: "-x", Tasks: []*delaydv1.UpsertTaskRequest{ok("a")}})
			return err
		}, "namespace has '-' at position 0"},
		{"batch empty", func(ctx context.Context) error {
			_, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: ns})
			return err
		}, "tasks is empty; 1-3 items are allowed"},
		{"batch too big", func(ctx context.Context) error {
			_, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: []*delaydv1.UpsertTaskRequest{ok("a"), ok("b"), ok("c"), ok("d")}})
			return err
		}, "tasks has more than 3 items; at most 3 are allowed"},
		{"remove namespace", func(ctx context.Context) error {
			_, err := e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Id: "a"})
			return err
		}, "namespace is required"},
		{"remove id", func(ctx context.Context) error {
			_, err := e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: ns, Id: "a b"})
			return err
		}, "id has ' ' at position 1"},
		{"get namespace", func(ctx context.Context) error {
			_, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: "ns:1", Id: "a"})
			return err
		}, "namespace has ':' at position 2"},
		{"get id", func(ctx context.Context) error {
			_, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns})
			return err
		}, "id is required"},
		{"list namespace", func(ctx context.Context) error {
			_, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: long})
			return err
		}, "namespace is 64 characters long"},
		{"list page_size negative", func(ctx context.Context) error {
			_, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, PageSize: -1})
			return err
		}, "page_size is -1; allowed: 1-1000, or 0 for 100"},
		{"list page_size too big", func(ctx context.Context) error {
			_, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, PageSize: 1001})
			return err
		}, "page_size is 1001; allowed: 1-1000"},
		{"list state", func(ctx context.Context) error {
			_, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, State: 9})
			return err
		}, "state is 9; allowed: TASK_STATE_SCHEDULED, TASK_STATE_DELIVERED, TASK_STATE_DEAD"},
		{"list page_token", func(ctx context.Context) error {
			_, err := e.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, PageToken: "garbage"})
			return err
		}, "page_token is not a token this server issued"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantStatus(t, tt.call(tskCtx(t)), codes.InvalidArgument, tt.want)
		})
	}
	if n := e.store.upserts.Load(); n != 0 {
		t.Fatalf("%d invalid upserts reached the store", n)
	}
}

func TestMaxMessageBytes(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{limits: server.Limits{MaxMessageBytes: 1024}})
	_, err := e.tasks.UpsertTask(tskCtx(t), &delaydv1.UpsertTaskRequest{
		Namespace: e.ns, Id: "big", Payload: bytes.Repeat([]byte("x"), 2048), When: inDelay(0),
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("2 KiB message to a 1 KiB limit: %v, want ResourceExhausted", err)
	}
}
