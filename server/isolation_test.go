package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/delayd/delayd/dispatcher"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/tenancy"
)

// The tenancy tests (isolation, auth, limits, TLS, fairness, admin API) run
// full delayd replicas — tenancy registry, dispatcher, gRPC server — over
// loopback, on an in-memory store and registry (storagefake) shared by the
// replicas of one test.

// tenAdminKey is the bootstrap admin key of every test replica.
const tenAdminKey = "isolation-test-admin-key-0123456789abcdef"

// tenEnv is one store and registry shared by the replicas of one test.
type tenEnv struct {
	t     *testing.T
	store fakeStores
}

func newTenEnv(t *testing.T) *tenEnv {
	t.Helper()
	return &tenEnv{t: t, store: newFakeStores()}
}

// tenReplica is one delayd server and a plaintext client connection.
type tenReplica struct {
	reg   *tenancy.Registry
	srv   *server.Server
	addr  string
	conn  *grpc.ClientConn
	tasks delaydv1.TaskServiceClient
	dlv   delaydv1.DeliveryServiceClient
	admin delaydv1.NamespaceServiceClient
}

// tenOpts adjust a replica before it starts.
type tenOpts struct {
	server  func(*server.Options)
	tenancy func(*tenancy.Config)
	// tls, if set, is the client's TLS config (the server's is set through
	// server); the replica's conn then speaks TLS.
	tls *tls.Config
}

// replica starts a delayd replica: auth on with tenAdminKey, auto-create off,
// unless o says otherwise.
func (e *tenEnv) replica(o tenOpts) *tenReplica {
	e.t.Helper()
	tc := tenancy.Config{Store: e.store}
	if o.tenancy != nil {
		o.tenancy(&tc)
	}
	reg, err := tenancy.New(tc)
	if err != nil {
		e.t.Fatal(err)
	}
	d, err := dispatcher.New(dispatcher.Config{Store: e.store, Wakeups: e.store, Policies: reg})
	if err != nil {
		e.t.Fatalf("dispatcher.New: %v", err)
	}
	opts := server.Options{
		Store: e.store, Tenancy: reg, Subscriptions: d, History: e.store,
		Schedules: newScheduler(e.t, e.store.Store, reg),
		Auth:      guard.AuthOptions{AdminKey: tenAdminKey},
	}
	if o.server != nil {
		o.server(&opts)
	}
	srv, err := server.New(opts)
	if err != nil {
		e.t.Fatalf("server.New: %v", err)
	}
	srv.SetServing(true)
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
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
		defer cancel()
		_ = conn.Close()
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("dispatcher Stop: %v", err)
		}
		if err := srv.GracefulStop(ctx); err != nil {
			e.t.Errorf("GracefulStop: %v", err)
		}
		<-served
	})
	return &tenReplica{
		reg: reg, srv: srv, addr: lis.Addr().String(), conn: conn,
		tasks: delaydv1.NewTaskServiceClient(conn),
		dlv:   delaydv1.NewDeliveryServiceClient(conn),
		admin: delaydv1.NewNamespaceServiceClient(conn),
	}
}

// as returns a context that sends key as the bearer token.
func as(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

// admin is a context with the bootstrap admin key.
func admin() context.Context { return as(tenAdminKey) }

// newNamespace creates a namespace (name prefix + random suffix) with pol
// through the admin API and deletes it, with its tasks, when the test ends.
func (e *tenEnv) newNamespace(r *tenReplica, prefix string, pol *delaydv1.NamespacePolicy) string {
	e.t.Helper()
	name := prefix + testkit.Suffix()
	if _, err := r.admin.CreateNamespace(admin(), &delaydv1.CreateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: name, Policy: pol},
	}); err != nil {
		e.t.Fatalf("CreateNamespace(%s): %v", name, err)
	}
	e.t.Cleanup(func() { e.drop(name) })
	return name
}

// drop deletes a namespace's tasks and record straight in the store.
func (e *tenEnv) drop(name string) {
	ctx := context.Background()
	_, _ = e.store.DropNamespace(ctx, name, 0)
	_ = e.store.DeleteNamespace(ctx, name)
}

