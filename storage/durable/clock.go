package durable

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// indexClock is the clock probe: the index's clock (Redis TIME, which
// decides due-ness) as this replica knows it, the local clock plus an
// offset measured through the index at most a second ago. A write reads it
// (now) and never waits for a hung index: once an offset is known, a stale
// one is measured again in the background (one probe at a time) while the
// write goes on with the last one. Stop waits for a probe in flight; after
// it no probe starts.
type indexClock struct {
	local storage.Clock
	index interface {
		// NextWake answers the index's time (its second value).
		NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error)
	}
	log *slog.Logger

	mu       sync.Mutex
	offset   time.Duration // index clock minus local clock
	offsetAt time.Time     // when offset was measured (local); zero: never
	probing  bool          // a background probe runs
	running  bool          // between Start and Stop: probes may run in the background
	probes   sync.WaitGroup
}

func newIndexClock(local storage.Clock, index Index, log *slog.Logger) *indexClock {
	return &indexClock{local: local, index: index, log: log}
}

// Start lets stale offsets be measured again in the background. Before it
// (and after Stop) only the first offset is measured, inline.
func (c *indexClock) Start(context.Context) error {
	c.mu.Lock()
	c.running = true
	c.mu.Unlock()
	return nil
}

// Stop ends background probes and waits for one in flight, or for ctx.
func (c *indexClock) Stop(ctx context.Context) error {
	c.mu.Lock()
	c.running = false // under mu: no probe is Added after this
	c.mu.Unlock()
	return waitCtx(ctx, c.probes.Wait)
}

// now returns the index's clock as well as this replica knows it. If the
// index cannot be asked, the last offset (at first 0) is used: a relative
// delay is then off by this replica's clock error, which is only the due
// time the task gets, never early delivery of another.
func (c *indexClock) now(ctx context.Context, ns string) time.Time {
	local := c.local.Now()
	c.mu.Lock()
	fresh := !c.offsetAt.IsZero() && local.Sub(c.offsetAt) < time.Second && local.Sub(c.offsetAt) >= 0
	off := c.offset
	if fresh {
		c.mu.Unlock()
		return local.Add(off)
	}
	first := c.offsetAt.IsZero()
	probe := !c.probing && !first && c.running
	if probe {
		c.probing = true
		c.probes.Add(1) // under mu: Stop waits for probes after taking it
	}
	c.mu.Unlock()
	if first {
		// No offset yet: measure it now (bounded by ctx and a second).
		return c.runOnce(ctx, ns)
	}
	if probe {
		// Measure again in the background: a hung index must not hold a
		// write, which goes on with the last offset meanwhile.
		go func() {
			defer c.probes.Done()
			c.runOnce(context.Background(), ns)
			c.mu.Lock()
			c.probing = false
			c.mu.Unlock()
		}()
	}
	return local.Add(off)
}

// runOnce measures the offset of the index's clock (within a second) and
// returns the index's time by it; when the index does not answer, the last
// offset is kept and not asked again for a second.
func (c *indexClock) runOnce(ctx context.Context, ns string) time.Time {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	before := c.local.Now()
	_, remote, _, err := c.index.NextWake(cctx, ns)
	after := c.local.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || remote.IsZero() {
		if err != nil {
			c.log.Debug("index clock unavailable; using the last known offset", "err", err)
		}
		c.offsetAt = after // do not ask again for a second
		return after.Add(c.offset)
	}
	mid := before.Add(after.Sub(before) / 2)
	c.offset, c.offsetAt = remote.Sub(mid), after
	return after.Add(c.offset)
}

// waitCtx runs wait and returns nil when it returned, or ctx's error first
// (wait then goes on in the background).
func waitCtx(ctx context.Context, wait func()) error {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
