package durable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

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
		if err := e.store.RecordEvents(ctx, ns, 1000, []storage.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	record(storage.Event{Kind: storage.EventUpserted, ID: "a"})
	clk.off.Add(int64(-50 * time.Millisecond)) // the estimate steps back
	record(storage.Event{Kind: storage.EventRescheduled, ID: "a"})
	record(storage.Event{Kind: storage.EventDelivered, ID: "a", Time: time.Now().Add(-time.Minute)})
	evs, _, err := e.store.TaskHistory(ctx, ns, storage.HistoryParams{ID: "a", Limit: 10})
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