// newKey creates an API key through the admin API (as the bootstrap key).
func (e *tenEnv) newKey(r *tenReplica, ns string, scopes ...delaydv1.KeyScope) (id, secret string) {
	e.t.Helper()
	resp, err := r.admin.CreateKey(admin(), &delaydv1.CreateKeyRequest{Namespace: ns, Scopes: scopes, Description: "test"})
	if err != nil {
		e.t.Fatalf("CreateKey(%s, %v): %v", ns, scopes, err)
	}
	if ns == storage.GlobalNamespace {
		e.t.Cleanup(func() { _ = e.store.RevokeKey(context.Background(), resp.GetKey().GetId()) })
	}
	return resp.GetKey().GetId(), resp.GetSecret()
}

// upsertAs upserts task id in ns, due now.
func upsertAs(ctx context.Context, r *tenReplica, ns, id string) error {
	_, err := r.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{
		Namespace: ns, Id: id, Payload: []byte("secret of " + ns),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)},
	})
	return err
}

// firstDelivery opens a Subscribe stream with ctx and returns its first
// delivery, or the error the stream ended with. cancel ends the stream.
func firstDelivery(ctx context.Context, r *tenReplica, ns string) (*delaydv1.Delivery, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(ctx, dlvWait)
	stream, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 1})
	if err != nil {
		return nil, cancel, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, cancel, err
	}
	return resp.GetDelivery(), cancel, nil
}

func codeOf(err error) codes.Code { return status.Code(err) }

// TestAuthentication: no key, a malformed key, an unknown key and a revoked
// key are Unauthenticated; health and reflection need no key.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Reflection = true }})
	ns := e.newNamespace(r, "auth-", nil)
	id, secret := e.newKey(r, ns, delaydv1.KeyScope_KEY_SCOPE_PRODUCE)
	get := func(ctx context.Context) error {
		_, err := r.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "x"})
		return err
	}
	if err := get(as(secret)); codeOf(err) != codes.NotFound {
		t.Fatalf("GetTask with a valid key: %v, want NotFound (authenticated)", err)
	}
	for name, ctx := range map[string]context.Context{
		"no key":           context.Background(),
		"not bearer":       metadata.AppendToOutgoingContext(context.Background(), "authorization", "Basic "+secret),
		"malformed":        as("dk_nothex_xyz"),
		"unknown id":       as("dk_0123456789abcdef_" + secret[len(secret)-43:]),
		"wrong secret":     as(secret[:len(secret)-4] + "AAAA"),
		"admin key prefix": as(tenAdminKey[:len(tenAdminKey)-1]),
	} {
		if err := get(ctx); codeOf(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	if err := get(context.Background()); !strings.Contains(status.Convert(err).Message(), "authorization: Bearer") {
		t.Errorf("missing key message %q does not say what to send", status.Convert(err).Message())
	}

	if _, err := r.admin.RevokeKey(admin(), &delaydv1.RevokeKeyRequest{Id: id}); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	if err := get(as(secret)); codeOf(err) != codes.Unauthenticated {
		t.Errorf("revoked key: %v, want Unauthenticated at once on the replica that revoked it", err)
	}

	// Health and reflection stay open.
	h, err := healthpb.NewHealthClient(r.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a key: %v %v", h, err)
	}
	if svcs, err := listServices(r.conn); err != nil || !slices.Contains(svcs, "delayd.v1.TaskService") {
		t.Errorf("reflection without a key: %v %v", svcs, err)
	}
}

// listServices asks server reflection for the service list.
func listServices(conn *grpc.ClientConn) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
	defer cancel()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	// A Send that fails with io.EOF means the server already ended the
	// stream (e.g. Unimplemented); Recv returns that status.
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	_ = st.CloseSend()
	var out []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		out = append(out, s.GetName())
	}
	return out, nil
}

// TestReflectionIsOffByDefault (issue 42 item 1): without
// Options.Reflection the reflection service is gone (Unimplemented) — it
// needs no key, so it is served only when asked for — while health still
// answers.
func TestReflectionIsOffByDefault(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	if _, err := listServices(r.conn); codeOf(err) != codes.Unimplemented {
		t.Errorf("reflection when disabled: %v, want Unimplemented", err)
	}
	if _, err := healthpb.NewHealthClient(r.conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health: %v", err)
	}
}

