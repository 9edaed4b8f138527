package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// HistoryStore is a store that keeps task histories and answers due
// forecasts.
type HistoryStore interface {
	storage.Store
	storage.History
	storage.Forecaster
	// storage.Store's DropNamespace, with an incarnation (a namespace
	// deleted), drops the namespace's history too.
}

// historyInc is the namespace incarnation the suite records histories in
// (a create time, Unix ms).
const historyInc = 1_700_000_000_000

// cleanup drops ns (its tasks, and the histories of incarnations up to
// inc), when t ends.
func cleanup(t *testing.T, s HistoryStore, ns string, inc int64) {
	t.Cleanup(func() {
		if _, err := s.DropNamespace(context.Background(), ns, inc); err != nil {
			t.Errorf("cleanup: drop namespace %s: %v", ns, err)
		}
	})
}

// record records events of incarnation inc of ns, keeping keep.
func record(t *testing.T, s HistoryStore, ns string, inc, keep int64, events ...storage.Event) {
	t.Helper()
	if err := s.RecordEvents(t.Context(), ns, storage.RecordParams{Incarnation: inc, Keep: keep, Events: events}); err != nil {
		t.Fatal(err)
	}
}

// historyOf reads every event of task id in incarnation inc of ns.
func historyOf(t *testing.T, s HistoryStore, ns string, inc int64, id string) []storage.Event {
	t.Helper()
	var out []storage.Event
	p := storage.HistoryParams{Incarnation: inc, ID: id, Limit: 1000}
	for range 100 {
		page, next, err := s.TaskHistory(t.Context(), ns, p)
		if err != nil {
			t.Fatalf("history of %s in incarnation %d of %s: %v", id, inc, ns, err)
		}
		out = append(out, page...)
		if next == "" {
			return out
		}
		p.Cursor = next
	}
	t.Fatalf("history of %s in incarnation %d of %s never ended its pages", id, inc, ns)
	return nil
}

// RunHistory runs the history and forecast suite as subtests of t.
func RunHistory(t *testing.T, newStore func(t *testing.T) HistoryStore) {
	t.Run("HistoryOrderAndPages", func(t *testing.T) { testHistoryPages(t, newStore(t)) })
	t.Run("HistoryCap", func(t *testing.T) { testHistoryCap(t, newStore(t)) })
	t.Run("Forecast", func(t *testing.T) { testForecast(t, newStore(t)) })
	t.Run("HistoryGoesWithNamespace", func(t *testing.T) { testHistoryDropped(t, newStore(t)) })
	t.Run("HistoryPerIncarnation", func(t *testing.T) { testHistoryIncarnations(t, newStore(t)) })
}

// testHistoryDropped: a deleted namespace's history goes with it (DropNamespace
// with an incarnation), so a namespace re-created under the name, perhaps for
// another team, never reads the events of the old one's tasks.
func testHistoryDropped(t *testing.T, s HistoryStore) {
	ctx := t.Context()
	ns := Namespace(t)
	cleanup(t, s, ns, historyInc)
	record(t, s, ns, historyInc, 1000, storage.Event{Kind: storage.EventNacked, ID: "a", Reason: "card 4111 declined"})
	if _, err := s.DropNamespace(ctx, ns, historyInc); err != nil {
		t.Fatal(err)
	}
	if got := historyOf(t, s, ns, historyInc, "a"); len(got) != 0 {
		t.Errorf("after DropNamespace the history of task a is %+v; want none", got)
	}
}

