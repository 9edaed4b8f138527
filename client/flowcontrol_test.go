package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/testkit"
)

// TestClientSendsNoPings: a client upserting and consuming a steady flow,
// one task at a time, sends delayd no PING (its flow-control windows are
// fixed, so grpc's BDP estimation is off). With the estimation on, the
// client pinged after nearly every message it received (each delivery,
// each answer), which cost delayd a read and a write per message
// (issue 37 item 4).
func TestClientSendsNoPings(t *testing.T) {
	t.Parallel()
	srv := startDelayd(t, "127.0.0.1:0")
	frames := testkit.NewH2Frames()
	c := newClient(t, srv.addr(), client.WithDialOptions(grpc.WithContextDialer(frames.Dial)), client.WithLogger(testLogger(t)))
	ns := namespace(t, c)

	handled := make(chan string)
	stop := consume(t, c, ns, func(ctx context.Context, d *client.Delivery) error {
		select {
		case handled <- d.ID:
		case <-ctx.Done():
		}
		return nil
	}, client.ConsumeOptions{AckFlushInterval: time.Millisecond})
	const n = 10
	for i := range n {
		id := fmt.Sprintf("t%d", i)
		if _, err := c.Upsert(t.Context(), ns, client.TaskSpec{ID: id, When: client.After(0)}); err != nil {
			t.Fatal(err)
		}
		if got := within(t, handled, 30*time.Second, "the task to be handled"); got != id {
			t.Fatalf("handled %s, want %s", got, id)
		}
		waitGone(t, c, ns, id)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := frames.Received(testkit.H2Data, false); got < 3*n {
		t.Fatalf("the client received %d DATA frames; want at least %d (a delivery, an ack's answer and a Get's per task)", got, 3*n)
	}
	if got := frames.Sent(testkit.H2Ping, false); got != 0 {
		t.Errorf("the client sent %d PINGs over %d received messages; want none (no BDP estimation)", got, frames.Received(testkit.H2Data, false))
	}
}
