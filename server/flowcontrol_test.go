package server_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// TestServerSendsNoPings: a steady flow of deliveries, unary acks and
// stream verdicts draws no PING from the server (its flow-control windows
// are fixed, so grpc's BDP estimation is off). With the estimation on, the
// server pinged after nearly every request message, a write and a read of
// delayd's per message (issue 37 item 4).
func TestServerSendsNoPings(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	frames := testkit.NewH2Frames()
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(frames.Dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	dlv := delaydv1.NewDeliveryServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
	defer cancel()

	// Subscribe with unary acks, one task at a time.
	subCtx, endSub := context.WithCancel(ctx)
	sub, err := dlv.Subscribe(subCtx, &delaydv1.SubscribeRequest{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Header(); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := range n {
		e.upsert(r, fmt.Sprintf("unary-%d", i), 0)
		resp, err := sub.Recv()
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		ack, err := dlv.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: e.ns, Tokens: []string{resp.GetDelivery().GetToken()}})
		if err != nil || ack.GetResults()[0].GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_OK {
			t.Fatalf("AckTasks: %v, %v", ack, err)
		}
	}

	endSub() // a task popped for it meanwhile is handed back unsent

	// StreamDeliveries with the verdicts on the stream.
	str, err := dlv.StreamDeliveries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := str.Send(&delaydv1.StreamDeliveriesRequest{Namespace: e.ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := str.Header(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		e.upsert(r, fmt.Sprintf("stream-%d", i), 0)
		var token string
		for token == "" {
			resp, err := str.Recv()
			if err != nil {
				t.Fatalf("StreamDeliveries: %v", err)
			}
			if ds := resp.GetDeliveries(); len(ds) > 0 {
				token = ds[0].GetToken()
			}
		}
		if err := str.Send(&delaydv1.StreamDeliveriesRequest{AckTokens: []string{token}}); err != nil {
			t.Fatal(err)
		}
		for {
			resp, err := str.Recv()
			if err != nil {
				t.Fatalf("StreamDeliveries: %v", err)
			}
			if rs := resp.GetAckResults(); len(rs) > 0 {
				if rs[0].GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_OK {
					t.Fatalf("stream ack: %v", rs[0].GetStatus())
				}
				break
			}
		}
	}

	if sent := frames.Sent(testkit.H2Data, false); sent < 2*n+2 {
		t.Fatalf("the client sent %d DATA frames; want at least %d, one per request (the counter sees the connection)", sent, 2*n+2)
	}
	if got := frames.Received(testkit.H2Ping, false); got != 0 {
		t.Errorf("the server sent %d PINGs over %d requests; want none (no BDP estimation)", got, frames.Sent(testkit.H2Data, false))
	}
}
