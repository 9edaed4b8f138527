package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayd/delayd/client"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// TestConsumeSlowHandlerKeepsItsLeaseWhileOthersQueue: one handler at a
// time, two in flight, a handler that works four ack timeouts. The
// deliveries waiting behind it run out of their leases, so delayd gives
// their credit back and sends more than max_in_flight to the consumer; the
// running handler's lease extensions (answered on the same stream) must
// still land, so its task is delivered once.
func TestConsumeSlowHandlerKeepsItsLeaseWhileOthersQueue(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	srv := startDelayd(t, "127.0.0.1:0")
	c := newClient(t, srv.addr(), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)
	setPolicy(t, c, ns, &delaydv1.NamespacePolicy{
		AckTimeout:     durationpb.New(lease),
		BackoffInitial: durationpb.New(10 * time.Millisecond),
		BackoffMax:     durationpb.New(10 * time.Millisecond),
	})
	if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: "slow", When: client.After(0)}); err != nil {
		t.Fatal(err)
	}
	// The others fall due just after, so "slow" is delivered first.
	for i := range 20 {
		if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: fmt.Sprintf("t%d", i), When: client.After(200 * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	slowRuns := 0
	slowDone := make(chan struct{}, 10)
	stop := consume(t, c, ns, func(ctx context.Context, d *client.Delivery) error {
		if d.ID != "slow" {
			return nil
		}
		mu.Lock()
		slowRuns++
		mu.Unlock()
		select {
		case <-time.After(8 * lease):
		case <-ctx.Done():
		}
		slowDone <- struct{}{}
		return nil
	}, client.ConsumeOptions{Concurrency: 1, MaxInFlight: 2})
	within(t, slowDone, 60*time.Second, "the slow handler to finish")
	waitGone(t, c, ns, "slow")
	_ = stop()
	mu.Lock()
	defer mu.Unlock()
	if slowRuns != 1 {
		t.Errorf("the slow task ran %d times; want 1 (its lease extensions kept it)", slowRuns)
	}
}
