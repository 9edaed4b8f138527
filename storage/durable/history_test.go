package durable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
)

// steppedClock is a local clock the test can step back.
type steppedClock struct{ off atomic.Int64 }

func (c *steppedClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// TestEventTimesFollowTheHistoryOrder: the events one replica writes to a
// namespace's history never go back in time in the history's order, even
// when its estimate of the index's clock steps back (a new offset
// measurement) or an event carries an earlier time of its own (another
// clock's). Before, the second event here was stamped 50 ms before the
// first, and GetTaskHistory showed a task's events out of time order.
func TestEventTimesFollowTheHistoryOrder(t *testing.T) {
	clk := &steppedClock{}
	e := newEnv(t, func(c *durable.Config) { c.Clock = clk })
	ctx := context.Background()
	ns := "evtime"
	record := func(ev storage.Event) {
		t.Helper()
		if err := e.store.RecordEvents(ctx, ns, storage.RecordParams{Incarnation: 1, Keep: 1000, Events: []storage.Event{ev}}); err != nil {
			t.Fatal(err)
		}
	}
	record(storage.Event{Kind: storage.EventUpserted, ID: "a"})
	clk.off.Add(int64(-50 * time.Millisecond)) // the estimate steps back
	record(storage.Event{Kind: storage.EventRescheduled, ID: "a"})
	record(storage.Event{Kind: storage.EventDelivered, ID: "a", Time: time.Now().Add(-time.Minute)})
	evs, _, err := e.store.TaskHistory(ctx, ns, storage.HistoryParams{Incarnation: 1, ID: "a", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	want := []storage.EventKind{storage.EventUpserted, storage.EventRescheduled, storage.EventDelivered}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want kinds %v", evs, want)
	}
	for i, ev := range evs {
		if ev.Kind != want[i] {
			t.Errorf("event %d is %s, want %s", i, ev.Kind, want[i])
		}
		if i > 0 && ev.Time.Before(evs[i-1].Time) {
			t.Errorf("event %d (%s) at %v is before event %d at %v", i, ev.Kind, ev.Time, i-1, evs[i-1].Time)
		}
	}
}

// TestLateEventsOfEndedIncarnationAreNotKept: events recorded for a
// namespace incarnation after DeleteNamespace's drop ended it (a call
// that changed a task just before the delete records after it) are
// dropped by the group commit that would write them — before the name is
// re-created and after — so MySQL keeps no row a successor could read;
// the re-created namespace's own events are kept.
func TestLateEventsOfEndedIncarnationAreNotKept(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	reg := e.store.Registry()
	ns := "lateev" + testkit.Suffix()
	n, err := reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
	if err != nil {
		t.Fatal(err)
	}
	old := n.Incarnation()
	record := func(inc int64, id string) {
		t.Helper()
		if err := e.store.RecordEvents(ctx, ns, storage.RecordParams{Incarnation: inc, Keep: 1000,
			Events: []storage.Event{{Kind: storage.EventUpserted, ID: id, KeyID: "k"}}}); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(inc int64) int {
		t.Helper()
		var c int
		if err := e.db.QueryRow("SELECT COUNT(*) FROM delayd_task_events WHERE namespace = ? AND incarnation = ?", ns, inc).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	record(old, "a")
	if c := rows(old); c != 1 {
		t.Fatalf("the live incarnation's event: %d rows, want 1", c)
	}
	if _, err := e.store.DropNamespace(ctx, ns, old); err != nil {
		t.Fatal(err)
	}
	if err := reg.DeleteNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	record(old, "b") // late, before the name is re-created
	n, err = reg.CreateNamespace(ctx, storage.Namespace{Name: ns})
	if err != nil {
		t.Fatal(err)
	}
	record(old, "c") // late, after
	record(n.Incarnation(), "d")
	if c := rows(old); c != 0 {
		t.Errorf("the deleted incarnation has %d event rows after its late writes, want 0", c)
	}
	if c := rows(n.Incarnation()); c != 1 {
		t.Errorf("the re-created namespace's own event: %d rows, want 1", c)
	}
}
