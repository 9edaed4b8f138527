package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// BenchmarkPushDrain measures how fast one replica pushes a backlog to a
// local endpoint that answers 204 at once: b.N tasks are upserted into a
// paused namespace, then the namespace is resumed and the clock runs until
// the endpoint has every task and the namespace is empty (every 2xx
// acked). It reports pushed tasks per second. docs/push.md quotes it:
//
//	go test -run '^$' -bench BenchmarkPushDrain -benchtime 5000x ./daemon/
func BenchmarkPushDrain(b *testing.B) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	d, err := Start(b.Context(), Config{Listen: "127.0.0.1:0", RedisURL: testRedisURL(), LogLevel: "warn", PushAllow: "127.0.0.1/32", PushAllowPorts: "1024-65535"},
		slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	}()
	conn, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	nsc, tasks := delaydv1.NewNamespaceServiceClient(conn), delaydv1.NewTaskServiceClient(conn)
	ns := "bench-push-" + suffix()
	if _, err := nsc.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{
		Paused: true, Push: &delaydv1.PushTarget{Url: srv.URL, Secret: "bench-secret-0123456789"},
	}}}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_, _ = nsc.DeleteNamespace(context.Background(), &delaydv1.DeleteNamespaceRequest{Namespace: ns, Force: true})
	}()
	for start := 0; start < b.N; start += 500 {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns}
		for i := start; i < min(start+500, b.N); i++ {
			req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{Id: "t" + strconv.Itoa(i), Payload: []byte(`{"order":42}`),
				When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}})
		}
		if _, err := tasks.BatchUpsertTasks(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	began := time.Now()
	if _, err := nsc.UpdateNamespace(ctx, &delaydv1.UpdateNamespaceRequest{
		Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{Paused: false}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy.paused"}},
	}); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st, err := nsc.GetNamespaceStats(ctx, &delaydv1.GetNamespaceStatsRequest{Namespace: ns})
		if err != nil {
			b.Fatal(err)
		}
		if got.Load() >= int64(b.N) && st.GetScheduled()+st.GetDelivered() == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after 5 minutes: pushed %d of %d, %d scheduled, %d delivered", got.Load(), b.N, st.GetScheduled(), st.GetDelivered())
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(began)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/took.Seconds(), "tasks/s")
	b.ReportMetric(float64(got.Load()-int64(b.N)), "duplicates")
}
