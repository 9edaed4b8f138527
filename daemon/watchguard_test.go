package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
)

// Issue 32 item 1: WatchDeliveries goes through the same stream guard as
// Subscribe. A whole delayd over a real Redis, over gRPC.

const guardAdminKey = "watchguard-admin-key-0123456789abcdef"

func asKey(ctx context.Context, secret string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+secret)
}

// guardEnv is a namespace on a started delayd with auth on.
type guardEnv struct {
	t     *testing.T
	s     *started
	ns    string
	admin context.Context
	nsc   delaydv1.NamespaceServiceClient
	dlv   delaydv1.DeliveryServiceClient
}

func newGuardEnv(t *testing.T, s *started, prefix string) *guardEnv {
	t.Helper()
	ns := prefix + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	e := &guardEnv{t: t, s: s, ns: ns, admin: asKey(ctxFor(t), guardAdminKey),
		nsc: delaydv1.NewNamespaceServiceClient(s.conn), dlv: delaydv1.NewDeliveryServiceClient(s.conn)}
	e.create()
	return e
}

func (e *guardEnv) create() {
	e.t.Helper()
	if _, err := e.nsc.CreateNamespace(e.admin, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: e.ns}}); err != nil {
		e.t.Fatalf("CreateNamespace: %v", err)
	}
}

func (e *guardEnv) key(scopes ...delaydv1.KeyScope) (id, secret string) {
	e.t.Helper()
	resp, err := e.nsc.CreateKey(e.admin, &delaydv1.CreateKeyRequest{Namespace: e.ns, Scopes: scopes})
	if err != nil {
		e.t.Fatalf("CreateKey: %v", err)
	}
	return resp.GetKey().GetId(), resp.GetSecret()
}

// due upserts a task due now with a payload naming it.
func (e *guardEnv) due(id string) {
	e.t.Helper()
	_, err := e.s.tasks.UpsertTask(e.admin, &delaydv1.UpsertTaskRequest{Namespace: e.ns, Id: id, Payload: []byte("secret-" + id),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}})
	if err != nil {
		e.t.Fatalf("upsert %s: %v", id, err)
	}
}

// subscribe opens an admin Subscribe stream that acks what it gets and
// reports each task id on the returned channel.
func (e *guardEnv) subscribe() <-chan string {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.admin)
	stream, err := e.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: e.ns, MaxInFlight: 10})
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		cancel()
		e.t.Fatal(err)
	}
	ids := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			d := resp.GetDelivery()
			_, _ = e.dlv.AckTasks(e.admin, &delaydv1.AckTasksRequest{Namespace: e.ns, Tokens: []string{d.GetToken()}})
			ids <- d.GetTask().GetId()
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done })
	return ids
}

// watchStream is an open WatchDeliveries stream: copies on got, its end on
// done.
type watchStream struct {
	got  chan *delaydv1.WatchDeliveriesResponse
	done chan error
}

func openWatch(t *testing.T, ctx context.Context, dlv delaydv1.DeliveryServiceClient, ns string) (*watchStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := dlv.WatchDeliveries(ctx, &delaydv1.WatchDeliveriesRequest{Namespace: ns})
	if err != nil {
		cancel()
		return nil, err
	}
	if _, err := stream.Header(); err != nil {
		cancel()
		return nil, err
	}
	w := &watchStream{got: make(chan *delaydv1.WatchDeliveriesResponse, 100), done: make(chan error, 1)}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			resp, err := stream.Recv()
			if err != nil {
				w.done <- err
				return
			}
			w.got <- resp
		}
	}()
	t.Cleanup(func() { cancel(); <-ended })
	return w, nil
}

func (e *guardEnv) watch(ctx context.Context) *watchStream {
	e.t.Helper()
	w, err := openWatch(e.t, ctx, e.dlv, e.ns)
	if err != nil {
		e.t.Fatalf("WatchDeliveries: %v", err)
	}
	return w
}

// copyOf waits for the watch's copy of task id.
func (w *watchStream) copyOf(t *testing.T, id string) {
	t.Helper()
	for {
		select {
		case c := <-w.got:
			if c.GetTask().GetId() == id {
				return
			}
		case err := <-w.done:
			t.Fatalf("the watch ended before the copy of %s: %v", id, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("no copy of %s", id)
		}
	}
}

// endsWith waits for the watch to end with code; it fails when the watch
// gets a copy of a task in forbidden first.
func (w *watchStream) endsWith(t *testing.T, code codes.Code, forbidden ...string) {
	t.Helper()
	for {
		select {
		case c := <-w.got:
			for _, id := range forbidden {
				if c.GetTask().GetId() == id {
					t.Fatalf("the watch received %s (payload %q) after it should have ended", id, c.GetTask().GetPayload())
				}
			}
		case err := <-w.done:
			if status.Code(err) != code {
				t.Fatalf("the watch ended with %v; want %s", err, code)
			}
			for {
				select {
				case c := <-w.got:
					for _, id := range forbidden {
						if c.GetTask().GetId() == id {
							t.Fatalf("the watch received %s (payload %q) after it should have ended", id, c.GetTask().GetPayload())
						}
					}
				default:
					return
				}
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the watch is still open; want it ended with %s", code)
		}
	}
}

// TestRevokedKeyEndsWatch: a WatchDeliveries stream of a key that is
// revoked ends Unauthenticated, and no task delivered after RevokeKey
// returned reaches it; on another replica the watch of the same key ends
// too (within the registry cache's lifetime).
func TestRevokedKeyEndsWatch(t *testing.T) {
	t.Parallel()
	s1 := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "warn"})
	s2 := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "warn"})
	e := newGuardEnv(t, s1, "wrevoke-")
	id, secret := e.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	w1 := e.watch(asKey(ctxFor(t), secret))
	w2, err := openWatch(t, asKey(ctxFor(t), secret), delaydv1.NewDeliveryServiceClient(s2.conn), e.ns)
	if err != nil {
		t.Fatal(err)
	}
	sub := e.subscribe()
	e.due("before")
	if got := <-sub; got != "before" {
		t.Fatalf("subscriber got %s", got)
	}
	w1.copyOf(t, "before")

	if _, err := e.nsc.RevokeKey(e.admin, &delaydv1.RevokeKeyRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	e.due("after")
	if got := <-sub; got != "after" {
		t.Fatalf("subscriber got %s", got)
	}
	w1.endsWith(t, codes.Unauthenticated, "after")
	w2.endsWith(t, codes.Unauthenticated)
}