// testHistoryIncarnations: each namespace incarnation has a history of its
// own; events recorded for an incarnation after DropNamespace ended it (a
// call that changed a task just before a forced delete records its events
// after it) are never read, neither through it nor through the namespace
// re-created under the name; and the new incarnation's own events are.
func testHistoryIncarnations(t *testing.T, s HistoryStore) {
	ctx := t.Context()
	ns := Namespace(t)
	old, next := int64(historyInc), int64(historyInc+5000)
	cleanup(t, s, ns, old)
	cleanup(t, s, ns, next)
	record(t, s, ns, old, 1000, storage.Event{Kind: storage.EventUpserted, ID: "a", KeyID: "old-key"})
	record(t, s, ns, next, 1000, storage.Event{Kind: storage.EventUpserted, ID: "b", KeyID: "new-key"})
	if got := historyOf(t, s, ns, old, "a"); len(got) != 1 || got[0].KeyID != "old-key" {
		t.Errorf("incarnation %d's history of a: %+v; want its one event", old, got)
	}
	if got := historyOf(t, s, ns, next, "a"); len(got) != 0 {
		t.Errorf("incarnation %d reads the history of a recorded in incarnation %d: %+v", next, old, got)
	}
	if got := historyOf(t, s, ns, old, "b"); len(got) != 0 {
		t.Errorf("incarnation %d reads the history of b recorded in incarnation %d: %+v", old, next, got)
	}
	// The old incarnation is deleted, then a call made for it records
	// late; then the name is re-created.
	if _, err := s.DropNamespace(ctx, ns, old); err != nil {
		t.Fatal(err)
	}
	record(t, s, ns, old, 1000, storage.Event{Kind: storage.EventDelivered, ID: "a", Attempt: 1},
		storage.Event{Kind: storage.EventUpserted, ID: "c", KeyID: "old-key"})
	newer := old + 10_000
	cleanup(t, s, ns, newer)
	record(t, s, ns, newer, 1000, storage.Event{Kind: storage.EventUpserted, ID: "c", KeyID: "newer-key"})
	for _, id := range []string{"a", "c"} {
		if got := historyOf(t, s, ns, old, id); len(got) != 0 {
			t.Errorf("the ended incarnation's history of %s, recorded after the drop: %+v; want none", id, got)
		}
	}
	if got := historyOf(t, s, ns, newer, "a"); len(got) != 0 {
		t.Errorf("the re-created namespace reads the old one's late events of a: %+v", got)
	}
	if got := historyOf(t, s, ns, newer, "c"); len(got) != 1 || got[0].KeyID != "newer-key" {
		t.Errorf("the re-created namespace's history of c: %+v; want its own one event", got)
	}
}

// testHistoryPages: a task's events come back in the order written, with
// every field, page by page (by count and by bytes), apart from other
// tasks' and other namespaces' events; keep 0 records nothing.
func testHistoryPages(t *testing.T, s HistoryStore) {
	ctx := t.Context()
	ns, other := Namespace(t), Namespace(t)
	cleanup(t, s, ns, historyInc)
	cleanup(t, s, other, historyInc)
	due := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli())
	var want []storage.Event
	for i := range 7 {
		e := storage.Event{Kind: storage.EventKind(1 + i%int(storage.NumEventKinds-1)), ID: "a", KeyID: "k1", Generation: int64(i + 1),
			Due: due, Attempt: int32(i), Replica: "r1", Lateness: time.Duration(i) * time.Millisecond, Reason: fmt.Sprint("why ", i),
			RetryAfter: time.Duration(i) * time.Second}
		if e.Kind == storage.EventUpserted {
			// A schedule's firing: its first event names the schedule and the slot.
			e.Schedule, e.Slot = "nightly", time.UnixMilli(due.Add(-time.Minute).UnixMilli())
		}
		want = append(want, e)
		// Another task's event between each of a's.
		record(t, s, ns, historyInc, 1000, e, storage.Event{Kind: storage.EventUpserted, ID: "b"})
	}
	record(t, s, other, historyInc, 1000, storage.Event{Kind: storage.EventUpserted, ID: "a"})
	record(t, s, ns, historyInc, 0, storage.Event{Kind: storage.EventAcked, ID: "a"})
	for _, p := range []storage.HistoryParams{{Limit: 3}, {Limit: 100, MaxBytes: 2*storage.EventWireSize + 10}, {Limit: 1000}} {
		p.Incarnation = historyInc
		var got []storage.Event
		p.ID = "a"
		for range 100 {
			page, next, err := s.TaskHistory(ctx, ns, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > p.Limit {
				t.Fatalf("page of %d events with limit %d", len(page), p.Limit)
			}
			got = append(got, page...)
			if next == "" {
				break
			}
			p.Cursor = next
		}
		if len(got) != len(want) {
			t.Fatalf("%+v: read %d events, want %d: %+v", p, len(got), len(want), got)
		}
		for i := range got {
			if got[i].Time.IsZero() {
				t.Errorf("event %d has no time", i)
			}
			g := got[i]
			g.Time = time.Time{}
			if g != want[i] {
				t.Errorf("event %d = %+v\nwant %+v", i, g, want[i])
			}
		}
	}
	if _, _, err := s.TaskHistory(ctx, ns, storage.HistoryParams{Incarnation: historyInc, ID: "a", Limit: 10, Cursor: "not a cursor"}); err == nil {
		t.Error("a bad cursor was accepted")
	}
	evs, _, err := s.TaskHistory(ctx, other, storage.HistoryParams{Incarnation: historyInc, ID: "a", Limit: 10})
	if err != nil || len(evs) != 1 {
		t.Errorf("the other namespace's history of a: %v, %v; want its one event", evs, err)
	}
}

