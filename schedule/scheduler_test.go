package schedule

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is the store's and the scheduler's clock in these tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// namespaces is the tenancy cache's answer over a fake registry.
type namespaces struct{ reg *storagefake.Registry }

func (n namespaces) Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error) {
	got, err := n.reg.GetNamespace(ctx, ns)
	if errors.Is(err, storage.ErrNotFound) && create {
		got, err = n.reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
	}
	got.Policy = got.Policy.WithDefaults(storage.DefaultPolicy())
	return got, err
}

type env struct {
	t     *testing.T
	clock *fakeClock
	store *storagefake.Store
	reg   *storagefake.Registry
	s     *Scheduler
	ns    string
}

func newEnv(t *testing.T, at string, pol storage.Policy) *env {
	t.Helper()
	c := &fakeClock{t: utc(at)}
	e := &env{t: t, clock: c, store: storagefake.New(c), reg: storagefake.NewRegistry(c), ns: "orders"}
	if _, err := e.reg.CreateNamespace(context.Background(), storage.Namespace{Name: e.ns, Policy: pol}); err != nil {
		t.Fatal(err)
	}
	e.s = e.scheduler()
	return e
}

func (e *env) scheduler() *Scheduler {
	s, err := New(Config{Schedules: e.store, Tasks: e.store, Namespaces: namespaces{e.reg}, History: e.store, Clock: e.clock})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// at moves the clock and runs one look of the loop.
func (e *env) at(when string) {
	e.t.Helper()
	e.clock.Set(utc(when))
	e.s.look(e.t.Context())
}

// tasks lists the namespace's tasks (every state) as "hh:mm:ss payload".
func (e *env) tasks() []string {
	e.t.Helper()
	var out []string
	for _, st := range []storage.State{storage.StateScheduled, storage.StateDelivered, storage.StateDead} {
		ts, _, err := e.store.List(e.t.Context(), e.ns, storage.ListParams{State: st, Limit: 1000})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, t := range ts {
			slot, _ := time.Parse(storage.FiringStampLayout, t.ID[strings.LastIndexByte(t.ID, '.')+1:])
			out = append(out, slot.Format("15:04:05")+" "+string(t.Payload))
		}
	}
	slices.Sort(out)
	return out
}

func (e *env) create(sc storage.Schedule) storage.Schedule {
	e.t.Helper()
	sc.Namespace = e.ns
	got, err := e.s.Create(e.t.Context(), sc, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

func minutely(id string) storage.Schedule {
	return storage.Schedule{ID: id, Every: time.Minute, Template: storage.TaskTemplate{Kind: "tick", Payload: []byte("v1")}}
}

// TestCreateFiresWithinLookahead: a new schedule's first firing within the
// lookahead exists as a task when CreateSchedule returns, due at its slot;
// the next one is created by the loop a lookahead before its slot.
func TestCreateFiresWithinLookahead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{})
	sc := e.create(minutely("tick"))
	if sc.Fired != 1 || !sc.NextSlot.Equal(utc("2026-05-01T10:02:00Z")) || !sc.Advance.Equal(utc("2026-05-01T10:01:50Z")) {
		t.Fatalf("after create: fired %d next %v advance %v", sc.Fired, sc.NextSlot, sc.Advance)
	}
	task, err := e.store.Get(t.Context(), e.ns, "tick.20260501T100100Z")
	if err != nil || !task.DueTime.Equal(utc("2026-05-01T10:01:00Z")) || task.Kind != "tick" || string(task.Payload) != "v1" {
		t.Fatalf("first firing: %+v, %v", task, err)
	}
	e.at("2026-05-01T10:01:49Z")
	if got := e.tasks(); len(got) != 1 {
		t.Fatalf("before the lookahead: %v", got)
	}
	e.at("2026-05-01T10:01:50Z")
	if got := e.tasks(); !slices.Equal(got, []string{"10:01:00 v1", "10:02:00 v1"}) {
		t.Fatalf("at the lookahead: %v", got)
	}
}

// TestOutageCatchUp: delayd is down for ten minutes (no look); when the
// loop looks again, the missed slots are what the policy says: none skips
// them, latest fires the last, all fires those within the window. The
// firing created before the outage is a task and stays.
func TestOutageCatchUp(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		policy storage.CatchUp
		window time.Duration
		want   []string
	}{
		{"none", storage.CatchUpNone, 0, []string{"10:01:00 v1"}},
		{"latest", storage.CatchUpLatest, 0, []string{"10:01:00 v1", "10:11:00 v1"}},
		{"latest outside its window", storage.CatchUpLatest, 5 * time.Second, []string{"10:01:00 v1"}},
		{"all within 5 minutes", storage.CatchUpAll, 5 * time.Minute,
			[]string{"10:01:00 v1", "10:07:00 v1", "10:08:00 v1", "10:09:00 v1", "10:10:00 v1", "10:11:00 v1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{})
			sc := minutely("tick")
			sc.CatchUp, sc.CatchUpWindow = tc.policy, tc.window
			e.create(sc)
			// Down from 10:00:56 to 10:11:30: slots 10:02 to 10:11 missed.
			e.at("2026-05-01T10:11:30Z")
			if got := e.tasks(); !slices.Equal(got, tc.want) {
				t.Fatalf("after the outage: %v, want %v", got, tc.want)
			}
			got, _ := e.s.Get(t.Context(), e.ns, "tick")
			if !got.NextSlot.Equal(utc("2026-05-01T10:12:00Z")) || got.Fired+got.Skipped != 11 {
				t.Fatalf("state: next %v fired %d skipped %d", got.NextSlot, got.Fired, got.Skipped)
			}
			// And on time again.
			e.at("2026-05-01T10:11:50Z")
			if all := e.tasks(); !slices.Equal(all, append(slices.Clone(tc.want), "10:12:00 v1")) {
				t.Fatalf("back on time: %v", all)
			}
		})
	}
}

