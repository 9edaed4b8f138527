package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

func dailyAt9(ns, id string) *delaydv1.Schedule {
	return &delaydv1.Schedule{Namespace: ns, Id: id, Rule: &delaydv1.Schedule_Cron{Cron: "0 9 * * *"}, TimeZone: "Europe/Berlin",
		Task: &delaydv1.ScheduleTaskTemplate{Kind: "remind", Payload: []byte("{}")}}
}

// TestScheduleScopes: a namespace's produce key (or its admin key)
// manages its schedules; a consume key and another namespace's keys may
// not.
func TestScheduleScopes(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "sched-", nil)
	other := e.newNamespace(r, "sched-other-", nil)
	_, produce := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_PRODUCE)
	_, adminKey := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_ADMIN)
	_, consume := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	_, stranger := e.newKey(r, other, delaydv1.KeyScope_KEY_SCOPE_PRODUCE)
	sc := delaydv1.NewScheduleServiceClient(r.conn)

	if _, err := sc.CreateSchedule(as(produce), &delaydv1.CreateScheduleRequest{Schedule: dailyAt9(ns, "daily")}); err != nil {
		t.Fatalf("produce key creates: %v", err)
	}
	if _, err := sc.GetSchedule(as(adminKey), &delaydv1.GetScheduleRequest{Namespace: ns, Id: "daily"}); err != nil {
		t.Fatalf("admin key reads: %v", err)
	}
	for name, key := range map[string]string{"consume": consume, "other namespace": stranger} {
		if _, err := sc.GetSchedule(as(key), &delaydv1.GetScheduleRequest{Namespace: ns, Id: "daily"}); codeOf(err) != codes.PermissionDenied {
			t.Errorf("%s key reads: %v, want PermissionDenied", name, err)
		}
		if _, err := sc.CreateSchedule(as(key), &delaydv1.CreateScheduleRequest{Schedule: dailyAt9(ns, "x")}); codeOf(err) != codes.PermissionDenied {
			t.Errorf("%s key creates: %v, want PermissionDenied", name, err)
		}
	}
	if _, err := sc.DeleteSchedule(as(produce), &delaydv1.DeleteScheduleRequest{Namespace: ns, Id: "daily"}); err != nil {
		t.Fatalf("produce key deletes: %v", err)
	}
	if _, err := sc.GetSchedule(as(produce), &delaydv1.GetScheduleRequest{Namespace: ns, Id: "daily"}); codeOf(err) != codes.NotFound ||
		!strings.Contains(status.Convert(err).Message(), `schedule "daily" not found`) {
		t.Fatalf("deleted schedule: %v", err)
	}
}

// TestScheduleErrors: each refusal names the field or the quota.
func TestScheduleErrors(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "schederr-", &delaydv1.NamespacePolicy{MaxSchedules: 1})
	sc := delaydv1.NewScheduleServiceClient(r.conn)
	bad := func(mod func(*delaydv1.Schedule)) *delaydv1.CreateScheduleRequest {
		s := dailyAt9(ns, "s")
		mod(s)
		return &delaydv1.CreateScheduleRequest{Schedule: s}
	}
	cases := []struct {
		req  *delaydv1.CreateScheduleRequest
		code codes.Code
		msg  string
	}{
		{bad(func(s *delaydv1.Schedule) { s.Rule = &delaydv1.Schedule_Cron{Cron: "0 9 * *"} }), codes.InvalidArgument, "schedule.cron has 4 fields"},
		{bad(func(s *delaydv1.Schedule) { s.Rule = nil }), codes.InvalidArgument, "schedule.cron and every are both empty"},
		{bad(func(s *delaydv1.Schedule) { s.Rule = &delaydv1.Schedule_Every{Every: durationpb.New(time.Millisecond)} }), codes.InvalidArgument, "schedule.every"},
		{bad(func(s *delaydv1.Schedule) { s.TimeZone = "Europe/Atlantis" }), codes.InvalidArgument, "schedule.time_zone"},
		{bad(func(s *delaydv1.Schedule) { s.Id = "no/slash" }), codes.InvalidArgument, "schedule.id"},
		{bad(func(s *delaydv1.Schedule) { s.CatchUp = delaydv1.CatchUpPolicy_CATCH_UP_POLICY_ALL }), codes.InvalidArgument, "schedule.catch_up_window"},
		{bad(func(s *delaydv1.Schedule) { s.Jitter = durationpb.New(2 * time.Hour) }), codes.InvalidArgument, "schedule.jitter"},
		{bad(func(s *delaydv1.Schedule) { s.Task.Payload = make([]byte, 70000) }), codes.InvalidArgument, "schedule.task.payload"},
		{bad(func(s *delaydv1.Schedule) { s.Namespace = "Bad NS" }), codes.InvalidArgument, "schedule.namespace"},
	}
	for _, tc := range cases {
		_, err := sc.CreateSchedule(admin(), tc.req)
		if codeOf(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%v: %v, want %v containing %q", tc.req.GetSchedule(), err, tc.code, tc.msg)
		}
	}
	if _, err := sc.CreateSchedule(admin(), &delaydv1.CreateScheduleRequest{Schedule: dailyAt9(ns, "one")}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.CreateSchedule(admin(), &delaydv1.CreateScheduleRequest{Schedule: dailyAt9(ns, "one")}); codeOf(err) != codes.AlreadyExists {
		t.Errorf("same id again: %v, want AlreadyExists", err)
	}
	if _, err := sc.CreateSchedule(admin(), &delaydv1.CreateScheduleRequest{Schedule: dailyAt9(ns, "two")}); codeOf(err) != codes.ResourceExhausted ||
		!strings.Contains(status.Convert(err).Message(), "max_schedules") {
		t.Errorf("past max_schedules 1: %v, want ResourceExhausted naming max_schedules", err)
	}
	_, err := sc.UpdateSchedule(admin(), &delaydv1.UpdateScheduleRequest{Schedule: dailyAt9(ns, "one"), IfVersion: 99,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"description"}}})
	if codeOf(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "not 99") {
		t.Errorf("update at a stale version: %v, want FailedPrecondition", err)
	}
	_, err = sc.UpdateSchedule(admin(), &delaydv1.UpdateScheduleRequest{Schedule: dailyAt9(ns, "one"),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"fired"}}})
	if codeOf(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "update_mask.paths[0]") {
		t.Errorf("mask naming an output field: %v", err)
	}
}

