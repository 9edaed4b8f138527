package guard

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// hangingCounter counts with the fake store until hang is set; then every
// Stats blocks until its context ends, as on a SIGSTOPped Redis.
type hangingCounter struct {
	storage.Counter
	hang atomic.Bool
}

func (h *hangingCounter) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return storage.Stats{}, fmt.Errorf("%w: %w", storage.ErrUnavailable, ctx.Err())
	}
	return h.Counter.Stats(ctx, ns)
}

// TestQuotaRecountDoesNotHoldTheCall: once a namespace was counted, the
// call that counts it again (its count older than quotaCountTTL) waits for
// a hung store at most quotaRecountWait, then goes on with the last count.
// Before, it waited until its own deadline: in durable mode, where writes
// must not wait for a hung Redis index, one upsert per count interval
// failed with DeadlineExceeded (TestFaultRedisSIGSTOPDurable, under load).
func TestQuotaRecountDoesNotHoldTheCall(t *testing.T) {
	clock := time.Unix(1_700_000_000, 0)
	var now atomic.Pointer[time.Time]
	now.Store(&clock)
	hc := &hangingCounter{Counter: storagefake.New(storage.SystemClock{})}
	q := &pendingQuota{
		counter:  hc,
		logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		now:      func() time.Time { return *now.Load() },
		counts:   map[string]*quotaCount{},
		reserved: map[string]int64{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := q.estimate(ctx, "ns"); err != nil {
		t.Fatalf("first count: %v", err)
	}
	later := clock.Add(2 * quotaCountTTL)
	now.Store(&later)
	hc.hang.Store(true)
	start := time.Now()
	n, err := q.estimate(ctx, "ns")
	took := time.Since(start)
	if err != nil || n != 0 {
		t.Fatalf("recount on a hung store: %d, %v; want the last count (0) and no error", n, err)
	}
	if took > quotaRecountWait+5*time.Second { // generous: a loaded machine
		t.Fatalf("recount on a hung store held the call %v; want about quotaRecountWait (%v)", took, quotaRecountWait)
	}
}
