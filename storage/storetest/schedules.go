package storetest

import (
	"context"
	"errors"

	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delayd/delayd/storage"
)

// ScheduleStore is a task store that keeps schedules: the Redis index in
// Redis-only mode, the durable store (MySQL), the fake.
type ScheduleStore interface {
	storage.Store
	storage.Schedules
}

// RunSchedules runs the schedule suite as subtests of t against a store
// whose namespaces have shards shards (1 unless the store spreads them):
// create, get, list, the compare-and-set update, a step's firings created
// with it atomically and exactly once under racing writers, the due scan,
// and the drop of a namespace's schedules. No schedule loop may run on
// the store meanwhile: DueSchedules answers every namespace, so a loop
// there (a delayd on the same Redis) steps the suite's schedules as it
// reads them.
func RunSchedules(t *testing.T, shards int, newStore func(t *testing.T) ScheduleStore) {
	t.Run("ScheduleCRUD", func(t *testing.T) { testScheduleCRUD(t, newStore(t)) })
	t.Run("ScheduleRoundTrip", func(t *testing.T) { testScheduleRoundTrip(t, newStore(t)) })
	t.Run("ScheduleFire", func(t *testing.T) { testScheduleFire(t, newStore(t), shards) })
	t.Run("ScheduleFireOnce", func(t *testing.T) { testScheduleFireOnce(t, newStore(t), shards) })
	t.Run("ScheduleDue", func(t *testing.T) { testScheduleDue(t, newStore(t)) })
	t.Run("ScheduleNamespaceEnded", func(t *testing.T) { testScheduleNamespaceEnded(t, newStore(t), shards) })
}

// scheduleEnv is one test's namespace, dropped (tasks and schedules) when
// the test ends.
func scheduleEnv(t *testing.T, s ScheduleStore) (context.Context, string) {
	t.Helper()
	ns := Namespace(t)
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := s.DropSchedules(ctx, ns); err != nil {
			t.Errorf("cleanup: drop schedules: %v", err)
		}
		if _, err := s.DropNamespace(ctx, ns, 0); err != nil {
			t.Errorf("cleanup: drop namespace: %v", err)
		}
	})
	return t.Context(), ns
}

func newSchedule(ns, id string) storage.Schedule {
	return storage.Schedule{Namespace: ns, ID: id, Every: time.Minute, Template: storage.TaskTemplate{Kind: "k", Payload: []byte("p:" + id)}}
}

// ignoreStoreTimes leaves out what the store sets from its clock.
var ignoreStoreTimes = cmpopts.IgnoreFields(storage.Schedule{}, "CreateTime", "UpdateTime")

func testScheduleCRUD(t *testing.T, s ScheduleStore) {
	ctx, ns := scheduleEnv(t, s)
	if _, err := s.GetSchedule(ctx, ns, "a"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("get of a missing schedule: %v, want ErrNotFound", err)
	}
	for _, id := range []string{"c", "a", "b"} {
		got, err := s.CreateSchedule(ctx, newSchedule(ns, id))
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != 1 || got.CreateTime.IsZero() || !got.UpdateTime.Equal(got.CreateTime) {
			t.Fatalf("created %s: version %d, times %v %v", id, got.Version, got.CreateTime, got.UpdateTime)
		}
	}
	if _, err := s.CreateSchedule(ctx, newSchedule(ns, "a")); !errors.Is(err, storage.ErrAlreadyExists) {
		t.Fatalf("second create of a: %v, want ErrAlreadyExists", err)
	}
	if n, err := s.CountSchedules(ctx, ns); err != nil || n != 3 {
		t.Fatalf("count = %d, %v; want 3", n, err)
	}
	page, more, err := s.ListSchedules(ctx, ns, "", 2)
	if err != nil || !more || len(page) != 2 || page[0].ID != "a" || page[1].ID != "b" {
		t.Fatalf("first page: %v more %v, %v; want a, b and more", scheduleIDs(page), more, err)
	}
	page, more, err = s.ListSchedules(ctx, ns, "b", 2)
	if err != nil || more || len(page) != 1 || page[0].ID != "c" {
		t.Fatalf("second page: %v more %v, %v; want c, last", scheduleIDs(page), more, err)
	}
	if err := s.DeleteSchedule(ctx, ns, "a", 7); !errors.Is(err, storage.ErrGenerationMismatch) {
		t.Fatalf("delete at another version: %v, want ErrGenerationMismatch", err)
	}
	if err := s.DeleteSchedule(ctx, ns, "a", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSchedule(ctx, ns, "a", 0); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if n, err := s.DropSchedules(ctx, ns); err != nil || n != 2 {
		t.Fatalf("drop = %d, %v; want 2", n, err)
	}
	if n, err := s.CountSchedules(ctx, ns); err != nil || n != 0 {
		t.Fatalf("count after drop = %d, %v", n, err)
	}
}

func scheduleIDs(ss []storage.Schedule) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.ID
	}
	return out
}

