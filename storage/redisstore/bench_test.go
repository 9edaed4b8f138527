package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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

// BenchmarkRedisCPUPerTask measures what each step of a task's life costs
// Redis: the CPU of a private redis-server's main thread (INFO cpu) per
// task, for batched upserts (1,000 per call, 100-byte payloads, due at
// once), pops (PopBatch-sized: 256 per call) and acks (500 tokens per
// call) of b.N × 10,000 tasks. Unlike wall time it is barely moved by
// other load on the machine, so before/after pairs of a script change can
// be compared (go test -run X -bench RedisCPUPerTask ./storage/redisstore/).
func BenchmarkRedisCPUPerTask(b *testing.B) {
	srv := testkit.StartRedis(b)
	c := srv.Client()
	s := New(c, Options{})
	ctx := context.Background()
	const n = 10_000
	cpu := func() time.Duration {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total time.Duration
		for _, line := range strings.Split(info, "\r\n") {
			k, v, _ := strings.Cut(line, ":")
			if k == "used_cpu_user_main_thread" || k == "used_cpu_sys_main_thread" {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += time.Duration(f * float64(time.Second))
			}
		}
		return total
	}
	payload := make([]byte, 100)
	var up, pop, ack time.Duration
	tasks := 0
	for i := 0; b.Loop(); i++ {
		ns := fmt.Sprintf("cpu%d", i)
		specs := make([]storage.UpsertSpec, MaxBatch)
		t0 := cpu()
		for lo := 0; lo < n; lo += MaxBatch {
			for j := range specs {
				specs[j] = storage.UpsertSpec{ID: "t" + strconv.Itoa(lo+j), Payload: payload}
			}
			if _, err := s.Upsert(ctx, ns, specs); err != nil {
				b.Fatal(err)
			}
		}
		t1 := cpu()
		var toks []storage.Token
		for len(toks) < n {
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 256, LeaseFor: time.Minute})
			if err != nil || len(ds) == 0 {
				b.Fatalf("pop: %d, %v", len(ds), err)
			}
			for _, d := range ds {
				toks = append(toks, d.Token)
			}
		}
		t2 := cpu()
		for lo := 0; lo < len(toks); lo += 500 {
			st, err := s.Ack(ctx, ns, toks[lo:min(lo+500, len(toks))])
			if err != nil || st[0] != storage.TokenOK {
				b.Fatalf("ack: %v, %v", st, err)
			}
		}
		t3 := cpu()
		up, pop, ack = up+t1-t0, pop+t2-t1, ack+t3-t2
		tasks += n
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(tasks) }
	b.ReportMetric(per(up), "upsert-µs/task")
	b.ReportMetric(per(pop), "pop-µs/task")
	b.ReportMetric(per(ack), "ack-µs/task")
	b.ReportMetric(per(up+pop+ack), "redis-µs/task")
}
