package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayd/delayd/dispatcher"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/storagefake"
)

// The delivery tests run real gRPC over loopback against the shared Redis
// (TEST_REDIS_URL), each in a namespace of its own.

// dlvWait bounds waiting for something that must happen (not a speed
// assertion); dlvQuiet is how long a test watches for something that must
// not happen.
const (
	dlvWait  = 20 * time.Second
	dlvQuiet = 400 * time.Millisecond
)

// dlvEnv is one Redis store and a namespace; replicas are delayd servers
// (dispatcher + gRPC server) over that store.
type dlvEnv struct {
	t     *testing.T
	store *storagefake.Store
	pol   storage.Policy
	ns    string
}

// dlvPolicy is the default policy with a long lease and quick backoff, so
// nothing is retried unless a test asks for it.
func dlvPolicy() storage.Policy {
	p := storage.DefaultPolicy()
	p.AckTimeout = time.Hour
	p.Backoff = storage.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	return p
}

// newDlvEnv returns an env over a fresh in-memory store (storagefake: the
// real stores' semantics, checked by the conformance suite). The server's
// tests test the edge above its store seam; the end-to-end tests in daemon/
// run the same paths over a real Redis.
func newDlvEnv(t *testing.T, pol storage.Policy) *dlvEnv {
	t.Helper()
	return &dlvEnv{t: t, store: storagefake.New(nil), pol: pol, ns: "st-" + testkit.Suffix()}
}

// fakeStores is an in-memory task store and registry: what a replica of
// the tenancy tests runs on.
type fakeStores struct {
	*storagefake.Store
	*storagefake.Registry
}

func newFakeStores() fakeStores {
	return fakeStores{Store: storagefake.New(nil), Registry: storagefake.NewRegistry(nil)}
}

// dlvReplica is one delayd server on 127.0.0.1:0 and a client connection.
type dlvReplica struct {
	d     *dispatcher.Dispatcher
	srv   *server.Server
	addr  string // the server's host:port
	tasks delaydv1.TaskServiceClient
	dlv   delaydv1.DeliveryServiceClient
	admin delaydv1.NamespaceServiceClient
}

func (e *dlvEnv) replica() *dlvReplica {
	e.t.Helper()
	pols := storage.StaticPolicies{P: e.pol}
	d, err := dispatcher.New(dispatcher.Config{Store: e.store, Wakeups: e.store, Feed: e.store, Policies: pols})
	if err != nil {
		e.t.Fatalf("dispatcher.New: %v", err)
	}
	srv, err := server.New(server.Options{
		Store: e.store, Tenancy: staticTenancy{policy: e.pol}, Subscriptions: d, History: e.store,
		Schedules: newScheduler(e.t, e.store, staticTenancy{policy: e.pol}),
		Auth:      guard.AuthOptions{Disabled: true},
	})
	if err != nil {
		e.t.Fatalf("server.New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	r := &dlvReplica{d: d, srv: srv, addr: lis.Addr().String(),
		tasks: delaydv1.NewTaskServiceClient(conn),
		dlv:   delaydv1.NewDeliveryServiceClient(conn),
		admin: delaydv1.NewNamespaceServiceClient(conn),
	}
	// Shutdown order as the daemon does it: the dispatcher ends the streams,
	// then the server drains.
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("dispatcher Stop: %v", err)
		}
		if err := srv.GracefulStop(ctx); err != nil {
			e.t.Errorf("GracefulStop: %v", err)
		}
		<-served
		_ = conn.Close()
	})
	return r
}

// upsert creates or replaces task id, due after delay.
func (e *dlvEnv) upsert(r *dlvReplica, id string, delay time.Duration) *delaydv1.Task {
	e.t.Helper()
	resp, err := r.tasks.UpsertTask(context.Background(), &delaydv1.UpsertTaskRequest{
		Namespace: e.ns, Id: id, Kind: "test.kind", Payload: []byte("payload-" + id),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(delay)},
	})
	if err != nil {
		e.t.Fatalf("UpsertTask(%s): %v", id, err)
	}
	return resp.GetTask()
}