// testScheduleRoundTrip: every field of a schedule comes back as written,
// and an update at a stale version changes nothing.
func testScheduleRoundTrip(t *testing.T, s ScheduleStore) {
	ctx, ns := scheduleEnv(t, s)
	ms := func(v string) time.Time { return time.UnixMilli(utcMS(v)).UTC() }
	full := storage.Schedule{
		Namespace: ns, ID: "full", Description: "nightly loan sweep", Cron: "30 2 * * 1-5", TimeZone: "Europe/Berlin",
		Start: ms("2026-01-01T00:00:00Z"), End: ms("2027-01-01T00:00:00Z"), MaxFirings: 99,
		CatchUp: storage.CatchUpAll, CatchUpWindow: time.Hour, Overlap: storage.OverlapSkip, Jitter: 90 * time.Second,
		Template: storage.TaskTemplate{Kind: "loan.sweep", Payload: []byte{0, 1, 2, 255}, IDPrefix: "sweep-"},
	}
	created, err := s.CreateSchedule(ctx, full)
	if err != nil {
		t.Fatal(err)
	}
	want := full
	want.Version = 1
	if diff := cmp.Diff(want, created, ignoreStoreTimes); diff != "" {
		t.Fatalf("created (-want +got):\n%s", diff)
	}
	next := created
	next.Paused, next.Cursor, next.Fired, next.Skipped = true, ms("2026-03-02T01:30:00Z"), 5, 2
	next.LastSlot, next.LastTaskID, next.NextSlot = ms("2026-03-02T01:30:00Z"), "sweep-full.20260302T013000Z", ms("2026-03-03T01:30:00Z")
	next.Advance = ms("2026-03-03T01:29:50Z")
	res, err := s.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	want = next
	want.Version = 2
	if diff := cmp.Diff(want, res.Schedule, ignoreStoreTimes); diff != "" {
		t.Fatalf("updated (-want +got):\n%s", diff)
	}
	got, err := s.GetSchedule(ctx, ns, "full")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, ignoreStoreTimes); diff != "" {
		t.Fatalf("read back (-want +got):\n%s", diff)
	}
	if !got.CreateTime.Equal(created.CreateTime) || got.UpdateTime.Before(created.UpdateTime) {
		t.Fatalf("times: created %v then %v, updated %v then %v", created.CreateTime, got.CreateTime, created.UpdateTime, got.UpdateTime)
	}
	stale := got
	stale.Description = "lost"
	if _, err := s.UpdateSchedule(ctx, stale, storage.UpdateScheduleParams{IfVersion: 1}); !errors.Is(err, storage.ErrGenerationMismatch) {
		t.Fatalf("update at version 1 of version 2: %v, want ErrGenerationMismatch", err)
	}
	missing := newSchedule(ns, "missing")
	if _, err := s.UpdateSchedule(ctx, missing, storage.UpdateScheduleParams{IfVersion: 1}); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("update of a missing schedule: %v, want ErrNotFound", err)
	}
	if again, _ := s.GetSchedule(ctx, ns, "full"); again.Description != full.Description || again.Version != 2 {
		t.Fatalf("a refused update changed the schedule: %+v", again)
	}
}