// TestPauseAndResume: a pause removes the firing created ahead and not
// due yet; the slots of the pause are missed and the catch-up policy
// decides them on resume.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{})
	sc := minutely("tick")
	sc.CatchUp = storage.CatchUpLatest
	e.create(sc)
	if got := e.tasks(); len(got) != 1 {
		t.Fatalf("before the pause: %v", got)
	}
	paused, removed, err := e.s.Pause(t.Context(), e.ns, "tick")
	if err != nil || removed != 1 || !paused.Paused || paused.Fired != 0 || !paused.Advance.IsZero() {
		t.Fatalf("pause: removed %d, %+v, %v", removed, paused, err)
	}
	if got := e.tasks(); len(got) != 0 {
		t.Fatalf("the firing not due yet survived the pause: %v", got)
	}
	e.at("2026-05-01T10:05:30Z")
	if got := e.tasks(); len(got) != 0 {
		t.Fatalf("a paused schedule fired: %v", got)
	}
	resumed, err := e.s.Resume(t.Context(), e.ns, "tick")
	if err != nil || resumed.Paused {
		t.Fatalf("resume: %+v, %v", resumed, err)
	}
	// Missed 10:01-10:05, latest fires 10:05; 10:06 is beyond the lookahead.
	if got := e.tasks(); !slices.Equal(got, []string{"10:05:00 v1"}) {
		t.Fatalf("after resume: %v", got)
	}
}

// TestUpdateRefires: a new payload removes the firing not due yet and
// fires its slot again with the new payload; a description change alone
// removes nothing.
func TestUpdateRefires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{})
	e.create(minutely("tick"))
	up, removed, err := e.s.Update(t.Context(), e.ns, "tick", 0, func(s *storage.Schedule) { s.Description = "just words" })
	if err != nil || removed != 0 || up.Description != "just words" {
		t.Fatalf("description: removed %d, %+v, %v", removed, up, err)
	}
	up, removed, err = e.s.Update(t.Context(), e.ns, "tick", up.Version, func(s *storage.Schedule) { s.Template.Payload = []byte("v2") })
	if err != nil || removed != 1 {
		t.Fatalf("payload: removed %d, %v", removed, err)
	}
	if got := e.tasks(); !slices.Equal(got, []string{"10:01:00 v2"}) {
		t.Fatalf("after the update: %v", got)
	}
	if up.Fired != 1 {
		t.Fatalf("fired %d after the re-decision", up.Fired)
	}
	if _, _, err := e.s.Update(t.Context(), e.ns, "tick", 1, func(s *storage.Schedule) {}); !errors.As(err, new(*VersionError)) {
		t.Fatalf("update at a stale version: %v", err)
	}
}