// TestNoAuth: with auth disabled every RPC works without a key.
func TestNoAuth(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{server: func(o *server.Options) { o.Auth = guard.AuthOptions{Disabled: true} }})
	ns := e.newNamespace(r, "noauth-", nil)
	if err := upsertAs(context.Background(), r, ns, "a"); err != nil {
		t.Errorf("UpsertTask without a key and auth off: %v", err)
	}
	if _, err := r.admin.ListNamespaces(context.Background(), &delaydv1.ListNamespacesRequest{}); err != nil {
		t.Errorf("ListNamespaces without a key and auth off: %v", err)
	}
}

// call is one RPC of the isolation matrix, made on namespace ns.
type call struct {
	name  string
	scope delaydv1.KeyScope
	// orScope, if set, is a second scope that is enough on its own.
	orScope delaydv1.KeyScope
	// anyKey: every valid key may make it.
	anyKey bool
	// global: only a global key may make it.
	global bool
	do     func(ctx context.Context, ns string) (any, error)
}

// TestIsolationMatrix walks every RPC × key scope × namespace over real
// gRPC: a key of namespace A may use exactly its scopes on A, nothing on B;
// a global key its scopes everywhere. A refused call is PermissionDenied
// and carries no data; an allowed one is never PermissionDenied.
func TestIsolationMatrix(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	pol := &delaydv1.NamespacePolicy{MaxAttempts: 1000, AckTimeout: durationpb.New(time.Hour)}
	nsA := e.newNamespace(r, "iso-a-", pol)
	nsB := e.newNamespace(r, "iso-b-", pol)

	// Each namespace holds a due task (subscribers get it), a task to read,
	// a delivery token (for ack/nack/extend) and a schedule.
	sched := delaydv1.NewScheduleServiceClient(r.conn)
	tokens := map[string]string{}
	for _, ns := range []string{nsA, nsB} {
		if _, err := sched.CreateSchedule(admin(), &delaydv1.CreateScheduleRequest{Schedule: &delaydv1.Schedule{Namespace: ns, Id: "held",
			Rule: &delaydv1.Schedule_Cron{Cron: "@daily"}}}); err != nil {
			t.Fatal(err)
		}
		if err := upsertAs(admin(), r, ns, "held"); err != nil {
			t.Fatal(err)
		}
		d, cancel, err := firstDelivery(admin(), r, ns)
		if err != nil {
			t.Fatalf("subscribe %s: %v", ns, err)
		}
		tokens[ns] = d.GetToken()
		cancel()
		if err := upsertAs(admin(), r, ns, "due"); err != nil {
			t.Fatal(err)
		}
	}

	P, C, A := delaydv1.KeyScope_KEY_SCOPE_PRODUCE, delaydv1.KeyScope_KEY_SCOPE_CONSUME, delaydv1.KeyScope_KEY_SCOPE_ADMIN
	calls := []call{
		{name: "UpsertTask", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "new", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}})
		}},
		{name: "BatchUpsertTasks", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: []*delaydv1.UpsertTaskRequest{{Id: "new2", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}}}})
		}},
		{name: "RemoveTask", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: ns, Id: "absent"})
		}},
		{name: "RemoveTasks", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: ns, Ids: []string{"absent"}})
		}},
		{name: "GetTask", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "held"})
		}},
		{name: "ListTasks", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: ns})
		}},
		{name: "GetTaskHistory", scope: P, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.tasks.GetTaskHistory(ctx, &delaydv1.GetTaskHistoryRequest{Namespace: ns, Id: "held"})
		}},
		{name: "Subscribe", scope: C, global: false, do: func(ctx context.Context, ns string) (any, error) {
			d, cancel, err := firstDelivery(ctx, r, ns)
			cancel()
			if err != nil {
				return nil, err
			}
			return d, nil
		}},
		{name: "StreamDeliveries", scope: C, global: false, do: func(ctx context.Context, ns string) (any, error) {
			// Opened with an ack on it: the answer is its result.
			ctx, cancel := context.WithTimeout(ctx, dlvWait)
			defer cancel()
			stream, err := r.dlv.StreamDeliveries(ctx)
			if err != nil {
				return nil, err
			}
			if err := stream.Send(&delaydv1.StreamDeliveriesRequest{Namespace: ns, MaxInFlight: 1, AckTokens: []string{tokens[ns] + "x"}}); err != nil {
				return nil, err
			}
			for {
				resp, err := stream.Recv()
				if err != nil {
					return nil, err
				}
				if len(resp.GetAckResults()) > 0 {
					return resp, nil
				}
			}
		}},
		{name: "AckTasks", scope: C, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.dlv.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: []string{tokens[ns] + "x"}})
		}},
		{name: "NackTasks", scope: C, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.dlv.NackTasks(ctx, &delaydv1.NackTasksRequest{Namespace: ns, Tokens: []string{tokens[ns] + "x"}})
		}},
		{name: "ExtendLease", scope: C, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.dlv.ExtendLease(ctx, &delaydv1.ExtendLeaseRequest{Namespace: ns, Tokens: []string{tokens[ns]}, ExtendBy: durationpb.New(time.Hour)})
		}},
		{name: "WatchDeliveries", scope: C, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stream, err := r.dlv.WatchDeliveries(ctx, &delaydv1.WatchDeliveriesRequest{Namespace: ns})
			if err != nil {
				return nil, err
			}
			// Headers mean the watch was registered; none means it ended.
			md, err := stream.Header()
			if err == nil && md == nil {
				_, err = stream.Recv()
			}
			if err != nil {
				return nil, err
			}
			return md, nil
		}},
		{name: "WhoAmI", anyKey: true, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.WhoAmI(ctx, &delaydv1.WhoAmIRequest{})
		}},
		{name: "CreateNamespace", scope: A, global: true, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}})
		}},
		{name: "ListNamespaces", scope: A, global: true, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.ListNamespaces(ctx, &delaydv1.ListNamespacesRequest{PageSize: 1})
		}},
		{name: "GetNamespace", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.GetNamespace(ctx, &delaydv1.GetNamespaceRequest{Namespace: ns})
		}},
		{name: "UpdateNamespace", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.UpdateNamespace(ctx, &delaydv1.UpdateNamespaceRequest{
				Namespace:  &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{MaxAttempts: 1000}},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.max_attempts"}},
			})
		}},
		{name: "DeleteNamespace", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.DeleteNamespace(ctx, &delaydv1.DeleteNamespaceRequest{Namespace: ns}) // has tasks: never deletes
		}},
		{name: "GetNamespaceStats", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: ns})
		}},
		{name: "ListDeadLetters", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.ListDeadLetters(ctx, &delaydv1.ListDeadLettersRequest{Namespace: ns})
		}},
		{name: "RequeueDeadLetters", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.RequeueDeadLetters(ctx, &delaydv1.RequeueDeadLettersRequest{Namespace: ns, Ids: []string{"absent"}})
		}},
		{name: "PurgeDeadLetters", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.PurgeDeadLetters(ctx, &delaydv1.PurgeDeadLettersRequest{Namespace: ns, Ids: []string{"absent"}})
		}},
		{name: "CreateKey", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.CreateKey(ctx, &delaydv1.CreateKeyRequest{Namespace: ns, Scopes: []delaydv1.KeyScope{P}})
		}},
		{name: "ListKeys", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			return r.admin.ListKeys(ctx, &delaydv1.ListKeysRequest{Namespace: ns})
		}},
		{name: "RevokeKey", scope: A, global: false, do: func(ctx context.Context, ns string) (any, error) {
			victim, _ := e.newKey(r, ns, P) // a fresh key of ns each time
			return r.admin.RevokeKey(ctx, &delaydv1.RevokeKeyRequest{Id: victim})
		}},
		// Schedules: the namespace's producers, or its admins.
		{name: "CreateSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.CreateSchedule(ctx, &delaydv1.CreateScheduleRequest{Schedule: &delaydv1.Schedule{Namespace: ns, Id: "s-" + testkit.Suffix(),
				Rule: &delaydv1.Schedule_Cron{Cron: "@daily"}}})
		}},
		{name: "GetSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.GetSchedule(ctx, &delaydv1.GetScheduleRequest{Namespace: ns, Id: "held"})
		}},
		{name: "ListSchedules", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.ListSchedules(ctx, &delaydv1.ListSchedulesRequest{Namespace: ns})
		}},
		{name: "UpdateSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.UpdateSchedule(ctx, &delaydv1.UpdateScheduleRequest{Schedule: &delaydv1.Schedule{Namespace: ns, Id: "held", Description: "x"},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"description"}}})
		}},
		{name: "PauseSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.PauseSchedule(ctx, &delaydv1.PauseScheduleRequest{Namespace: ns, Id: "held"})
		}},
		{name: "ResumeSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.ResumeSchedule(ctx, &delaydv1.ResumeScheduleRequest{Namespace: ns, Id: "held"})
		}},
		{name: "DeleteSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.DeleteSchedule(ctx, &delaydv1.DeleteScheduleRequest{Namespace: ns, Id: "absent"})
		}},
		{name: "PreviewSchedule", scope: P, orScope: A, do: func(ctx context.Context, ns string) (any, error) {
			return sched.PreviewSchedule(ctx, &delaydv1.PreviewScheduleRequest{Namespace: ns, Id: "held"})
		}},
	}
	// Every RPC of the four services has its row: a new one cannot be
	// left out of the matrix.
	var missing []string
	for _, fd := range []protoreflect.FileDescriptor{delaydv1.File_delayd_v1_task_proto, delaydv1.File_delayd_v1_delivery_proto,
		delaydv1.File_delayd_v1_namespace_proto, delaydv1.File_delayd_v1_schedule_proto} {
		for i := range fd.Services().Len() {
			ms := fd.Services().Get(i).Methods()
			for j := range ms.Len() {
				name := string(ms.Get(j).Name())
				if !slices.ContainsFunc(calls, func(c call) bool { return c.name == name }) {
					missing = append(missing, name)
				}
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the matrix has no row for %v", missing)
	}

	type key struct {
		ns     string
		scope  delaydv1.KeyScope
		secret string
	}
	var keys []key
	for _, ns := range []string{nsA, storage.GlobalNamespace} {
		for _, sc := range []delaydv1.KeyScope{P, C, A} {
			_, secret := e.newKey(r, ns, sc)
			keys = append(keys, key{ns: ns, scope: sc, secret: secret})
		}
	}

	// A malformed namespace name is answered InvalidArgument naming the
	// field, whatever the key may do: validation comes before
	// authorization, so a typo never reads as a missing permission.
	const badName = "Orders Typo"
	for _, c := range calls {
		if c.name == "ListNamespaces" || c.name == "RevokeKey" || c.name == "WhoAmI" { // no namespace in the request
			continue
		}
		for _, k := range keys {
			_, err := c.do(as(k.secret), badName)
			if codeOf(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "namespace") {
				t.Errorf("%s on %q with a %s key of %q: %v, want InvalidArgument naming the namespace field", c.name, badName, k.scope, k.ns, err)
			}
		}
	}
	for _, k := range keys {
		_, err := r.admin.RevokeKey(as(k.secret), &delaydv1.RevokeKeyRequest{Id: "not-a-key-id"})
		if codeOf(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "id") {
			t.Errorf("RevokeKey of a malformed id with a %s key of %q: %v, want InvalidArgument naming id", k.scope, k.ns, err)
		}
	}

	for _, c := range calls {
		for _, k := range keys {
			for _, target := range []string{nsA, nsB} {
				allowed := (k.scope == c.scope || (c.orScope != 0 && k.scope == c.orScope)) &&
					(k.ns == storage.GlobalNamespace || (!c.global && k.ns == target))
				if c.anyKey {
					allowed = true
				}
				resp, err := c.do(as(k.secret), target)
				desc := fmt.Sprintf("%s on %s with a %s key of %q", c.name, target, k.scope, k.ns)
				switch code := codeOf(err); {
				case allowed && (code == codes.PermissionDenied || code == codes.Unauthenticated):
					t.Errorf("%s: %v, want it allowed", desc, err)
				case !allowed && code != codes.PermissionDenied:
					t.Errorf("%s: %v, want PermissionDenied", desc, err)
				case !allowed && resp != nil && !isNilResp(resp):
					t.Errorf("%s: refused but answered %v", desc, resp)
				}
			}
		}
	}
}

func isNilResp(v any) bool {
	switch r := v.(type) {
	case *delaydv1.Delivery:
		return r == nil
	}
	return v == nil || fmt.Sprint(v) == "<nil>"
}

// TestCrossNamespaceTokens: a consumer of A cannot settle B's deliveries —
// not by naming B (PermissionDenied), not by passing B's token in a request
// for A (the token names its namespace: NOT_FOUND, nothing changes).
func TestCrossNamespaceTokens(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	pol := &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(time.Hour)}
	nsA := e.newNamespace(r, "tok-a-", pol)
	nsB := e.newNamespace(r, "tok-b-", pol)
	_, consumerA := e.newKey(r, nsA, delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	_, consumerB := e.newKey(r, nsB, delaydv1.KeyScope_KEY_SCOPE_CONSUME)

	if err := upsertAs(admin(), r, nsB, "b1"); err != nil {
		t.Fatal(err)
	}
	// B's own consumer holds B's delivery, on an open stream.
	ctx, cancel := context.WithCancel(as(consumerB))
	defer cancel()
	stream, err := r.dlv.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: nsB, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("B's subscriber: %v", err)
	}
	tokB := resp.GetDelivery().GetToken()
	deadline := resp.GetDelivery().GetLeaseDeadline().AsTime()

	for name, do := range map[string]func(ctx context.Context, ns string) ([]*delaydv1.TokenResult, error){
		"AckTasks": func(ctx context.Context, ns string) ([]*delaydv1.TokenResult, error) {
			r, err := r.dlv.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: []string{tokB}})
			return r.GetResults(), err
		},
		"NackTasks": func(ctx context.Context, ns string) ([]*delaydv1.TokenResult, error) {
			r, err := r.dlv.NackTasks(ctx, &delaydv1.NackTasksRequest{Namespace: ns, Tokens: []string{tokB}})
			return r.GetResults(), err
		},
		"ExtendLease": func(ctx context.Context, ns string) ([]*delaydv1.TokenResult, error) {
			r, err := r.dlv.ExtendLease(ctx, &delaydv1.ExtendLeaseRequest{Namespace: ns, Tokens: []string{tokB}, ExtendBy: durationpb.New(11 * time.Hour)})
			return r.GetResults(), err
		},
	} {
		if _, err := do(as(consumerA), nsB); codeOf(err) != codes.PermissionDenied {
			t.Errorf("%s naming B with A's key: %v, want PermissionDenied", name, err)
		}
		res, err := do(as(consumerA), nsA)
		if err != nil {
			t.Errorf("%s of B's token in a request for A: %v, want per-token NOT_FOUND", name, err)
		} else if len(res) != 1 || res[0].GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND {
			t.Errorf("%s of B's token in a request for A: %v, want NOT_FOUND", name, res)
		}
	}
	// B's task is untouched: still delivered, same lease.
	got, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: nsB, Id: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	// (The store lease a live replica renews is at most the deadline the
	// subscriber was told; an extension by A's token would have moved it
	// past it.)
	if got.GetTask().GetState() != delaydv1.TaskState_TASK_STATE_DELIVERED || got.GetTask().GetLeaseDeadline().AsTime().After(deadline) {
		t.Errorf("B's task after A's attempts: state %v lease %v, want DELIVERED with lease at most %v",
			got.GetTask().GetState(), got.GetTask().GetLeaseDeadline().AsTime(), deadline)
	}
	// And B's own consumer still can ack it.
	ack, err := r.dlv.AckTasks(as(consumerB), &delaydv1.AckTasksRequest{Namespace: nsB, Tokens: []string{tokB}})
	if err != nil || ack.GetResults()[0].GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Errorf("B's consumer acking its own token: %v %v", ack, err)
	}
	cancel()
	for {
		if _, err := stream.Recv(); err != nil {
			if !errors.Is(err, io.EOF) && codeOf(err) != codes.Canceled {
				t.Logf("stream end: %v", err)
			}
			break
		}
	}
}

