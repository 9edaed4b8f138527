package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Conditional writes (create_only, if_generation) and RemoveTasks over
// gRPC, backed by the real Redis store.

// conflictDetails returns the ErrorInfo and the task a conflict status
// carries (task nil when it carries none), failing t unless err has code.
func conflictDetails(t *testing.T, err error, code codes.Code, reason string) (*errdetails.ErrorInfo, *delaydv1.Task) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("got %v %q; want %v", st.Code(), st.Message(), code)
	}
	var info *errdetails.ErrorInfo
	var task *delaydv1.Task
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *delaydv1.Task:
			task = d
		default:
			t.Errorf("unexpected detail %T", d)
		}
	}
	if info == nil || info.GetReason() != reason || info.GetDomain() != "delayd.v1" {
		t.Fatalf("ErrorInfo = %v, want reason %s in domain delayd.v1", info, reason)
	}
	return info, task
}

func TestUpsertTaskCreateOnly(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	req := &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "order-1", Payload: []byte("close"), When: inDelay(time.Hour), CreateOnly: true}
	first, err := e.tasks.UpsertTask(ctx, req)
	if err != nil || !first.GetCreated() {
		t.Fatalf("first create-only = %v, %v; want created", first, err)
	}
	// The producer timed out and retries later: the due time must not move.
	time.Sleep(5 * time.Millisecond)
	_, err = e.tasks.UpsertTask(ctx, req)
	info, task := conflictDetails(t, err, codes.AlreadyExists, "TASK_EXISTS")
	if info.GetMetadata()["generation"] != "1" {
		t.Errorf("metadata = %v, want generation 1", info.GetMetadata())
	}
	if task.GetId() != "order-1" || !task.GetDueTime().AsTime().Equal(first.GetTask().GetDueTime().AsTime()) {
		t.Errorf("detail task = %v, want the first one (due %v)", task, first.GetTask().GetDueTime().AsTime())
	}
	got, err := e.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "order-1"})
	if err != nil || got.GetTask().GetGeneration() != 1 || !got.GetTask().GetDueTime().AsTime().Equal(first.GetTask().GetDueTime().AsTime()) {
		t.Fatalf("get = %v, %v; want generation 1 at the first due time", got, err)
	}
}

func TestIfGeneration(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	up := func(gen int64, payload string) (*delaydv1.UpsertTaskResponse, error) {
		return e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "loan-7", Payload: []byte(payload), When: inDelay(time.Hour), IfGeneration: gen})
	}

	// No task yet: FAILED_PRECONDITION at generation 0, no task detail.
	_, err := up(1, "x")
	info, task := conflictDetails(t, err, codes.FailedPrecondition, "GENERATION_MISMATCH")
	if info.GetMetadata()["generation"] != "0" || info.GetMetadata()["expected"] != "1" || task != nil {
		t.Errorf("missing task: metadata %v, task %v; want generation 0, expected 1, no task", info.GetMetadata(), task)
	}

	if _, err := up(0, "borrowed"); err != nil {
		t.Fatal(err)
	}
	renewed, err := up(1, "renewed")
	if err != nil || renewed.GetTask().GetGeneration() != 2 {
		t.Fatalf("renew at generation 1 = %v, %v; want generation 2", renewed, err)
	}
	_, err = up(1, "stale renew")
	info, task = conflictDetails(t, err, codes.FailedPrecondition, "GENERATION_MISMATCH")
	if info.GetMetadata()["generation"] != "2" || info.GetMetadata()["expected"] != "1" || string(task.GetPayload()) != "renewed" {
		t.Errorf("stale renew: metadata %v, task %v; want generation 2, expected 1, the renewed task", info.GetMetadata(), task)
	}

	// The return saw generation 1: refused, the renewed loan stays.
	_, err = e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "loan-7", IfGeneration: 1})
	info, task = conflictDetails(t, err, codes.FailedPrecondition, "GENERATION_MISMATCH")
	if info.GetMetadata()["generation"] != "2" || task.GetGeneration() != 2 {
		t.Errorf("stale return: metadata %v, task %v; want generation 2", info.GetMetadata(), task)
	}
	resp, err := e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "loan-7", IfGeneration: 2})
	if err != nil || !resp.GetRemoved() {
		t.Fatalf("return at generation 2 = %v, %v; want removed", resp, err)
	}
	// Gone: a conditional remove answers removed=false, as an unconditional one.
	resp, err = e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "loan-7", IfGeneration: 2})
	if err != nil || resp.GetRemoved() {
		t.Fatalf("second return = %v, %v; want removed=false", resp, err)
	}
}

