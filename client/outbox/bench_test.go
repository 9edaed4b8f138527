package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/client/outbox"
)

// What the outbox costs, on the test databases and an in-process delayd
// (docs/client-guide.md quotes the figures with the command):
//
//	go test -run '^$' -bench 'Outbox' -benchtime 3000x ./client/outbox
//
// BenchmarkOutboxCommit: one business transaction (an order row) without
// and with an outbox Upsert; the difference is the commit latency the
// outbox adds. BenchmarkOutboxRelay: rows per second one relay moves from
// a table holding b.N committed rows until it is empty (park and arm
// included), reported as rows/s.

func BenchmarkOutboxCommit(b *testing.B) {
	for _, d := range dialects {
		for _, withOutbox := range []bool{false, true} {
			name := d.String() + "/plain"
			if withOutbox {
				name = d.String() + "/outbox"
			}
			b.Run(name, func(b *testing.B) {
				e := newEnv(b, d)
				ob := e.outbox(nil)
				ctx := b.Context()
				insert := e.q("INSERT INTO orders (id, status) VALUES (?, 'WAIT_PAY')")
				due := time.Now().Add(time.Hour)
				b.ResetTimer()
				for i := range b.N {
					id := fmt.Sprintf("o-%d", i)
					tx, err := e.db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := tx.ExecContext(ctx, insert, id); err != nil {
						b.Fatal(err)
					}
					if withOutbox {
						if err := ob.Upsert(ctx, tx, e.ns, outbox.Task{ID: id, Kind: "order.close", Payload: []byte(id), DueAt: due}); err != nil {
							b.Fatal(err)
						}
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkOutboxRelay(b *testing.B) {
	for _, d := range dialects {
		for _, batch := range []int{outbox.DefaultBatchSize, 500} {
			b.Run(fmt.Sprintf("%s/batch-%d", d, batch), func(b *testing.B) { benchRelay(b, d, batch) })
		}
	}
}

func benchRelay(b *testing.B, d outbox.Dialect, batch int) {
	e := newEnv(b, d)
	ob := e.outboxBatch(e.c, batch)
	ctx := b.Context()
	due := time.Now().Add(time.Hour)
	for start := 0; start < b.N; start += 500 {
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := start; i < min(start+500, b.N); i++ {
			id := fmt.Sprintf("o-%d", i)
			if err := ob.Upsert(ctx, tx, e.ns, outbox.Task{ID: id, Kind: "order.close", Payload: []byte(id), DueAt: due}); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	began := time.Now()
	if err := ob.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for {
		n, err := ob.Pending(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(began)
	b.StopTimer()
	if err := ob.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
}