// TestBatchCannotWriteIntoAnotherNamespace: a batch for A whose item names
// B fails that item; B gets nothing.
func TestBatchCannotWriteIntoAnotherNamespace(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{})
	nsA := e.newNamespace(r, "bat-a-", nil)
	nsB := e.newNamespace(r, "bat-b-", nil)
	_, producerA := e.newKey(r, nsA, delaydv1.KeyScope_KEY_SCOPE_PRODUCE)
	resp, err := r.tasks.BatchUpsertTasks(as(producerA), &delaydv1.BatchUpsertTasksRequest{
		Namespace: nsA,
		Tasks: []*delaydv1.UpsertTaskRequest{
			{Namespace: nsB, Id: "sneak", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}},
		},
	})
	if err == nil && resp.GetResults()[0].GetError() == nil {
		t.Errorf("an item naming B inside A's batch was accepted: %v", resp)
	}
	if _, err := r.tasks.GetTask(admin(), &delaydv1.GetTaskRequest{Namespace: nsB, Id: "sneak"}); codeOf(err) != codes.NotFound {
		t.Errorf("B has the task A's batch named: %v", err)
	}
}

// With auto-create on (embedded mode, no auth), only calls that put a
// namespace to use (UpsertTask, BatchUpsertTasks, Subscribe) create it; a
// read, a verdict or an admin call naming a typo answers NotFound and
// leaves nothing behind.
func TestReadsNeverAutoCreate(t *testing.T) {
	t.Parallel()
	e := newTenEnv(t)
	r := e.replica(tenOpts{
		server:  func(o *server.Options) { o.Auth = guard.AuthOptions{Disabled: true} },
		tenancy: func(c *tenancy.Config) { c.AutoCreate = true },
	})
	ctx := context.Background()
	typo := "typo-" + testkit.Suffix()
	t.Cleanup(func() { e.drop(typo) })
	// A well-formed token (of another namespace) for the verdict calls.
	real := e.newNamespace(r, "real-", nil)
	if err := upsertAs(ctx, r, real, "a"); err != nil {
		t.Fatal(err)
	}
	d, cancel, err := firstDelivery(ctx, r, real)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	token := d.GetToken()
	reads := map[string]func() error{
		"GetNamespaceStats": func() error {
			_, err := r.admin.GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: typo})
			return err
		},
		"GetNamespace": func() error {
			_, err := r.admin.GetNamespace(ctx, &delaydv1.GetNamespaceRequest{Namespace: typo})
			return err
		},
		"ListDeadLetters": func() error {
			_, err := r.admin.ListDeadLetters(ctx, &delaydv1.ListDeadLettersRequest{Namespace: typo})
			return err
		},
		"RequeueDeadLetters": func() error {
			_, err := r.admin.RequeueDeadLetters(ctx, &delaydv1.RequeueDeadLettersRequest{Namespace: typo, All: true})
			return err
		},
		"PurgeDeadLetters": func() error {
			_, err := r.admin.PurgeDeadLetters(ctx, &delaydv1.PurgeDeadLettersRequest{Namespace: typo, All: true})
			return err
		},
		"NackTasks": func() error {
			_, err := r.dlv.NackTasks(ctx, &delaydv1.NackTasksRequest{Namespace: typo, Tokens: []string{token}})
			return err
		},
		"ExtendLease": func() error {
			_, err := r.dlv.ExtendLease(ctx, &delaydv1.ExtendLeaseRequest{Namespace: typo, Tokens: []string{token}})
			return err
		},
	}
	for name, call := range reads {
		if err := call(); codeOf(err) != codes.NotFound {
			t.Errorf("%s on an unknown namespace with auto-create on: %v, want NotFound", name, err)
		}
	}
	if _, err := e.store.GetNamespace(ctx, typo); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("after reads only, the registry has %q (err %v): a read auto-created it", typo, err)
	}
	// A write still creates it.
	if err := upsertAs(ctx, r, typo, "a"); err != nil {
		t.Fatalf("UpsertTask with auto-create on: %v", err)
	}
	if _, err := e.store.GetNamespace(ctx, typo); err != nil {
		t.Errorf("UpsertTask did not auto-create %q: %v", typo, err)
	}
}
