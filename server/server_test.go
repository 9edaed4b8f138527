package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
)

// TestMain fails the package when a goroutine outlives its tests.
func TestMain(m *testing.M) {
	testkit.Main(m)
}

// listServices asks server reflection for the service names.
func reflectedServices(t *testing.T, e *tskEnv) ([]string, error) {
	t.Helper()
	stream, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(tskCtx(t))
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.CloseSend() }()
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"},
	}); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names, nil
}

func TestReflectionListsDelaydServices(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{reflection: true})
	names, err := reflectedServices(t, e)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append(server.ServiceNames(), "grpc.health.v1.Health") {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v; %s missing", names, want)
		}
	}
	if len(server.ServiceNames()) != 4 {
		t.Errorf("ServiceNames = %v, want the four delayd services", server.ServiceNames())
	}
}

func TestHealthServingThenNotServingOnShutdown(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	ctx := tskCtx(t)
	health := healthpb.NewHealthClient(e.conn)
	for _, svc := range append([]string{""}, server.ServiceNames()...) {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}

	// SetServing(false) is what the daemon does while starting or
	// rebuilding, and first thing on shutdown.
	e.server.SetServing(false)
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: server.ServiceNames()[0]})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after SetServing(false): %v, %v; want NOT_SERVING", resp, err)
	}
	e.server.SetServing(true)

	// GracefulStop reports NOT_SERVING to watchers before it drains.
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := health.Watch(watchCtx, &healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch first = %v, %v; want SERVING", first, err)
	}
	stopped := make(chan error, 1)
	go func() {
		stopCtx, stopCancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer stopCancel()
		stopped <- e.server.GracefulStop(stopCtx)
	}()
	next, err := watch.Recv()
	if err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after GracefulStop began = %v, %v; want NOT_SERVING", next, err)
	}
	cancel() // the watch is the last call the drain waits for
	if err := <-stopped; err != nil {
		t.Fatalf("GracefulStop: %v", err)
	}
	// SetServing after shutdown began changes nothing.
	e.server.SetServing(true)
}

func TestHealthNotServingUntilSetServing(t *testing.T) {
	t.Parallel()
	e := newTskEnv(t, tskOpts{})
	e.server.SetServing(false)
	resp, err := healthpb.NewHealthClient(e.conn).Check(tskCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Check = %v, %v; want NOT_SERVING", resp, err)
	}
	_, err = healthpb.NewHealthClient(e.conn).Check(tskCtx(t), &healthpb.HealthCheckRequest{Service: "no.such.Service"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("Check(unknown service) = %v, want NotFound", err)
	}
}