// TestOverlapSkip: with overlap SKIP a slot whose previous firing is still
// scheduled (no subscriber took it) is skipped; once it is acked the next
// slot fires.
func TestOverlapSkip(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:30Z", storage.Policy{})
	sc := minutely("tick")
	sc.Overlap = storage.OverlapSkip
	e.create(sc)
	e.at("2026-05-01T10:01:00.003Z")
	e.at("2026-05-01T10:02:00.002Z") // 10:01's task was never taken
	if got := e.tasks(); !slices.Equal(got, []string{"10:01:00 v1"}) {
		t.Fatalf("overlapping slot fired: %v", got)
	}
	ds, err := e.store.Pop(t.Context(), e.ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
	if err != nil || len(ds) != 1 {
		t.Fatalf("pop: %v %v", ds, err)
	}
	if _, err := e.store.Ack(t.Context(), e.ns, []storage.Token{ds[0].Token}); err != nil {
		t.Fatal(err)
	}
	e.at("2026-05-01T10:03:00.001Z")
	if got := e.tasks(); !slices.Equal(got, []string{"10:03:00 v1"}) {
		t.Fatalf("after the ack: %v", got)
	}
	got, _ := e.s.Get(t.Context(), e.ns, "tick")
	if got.Skipped != 1 || got.Fired != 2 {
		t.Fatalf("fired %d skipped %d, want 2 and 1", got.Fired, got.Skipped)
	}
}

// TestReplicasFireOnce: three schedulers (replicas) look at the same store
// at the same instants; every slot becomes one task.
func TestReplicasFireOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:00.5Z", storage.Policy{})
	fast := storage.Schedule{ID: "fast", Every: time.Second, Template: storage.TaskTemplate{Payload: []byte("x")}}
	e.create(fast)
	rs := []*Scheduler{e.s, e.scheduler(), e.scheduler()}
	var created sync.Map
	var dup sync.Mutex
	dups := 0
	for _, r := range rs {
		r.hooks.step = func(_ storage.Schedule, fire []Firing) {
			for _, f := range fire {
				if _, loaded := created.LoadOrStore(f.ID, true); loaded {
					dup.Lock()
					dups++
					dup.Unlock()
				}
			}
		}
	}
	base := utc("2026-05-01T10:00:00.5Z")
	for i := range 120 {
		e.clock.Set(base.Add(time.Duration(i) * 250 * time.Millisecond))
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Go(func() { r.look(t.Context()) })
		}
		wg.Wait()
	}
	n := len(e.tasks())
	// Slots 10:00:01 .. 10:00:40 (the last look at 10:00:30.25 + 10 s).
	if dups != 0 || n != 40 {
		t.Fatalf("%d duplicate firings, %d tasks; want 0 and 40", dups, n)
	}
}

// TestFiringHistory: in a namespace that keeps history, a firing's first
// event names its schedule and slot.
func TestFiringHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{HistoryRetentionBytes: 1 << 20})
	e.create(minutely("tick"))
	n, err := e.reg.GetNamespace(t.Context(), e.ns)
	if err != nil {
		t.Fatal(err)
	}
	evs, _, err := e.store.TaskHistory(t.Context(), e.ns, storage.HistoryParams{Incarnation: n.CreateTime.UnixMilli(), ID: "tick.20260501T100100Z", Limit: 10})
	if err != nil || len(evs) != 1 {
		t.Fatalf("history: %+v, %v", evs, err)
	}
	if ev := evs[0]; ev.Kind != storage.EventUpserted || ev.Schedule != "tick" || !ev.Slot.Equal(utc("2026-05-01T10:01:00Z")) {
		t.Fatalf("event %+v", ev)
	}
}

// TestDeleteRemovesPendingFirings and the quota.
func TestDeleteAndQuota(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{MaxSchedules: 2})
	e.create(minutely("a"))
	e.create(minutely("b"))
	if _, err := e.s.Create(t.Context(), storage.Schedule{Namespace: e.ns, ID: "c", Every: time.Minute}, false); !errors.As(err, new(*QuotaError)) || !errors.Is(err, storage.ErrQuotaExceeded) {
		t.Fatalf("third schedule under max_schedules 2: %v", err)
	}
	removed, err := e.s.Delete(t.Context(), e.ns, "a", 0)
	if err != nil || removed != 1 {
		t.Fatalf("delete: removed %d, %v", removed, err)
	}
	if got := e.tasks(); len(got) != 1 {
		t.Fatalf("after delete: %v", got)
	}
	if _, err := e.s.Get(t.Context(), e.ns, "a"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("deleted schedule: %v", err)
	}
}