func TestBatchUpsertConditionalItems(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	if _, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "a", Payload: []byte("old"), When: inDelay(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: "a", Payload: []byte("new"), When: inDelay(time.Hour), CreateOnly: true},
		{Id: "a", Payload: []byte("new"), When: inDelay(time.Hour), IfGeneration: 7},
		{Id: "b", When: inDelay(time.Hour), IfGeneration: 1},
		{Id: "c", When: inDelay(time.Hour), CreateOnly: true},
		{Id: "a", When: inDelay(time.Hour), IfGeneration: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResults()
	if r[0].GetError().GetCode() != int32(codes.AlreadyExists) || string(r[0].GetTask().GetPayload()) != "old" {
		t.Errorf("create-only of an existing id = %v, want code 6 with the existing task", r[0])
	}
	if r[1].GetError().GetCode() != int32(codes.FailedPrecondition) || r[1].GetTask().GetGeneration() != 1 {
		t.Errorf("if_generation 7 = %v, want code 9 with the task at generation 1", r[1])
	}
	if r[2].GetError().GetCode() != int32(codes.FailedPrecondition) || r[2].GetTask() != nil {
		t.Errorf("if_generation of a missing id = %v, want code 9 and no task", r[2])
	}
	if r[3].GetError() != nil || !r[3].GetCreated() {
		t.Errorf("create-only of a new id = %v, want created", r[3])
	}
	if r[4].GetError() != nil || r[4].GetTask().GetGeneration() != 2 {
		t.Errorf("if_generation 1 = %v, want applied at generation 2", r[4])
	}
}

func TestRemoveTasks(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	var items []*delaydv1.UpsertTaskRequest
	for i := range 2500 {
		kind := "loan.overdue"
		if i%5 == 0 {
			kind = "loan.reminder"
		}
		items = append(items, &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("loan-%04d", i), Kind: kind, When: inDelay(time.Duration(i) * time.Second)})
	}
	for lo := 0; lo < len(items); lo += 1000 {
		if _, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: items[lo:min(lo+1000, len(items))]}); err != nil {
			t.Fatal(err)
		}
	}

	resp, err := e.tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: e.ns, Ids: []string{"loan-0001", "loan-0002", "nope"}})
	if err != nil || resp.GetRemoved() != 2 || resp.GetNextPageToken() != "" {
		t.Fatalf("remove by ids = %v, %v; want 2 removed, no token", resp, err)
	}
	// one result per id, in request order, as RemoveTask would answer
	wantResults := []*delaydv1.RemoveTaskResult{
		{Id: "loan-0001", Removed: true, PreviousState: delaydv1.TaskState_TASK_STATE_SCHEDULED},
		{Id: "loan-0002", Removed: true, PreviousState: delaydv1.TaskState_TASK_STATE_SCHEDULED},
		{Id: "nope"},
	}
	if diff := cmp.Diff(wantResults, resp.GetResults(), protocmp.Transform()); diff != "" {
		t.Fatalf("remove by ids results (-want +got):\n%s", diff)
	}

	filter := &delaydv1.TaskFilter{Kind: "loan.overdue"}
	var total int64
	pages := 0
	token := ""
	for {
		resp, err := e.tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: e.ns, Filter: filter, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		total += resp.GetRemoved()
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		if pages == 1 {
			// A token is bound to its namespace and filter.
			_, err := e.tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: e.ns, Filter: &delaydv1.TaskFilter{Kind: "other"}, PageToken: token})
			wantStatus(t, err, codes.InvalidArgument, "page_token was issued for another namespace or filter")
		}
	}
	// 2,500 tasks, 1,000 examined per page: at least 3 pages.
	if total != 2000-2 || pages < 3 {
		t.Fatalf("filter removed %d in %d pages; want 1998 in at least 3", total, pages)
	}
	st, err := e.store.Stats(ctx, e.ns)
	if err != nil || st.Scheduled != 500 {
		t.Fatalf("stats = %+v, %v; want the 500 reminders left", st, err)
	}
}