func (e *dlvEnv) getTask(r *dlvReplica, id string) (*delaydv1.Task, error) {
	resp, err := r.tasks.GetTask(context.Background(), &delaydv1.GetTaskRequest{Namespace: e.ns, Id: id})
	return resp.GetTask(), err
}

func (e *dlvEnv) mustGet(r *dlvReplica, id string) *delaydv1.Task {
	e.t.Helper()
	task, err := e.getTask(r, id)
	if err != nil {
		e.t.Fatalf("GetTask(%s): %v", id, err)
	}
	return task
}

// redisNow is the store's clock, the one that decides due-ness.
func (e *dlvEnv) redisNow() time.Time { return e.store.Now() }

func (e *dlvEnv) ack(r *dlvReplica, tokens ...string) []delaydv1.TokenStatus {
	e.t.Helper()
	resp, err := r.dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: e.ns, Tokens: tokens})
	if err != nil {
		e.t.Fatalf("AckTasks: %v", err)
	}
	return dlvStatuses(resp.GetResults())
}

func (e *dlvEnv) nack(r *dlvReplica, retryAfter *durationpb.Duration, reason string, tokens ...string) []delaydv1.TokenStatus {
	e.t.Helper()
	resp, err := r.dlv.NackTasks(context.Background(), &delaydv1.NackTasksRequest{
		Namespace: e.ns, Tokens: tokens, RetryAfter: retryAfter, Reason: reason,
	})
	if err != nil {
		e.t.Fatalf("NackTasks: %v", err)
	}
	return dlvStatuses(resp.GetResults())
}

func dlvStatuses(rs []*delaydv1.TokenResult) []delaydv1.TokenStatus {
	out := make([]delaydv1.TokenStatus, len(rs))
	for i, r := range rs {
		out[i] = r.GetStatus()
	}
	return out
}

// dlvSub is a Subscribe stream read by a goroutine into ch.
type dlvSub struct {
	ch     chan *delaydv1.Delivery
	err    chan error // the stream's final error, once
	cancel context.CancelFunc
}

// subscribe opens a stream and waits until the server registered it.
func (e *dlvEnv) subscribe(r *dlvReplica, maxInFlight int32) *dlvSub {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: maxInFlight})
	if err != nil {
		cancel()
		e.t.Fatalf("Subscribe: %v", err)
	}
	if _, err := stream.Header(); err != nil {
		cancel()
		e.t.Fatalf("Subscribe headers: %v", err)
	}
	s := &dlvSub{ch: make(chan *delaydv1.Delivery, 100000), err: make(chan error, 1), cancel: cancel}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				s.err <- err
				close(s.ch)
				return
			}
			s.ch <- resp.GetDelivery()
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		for range s.ch {
		}
	})
	return s
}

func (s *dlvSub) next(t *testing.T) *delaydv1.Delivery {
	t.Helper()
	select {
	case d, ok := <-s.ch:
		if !ok {
			t.Fatalf("stream ended: %v", <-s.err)
		}
		return d
	case <-time.After(dlvWait):
		t.Fatalf("no delivery within %s", dlvWait)
		return nil
	}
}

func (s *dlvSub) none(t *testing.T) {
	t.Helper()
	select {
	case d, ok := <-s.ch:
		if ok {
			t.Fatalf("unexpected delivery of %s (attempt %d)", d.GetTask().GetId(), d.GetTask().GetAttempt())
		}
	case <-time.After(dlvQuiet):
	}
}

// end cancels the stream and waits until its reader saw the end.
func (s *dlvSub) end() {
	s.cancel()
	for range s.ch {
	}
}

func wantCode(t *testing.T, err error, code codes.Code, mention string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), mention) {
		t.Fatalf("got %v (%q), want %v mentioning %q", st.Code(), st.Message(), code, mention)
	}
}