// TestValidate: each bad definition names its field.
func TestValidate(t *testing.T) {
	t.Parallel()
	now := utc("2026-05-01T10:00:00Z")
	ok := storage.Schedule{ID: "s", Every: time.Minute}
	cases := []struct {
		field string
		mod   func(*storage.Schedule)
	}{
		{"id", func(s *storage.Schedule) { s.ID = "has space" }},
		{"id", func(s *storage.Schedule) { s.ID = strings.Repeat("x", 65) }},
		{"cron", func(s *storage.Schedule) { s.Every = 0 }},
		{"every", func(s *storage.Schedule) { s.Cron = "@daily" }},
		{"cron", func(s *storage.Schedule) { s.Every, s.Cron = 0, "0 0 31 2 *" }},
		{"every", func(s *storage.Schedule) { s.Every = 1500 * time.Millisecond }},
		{"time_zone", func(s *storage.Schedule) { s.TimeZone = "Local" }},
		{"end_time", func(s *storage.Schedule) { s.End = now.Add(-time.Hour) }},
		{"end_time", func(s *storage.Schedule) { s.Start, s.End = now.Add(2*time.Hour), now.Add(time.Hour) }},
		{"max_firings", func(s *storage.Schedule) { s.MaxFirings = -1 }},
		{"catch_up_window", func(s *storage.Schedule) { s.CatchUp = storage.CatchUpAll }},
		{"catch_up_window", func(s *storage.Schedule) { s.CatchUpWindow = 8 * 24 * time.Hour }},
		{"jitter", func(s *storage.Schedule) { s.Jitter = time.Minute }},
		{"jitter", func(s *storage.Schedule) { s.Every, s.Jitter = 0, 2*time.Hour; s.Cron = "@daily" }},
		{"task.id_prefix", func(s *storage.Schedule) { s.Template.IDPrefix = "a/b" }},
		{"description", func(s *storage.Schedule) { s.Description = strings.Repeat("é", 257) }},
	}
	for _, tc := range cases {
		s := ok
		tc.mod(&s)
		_, err := Validate(s, now)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: %v, want an error on %s", s, err, tc.field)
		}
	}
	if _, err := Validate(ok, now); err != nil {
		t.Errorf("a valid schedule: %v", err)
	}
}

// TestLoopStartStop: the loop fires on its own and Stop leaves no
// goroutine behind (goleak).
func TestLoopStartStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{})
	e.create(minutely("tick"))
	stepped := make(chan struct{}, 10)
	e.s.hooks.step = func(storage.Schedule, []Firing) { stepped <- struct{}{} }
	if err := e.s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.clock.Set(utc("2026-05-01T10:01:50Z"))
	e.s.Poke()
	select {
	case <-stepped:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not step the schedule")
	}
	if err := e.s.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.tasks(); len(got) != 2 {
		t.Fatalf("tasks: %v", got)
	}
}

// TestForecast: the firings not created yet, per minute and per hour from
// now; a firing already created (a task) is not counted again; max
// firings and a cron rule bound the counts.
func TestForecast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:30Z", storage.Policy{})
	e.create(minutely("tick")) // its 10:01 firing is not created yet (lookahead 10 s)
	hourly := storage.Schedule{ID: "hourly", Cron: "@hourly", MaxFirings: 5}
	e.create(hourly)
	e.create(storage.Schedule{ID: "paused", Every: time.Minute})
	if _, _, err := e.s.Pause(t.Context(), e.ns, "paused"); err != nil {
		t.Fatal(err)
	}
	f, partial, err := e.s.Forecast(t.Context(), e.ns, utc("2026-05-01T10:00:30Z"))
	if err != nil || partial {
		t.Fatalf("forecast: %v, partial %v", err, partial)
	}
	// tick: one per minute; hourly: 11:00 falls in minute 59 ((10:59:30, 11:00:30]).
	wantMin := make([]int64, 60)
	for i := range wantMin {
		wantMin[i] = 1
	}
	wantMin[59] = 2
	if !slices.Equal(f.PerMinute, wantMin) {
		t.Fatalf("per minute: %v", f.PerMinute)
	}
	// Hours: 60 ticks each; hourly's 12:00..15:00 (4 more: max 5) in hours 1-4.
	if f.PerHour[0] != 61 || f.PerHour[1] != 61 || f.PerHour[4] != 61 || f.PerHour[5] != 60 || f.PerHour[23] != 60 {
		t.Fatalf("per hour: %v", f.PerHour)
	}
	e.at("2026-05-01T10:00:52Z") // creates tick's 10:01 firing
	f, _, _ = e.s.Forecast(t.Context(), e.ns, utc("2026-05-01T10:00:52Z"))
	if f.PerMinute[0] != 0 || f.PerMinute[1] != 1 {
		t.Fatalf("a created firing counted again: %v", f.PerMinute[:3])
	}
}