// TestSchedulePreviewAndUpdate: the preview shows the next firings in UTC
// and in the zone (across Berlin's spring change), with their task ids and
// the tz release; an update by mask changes the rule and the preview.
func TestSchedulePreviewAndUpdate(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "schedprev-", nil)
	sc := delaydv1.NewScheduleServiceClient(r.conn)
	def := dailyAt9(ns, "early")
	def.Rule = &delaydv1.Schedule_Cron{Cron: "30 2 * * *"}
	after := timestamppb.New(time.Date(2026, 3, 27, 12, 0, 0, 0, time.UTC))
	resp, err := sc.PreviewSchedule(admin(), &delaydv1.PreviewScheduleRequest{Namespace: ns, Schedule: def, Count: 3, After: after})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range resp.GetFirings() {
		got = append(got, f.GetSlotTime().AsTime().Format(time.RFC3339)+" "+f.GetLocalTime()+" "+f.GetTaskId())
	}
	want := []string{
		"2026-03-28T01:30:00Z 2026-03-28T02:30:00+01:00 CET early.20260328T013000Z",
		"2026-03-29T01:00:00Z 2026-03-29T03:00:00+02:00 CEST early.20260329T010000Z",
		"2026-03-30T00:30:00Z 2026-03-30T02:30:00+02:00 CEST early.20260330T003000Z",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("preview:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if resp.GetTimeZone() != "Europe/Berlin" || resp.GetTzDataVersion() == "" {
		t.Fatalf("zone %q, tz data %q", resp.GetTimeZone(), resp.GetTzDataVersion())
	}
	if _, err := sc.CreateSchedule(admin(), &delaydv1.CreateScheduleRequest{Schedule: def}); err != nil {
		t.Fatal(err)
	}
	up, err := sc.UpdateSchedule(admin(), &delaydv1.UpdateScheduleRequest{
		Schedule:   &delaydv1.Schedule{Namespace: ns, Id: "early", Rule: &delaydv1.Schedule_Every{Every: durationpb.New(15 * time.Minute)}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"every"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if up.GetSchedule().GetEvery().AsDuration() != 15*time.Minute || up.GetSchedule().GetCron() != "" || up.GetSchedule().GetTimeZone() != "Europe/Berlin" {
		t.Fatalf("after the update: %v", up.GetSchedule())
	}
	resp, err = sc.PreviewSchedule(admin(), &delaydv1.PreviewScheduleRequest{Namespace: ns, Id: "early", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetFirings()); n != 2 || resp.GetFirings()[1].GetSlotTime().AsTime().Sub(resp.GetFirings()[0].GetSlotTime().AsTime()) != 15*time.Minute {
		t.Fatalf("preview of the stored rate: %v", resp.GetFirings())
	}
	paused, err := sc.PauseSchedule(admin(), &delaydv1.PauseScheduleRequest{Namespace: ns, Id: "early"})
	if err != nil || paused.GetSchedule().GetState() != delaydv1.ScheduleState_SCHEDULE_STATE_PAUSED {
		t.Fatalf("pause: %v, %v", paused, err)
	}
	list, err := sc.ListSchedules(admin(), &delaydv1.ListSchedulesRequest{Namespace: ns})
	if err != nil || len(list.GetSchedules()) != 1 || list.GetSchedules()[0].GetState() != delaydv1.ScheduleState_SCHEDULE_STATE_PAUSED {
		t.Fatalf("list: %v, %v", list, err)
	}
}