// testHistoryCap: a namespace keeps about keep events, the newest.
func testHistoryCap(t *testing.T, s HistoryStore) {
	ctx := t.Context()
	ns := Namespace(t)
	cleanup(t, s, ns, historyInc)
	const keep = 300
	for b := range 10 {
		var batch []storage.Event
		for i := range 100 {
			batch = append(batch, storage.Event{Kind: storage.EventUpserted, ID: fmt.Sprintf("t%d-%d", b, i)})
		}
		record(t, s, ns, historyInc, keep, batch...)
	}
	if evs, _, err := s.TaskHistory(ctx, ns, storage.HistoryParams{Incarnation: historyInc, ID: "t9-99", Limit: 10}); err != nil || len(evs) != 1 {
		t.Errorf("the newest event: %v, %v", evs, err)
	}
	// MAXLEN ~ trims whole stream nodes, and MySQL trims in steps: the
	// oldest events must be gone, not necessarily exactly keep.
	if evs, _, err := s.TaskHistory(ctx, ns, storage.HistoryParams{Incarnation: historyInc, ID: "t0-0", Limit: 10}); err != nil || len(evs) != 0 {
		t.Errorf("the oldest of 1,000 events with keep %d: %v, %v; want gone", keep, evs, err)
	}
}

// testForecast: tasks land in the minute and hour buckets of their due
// times; due, delivered and dead tasks are not counted.
func testForecast(t *testing.T, s HistoryStore) {
	ctx := t.Context()
	ns := Namespace(t)
	cleanup(t, s, ns, historyInc)
	var specs []storage.UpsertSpec
	add := func(n int, d time.Duration) {
		for range n {
			specs = append(specs, storage.UpsertSpec{ID: fmt.Sprint("f", len(specs)), Delay: d})
		}
	}
	add(3, 90*time.Second)             // minute 1, hour 0
	add(2, 30*time.Minute+time.Second) // minute 30, hour 0
	add(4, 5*time.Hour+time.Minute)    // hour 5
	add(1, 30*time.Hour)               // beyond the day
	add(2, 0)                          // due now: not in the forecast
	if _, err := s.Upsert(ctx, ns, specs); err != nil {
		t.Fatal(err)
	}
	f, err := s.Forecast(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.PerMinute) != storage.ForecastMinutes || len(f.PerHour) != storage.ForecastHours || f.Now.IsZero() {
		t.Fatalf("forecast shape: %d minutes, %d hours, now %v", len(f.PerMinute), len(f.PerHour), f.Now)
	}
	wantMin := make([]int64, storage.ForecastMinutes)
	wantMin[1], wantMin[30] = 3, 2
	wantHour := make([]int64, storage.ForecastHours)
	wantHour[0], wantHour[5] = 5, 4
	if !slices.Equal(f.PerMinute, wantMin) || !slices.Equal(f.PerHour, wantHour) {
		t.Errorf("forecast per minute %v\nper hour %v\nwant %v\n%v", f.PerMinute, f.PerHour, wantMin, wantHour)
	}
}