func TestDeliveryAck(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 0)
	up := e.upsert(r, "order-1", 0)

	d := s.next(t)
	task := d.GetTask()
	if task.GetId() != "order-1" || task.GetKind() != "test.kind" || string(task.GetPayload()) != "payload-order-1" ||
		task.GetAttempt() != 1 || task.GetGeneration() != up.GetGeneration() || task.GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED ||
		task.GetNamespace() != e.ns || !task.GetDueTime().AsTime().Equal(up.GetDueTime().AsTime()) {
		t.Fatalf("delivered task %v, want order-1 as upserted (%v), attempt 1, DELIVERED", task, up)
	}
	if d.GetToken() == "" || d.GetLeaseDeadline().AsTime().Sub(e.redisNow()) < 30*time.Minute {
		t.Fatalf("delivery token %q lease %v: want a token and a one-hour lease", d.GetToken(), d.GetLeaseDeadline().AsTime())
	}
	if got := e.mustGet(r, "order-1"); got.GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED {
		t.Fatalf("GetTask while leased: %v, want DELIVERED", got.GetState())
	} else if !got.GetLeaseDeadline().AsTime().Equal(d.GetLeaseDeadline().AsTime()) {
		// not the replica's short store lease (Liveness, renewed)
		t.Fatalf("GetTask while leased: lease deadline %v, want the one the subscriber was told, %v",
			got.GetLeaseDeadline().AsTime(), d.GetLeaseDeadline().AsTime())
	}
	if st := e.ack(r, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack: %v, want OK", st[0])
	}
	if _, err := e.getTask(r, "order-1"); status.Code(err) != codes.NotFound {
		t.Fatalf("GetTask after ack: %v, want NotFound", err)
	}
	if st := e.ack(r, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Fatalf("second ack: %v, want NOT_FOUND", st[0])
	}
	s.none(t)
}

func TestDeliveryNackWithRetryAfter(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "n1", 0)
	d := s.next(t)

	before := e.redisNow()
	if st := e.nack(r, durationpb.New(300*time.Millisecond), "try later", d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("nack: %v, want OK", st[0])
	}
	after := e.redisNow()
	task := e.mustGet(r, "n1")
	due := task.GetDueTime().AsTime()
	if task.GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED || task.GetLastError() != "try later" || task.GetAttempt() != 1 {
		t.Fatalf("after nack: %v %q attempt %d, want SCHEDULED, \"try later\", 1", task.GetState(), task.GetLastError(), task.GetAttempt())
	}
	if due.Before(before.Add(300*time.Millisecond-time.Millisecond)) || due.After(after.Add(300*time.Millisecond+time.Millisecond)) {
		t.Fatalf("retry due at %v, want nack time + 300ms (%v..%v)", due, before.Add(300*time.Millisecond), after.Add(300*time.Millisecond))
	}
	again := s.next(t)
	if now := e.redisNow(); now.Before(due) {
		t.Fatalf("redelivered at %v (Redis TIME), before its retry time %v", now, due)
	}
	if again.GetTask().GetId() != "n1" || again.GetTask().GetAttempt() != 2 {
		t.Fatalf("redelivery %s attempt %d, want n1 attempt 2", again.GetTask().GetId(), again.GetTask().GetAttempt())
	}
	// Nack with retry_after 0: back at once.
	e.nack(r, durationpb.New(0), "", again.GetToken())
	if third := s.next(t); third.GetTask().GetAttempt() != 3 {
		t.Fatalf("after nack with retry_after 0: attempt %d, want 3", third.GetTask().GetAttempt())
	}
}

func TestDeliveryNackWithoutRetryAfterUsesBackoff(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.Backoff = storage.Backoff{Initial: 400 * time.Millisecond, Max: time.Minute, Multiplier: 2}
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "b1", 0)
	d := s.next(t)
	before := e.redisNow()
	e.nack(r, nil, "failed", d.GetToken())
	after := e.redisNow()
	due := e.mustGet(r, "b1").GetDueTime().AsTime()
	if due.Before(before.Add(400*time.Millisecond-time.Millisecond)) || due.After(after.Add(400*time.Millisecond+time.Millisecond)) {
		t.Fatalf("retry due %v after the nack, want the first backoff step, 400ms", due.Sub(before))
	}
	if again := s.next(t); again.GetTask().GetAttempt() != 2 {
		t.Fatalf("redelivery attempt %d, want 2", again.GetTask().GetAttempt())
	}
}

