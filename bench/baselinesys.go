package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/bench/baseline"
)

// baselineSystem runs the source design (package baseline) with one poller
// at a fixed interval, in this process.
type baselineSystem struct {
	q        *baseline.Queue
	interval time.Duration
	batch    int
	clock    Clock
	logger   *slog.Logger
}

// newBaselineSystem returns the baseline under a fresh key prefix on rdb,
// polling every interval and popping batch ids per pop.
func newBaselineSystem(rdb redis.UniversalClient, prefix string, interval time.Duration, batch int, clock Clock, logger *slog.Logger) *baselineSystem {
	return &baselineSystem{q: baseline.New(rdb, prefix), interval: interval, batch: batch, clock: clock, logger: logger}
}

func (b *baselineSystem) name() string { return "baseline-" + fmtInterval(b.interval) }

// fmtInterval prints 1s, 10ms, 250ms ...
func fmtInterval(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d/time.Millisecond)
}

func (b *baselineSystem) setup(context.Context, []string) error { return nil }

func (b *baselineSystem) upsert(ctx context.Context, ns string, items []item, payload []byte, unary bool) error {
	if unary {
		for _, it := range items {
			if err := b.q.Upsert(ctx, ns, baseline.Item{ID: it.id, Due: it.due, Record: payload}); err != nil {
				return err
			}
		}
		return nil
	}
	bi := make([]baseline.Item, len(items))
	for i, it := range items {
		bi[i] = baseline.Item{ID: it.id, Due: it.due, Record: payload}
	}
	return b.q.UpsertPipelined(ctx, ns, bi)
}

// consume runs the source design's single poller over every namespace;
// subscribers and maxInFlight do not apply to it. The poller decides
// due-ness with the Redis clock as estimated here (on one host, the same
// clock as its own), so early deliveries measure the design, not clock skew.
func (b *baselineSystem) consume(ctx context.Context, nss []string, _, _ int, s sink) (func(), error) {
	p, err := baseline.NewPoller(baseline.PollerConfig{
		Queue:    b.q,
		Queues:   nss,
		Interval: b.interval,
		Batch:    b.batch,
		Now:      b.clock.Now,
		Logger:   b.logger,
		Handle: func(t baseline.Task) {
			now := time.Now()
			s.delivered(t.Queue, t.ID, now)
			// The pop deleted the task: handling it is its ack.
			s.acked(1, 0, now)
		},
	})
	if err != nil {
		return nil, err
	}
	p.Start(ctx)
	return func() { _ = p.Stop(context.Background()) }, nil
}

func (b *baselineSystem) cpu() (time.Duration, string, bool) {
	return SelfCPU(), "delaybench process: baseline poller + load generator", true
}

func (b *baselineSystem) pid() int { return os.Getpid() }

func (b *baselineSystem) cleanup(ctx context.Context, _ []string) error {
	_, err := b.q.Cleanup(ctx)
	return err
}
