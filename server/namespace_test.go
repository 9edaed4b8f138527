package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// killTasks makes dead letters of ids: with max attempts 1, one delivery
// and a nack each. The subscriber is ended afterwards.
func (e *dlvEnv) killTasks(r *dlvReplica, ids ...string) {
	e.t.Helper()
	if e.pol.MaxAttempts != 1 {
		e.t.Fatal("killTasks needs a policy with MaxAttempts 1")
	}
	s := e.subscribe(r, int32(len(ids)))
	for _, id := range ids {
		e.upsert(r, id, 0)
	}
	for range ids {
		d := s.next(e.t)
		if st := e.nack(r, durationpb.New(0), "poison", d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
			e.t.Fatalf("nack: %v", st[0])
		}
	}
	s.end()
	for _, id := range ids {
		if got := e.mustGet(r, id); got.GetState() != delaydv1.TaskState_TASK_STATE_DEAD {
			e.t.Fatalf("%s is %v, want DEAD", id, got.GetState())
		}
	}
}

func (e *dlvEnv) listDead(r *dlvReplica) []string {
	e.t.Helper()
	var ids []string
	token := ""
	for {
		resp, err := r.admin.ListDeadLetters(context.Background(), &delaydv1.ListDeadLettersRequest{Namespace: e.ns, PageSize: 2, PageToken: token})
		if err != nil {
			e.t.Fatalf("ListDeadLetters: %v", err)
		}
		for _, task := range resp.GetTasks() {
			if task.GetState() != delaydv1.TaskState_TASK_STATE_DEAD {
				e.t.Errorf("dead letter %s has state %v", task.GetId(), task.GetState())
			}
			ids = append(ids, task.GetId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			return ids
		}
	}
}

func TestDeadLettersListRequeuePurge(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.MaxAttempts = 1
	e := newDlvEnv(t, pol)
	r := e.replica()
	e.killTasks(r, "d1", "d2", "d3", "d4", "d5")

	got := e.listDead(r) // pages of 2: oldest death first
	if diff := cmp.Diff([]string{"d1", "d2", "d3", "d4", "d5"}, got); diff != "" {
		t.Fatalf("ListDeadLetters (-want +got):\n%s", diff)
	}

	// Requeue by id resets the attempts; ids that are not dead are skipped.
	rq, err := r.admin.RequeueDeadLetters(context.Background(), &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns, Ids: []string{"d1", "nope"}})
	if err != nil {
		t.Fatal(err)
	}
	if rq.GetRequeued() != 1 {
		t.Fatalf("requeued %d, want 1", rq.GetRequeued())
	}
	task := e.mustGet(r, "d1")
	if task.GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED || task.GetAttempt() != 0 {
		t.Fatalf("requeued task: %v attempt %d, want SCHEDULED attempt 0", task.GetState(), task.GetAttempt())
	}
	s := e.subscribe(r, 10)
	d := s.next(t)
	if d.GetTask().GetId() != "d1" || d.GetTask().GetAttempt() != 1 {
		t.Fatalf("after requeue: %s attempt %d, want d1 attempt 1", d.GetTask().GetId(), d.GetTask().GetAttempt())
	}
	e.ack(r, d.GetToken())
	s.none(t) // the others stay dead

	// Requeue all, due after a delay.
	rq, err = r.admin.RequeueDeadLetters(context.Background(), &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns, All: true, Delay: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if rq.GetRequeued() != 4 {
		t.Fatalf("requeue all: %d, want 4", rq.GetRequeued())
	}
	if left := e.listDead(r); len(left) != 0 {
		t.Fatalf("dead letters after requeue all: %v", left)
	}
	if due := e.mustGet(r, "d2").GetDueTime().AsTime(); due.Sub(e.redisNow()) < 30*time.Minute {
		t.Fatalf("requeued with a one-hour delay but due in %s", due.Sub(e.redisNow()))
	}
	s.none(t)
}

func TestDeadLettersPurge(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.MaxAttempts = 1
	e := newDlvEnv(t, pol)
	r := e.replica()
	e.killTasks(r, "p1", "p2", "p3")
	e.upsert(r, "alive", time.Hour)

	pg, err := r.admin.PurgeDeadLetters(context.Background(), &delaydv1.PurgeDeadLettersRequest{Namespace: e.ns, Ids: []string{"p1", "alive"}})
	if err != nil {
		t.Fatal(err)
	}
	if pg.GetPurged() != 1 {
		t.Fatalf("purged %d, want 1 (alive is not dead)", pg.GetPurged())
	}
	if _, err := e.getTask(r, "p1"); status.Code(err) != codes.NotFound {
		t.Fatalf("GetTask after purge: %v, want NotFound", err)
	}
	if e.mustGet(r, "alive").GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED {
		t.Fatal("purge touched a scheduled task")
	}
	pg, err = r.admin.PurgeDeadLetters(context.Background(), &delaydv1.PurgeDeadLettersRequest{Namespace: e.ns, All: true})
	if err != nil {
		t.Fatal(err)
	}
	if pg.GetPurged() != 2 {
		t.Fatalf("purge all: %d, want 2", pg.GetPurged())
	}
	if left := e.listDead(r); len(left) != 0 {
		t.Fatalf("dead letters after purge all: %v", left)
	}
}

func TestDeadLetterValidation(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	ctx := context.Background()

	_, err := r.admin.RequeueDeadLetters(ctx, &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns})
	wantCode(t, err, codes.InvalidArgument, "ids")
	_, err = r.admin.RequeueDeadLetters(ctx, &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns, Ids: []string{"a"}, All: true})
	wantCode(t, err, codes.InvalidArgument, "ids")
	_, err = r.admin.RequeueDeadLetters(ctx, &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns, Ids: []string{"ok", "bad id"}})
	wantCode(t, err, codes.InvalidArgument, "ids[1]")
	_, err = r.admin.RequeueDeadLetters(ctx, &delaydv1.RequeueDeadLettersRequest{Namespace: e.ns, All: true, Delay: durationpb.New(-time.Second)})
	wantCode(t, err, codes.InvalidArgument, "delay")
	_, err = r.admin.PurgeDeadLetters(ctx, &delaydv1.PurgeDeadLettersRequest{Namespace: e.ns, Ids: make([]string, 1001)})
	wantCode(t, err, codes.InvalidArgument, "ids")
	_, err = r.admin.PurgeDeadLetters(ctx, &delaydv1.PurgeDeadLettersRequest{Namespace: "NO"})
	wantCode(t, err, codes.InvalidArgument, "namespace")
	_, err = r.admin.ListDeadLetters(ctx, &delaydv1.ListDeadLettersRequest{Namespace: e.ns, PageSize: 1001})
	wantCode(t, err, codes.InvalidArgument, "page_size")
	_, err = r.admin.ListDeadLetters(ctx, &delaydv1.ListDeadLettersRequest{Namespace: e.ns, PageToken: "garbage"})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	_, err = r.admin.GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: ""})
	wantCode(t, err, codes.InvalidArgument, "namespace")
	// The tenancy RPCs are not part of this service yet.
	if _, err := r.admin.CreateKey(ctx, &delaydv1.CreateKeyRequest{Namespace: e.ns}); status.Code(err) == codes.OK {
		t.Fatal("CreateKey answered OK without a registry")
	}
}

