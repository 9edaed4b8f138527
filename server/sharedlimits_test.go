package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
)

// downLimits is shared limits whose store cannot be reached.
type downLimits struct{}

var errDown = fmt.Errorf("shared limits: %w", storage.ErrUnavailable)

func (downLimits) TakeRequestToken(context.Context, string, float64, int) (bool, error) {
	return false, errDown
}

func (downLimits) AcquireSubscriber(context.Context, string, string, int, time.Duration) (bool, int, error) {
	return false, 0, errDown
}

func (downLimits) RenewSubscribers(context.Context, string, []string, time.Duration) error {
	return errDown
}

func (downLimits) ReleaseSubscriber(context.Context, string, string) error { return errDown }

// calls makes n GetTask calls of ns alternately through rs and counts
// those the rate limit let through; refusals must mention scope.
func rateLimitedCalls(t *testing.T, n int, ns, scope string, rs ...*tenReplica) int {
	t.Helper()
	allowed := 0
	for i := range n {
		_, err := rs[i%len(rs)].tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: ns, Id: "missing"})
		switch status.Code(err) {
		case codes.NotFound:
			allowed++
		case codes.ResourceExhausted:
			if msg := status.Convert(err).Message(); !strings.Contains(msg, scope) {
				t.Errorf("refusal %q does not say %q", msg, scope)
			}
		default:
			t.Fatalf("GetTask: %v", err)
		}
	}
	return allowed
}

// TestRateLimitSharedAndFallback: replicas with shared limits allow a
// namespace its burst once between them; a replica whose shared limits
// cannot be reached falls back to a bucket of its own instead of refusing
// or letting everything through.
func TestRateLimitSharedAndFallback(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	shared := func(o *server.Options) { o.SharedLimits = e.store.Store }
	r1, r2 := e.replica(tenOpts{server: shared}), e.replica(tenOpts{server: shared})
	ns := e.newNamespace(r1, "sharedrate-", &delaydv1.NamespacePolicy{RateLimit: 0.001, RateBurst: 3})
	if got := rateLimitedCalls(t, 8, ns, "across all replicas", r1, r2); got != 3 {
		t.Errorf("8 calls over two replicas sharing a burst of 3: %d allowed, want 3", got)
	}
	down := e.replica(tenOpts{server: func(o *server.Options) { o.SharedLimits = downLimits{} }})
	if got := rateLimitedCalls(t, 6, ns, "per server replica", down); got != 3 {
		t.Errorf("6 calls through a replica whose shared bucket is down: %d allowed, want its own burst of 3", got)
	}
}

// streamRefused opens a Subscribe stream of ns on r and reports whether it
// was refused (ResourceExhausted mentioning scope) within a few seconds;
// an open stream stays open until the test ends.
func streamRefused(t *testing.T, r *tenReplica, ns, scope string) bool {
	t.Helper()
	ctx, cancel := context.WithCancel(admin())
	t.Cleanup(cancel)
	stream, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), scope) {
			t.Fatalf("stream ended with %v; want ResourceExhausted mentioning %q", err, scope)
		}
		return true
	case <-time.After(2 * time.Second):
		return false
	}
}

// TestMaxSubscribersSharedAndFallback: max_subscribers 1 with shared
// limits refuses a second stream on another replica; a replica whose
// shared count cannot be reached counts its own streams.
func TestMaxSubscribersSharedAndFallback(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	shared := func(o *server.Options) { o.SharedLimits = e.store.Store }
	r1, r2 := e.replica(tenOpts{server: shared}), e.replica(tenOpts{server: shared})
	ns := e.newNamespace(r1, "sharedsubs-", &delaydv1.NamespacePolicy{MaxSubscribers: 1})
	if streamRefused(t, r1, ns, "") {
		t.Fatal("the first stream was refused")
	}
	if !streamRefused(t, r2, ns, "across all replicas") {
		t.Error("a second stream on another replica was let in under max_subscribers 1")
	}
	down := e.replica(tenOpts{server: func(o *server.Options) { o.SharedLimits = downLimits{} }})
	if streamRefused(t, down, ns, "") {
		t.Fatal("the first stream on the replica whose shared count is down was refused")
	}
	if !streamRefused(t, down, ns, "on this server replica") {
		t.Error("a second stream on the replica whose shared count is down was let in under max_subscribers 1")
	}
}

// askedLimits records the namespaces shared limits are asked about.
type askedLimits struct {
	downLimits
	asked chan string
}

func (a askedLimits) TakeRequestToken(_ context.Context, ns string, _ float64, _ int) (bool, error) {
	a.asked <- ns
	return true, nil
}

func (a askedLimits) AcquireSubscriber(_ context.Context, ns, _ string, _ int, _ time.Duration) (bool, int, error) {
	a.asked <- ns
	return true, 1, nil
}

// TestLimitsIgnoreInvalidNamespaces: a request whose namespace is not a
// valid name is answered InvalidArgument without the shared limits (Redis)
// being asked about it (Subscribe to "Not A Namespace" asked for a
// subscriber slot, and logged the refusal of the name as a Redis failure).
func TestLimitsIgnoreInvalidNamespaces(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	lim := askedLimits{asked: make(chan string, 100)}
	// Auth off, as `make run`: with auth on, the key check refuses the
	// name before the limits run.
	r := e.replica(tenOpts{server: func(o *server.Options) {
		o.SharedLimits = lim
		o.Auth = guard.AuthOptions{Disabled: true}
	}})
	const bad = "Not A Namespace"
	ctx, cancel := context.WithTimeout(admin(), 10*time.Second)
	defer cancel()
	stream, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: bad, MaxInFlight: 1})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Subscribe of %q: %v, want InvalidArgument", bad, err)
	}
	if _, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: bad, Id: "x"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("GetTask of %q: %v, want InvalidArgument", bad, err)
	}
	close(lim.asked)
	for ns := range lim.asked {
		if ns == bad {
			t.Errorf("shared limits were asked about the invalid namespace %q", ns)
		}
	}
}
