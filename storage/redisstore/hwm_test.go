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