func TestNamespaceStats(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.MaxAttempts = 1
	e := newDlvEnv(t, pol)
	r := e.replica()
	e.killTasks(r, "dead")
	s := e.subscribe(r, 1)
	e.upsert(r, "leased", 0)
	s.next(t)
	e.upsert(r, "later", time.Hour)
	// Two due tasks nobody takes: s has no credit left.
	e.upsert(r, "due1", 0)
	e.upsert(r, "due2", 0)
	time.Sleep(50 * time.Millisecond)

	resp, err := r.admin.GetNamespaceStats(context.Background(), &delaydv1.GetNamespaceStatsRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	got := []int64{resp.GetScheduled(), resp.GetDelivered(), resp.GetDead(), resp.GetDueNow()}
	if diff := cmp.Diff([]int64{3, 1, 1, 2}, got); diff != "" {
		t.Fatalf("stats [scheduled delivered dead due_now] (-want +got):\n%s", diff)
	}
	if l := resp.GetOldestDueLateness().AsDuration(); l < 50*time.Millisecond || l > time.Hour {
		t.Fatalf("oldest due lateness %s, want at least the 50ms the due tasks waited", l)
	}

	// A task written with a due time long past is due now, not years late:
	// lateness counts from the later of its due time and when it was written
	// (as delayd_delivery_lateness_seconds does).
	if _, err := r.tasks.UpsertTask(context.Background(), &delaydv1.UpsertTaskRequest{
		Namespace: e.ns, Id: "past", Kind: "test.kind",
		When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err = r.admin.GetNamespaceStats(context.Background(), &delaydv1.GetNamespaceStatsRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDueNow() != 3 {
		t.Fatalf("due now %d, want 3", resp.GetDueNow())
	}
	if l := resp.GetOldestDueLateness().AsDuration(); l < 50*time.Millisecond || l > time.Hour {
		t.Fatalf("oldest due lateness %s with a task due in 2020 written just now, want the 50ms+ due1 waited", l)
	}

	empty, err := r.admin.GetNamespaceStats(context.Background(), &delaydv1.GetNamespaceStatsRequest{Namespace: "st-empty-" + testkit.Suffix()})
	if err != nil {
		t.Fatal(err)
	}
	if empty.GetScheduled()+empty.GetDelivered()+empty.GetDead()+empty.GetDueNow() != 0 || empty.GetOldestDueLateness().AsDuration() != 0 {
		t.Fatalf("stats of an empty namespace: %v", empty)
	}
}