// TestRecycledNamespaceEndsWatch: a watch of a namespace that is deleted
// and re-created ends NotFound and never receives the new namespace's task
// or its payload.
func TestRecycledNamespaceEndsWatch(t *testing.T) {
	t.Parallel()
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "warn"})
	e := newGuardEnv(t, s, "wrecycle-")
	_, secret := e.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	w := e.watch(asKey(ctxFor(t), secret))
	adminWatch := e.watch(e.admin)

	if _, err := e.nsc.DeleteNamespace(e.admin, &delaydv1.DeleteNamespaceRequest{Namespace: e.ns, Force: true}); err != nil {
		t.Fatal(err)
	}
	e.create()
	sub := e.subscribe()
	e.due("new-tenant")
	if got := <-sub; got != "new-tenant" {
		t.Fatalf("subscriber got %s", got)
	}
	w.endsWith(t, codes.NotFound, "new-tenant")
	adminWatch.endsWith(t, codes.NotFound, "new-tenant")
}

// TestWatchFloodIsCapped: 2,000 WatchDeliveries attempts by one consume
// key over 3 connections are refused past the per-key stream cap, and
// meanwhile every upsert of another tenant succeeds. delayd runs on a
// private Redis with maxclients 400: before watches were capped and shared
// one pub/sub connection, each watch took a connection of its own, Redis
// ran out of them and the other tenant's upserts failed.
func TestWatchFloodIsCapped(t *testing.T) {
	t.Parallel()
	rds := testkit.StartRedis(t, "--maxclients", "400")
	s := start(t, Config{RedisURL: rds.URL, AdminKey: guardAdminKey, LogLevel: "error"})
	attacker := newGuardEnv(t, s, "wflood-")
	_, secret := attacker.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	victim := newGuardEnv(t, s, "wvictim-")
	_, producer := victim.key(delaydv1.KeyScope_KEY_SCOPE_PRODUCE)

	const attempts, conns = 2000, 3
	ctx, cancel := context.WithCancel(asKey(context.Background(), secret))
	defer cancel()
	var clients []delaydv1.DeliveryServiceClient
	for range conns {
		conn, err := grpc.NewClient(s.d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		clients = append(clients, delaydv1.NewDeliveryServiceClient(conn))
	}
	var opened, refused atomic.Int64
	var other sync.Map // unexpected errors
	var wg sync.WaitGroup
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := clients[i%conns].WatchDeliveries(ctx, &delaydv1.WatchDeliveriesRequest{Namespace: attacker.ns})
			if err == nil {
				_, err = stream.Header()
			}
			if err == nil {
				// An accepted watch sends its headers; a refused one ends.
				_, err = stream.Recv()
				if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
					opened.Add(1)
					return
				}
			}
			if status.Code(err) == codes.ResourceExhausted {
				refused.Add(1)
				return
			}
			other.Store(status.Code(err).String(), err)
		}()
	}
	// The other tenant upserts while the flood is on.
	var upsertsFailed atomic.Int64
	var firstErr atomic.Value
	// Each upsert has its own deadline: what fails is what the flood
	// refused or starved, not 800 calls on a loaded machine sharing one.
	var uwg sync.WaitGroup
	for w := range 8 {
		uwg.Add(1)
		go func() {
			defer uwg.Done()
			for i := range 100 {
				pctx, cancel := context.WithTimeout(asKey(context.Background(), producer), 15*time.Second)
				_, err := s.tasks.UpsertTask(pctx, upsert(victim.ns, fmt.Sprintf("v%d-%d", w, i)))
				cancel()
				if err != nil {
					upsertsFailed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	uwg.Wait()
	// Wait until every refused attempt was answered, then end the open ones.
	deadline := time.Now().Add(60 * time.Second)
	for refused.Load()+int64(countMap(&other)) < attempts-int64(server.DefaultMaxStreamsPerKey) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if n := upsertsFailed.Load(); n > 0 {
		t.Errorf("%d of 800 upserts of another tenant failed during the watch flood; first: %v", n, firstErr.Load())
	}
	other.Range(func(k, v any) bool {
		t.Errorf("a watch attempt failed with %s: %v", k, v)
		return true
	})
	if got := opened.Load(); got != server.DefaultMaxStreamsPerKey {
		t.Errorf("%d watches of one key were accepted (%d refused); want the per-key cap, %d", got, refused.Load(), server.DefaultMaxStreamsPerKey)
	}
}

func countMap(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}
