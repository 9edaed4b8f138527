package durable_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// benchCallers is how many goroutines call Upsert at once in the upsert
// benchmarks, whatever -cpu says.
const benchCallers = 64

// benchUpserts runs b.N single-task upserts from benchCallers goroutines
// and reports upserts per second.
func benchUpserts(b *testing.B, s storage.Tasks, ns string) {
	benchUpsertsOf(b, s, ns, false)
}

// benchUpsertsOf is benchUpserts, the upserts create-only when createOnly.
func benchUpsertsOf(b *testing.B, s storage.Tasks, ns string, createOnly bool) {
	benchUpsertsFor(b, s, ns, createOnly, 0)
}

// benchUpsertsFor is benchUpsertsOf with every upsert naming namespace
// incarnation inc (0: none, unchecked).
func benchUpsertsFor(b *testing.B, s storage.Tasks, ns string, createOnly bool, inc int64) {
	payload := make([]byte, 100)
	var seq atomic.Int64
	b.SetParallelism((benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			id := fmt.Sprintf("b%09d", seq.Add(1))
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: payload, Delay: time.Hour, CreateOnly: createOnly, NamespaceIncarnation: inc}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "upserts/s")
}

// BenchmarkUpsertDurable: single-task upserts through the durable store
// (MySQL group commit, then Redis) from 64 concurrent callers.
//
//	go test ./storage/durable -run '^$' -bench 'Upsert(Durable|RedisOnly)' -benchtime 20000x
func BenchmarkUpsertDurable(b *testing.B) {
	e := newEnv(b, nil)
	ns := testkit.Namespace(b, "du")
	b.Cleanup(func() { _, _ = e.store.DropNamespace(context.Background(), ns, 0) })
	benchUpserts(b, e.store, ns)
}

// BenchmarkUpsertRedisOnly: the same upserts on the Redis index alone, the
// baseline durable mode is measured against.
func BenchmarkUpsertRedisOnly(b *testing.B) {
	e := newEnv(b, nil)
	ns := testkit.Namespace(b, "du")
	b.Cleanup(func() { _, _ = e.idx.DropNamespace(context.Background(), ns, 0) })
	benchUpserts(b, e.idx, ns)
}

// BenchmarkUpsertDurableCreateOnly: BenchmarkUpsertDurable with every
// upsert create-only (MySQL reads the conditional rows FOR UPDATE first).
//
//	go test ./storage/durable -run '^$' -bench 'UpsertDurable' -benchtime 20000x
func BenchmarkUpsertDurableCreateOnly(b *testing.B) {
	e := newEnv(b, nil)
	ns := testkit.Namespace(b, "du")
	b.Cleanup(func() { _, _ = e.store.DropNamespace(context.Background(), ns, 0) })
	benchUpsertsOf(b, e.store, ns, true)
}

// BenchmarkUpsertDurableChecked: BenchmarkUpsertDurable with every upsert
// naming its namespace incarnation, as the server's do: each upsert first
// asks the index (ClaimIncarnation, one Redis call per upsert), and the
// group commit reads the namespace's registry row LOCK IN SHARE MODE once
// per transaction (mysqlstore checkIncarnations).
//
//	go test ./storage/durable -run '^$' -bench 'UpsertDurable(Checked)?$' -benchtime 20000x -count 3
func BenchmarkUpsertDurableChecked(b *testing.B) {
	e := newEnv(b, nil)
	ns := testkit.Namespace(b, "du")
	n, err := e.store.Registry().CreateNamespace(context.Background(), storage.Namespace{Name: ns})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = e.store.DropNamespace(context.Background(), ns, 0) })
	benchUpsertsFor(b, e.store, ns, false, n.CreateTime.UnixMilli())
}
