package daemon

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// TestConditionalWritesDurable: over gRPC against a durable delayd, a
// failed create_only / if_generation answers its code with the ErrorInfo
// and the stored task in the status details, and RemoveTasks pages through
// a filter and deletes from MySQL too.
func TestConditionalWritesDurable(t *testing.T) {
	t.Parallel()
	dsn := testkit.Database(t, "delayd_daemon_cond")
	s := start(t, Config{RedisURL: testRedisURL(), MySQLDSN: dsn})
	ns := "cond-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	ctx := ctxFor(t)

	req := upsert(ns, "order-1")
	req.CreateOnly = true
	first, err := s.tasks.UpsertTask(ctx, req)
	if err != nil || !first.GetCreated() {
		t.Fatalf("create-only = %v, %v", first, err)
	}
	_, err = s.tasks.UpsertTask(ctx, req)
	info, task := details(t, err, codes.AlreadyExists)
	if info.GetReason() != "TASK_EXISTS" || info.GetMetadata()["generation"] != "1" ||
		!task.GetDueTime().AsTime().Equal(first.GetTask().GetDueTime().AsTime()) {
		t.Fatalf("create-only again: info %v, task %v; want TASK_EXISTS at generation 1 with the first due time", info, task)
	}

	_, err = s.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: ns, Id: "order-1", IfGeneration: 4})
	info, task = details(t, err, codes.FailedPrecondition)
	if info.GetReason() != "GENERATION_MISMATCH" || info.GetMetadata()["generation"] != "1" || info.GetMetadata()["expected"] != "4" || task.GetId() != "order-1" {
		t.Fatalf("remove at generation 4: info %v, task %v", info, task)
	}

	var items []*delaydv1.UpsertTaskRequest
	for i := range 1500 {
		kind := "order.close"
		if i%3 == 0 {
			kind = "order.remind"
		}
		items = append(items, &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("o-%04d", i), Kind: kind,
			When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Duration(i+1) * time.Minute)}})
	}
	for lo := 0; lo < len(items); lo += 1000 {
		if _, err := s.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: items[lo:min(lo+1000, len(items))]}); err != nil {
			t.Fatal(err)
		}
	}
	var removed int64
	pages := 0
	for token := ""; ; pages++ {
		resp, err := s.tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: ns,
			Filter: &delaydv1.TaskFilter{Kind: "order.close", IdPrefix: "o-"}, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		removed += resp.GetRemoved()
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if removed != 1000 || pages < 1 {
		t.Fatalf("filter removed %d in %d pages, want 1000 in at least 2", removed, pages+1)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var closes, all int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(SUM(kind = 'order.close'), 0) FROM delayd_tasks WHERE namespace = ?", ns).Scan(&all, &closes); err != nil {
		t.Fatal(err)
	}
	if closes != 0 || all != 501 {
		t.Fatalf("mysql holds %d tasks (%d order.close), want 501 (none order.close)", all, closes)
	}
}

// details returns the ErrorInfo and task of a status error, failing t
// unless err has code.
func details(t *testing.T, err error, code codes.Code) (*errdetails.ErrorInfo, *delaydv1.Task) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("got %v %q, want %v", st.Code(), st.Message(), code)
	}
	var info *errdetails.ErrorInfo
	var task *delaydv1.Task
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *delaydv1.Task:
			task = d
		}
	}
	if info == nil || info.GetDomain() != "delayd.v1" {
		t.Fatalf("details %v: no delayd.v1 ErrorInfo", st.Details())
	}
	return info, task
}