func TestDeliveryBackoffSchedule(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.MaxAttempts = 10
	pol.Backoff = storage.Backoff{Initial: 40 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2, Jitter: 0.25}
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "sched", 0)
	// Attempt n failed → delay min(Max, Initial*2^(n-1)), jittered down by up to 25%.
	want := []time.Duration{40, 80, 160, 200, 200}
	for i, w := range want {
		w *= time.Millisecond
		d := s.next(t)
		if d.GetTask().GetAttempt() != int32(i+1) {
			t.Fatalf("delivery attempt %d, want %d", d.GetTask().GetAttempt(), i+1)
		}
		before := e.redisNow()
		e.nack(r, nil, "again", d.GetToken())
		after := e.redisNow()
		due := e.mustGet(r, "sched").GetDueTime().AsTime()
		lo, hi := before.Add(w*3/4-time.Millisecond), after.Add(w+time.Millisecond)
		if due.Before(lo) || due.After(hi) {
			t.Errorf("after attempt %d: retry %v after the nack, want %v..%v", i+1, due.Sub(before), w*3/4, w)
		}
	}
}

func TestDeliveryLeaseExpiryRedeliversToSubscriberThatNeverAcks(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.AckTimeout = 250 * time.Millisecond
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 1) // never acks
	e.upsert(r, "lease", 0)
	first := s.next(t)
	second := s.next(t)
	if second.GetTask().GetId() != "lease" || second.GetTask().GetAttempt() != 2 {
		t.Fatalf("after the lease: %s attempt %d, want lease attempt 2", second.GetTask().GetId(), second.GetTask().GetAttempt())
	}
	if second.GetTask().GetLastError() != dispatcher.ReasonLeaseExpired {
		t.Errorf("last error %q, want %q", second.GetTask().GetLastError(), dispatcher.ReasonLeaseExpired)
	}
	if !first.GetLeaseDeadline().AsTime().Before(second.GetLeaseDeadline().AsTime()) {
		t.Errorf("second lease %v not after the first %v", second.GetLeaseDeadline().AsTime(), first.GetLeaseDeadline().AsTime())
	}
	// The expired delivery's ack is stale; the current one's is OK.
	if st := e.ack(r, first.GetToken(), second.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_STALE || st[1] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("acks: %v, want [STALE OK]", st)
	}
}

func TestDeliveryDeadLetterAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.MaxAttempts = 3
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "doomed", 0)
	for i := 1; i <= 3; i++ {
		d := s.next(t)
		if d.GetTask().GetAttempt() != int32(i) {
			t.Fatalf("attempt %d, want %d", d.GetTask().GetAttempt(), i)
		}
		e.nack(r, durationpb.New(0), "bad payload", d.GetToken())
	}
	s.none(t)
	task := e.mustGet(r, "doomed")
	if task.GetState() != delaydv1.TaskState_TASK_STATE_DEAD || task.GetDeadTime() == nil || task.GetLastError() != "bad payload" {
		t.Fatalf("after max attempts: %v dead_time %v last error %q, want DEAD with a dead time", task.GetState(), task.GetDeadTime(), task.GetLastError())
	}
	list, err := r.tasks.ListTasks(context.Background(), &delaydv1.ListTasksRequest{Namespace: e.ns, State: delaydv1.TaskState_TASK_STATE_DEAD})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetTasks()) != 1 || list.GetTasks()[0].GetId() != "doomed" {
		t.Fatalf("ListTasks DEAD: %v, want [doomed]", list.GetTasks())
	}
}

