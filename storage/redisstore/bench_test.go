package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// BenchmarkUpsertBatch measures batched upserts of 1,000 tasks with
// 100-byte payloads against the test Redis (go test -bench UpsertBatch).
func BenchmarkUpsertBatch(b *testing.B) {
	s := New(testRedisClient(b), Options{})
	ctx := context.Background()
	ns := testkit.Namespace(b, "bench")
	b.Cleanup(func() { s.rdb.Del(context.Background(), allKeys(keysFor(ns, 0))...) })
	payload := make([]byte, 100)
	specs := make([]storage.UpsertSpec, MaxBatch)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range specs {
			specs[j] = storage.UpsertSpec{ID: fmt.Sprintf("t%d-%d", i%100, j), Payload: payload, Delay: time.Hour}
		}
		if _, err := s.Upsert(ctx, ns, specs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*MaxBatch)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkPopAck measures the delivery path: pop 100 due tasks into a
// lease, then ack them, against the test Redis.
func BenchmarkPopAck(b *testing.B) {
	s := New(testRedisClient(b), Options{})
	ctx := context.Background()
	ns := testkit.Namespace(b, "bench")
	b.Cleanup(func() { s.rdb.Del(context.Background(), allKeys(keysFor(ns, 0))...) })
	payload := make([]byte, 100)
	const batch = 100
	specs := make([]storage.UpsertSpec, batch)
	toks := make([]storage.Token, 0, batch)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range specs {
			specs[j] = storage.UpsertSpec{ID: fmt.Sprintf("t%d-%d", i, j), Payload: payload}
		}
		if _, err := s.Upsert(ctx, ns, specs); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: batch, LeaseFor: time.Minute})
		if err != nil || len(ds) != batch {
			b.Fatalf("pop: %d, %v", len(ds), err)
		}
		toks = toks[:0]
		for _, d := range ds {
			toks = append(toks, d.Token)
		}
		if _, err := s.Ack(ctx, ns, toks); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "tasks/s")
}
