package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
	"github.com/delayd/delayd/storage/redisstore"
)

// TestTraceContextSurvivesIndexRebuild: MySQL keeps each task's trace
// context (the traceparent of its last upsert), so when Redis loses
// everything and the index is rebuilt from MySQL, the task is still
// delivered — and read — with its producer's trace context. Before the
// traceparent column it was kept in Redis only and lost with it.
func TestTraceContextSurvivesIndexRebuild(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	rdb := testkit.RedisAt(t, testkit.StartRedis(t).URL)
	idx := redisstore.New(rdb, redisstore.Options{Logger: testkit.Logger(t), Traces: true})
	ctx := context.Background()
	s := openStore(t, testkit.Database(t, "delayd_test"), durable.Config{Index: idx, Logger: testkit.Logger(t),
		IndexCheckInterval: 50 * time.Millisecond, OpTimeout: 2 * time.Second})
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	select {
	case <-s.Ready():
	case <-time.After(time.Minute):
		t.Fatal("store never became ready")
	}
	ns := testkit.Namespace(t, "trace")
	due := time.Now().Add(2 * time.Second)
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{
		{ID: "traced", Payload: []byte("p"), DueTime: due, TraceParent: tp},
		{ID: "untraced", Payload: []byte("p"), DueTime: due},
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, ns, "traced"); err != nil || got.TraceParent != tp {
		t.Fatalf("GetTask before the loss: traceparent %q, %v; want %q", got.TraceParent, err, tp)
	}

	// Redis loses everything; the store rebuilds the index from MySQL.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	poll(t, "the index to be rebuilt from MySQL", func() bool {
		ok, err := idx.Indexed(ctx, ns)
		return err == nil && ok
	})
	if got, err := idx.Get(ctx, ns, "traced"); err != nil || got.TraceParent != tp {
		t.Fatalf("the rebuilt index holds traceparent %q (%v), want the producer's %q", got.TraceParent, err, tp)
	}

	got := map[string]string{}
	poll(t, "both tasks to be delivered", func() bool {
		ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
		if err != nil {
			t.Logf("pop: %v", err)
		}
		for _, d := range ds {
			got[d.Task.ID] = d.Task.TraceParent
		}
		return len(got) == 2
	})
	if got["traced"] != tp || got["untraced"] != "" {
		t.Fatalf("deliveries after the rebuild carry %q and %q, want %q and none", got["traced"], got["untraced"], tp)
	}
}
