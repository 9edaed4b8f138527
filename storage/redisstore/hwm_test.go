package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// Incarnations and delivery sequences never repeat or go back, even when
// the Redis clock does (issue 30 item 3): each comes from max(TIME in µs,
// the shard's high-water mark + 1) and moves the mark. A mark planted an
// hour ahead of the clock (as if TIME had been stepped back an hour since
// the last pop) puts every later incarnation and sequence above it, each
// above the one before.
func TestStampsStayAboveTheHighWaterMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testRedisClient(t)
	s := New(c, Options{})
	ns := fmt.Sprintf("hwm-%d", time.Now().UnixNano())
	k := keysFor(ns, 0)
	t.Cleanup(func() {
		c.Del(context.Background(), k.due, k.inflight, k.dead, k.meta, k.body, k.life, k.hwm)
	})
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	planted := tm.Add(time.Hour).UnixMicro()
	if err := c.Set(ctx, k.hwm, planted, 0).Err(); err != nil {
		t.Fatal(err)
	}
	last := planted
	above := func(what string, v int64) {
		t.Helper()
		if v <= last {
			t.Fatalf("%s %d is not above the high-water mark %d (planted %d, the clock an hour behind it)", what, v, last, planted)
		}
		last = v
	}
	for i, id := range []string{"a", "b"} {
		res, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: []byte("p")}})
		if err != nil {
			t.Fatal(err)
		}
		above(fmt.Sprintf("incarnation of new task %s", id), res[0].Task.Incarnation)
		dels, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
		if err != nil || len(dels) != 1 {
			t.Fatalf("pop %d: %v, %d deliveries; want 1", i, err, len(dels))
		}
		above(fmt.Sprintf("delivery sequence of %s", id), dels[0].Token.Delivery)
		// The task comes back and is delivered again: a later sequence.
		zero := time.Duration(0)
		if _, _, err := s.Nack(ctx, ns, []storage.Token{dels[0].Token}, storage.NackOptions{RetryAfter: &zero}); err != nil {
			t.Fatal(err)
		}
		again, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
		if err != nil || len(again) != 1 {
			t.Fatalf("pop again %d: %v, %d deliveries; want 1", i, err, len(again))
		}
		above(fmt.Sprintf("redelivery sequence of %s", id), again[0].Token.Delivery)
		if _, err := s.Ack(ctx, ns, []storage.Token{again[0].Token}); err != nil {
			t.Fatal(err)
		}
	}
}

// The high-water mark lives in the meta HASH (hwmField) once a shard has
// written, beside the headers its upserts and pops read anyway; it
// outlives a DropNamespace in the hwm STRING, so a namespace re-created
// under the name never repeats an incarnation. A mark planted in the field
// an hour ahead of the clock puts the stamps above it, whatever the STRING
// says.
func TestHighWaterMarkInMetaOutlivesDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testRedisClient(t)
	s := New(c, Options{})
	ns := fmt.Sprintf("hwm-drop-%d", time.Now().UnixNano())
	k := keysFor(ns, 0)
	t.Cleanup(func() {
		c.Del(context.Background(), k.due, k.inflight, k.dead, k.meta, k.body, k.life, k.hwm)
	})
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	planted := tm.Add(time.Hour).UnixMicro()
	if err := c.HSet(ctx, k.meta, hwmField, planted).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, k.hwm, tm.Add(-time.Hour).UnixMicro(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	first := res[0].Task.Incarnation
	if first <= planted {
		t.Fatalf("incarnation %d is not above the mark %d planted in the meta HASH", first, planted)
	}
	if got, _ := c.HGet(ctx, k.meta, hwmField).Int64(); got != first {
		t.Fatalf("meta HASH mark %d after the upsert, want its incarnation %d", got, first)
	}
	dels, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
	if err != nil || len(dels) != 1 || dels[0].Token.Delivery <= first {
		t.Fatalf("pop: %v, %+v; want a delivery sequence above %d", err, dels, first)
	}
	seq := dels[0].Token.Delivery
	if got, _ := c.HGet(ctx, k.meta, hwmField).Int64(); got != seq {
		t.Fatalf("meta HASH mark %d after the pop, want its sequence %d", got, seq)
	}
	if _, err := s.DropNamespace(ctx, ns, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, k.meta).Result(); n != 0 {
		t.Fatal("the meta HASH outlived DropNamespace")
	}
	if got, _ := c.Get(ctx, k.hwm).Int64(); got != seq {
		t.Fatalf("hwm STRING %d after DropNamespace, want the mark %d", got, seq)
	}
	res, err = s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Task.Incarnation <= seq {
		t.Fatalf("re-created task's incarnation %d is not above the mark %d kept by the drop", res[0].Task.Incarnation, seq)
	}
}