func TestDeliveryLeaseExpiryAfterMaxAttemptsIsDead(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.AckTimeout = 150 * time.Millisecond
	pol.MaxAttempts = 2
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 0) // never acks
	e.upsert(r, "ghost", 0)
	s.next(t)
	s.next(t)
	deadline := time.Now().Add(dlvWait)
	for {
		task := e.mustGet(r, "ghost")
		if task.GetState() == delaydv1.TaskState_TASK_STATE_DEAD {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task still %v after two expired leases, want DEAD", task.GetState())
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.none(t)
}

func TestDeliveryStaleAckAfterReupsert(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "re", 0)
	d := s.next(t)
	e.upsert(r, "re", time.Hour) // reschedule while in flight
	if st := e.ack(r, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_STALE {
		t.Fatalf("ack of the old generation: %v, want STALE", st[0])
	}
	if st := e.nack(r, durationpb.New(0), "", d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_STALE {
		t.Fatalf("nack of the old generation: %v, want STALE", st[0])
	}
	task := e.mustGet(r, "re")
	if task.GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED || task.GetGeneration() != d.GetTask().GetGeneration()+1 || task.GetAttempt() != 0 {
		t.Fatalf("after re-upsert and stale ack: %v gen %d attempt %d, want SCHEDULED gen %d attempt 0",
			task.GetState(), task.GetGeneration(), task.GetAttempt(), d.GetTask().GetGeneration()+1)
	}
	s.none(t) // due in an hour
}

func TestDeliveryRemoveWhileInFlight(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.AckTimeout = 200 * time.Millisecond
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "gone", 0)
	d := s.next(t)
	resp, err := r.tasks.RemoveTask(context.Background(), &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetRemoved() || resp.GetPreviousState() != delaydv1.TaskState_TASK_STATE_DELIVERED {
		t.Fatalf("RemoveTask: %v, want removed from DELIVERED", resp)
	}
	time.Sleep(2 * pol.AckTimeout) // past the lease: nothing to reap
	s.none(t)
	if st := e.ack(r, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Fatalf("ack after remove: %v, want NOT_FOUND", st[0])
	}
}

// TestDeliveryAckOfRemovedThenRecreatedTask: a task removed while in
// flight and re-created with the same id starts again at the same
// generation and attempt; the old subscriber's token must not ack (nor
// nack, nor extend) the new incarnation, which would lose it.
func TestDeliveryAckOfRemovedThenRecreatedTask(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "again", 0)
	old := s.next(t)
	if _, err := r.tasks.RemoveTask(context.Background(), &delaydv1.RemoveTaskRequest{Namespace: e.ns, Id: "again"}); err != nil {
		t.Fatal(err)
	}
	// The re-created task must get another create time (the store's clock
	// has to move on by a millisecond).
	created := old.GetTask().GetCreateTime().AsTime()
	for deadline := time.Now().Add(dlvWait); !e.redisNow().After(created.Add(time.Millisecond)); {
		if time.Now().After(deadline) {
			t.Fatalf("store clock did not pass %v", created)
		}
		time.Sleep(2 * time.Millisecond)
	}
	e.upsert(r, "again", 0)
	cur := s.next(t)
	if cur.GetTask().GetId() != "again" || cur.GetToken() == old.GetToken() {
		t.Fatalf("redelivery %v with token %q, want the re-created task with a new token (old %q)", cur.GetTask(), cur.GetToken(), old.GetToken())
	}
	if g, a := cur.GetTask().GetGeneration(), cur.GetTask().GetAttempt(); g != old.GetTask().GetGeneration() || a != old.GetTask().GetAttempt() {
		t.Logf("re-created delivery is gen %d attempt %d, the removed one was gen %d attempt %d", g, a, old.GetTask().GetGeneration(), old.GetTask().GetAttempt())
	}
	if st := e.ack(r, old.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Fatalf("ack of the removed task's token: %v, want NOT_FOUND", st[0])
	}
	if st := e.nack(r, durationpb.New(0), "old", old.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Fatalf("nack of the removed task's token: %v, want NOT_FOUND", st[0])
	}
	ext, err := r.dlv.ExtendLease(context.Background(), &delaydv1.ExtendLeaseRequest{
		Namespace: e.ns, Tokens: []string{old.GetToken()}, ExtendBy: durationpb.New(2 * time.Hour),
	})
	if err != nil {
		t.Fatalf("ExtendLease: %v", err)
	}
	if st := dlvStatuses(ext.GetResults()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Fatalf("extend of the removed task's token: %v, want NOT_FOUND", st[0])
	}
	task := e.mustGet(r, "again")
	// The store lease a live replica renews is at most the deadline the
	// subscriber was told; the old token's two-hour extension would have
	// moved it past it.
	if task.GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED || task.GetAttempt() != 1 ||
		task.GetLeaseDeadline().AsTime().After(cur.GetLeaseDeadline().AsTime()) {
		t.Fatalf("re-created task after the old token: %v, want still DELIVERED, attempt 1, lease at most %v", task, cur.GetLeaseDeadline().AsTime())
	}
	if st := e.ack(r, cur.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack of the re-created task's token: %v, want OK", st[0])
	}
	if _, err := e.getTask(r, "again"); status.Code(err) != codes.NotFound {
		t.Fatalf("GetTask after ack: %v, want NotFound", err)
	}
	s.none(t)
}

// A stream that is cut leaves what it was sent leased (issue 10 item 4):
// the subscriber may still be working on it, and its ack works over another
// stream or replica; nothing is redelivered meanwhile.
func TestDeliveryStreamCutLeavesSentLeased(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy()) // lease: one hour
	r, other := e.replica(), e.replica()
	a := e.subscribe(r, 1)
	e.upsert(r, "cut", 0)
	first := a.next(t)
	b := e.subscribe(r, 1)
	a.end()
	b.none(t)
	if task := e.mustGet(r, "cut"); task.GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED || task.GetAttempt() != 1 {
		t.Fatalf("after the cut: %v attempt %d, want DELIVERED attempt 1", task.GetState(), task.GetAttempt())
	}
	if st := e.ack(other, first.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack of the cut stream's delivery on another replica: %v, want OK", st[0])
	}
	b.none(t)
}

