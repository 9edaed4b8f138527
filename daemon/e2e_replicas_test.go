package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage/redisstore"
)

// Limits and credit across replicas (issue 15 item 4): two whole delayd
// replicas over one Redis, as deployed behind a balancer. Before the limits
// were kept in Redis each replica counted its own, so two replicas allowed
// twice a namespace's rate and subscribers, and an ack sent to the replica
// that did not serve the stream freed the stream's credit only when the
// lease ended.

// replicaPair starts two replicas over the test Redis and creates a
// namespace of the test's own with pol through the first.
func replicaPair(t *testing.T, pol *delaydv1.NamespacePolicy) (a, b *started, ns string) {
	t.Helper()
	url := testRedisURL()
	ns = "repl-" + suffix()
	cleanNamespace(t, url, ns)
	a = start(t, Config{RedisURL: url, LogLevel: "warn"})
	b = start(t, Config{RedisURL: url, LogLevel: "warn"})
	if _, err := delaydv1.NewNamespaceServiceClient(a.conn).CreateNamespace(ctxFor(t),
		&delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns, Policy: pol}}); err != nil {
		t.Fatalf("CreateNamespace: %v", err)
	}
	return a, b, ns
}

// TestRateLimitHoldsAcrossReplicas: rate_burst 4 at 0.1/s allows about 4
// calls at once in all, not 4 per replica.
func TestRateLimitHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	a, b, ns := replicaPair(t, &delaydv1.NamespacePolicy{RateLimit: 0.1, RateBurst: 4})
	ctx := ctxFor(t)
	start := time.Now()
	allowed := 0
	for i := range 8 {
		r := a
		if i%2 == 1 {
			r = b
		}
		_, err := r.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "missing"})
		switch status.Code(err) {
		case codes.NotFound:
			allowed++
		case codes.ResourceExhausted:
			if !strings.Contains(status.Convert(err).Message(), "across all replicas") {
				t.Errorf("refusal does not say the limit is shared: %v", err)
			}
		default:
			t.Fatalf("GetTask %d: %v", i, err)
		}
	}
	// The bucket refills 0.1 token a second: at most one more token in
	// 10 s of a slow machine.
	if most := 4 + int(time.Since(start).Seconds()/10); allowed > most {
		t.Errorf("8 calls spread over two replicas under rate_burst 4: %d allowed; want at most %d (each replica had a bucket of its own?)", allowed, most)
	}
	if allowed < 4 {
		t.Errorf("only %d of the first calls allowed; want the burst of 4", allowed)
	}
}

// openStream opens a Subscribe stream of ns on r and returns the first
// error it ends with (on errc) and its cancel.
func openStream(t *testing.T, r *started, ns string) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := delaydv1.NewDeliveryServiceClient(r.conn).Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 1})
	errc := make(chan error, 1)
	if err != nil {
		errc <- err
		return errc, cancel
	}
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				errc <- err
				return
			}
		}
	}()
	return errc, cancel
}

// refused waits up to d for the stream to end with ResourceExhausted; it
// reports false when the stream is still open then.
func refused(t *testing.T, errc <-chan error, d time.Duration) bool {
	t.Helper()
	select {
	case err := <-errc:
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream ended with %v; want ResourceExhausted or open", err)
		}
		if !strings.Contains(status.Convert(err).Message(), "across all replicas") {
			t.Errorf("refusal does not say the limit is shared: %v", err)
		}
		return true
	case <-time.After(d):
		return false
	}
}

// TestMaxSubscribersHoldAcrossReplicas: max_subscribers 2 with one stream
// on each replica refuses a third on either; once one closes, a new one
// is let in.
func TestMaxSubscribersHoldAcrossReplicas(t *testing.T) {
	t.Parallel()
	a, b, ns := replicaPair(t, &delaydv1.NamespacePolicy{MaxSubscribers: 2})
	ea, cancelA := openStream(t, a, ns)
	if refused(t, ea, 2*time.Second) {
		t.Fatal("the first stream was refused")
	}
	eb, _ := openStream(t, b, ns)
	if refused(t, eb, 2*time.Second) {
		t.Fatal("the second stream was refused")
	}
	third, _ := openStream(t, b, ns)
	if !refused(t, third, 15*time.Second) {
		t.Fatal("a third stream (one open on each replica) was let in under max_subscribers 2")
	}
	cancelA()
	deadline := time.Now().Add(20 * time.Second)
	for {
		next, cancel := openStream(t, b, ns)
		if !refused(t, next, 2*time.Second) {
			break
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatal("a closed stream's slot never came back")
		}
	}
}

// TestAckOnOtherReplicaFreesCredit: a stream of max_in_flight 1 on replica
// A, its delivery acked through replica B, gets the next task promptly,
// though its lease (ack timeout one hour) is far from over: B announces the
// settled delivery on the wake-up channel. (A's lease renewal, every 2 s,
// would also find the delivery gone; the dispatcher test with a long
// renewal period shows the announcement alone frees the credit.)
func TestAckOnOtherReplicaFreesCredit(t *testing.T) {
	t.Parallel()
	e, a := newE2E(t, testRedisURL())
	b := e.replica()
	sub := e.subscribe(a, 1)
	e.upsert(b, "t1", 0)
	e.upsert(b, "t2", 0)
	first := sub.next(t)
	wake := e.rdb.Subscribe(context.Background(), redisstore.DefaultWakeChannel)
	defer wake.Close()
	if _, err := wake.Receive(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if st := e.ack(b, first.GetToken()); len(st) != 1 || st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack through B: %v", st)
	}
	announced := false
	for !announced {
		select {
		case m := <-wake.Channel():
			announced = strings.HasPrefix(m.Payload, "settled:") && strings.Contains(m.Payload, first.GetTask().GetId())
		case <-time.After(e2eWait):
			t.Fatalf("B did not announce the delivery it settled within %s", e2eWait)
		}
	}
	select {
	case d, ok := <-sub.ch:
		if !ok {
			t.Fatalf("stream ended: %v", <-sub.err)
		}
		if d.GetTask().GetId() == first.GetTask().GetId() {
			t.Fatalf("the acked task %s came again", d.GetTask().GetId())
		}
	case <-time.After(e2eWait):
		t.Fatalf("no second delivery within %s of the ack through the other replica (credit held until the one-hour lease ends?)", e2eWait)
	}
}
