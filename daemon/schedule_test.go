package daemon

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// TestScheduleEndToEnd: two replicas on one Redis; a 1-second rate
// schedule created on one is delivered through the other, every slot once
// and in order, none missing between the first and the last; each firing
// is an ordinary task whose history names its schedule and slot; a pause
// removes the firings created ahead and not due yet; deleting the
// namespace deletes its schedules.
func TestScheduleEndToEnd(t *testing.T) {
	t.Parallel()
	url := testRedisURL()
	ns := "sched-" + suffix()
	cleanNamespace(t, url, ns)
	a := start(t, Config{RedisURL: url, LogLevel: "warn"})
	b := start(t, Config{RedisURL: url, LogLevel: "warn"})
	ctx := ctxFor(t)
	if _, err := delaydv1.NewNamespaceServiceClient(a.conn).CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(time.Hour), HistoryRetentionBytes: 1 << 20}},
	}); err != nil {
		t.Fatal(err)
	}
	e := &e2eEnv{t: t, url: url, ns: ns}
	sub := e.subscribe(b, 100)
	sa := delaydv1.NewScheduleServiceClient(a.conn)
	created, err := sa.CreateSchedule(ctx, &delaydv1.CreateScheduleRequest{Schedule: &delaydv1.Schedule{
		Namespace: ns, Id: "tick", Rule: &delaydv1.Schedule_Every{Every: durationpb.New(time.Second)},
		Task: &delaydv1.ScheduleTaskTemplate{Kind: "tick", Payload: []byte("t"), IdPrefix: "t-"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if created.GetSchedule().GetFired() < 5 {
		t.Fatalf("a 1 s rate with a 10 s lookahead fired %d at create; want its next ~10 slots", created.GetSchedule().GetFired())
	}
	var slots []time.Time
	for len(slots) < 4 {
		d := sub.next(t)
		id := d.GetTask().GetId()
		stamp, ok := strings.CutPrefix(id, "t-tick.")
		slot, err := time.Parse(storage.FiringStampLayout, stamp)
		if !ok || err != nil || d.GetTask().GetKind() != "tick" || string(d.GetTask().GetPayload()) != "t" {
			t.Fatalf("delivery %s (kind %q): not a firing of tick", id, d.GetTask().GetKind())
		}
		if !d.GetTask().GetDueTime().AsTime().Equal(slot) {
			t.Fatalf("firing %s due at %v, not its slot", id, d.GetTask().GetDueTime().AsTime())
		}
		if n := len(slots); n > 0 && !slot.Equal(slots[n-1].Add(time.Second)) {
			t.Fatalf("slot %v after %v: one missing, repeated or out of order", slot, slots[n-1])
		}
		slots = append(slots, slot)
		e.ack(b, d.GetToken())
	}
	hist, err := b.tasks.GetTaskHistory(ctx, &delaydv1.GetTaskHistoryRequest{Namespace: ns, Id: storage.FiringID("t-", "tick", slots[0], 1)})
	if err != nil || len(hist.GetEvents()) == 0 {
		t.Fatalf("history: %v, %v", hist, err)
	}
	first := hist.GetEvents()[0]
	if first.GetKind() != delaydv1.TaskEventKind_TASK_EVENT_KIND_UPSERTED || first.GetScheduleId() != "tick" || !first.GetSlotTime().AsTime().Equal(slots[0]) {
		t.Fatalf("first event of a firing: %v; want upserted naming tick and its slot", first)
	}

	sb := delaydv1.NewScheduleServiceClient(b.conn)
	paused, err := sb.PauseSchedule(ctx, &delaydv1.PauseScheduleRequest{Namespace: ns, Id: "tick"})
	if err != nil || paused.GetRemovedFirings() < 3 {
		t.Fatalf("pause: %v, %v; want the firings of the next seconds removed", paused, err)
	}
	// What is left scheduled is due within the pause's margin (a second).
	list, err := b.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range list.GetTasks() {
		if due := task.GetDueTime().AsTime(); due.After(paused.GetSchedule().GetUpdateTime().AsTime().Add(2 * time.Second)) {
			t.Errorf("firing %s due %v survived the pause", task.GetId(), due)
		}
	}
	if _, err := delaydv1.NewNamespaceServiceClient(b.conn).DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := sa.GetSchedule(context.Background(), &delaydv1.GetScheduleRequest{Namespace: ns, Id: "tick"}); status.Code(err) != codes.NotFound {
		t.Fatalf("schedule of a deleted namespace: %v, want NotFound", err)
	}
}

// TestScheduleRestartAfterOutage: delayd is stopped for ten minutes (its
// store's clock moves on: a Redis-protocol server whose clock the test
// sets) and started again; each schedule's missed slots are what its
// catch-up policy says, delivered over gRPC: none skips them, latest
// fires the latest, all fires those within its window. The firing
// created before the outage (its slot was within the lookahead) is a task
// and is delivered too.
func TestScheduleRestartAfterOutage(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	base := time.Date(2030, 1, 1, 12, 0, 55, 0, time.UTC)
	var offset atomic.Int64
	offset.Store(int64(base.Sub(time.Now())))
	tick, stopTick := context.WithCancel(context.Background())
	var ticking sync.WaitGroup
	ticking.Go(func() {
		for tick.Err() == nil {
			m.SetTime(time.Now().Add(time.Duration(offset.Load())))
			time.Sleep(2 * time.Millisecond)
		}
	})
	t.Cleanup(func() { stopTick(); ticking.Wait() })
	url := "redis://" + m.Addr()

	d1 := start(t, Config{RedisURL: url, LogLevel: "warn"})
	ns := "outage"
	sc := delaydv1.NewScheduleServiceClient(d1.conn)
	policies := map[string]*delaydv1.Schedule{
		"none":   {CatchUp: delaydv1.CatchUpPolicy_CATCH_UP_POLICY_NONE},
		"latest": {CatchUp: delaydv1.CatchUpPolicy_CATCH_UP_POLICY_LATEST},
		"all":    {CatchUp: delaydv1.CatchUpPolicy_CATCH_UP_POLICY_ALL, CatchUpWindow: durationpb.New(5 * time.Minute)},
	}
	for id, s := range policies {
		s.Namespace, s.Id, s.Rule = ns, id, &delaydv1.Schedule_Cron{Cron: "* * * * *"}
		resp, err := sc.CreateSchedule(ctxFor(t), &delaydv1.CreateScheduleRequest{Schedule: s})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetSchedule().GetFired() != 1 {
			t.Fatalf("%s: fired %d at create, want 12:01's firing (within the lookahead)", id, resp.GetSchedule().GetFired())
		}
	}
	stop, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d1.d.Stop(stop); err != nil {
		t.Fatal(err)
	}
	// Ten minutes down: the store's clock is 12:11:30 when delayd is back.
	offset.Add(int64(10*time.Minute + 35*time.Second))
	d2 := start(t, Config{RedisURL: url, LogLevel: "warn"})
	e := &e2eEnv{t: t, ns: ns}
	sub := e.subscribe(d2, 100)
	want := map[string][]string{
		"none":   {"12:01"},
		"latest": {"12:01", "12:11"},
		"all":    {"12:01", "12:07", "12:08", "12:09", "12:10", "12:11"},
	}
	got := map[string][]string{}
	n := 0
	for _, w := range want {
		n += len(w)
	}
	for range n {
		d := sub.next(t)
		id, stamp, _ := strings.Cut(d.GetTask().GetId(), ".")
		slot, err := time.Parse(storage.FiringStampLayout, stamp)
		if err != nil {
			t.Fatalf("delivery %s is no firing", d.GetTask().GetId())
		}
		got[id] = append(got[id], slot.Format("15:04"))
		e.ack(d2, d.GetToken())
	}
	for id := range want {
		slices.Sort(got[id])
		if !slices.Equal(got[id], want[id]) {
			t.Errorf("%s: delivered %v, want %v", id, got[id], want[id])
		}
		s, err := delaydv1.NewScheduleServiceClient(d2.conn).GetSchedule(ctxFor(t), &delaydv1.GetScheduleRequest{Namespace: ns, Id: id})
		if err != nil {
			t.Fatal(err)
		}
		if skipped := s.GetSchedule().GetSkipped(); skipped != int64(11-len(want[id])) || s.GetSchedule().GetNextSlotTime().AsTime().Format("15:04") != "12:12" {
			t.Errorf("%s: skipped %d, next %v; want %d and 12:12", id, skipped, s.GetSchedule().GetNextSlotTime().AsTime(), 11-len(want[id]))
		}
	}
}