func TestConditionalInvalidArguments(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	_, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "a", When: inDelay(time.Hour), IfGeneration: -1})
	wantStatus(t, err, codes.InvalidArgument, "if_generation is -1; allowed: 0")
	_, err = e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "a", When: inDelay(time.Hour), IfGeneration: 3, CreateOnly: true})
	wantStatus(t, err, codes.InvalidArgument, "if_generation is 3 with create_only set")
	_, err = e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "a", IfGeneration: -2})
	wantStatus(t, err, codes.InvalidArgument, "if_generation is -2")
	_, err = e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "a", IfIncarnation: 5})
	wantStatus(t, err, codes.InvalidArgument, "if_incarnation is 5 without if_generation")
	br, err := e.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: "a", When: inDelay(time.Hour), IfGeneration: 1, IfIncarnation: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	if ie := br.GetResults()[0].GetError(); ie.GetCode() != int32(codes.InvalidArgument) || !strings.HasPrefix(ie.GetMessage(), "tasks[0].if_incarnation is -1") {
		t.Errorf("batch item error = %v, want tasks[0].if_incarnation named", ie)
	}

	cases := []struct {
		req  *delaydv1.RemoveTasksRequest
		want string
	}{
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns}, "ids or filter is required"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Ids: []string{"a"}, Filter: &delaydv1.TaskFilter{Kind: "k"}}, "filter is set together with ids"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Filter: &delaydv1.TaskFilter{}}, "filter is empty; set at least one of kind, id_prefix and state"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Ids: []string{"a", "b c"}}, "ids[1] has ' '"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Ids: []string{"a"}, PageToken: "x"}, "page_token is set with ids"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Filter: &delaydv1.TaskFilter{IdPrefix: "a/b"}}, "filter.id_prefix has '/'"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Filter: &delaydv1.TaskFilter{State: 9}}, "filter.state is 9"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Filter: &delaydv1.TaskFilter{Kind: "k"}, PageToken: "garbage!"}, "page_token is not a token this server issued"},
		{&delaydv1.RemoveTasksRequest{Namespace: e.ns, Ids: make([]string, 1001)}, "ids has more than 1000 items"},
	}
	for _, c := range cases {
		_, err := e.tasks.RemoveTasks(ctx, c.req)
		wantStatus(t, err, codes.InvalidArgument, c.want)
	}
}

// A task removed and created again starts over at generation 1; with the
// incarnation read, a compare-and-set tells the new life apart.
func TestIfIncarnation(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	first, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "dev-1", When: inDelay(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	old := first.GetTask()
	if old.GetIncarnation() == 0 {
		t.Fatalf("task %v has no incarnation", old)
	}
	if _, err := e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "dev-1"}); err != nil {
		t.Fatal(err)
	}
	again, err := e.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: "dev-1", When: inDelay(time.Hour)})
	if err != nil || again.GetTask().GetGeneration() != 1 || again.GetTask().GetIncarnation() <= old.GetIncarnation() {
		t.Fatalf("re-create = %v, %v; want generation 1, a larger incarnation", again, err)
	}
	_, err = e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "dev-1", IfGeneration: 1, IfIncarnation: old.GetIncarnation()})
	info, task := conflictDetails(t, err, codes.FailedPrecondition, "GENERATION_MISMATCH")
	md := info.GetMetadata()
	if md["expected_incarnation"] != fmt.Sprint(old.GetIncarnation()) || md["incarnation"] != fmt.Sprint(again.GetTask().GetIncarnation()) ||
		task.GetIncarnation() != again.GetTask().GetIncarnation() {
		t.Fatalf("metadata %v, task %v; want the old incarnation expected and the new one stored", md, task)
	}
	if !strings.Contains(status.Convert(err).Message(), "another incarnation") {
		t.Errorf("message %q does not say the task is another incarnation", status.Convert(err).Message())
	}
	resp, err := e.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "dev-1", IfGeneration: 1, IfIncarnation: again.GetTask().GetIncarnation()})
	if err != nil || !resp.GetRemoved() {
		t.Fatalf("remove of the new life = %v, %v; want removed", resp, err)
	}
}