func utcMS(v string) int64 {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		panic(err)
	}
	return t.UnixMilli()
}

// fireSpecs are the firings of schedule id at the given slots (due at the
// slot), with the namespace's shard count.
func fireSpecs(id string, shards int, slots ...time.Time) []storage.UpsertSpec {
	out := make([]storage.UpsertSpec, len(slots))
	for i, slot := range slots {
		out[i] = storage.UpsertSpec{ID: storage.FiringID("", id, slot, shards), Kind: "k", Payload: []byte("fired"), DueTime: slot, CreateOnly: true}
	}
	return out
}

// testScheduleFire: a step's firings are created with the schedule's new
// state; a firing whose id exists is refused and left as it is; a step at
// a stale version creates nothing.
func testScheduleFire(t *testing.T, s ScheduleStore, shards int) {
	ctx, ns := scheduleEnv(t, s)
	sc, err := s.CreateSchedule(ctx, newSchedule(ns, "tick"))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(time.Hour).Truncate(time.Minute).UTC()
	slots := []time.Time{base, base.Add(time.Minute), base.Add(2 * time.Minute)}
	specs := fireSpecs("tick", shards, slots...)
	// A task of the second firing's id exists already.
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: specs[1].ID, Payload: []byte("mine"), DueTime: base.Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	next := sc
	next.Cursor, next.Fired = slots[2], 3
	res, err := s.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: sc.Version, Fire: specs})
	if err != nil {
		t.Fatal(err)
	}
	if res.Schedule.Version != 2 || !res.Schedule.Cursor.Equal(slots[2]) || len(res.Fired) != 3 {
		t.Fatalf("step: version %d cursor %v, %d results", res.Schedule.Version, res.Schedule.Cursor, len(res.Fired))
	}
	for i, r := range res.Fired {
		wantCreated := i != 1
		if r.Created != wantCreated || (i == 1) != (r.Refused == storage.RefusedExists) {
			t.Errorf("firing %d: created %v refused %v; want created %v", i, r.Created, r.Refused, wantCreated)
		}
		task, err := s.Get(ctx, ns, specs[i].ID)
		if err != nil {
			t.Fatalf("get firing %d: %v", i, err)
		}
		switch {
		case i == 1 && string(task.Payload) != "mine":
			t.Errorf("the existing task was overwritten: %q", task.Payload)
		case i != 1 && (string(task.Payload) != "fired" || task.Kind != "k" || !task.DueTime.Equal(slots[i]) || task.State != storage.StateScheduled || task.Generation != 1):
			t.Errorf("firing %d stored as %+v", i, task)
		}
	}
	// A step at the old version: nothing is created, nothing changes.
	late := fireSpecs("tick", shards, base.Add(3*time.Minute))
	if _, err := s.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: sc.Version, Fire: late}); !errors.Is(err, storage.ErrGenerationMismatch) {
		t.Fatalf("stale step: %v, want ErrGenerationMismatch", err)
	}
	if _, err := s.Get(ctx, ns, late[0].ID); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a stale step created its firing: %v", err)
	}
}

