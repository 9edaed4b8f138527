package server_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server"
)

// TestPendingTaskQuota: a namespace at max_pending_tasks refuses new tasks
// with ResourceExhausted naming the quota, still takes replacements of
// tasks it holds, and takes new ones again once tasks are gone.
func TestPendingTaskQuota(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "quota-", &delaydv1.NamespacePolicy{MaxPendingTasks: 5})
	for i := range 5 {
		if err := upsertAs(admin(), r, ns, "t"+string(rune('0'+i))); err != nil {
			t.Fatalf("upsert %d under the quota: %v", i, err)
		}
	}
	err := upsertAs(admin(), r, ns, "t5")
	wantCode(t, err, codes.ResourceExhausted, "max_pending_tasks is 5")
	if err := upsertAs(admin(), r, ns, "t2"); err != nil {
		t.Errorf("replacing a task of a full namespace: %v", err)
	}
	_, err = r.tasks.BatchUpsertTasks(admin(), &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: []*delaydv1.UpsertTaskRequest{
		{Id: "t0", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}},
		{Id: "n1", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}},
	}})
	wantCode(t, err, codes.ResourceExhausted, "max_pending_tasks")
	if _, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: ns, Id: "n1"}); codeOf(err) != codes.NotFound {
		t.Errorf("a refused batch stored a task: %v", err)
	}

	// Room again after a removal (the count is cached for about a second).
	if _, err := r.tasks.RemoveTask(admin(), &delaydv1.RemoveTaskRequest{Namespace: ns, Id: "t0"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(dlvWait)
	for {
		err := upsertAs(admin(), r, ns, "t5")
		if err == nil {
			break
		}
		if codeOf(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("upsert after a removal: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Another namespace is not affected.
	other := e.newNamespace(r, "quota-free-", nil)
	for i := range 10 {
		if err := upsertAs(admin(), r, other, "t"+string(rune('0'+i))); err != nil {
			t.Fatalf("a namespace without a quota: %v", err)
		}
	}
}

// TestRateLimit: a namespace over its rate gets ResourceExhausted naming
// the limit; other namespaces are not slowed.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	// 0.001/s: the bucket refills once in 1000 s, so the test never races
	// a refill.
	ns := e.newNamespace(r, "rate-", &delaydv1.NamespacePolicy{RateLimit: 0.001, RateBurst: 3})
	free := e.newNamespace(r, "rate-free-", nil)
	get := func(ns string) error {
		_, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: ns, Id: "x"})
		return err
	}
	for i := range 3 {
		if err := get(ns); codeOf(err) != codes.NotFound {
			t.Fatalf("request %d within the burst: %v", i, err)
		}
	}
	wantCode(t, get(ns), codes.ResourceExhausted, "policy.rate_limit")
	// Every data-plane RPC naming the namespace counts, streams too.
	_, err := r.tasks.ListTasks(admin(), &delaydv1.ListTasksRequest{Namespace: ns})
	wantCode(t, err, codes.ResourceExhausted, "rate_limit")
	_, _, err = firstDelivery(admin(), r, ns)
	wantCode(t, err, codes.ResourceExhausted, "rate_limit")
	for range 20 {
		if err := get(free); codeOf(err) != codes.NotFound {
			t.Fatalf("a namespace without a limit: %v", err)
		}
	}
	// Admin calls are not limited, so the operator can lift the limit, and
	// the new policy applies at once on this replica.
	if _, err := r.admin.GetNamespaceStats(admin(), &delaydv1.GetNamespaceStatsRequest{Namespace: ns}); err != nil {
		t.Errorf("GetNamespaceStats of a throttled namespace: %v", err)
	}
	if _, err := r.admin.UpdateNamespace(admin(), &delaydv1.UpdateNamespaceRequest{
		Namespace:  &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{RateLimit: 0}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.rate_limit", "policy.rate_burst"}},
	}); err != nil {
		t.Fatalf("lifting the rate limit: %v", err)
	}
	for range 10 {
		if err := get(ns); codeOf(err) != codes.NotFound {
			t.Fatalf("after lifting the limit: %v", err)
		}
	}
}

// TestMaxSubscribers: a namespace's streams beyond max_subscribers are
// refused with ResourceExhausted naming the limit; a slot frees when a
// stream ends.
func TestMaxSubscribers(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "subs-", &delaydv1.NamespacePolicy{MaxSubscribers: 2})
	open := func() (delaydv1.DeliveryService_SubscribeClient, context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(admin())
		s, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns})
		if err == nil {
			_, err = s.Header() // the server registered the stream
		}
		if err != nil {
			cancel()
		}
		return s, cancel, err
	}
	s1, cancel1, err := open()
	if err != nil {
		t.Fatal(err)
	}
	_, cancel2, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	s3, cancel3, err := open()
	if err == nil {
		_, err = s3.Recv()
		cancel3()
	}
	wantCode(t, err, codes.ResourceExhausted, "policy.max_subscribers 2")

	cancel1()
	for {
		if _, err := s1.Recv(); err != nil {
			break
		}
	}
	deadline := time.Now().Add(dlvWait)
	for {
		s, cancel, err := open()
		if err == nil {
			// Header came: registered. Make sure it was not refused after.
			_ = s
			cancel()
			break
		}
		if codeOf(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("subscribe after a stream ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPayloadAndHorizonLimits: per-namespace payload size and delay horizon
// are enforced with InvalidArgument naming the field and the limit.
func TestPayloadAndHorizonLimits(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	ns := e.newNamespace(r, "pay-", &delaydv1.NamespacePolicy{MaxPayloadBytes: 16, MaxDelay: durationpb.New(time.Hour)})
	_, err := r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{
		Namespace: ns, Id: "big", Payload: bytes.Repeat([]byte("x"), 17),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Minute)},
	})
	wantCode(t, err, codes.InvalidArgument, "payload")
	wantCode(t, err, codes.InvalidArgument, "16")
	_, err = r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{
		Namespace: ns, Id: "far", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(2 * time.Hour)},
	})
	wantCode(t, err, codes.InvalidArgument, "delay")
	if _, err := r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{
		Namespace: ns, Id: "ok", Payload: bytes.Repeat([]byte("x"), 16),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(59 * time.Minute)},
	}); err != nil {
		t.Errorf("upsert at the limits: %v", err)
	}
}