func TestDeliveryExtendLease(t *testing.T) {
	t.Parallel()
	pol := dlvPolicy()
	pol.AckTimeout = 300 * time.Millisecond
	e := newDlvEnv(t, pol)
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "slowjob", 0)
	d := s.next(t)
	resp, err := r.dlv.ExtendLease(context.Background(), &delaydv1.ExtendLeaseRequest{
		Namespace: e.ns, Tokens: []string{d.GetToken()}, ExtendBy: durationpb.New(time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()[0]
	if res.GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_OK || res.GetLeaseDeadline().AsTime().Sub(e.redisNow()) < 30*time.Minute {
		t.Fatalf("extend: %v, want OK with a deadline an hour ahead", res)
	}
	time.Sleep(2 * pol.AckTimeout)
	s.none(t) // the original lease passed; the extended one holds
	if st := e.ack(r, d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack after extend: %v, want OK", st[0])
	}
	_, err = r.dlv.ExtendLease(context.Background(), &delaydv1.ExtendLeaseRequest{
		Namespace: e.ns, Tokens: []string{d.GetToken()}, ExtendBy: durationpb.New(0),
	})
	wantCode(t, err, codes.InvalidArgument, "extend_by")
}

func TestDeliveryTokens(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "tok", 0)
	d := s.next(t)

	_, err := r.dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: e.ns})
	wantCode(t, err, codes.InvalidArgument, "tokens")
	_, err = r.dlv.NackTasks(context.Background(), &delaydv1.NackTasksRequest{Namespace: e.ns, Tokens: make([]string, 1001)})
	wantCode(t, err, codes.InvalidArgument, "tokens")
	_, err = r.dlv.NackTasks(context.Background(), &delaydv1.NackTasksRequest{Namespace: e.ns, Tokens: []string{d.GetToken()}, RetryAfter: durationpb.New(-time.Second)})
	wantCode(t, err, codes.InvalidArgument, "retry_after")
	_, err = r.dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: "Bad NS", Tokens: []string{d.GetToken()}})
	wantCode(t, err, codes.InvalidArgument, "namespace")

	// A token is only valid in its own namespace.
	other := "st-other-" + testkit.Suffix()
	resp, err := r.dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: other, Tokens: []string{d.GetToken()}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetResults()[0]; got.GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND || got.GetToken() != d.GetToken() {
		t.Fatalf("ack in another namespace: %v, want NOT_FOUND", got)
	}
	if got := e.mustGet(r, "tok"); got.GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED {
		t.Fatalf("after a foreign-namespace ack the task is %v, want still DELIVERED", got.GetState())
	}
	// Results come in request order, duplicates included.
	if st := e.ack(r, d.GetToken(), d.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK || st[1] != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
		t.Fatalf("ack twice in one batch: %v, want [OK NOT_FOUND]", st)
	}

	// A malformed token is answered per token, like an unknown one; the
	// call's other tokens are applied. Ack, Nack and ExtendLease alike.
	e.upsert(r, "tok2", 0)
	d = s.next(t)
	for name, call := range map[string]func(toks ...string) ([]*delaydv1.TokenResult, error){
		"nack": func(toks ...string) ([]*delaydv1.TokenResult, error) {
			resp, err := r.dlv.NackTasks(context.Background(), &delaydv1.NackTasksRequest{Namespace: e.ns, Tokens: toks, RetryAfter: durationpb.New(0)})
			return resp.GetResults(), err
		},
		"extend": func(toks ...string) ([]*delaydv1.TokenResult, error) {
			resp, err := r.dlv.ExtendLease(context.Background(), &delaydv1.ExtendLeaseRequest{Namespace: e.ns, Tokens: toks})
			return resp.GetResults(), err
		},
	} {
		d := d
		if name == "nack" {
			e.upsert(r, "tok-nack", 0)
			d = s.next(t)
		}
		res, err := call("", d.GetToken(), "x"+d.GetToken()[1:])
		if err != nil {
			t.Fatalf("%s with malformed tokens: %v, want per-token answers", name, err)
		}
		if st := dlvStatuses(res); len(st) != 3 || st[0] != delaydv1.TokenStatus_TOKEN_STATUS_MALFORMED ||
			st[1] != delaydv1.TokenStatus_TOKEN_STATUS_OK || st[2] != delaydv1.TokenStatus_TOKEN_STATUS_MALFORMED {
			t.Fatalf("%s [empty, good, altered]: %v, want [MALFORMED OK MALFORMED]", name, st)
		}
	}
	resp, err = r.dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: e.ns, Tokens: []string{d.GetToken(), "not-a-token"}})
	if err != nil {
		t.Fatalf("ack with a malformed token: %v, want per-token answers", err)
	}
	if st := dlvStatuses(resp.GetResults()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK || st[1] != delaydv1.TokenStatus_TOKEN_STATUS_MALFORMED ||
		resp.GetResults()[1].GetToken() != "not-a-token" {
		t.Fatalf("ack [good, malformed]: %v, want [OK MALFORMED] with the token echoed", resp.GetResults())
	}
	if _, err := r.tasks.GetTask(context.Background(), &delaydv1.GetTaskRequest{Namespace: e.ns, Id: "tok2"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetTask after the ack beside a malformed token: %v, want NotFound (the good token was applied)", err)
	}
}

func TestSubscribeValidation(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	for _, tc := range []struct {
		req     *delaydv1.SubscribeRequest
		mention string
	}{
		{&delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: -1}, "max_in_flight"},
		{&delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: 10001}, "max_in_flight"},
		{&delaydv1.SubscribeRequest{Namespace: "", MaxInFlight: 1}, "namespace"},
		{&delaydv1.SubscribeRequest{Namespace: "-x", MaxInFlight: 1}, "namespace"},
	} {
		stream, err := r.dlv.Subscribe(context.Background(), tc.req)
		if err == nil {
			_, err = stream.Recv()
		}
		wantCode(t, err, codes.InvalidArgument, tc.mention)
	}
}

func TestSubscribeEndsUnavailableOnShutdown(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 0)
	e.upsert(r, "held", 0)
	held := s.next(t)

	ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
	defer cancel()
	if err := r.d.Stop(ctx); err != nil {
		t.Fatalf("dispatcher Stop: %v", err)
	}
	for range s.ch {
	}
	err := <-s.err
	wantCode(t, err, codes.Unavailable, "reconnect")
	// What the stream was sent stays leased (a rolling deploy redelivers
	// nothing); the ack goes to another replica.
	task := e.mustGet(r, "held")
	if task.GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED || task.GetAttempt() != 1 {
		t.Fatalf("after shutdown: %v attempt %d %q, want DELIVERED attempt 1", task.GetState(), task.GetAttempt(), task.GetLastError())
	}
	if st := e.ack(e.replica(), held.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack after shutdown on another replica: %v, want OK", st[0])
	}
	// A new subscriber on the stopped replica is told to go elsewhere.
	stream, err := r.dlv.Subscribe(context.Background(), &delaydv1.SubscribeRequest{Namespace: e.ns})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.Unavailable, "reconnect")
}