// testScheduleFireOnce: replicas racing the same step at the same version
// create each firing once: one step applies, the others change nothing.
func testScheduleFireOnce(t *testing.T, s ScheduleStore, shards int) {
	ctx, ns := scheduleEnv(t, s)
	sc, err := s.CreateSchedule(ctx, newSchedule(ns, "race"))
	if err != nil {
		t.Fatal(err)
	}
	slot := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	for round := range 5 {
		const racers = 8
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			applied int
			created int
		)
		for range racers {
			wg.Go(func() {
				next := sc
				next.Cursor, next.Fired = slot, sc.Fired+1
				res, err := s.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: sc.Version, Fire: fireSpecs("race", shards, slot)})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, storage.ErrGenerationMismatch):
				case err != nil:
					t.Errorf("round %d: %v", round, err)
				default:
					applied++
					if res.Fired[0].Created {
						created++
					}
				}
			})
		}
		wg.Wait()
		if applied != 1 || created != 1 {
			t.Fatalf("round %d: %d steps applied, %d firings created; want 1 and 1", round, applied, created)
		}
		if sc, err = s.GetSchedule(ctx, ns, "race"); err != nil || sc.Fired != int64(round+1) {
			t.Fatalf("round %d: fired %d, %v", round, sc.Fired, err)
		}
		slot = slot.Add(time.Second)
	}
}

// testScheduleDue: a schedule whose Advance has come is due, one whose
// Advance is ahead sets Next, one without an Advance (paused, done) is
// neither.
func testScheduleDue(t *testing.T, s ScheduleStore) {
	ctx, ns := scheduleEnv(t, s)
	mk := func(id string, advance time.Time) {
		sc, err := s.CreateSchedule(ctx, newSchedule(ns, id))
		if err != nil {
			t.Fatal(err)
		}
		sc.Advance = advance
		if _, err := s.UpdateSchedule(ctx, sc, storage.UpdateScheduleParams{IfVersion: 1}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	far := now.Add(24 * 365 * time.Hour) // later than anything of other tests
	mk("due1", now.Add(-time.Minute))
	mk("due2", now.Add(-time.Second))
	mk("later", far)
	mk("paused", time.Time{})
	d, err := s.DueSchedules(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sc := range d.Schedules {
		if sc.Namespace == ns {
			got = append(got, sc.ID)
			if sc.Advance.After(d.Now) {
				t.Errorf("%s returned with advance %v after now %v", sc.ID, sc.Advance, d.Now)
			}
		}
	}
	if diff := cmp.Diff([]string{"due1", "due2"}, got); diff != "" {
		t.Errorf("due schedules of the namespace (-want +got):\n%s", diff)
	}
	if d.Next.IsZero() || d.Next.After(far) || !d.Next.After(d.Now) {
		t.Errorf("next = %v (now %v), want after now and at or before %v", d.Next, d.Now, far)
	}
	if d.Now.Before(now.Add(-time.Minute)) || d.Now.After(now.Add(time.Minute)) {
		t.Errorf("store now %v is far from %v", d.Now, now)
	}
	// The limit holds per namespace.
	d, err = s.DueSchedules(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sc := range d.Schedules {
		if sc.Namespace == ns {
			n++
		}
	}
	if n != 1 {
		t.Errorf("limit 1: %d schedules of the namespace", n)
	}
}

// testScheduleNamespaceEnded: a step whose firings name an ended
// namespace incarnation writes nothing.
func testScheduleNamespaceEnded(t *testing.T, s ScheduleStore, shards int) {
	ctx, ns := scheduleEnv(t, s)
	sc, err := s.CreateSchedule(ctx, newSchedule(ns, "gone"))
	if err != nil {
		t.Fatal(err)
	}
	inc := time.Now().UnixMilli() - 1000
	if _, err := s.DropNamespace(ctx, ns, inc); err != nil {
		t.Fatal(err)
	}
	specs := fireSpecs("gone", shards, time.Now().Add(time.Hour).Truncate(time.Second))
	specs[0].NamespaceIncarnation = inc
	next := sc
	next.Fired = 1
	if _, err := s.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: 1, Fire: specs}); !errors.Is(err, storage.ErrNamespaceEnded) {
		t.Fatalf("step into an ended namespace: %v, want ErrNamespaceEnded", err)
	}
	if got, _ := s.GetSchedule(ctx, ns, "gone"); got.Version != 1 {
		t.Fatalf("the schedule changed: version %d", got.Version)
	}
	if _, err := s.Get(ctx, ns, specs[0].ID); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the firing was created: %v", err)
	}
}