// TestMaxMessageSize: a message over the server's MaxMessageBytes is
// refused with ResourceExhausted, whatever the namespace allows.
func TestMaxMessageSize(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Limits.MaxMessageBytes = 64 << 10 }})
	ns := e.newNamespace(r, "msg-", &delaydv1.NamespacePolicy{MaxPayloadBytes: 1 << 20})
	_, err := r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{
		Namespace: ns, Id: "big", Payload: make([]byte, 100<<10),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Minute)},
	})
	wantCode(t, err, codes.ResourceExhausted, "larger than max")
	if _, err := r.tasks.UpsertTask(admin(), &delaydv1.UpsertTaskRequest{
		Namespace: ns, Id: "small", Payload: make([]byte, 60<<10),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Minute)},
	}); err != nil {
		t.Errorf("a message under the limit: %v", err)
	}
}

// TestMaxConcurrentStreams: one connection holds at most
// MaxConcurrentStreams calls at once; the next waits until one ends.
func TestMaxConcurrentStreams(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Limits.MaxConcurrentStreams = 2 }})
	ns := e.newNamespace(r, "streams-", nil)
	var cancels []context.CancelFunc
	for range 2 {
		ctx, cancel := context.WithCancel(admin())
		cancels = append(cancels, cancel)
		s, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Header(); err != nil {
			t.Fatal(err)
		}
	}
	// A third call on the same connection cannot start while both streams
	// are open.
	ctx, cancel := context.WithTimeout(admin(), dlvQuiet)
	_, err := r.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "x"})
	cancel()
	if codeOf(err) != codes.DeadlineExceeded {
		t.Errorf("a third call with two streams open: %v, want it held back (DeadlineExceeded)", err)
	}
	cancels[0]()
	if _, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: ns, Id: "x"}); codeOf(err) != codes.NotFound {
		t.Errorf("a call after a stream ended: %v, want NotFound", err)
	}
	cancels[1]()
}

// TestKeepaliveEnforcement: a client that pings an idle connection more
// often than the server allows gets GOAWAY ENHANCE_YOUR_CALM
// "too_many_pings" (grpc-go's own client cannot ping that fast, so this
// speaks HTTP/2 directly).
func TestKeepaliveEnforcement(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(dlvWait))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			break // the server may have closed the connection already
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("connection ended without GOAWAY: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeEnhanceYourCalm || !strings.Contains(string(f.DebugData()), "too_many_pings") {
				t.Errorf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", f.ErrCode, f.DebugData())
			}
			return
		}
	}
}
