package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// TestMain fails the package when a goroutine outlives its tests: Stop must
// leave nothing behind.
func TestMain(m *testing.M) {
	testkit.Main(m,
		// After a failed dial go-redis retries in the background, sleeping
		// 1 s between tries; it exits on its next wake-up once the client
		// is closed (the Redis-down tests close theirs).
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	)
}

func testRedisURL() string { return testkit.RedisURL() }

// testRedisOpts are the test Redis's address and database.
func testRedisOpts(t testing.TB) *redis.Options {
	opt, err := redis.ParseURL(testRedisURL())
	if err != nil {
		t.Fatalf("TEST_REDIS_URL: %v", err)
	}
	return opt
}

func suffix() string { return testkit.Suffix() }

// syncBuffer is a log sink safe for the daemon's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// started is a daemon under test with a client connection and its log.
type started struct {
	d     *Daemon
	log   *syncBuffer
	conn  *grpc.ClientConn
	tasks delaydv1.TaskServiceClient
}

// start starts a daemon on 127.0.0.1:0 and stops it at the end of the test
// unless the test did.
func start(t *testing.T, cfg Config) *started {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := Start(t.Context(), cfg, logger)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	conn, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return &started{d: d, log: logs, conn: conn, tasks: delaydv1.NewTaskServiceClient(conn)}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func upsert(ns, id string) *delaydv1.UpsertTaskRequest {
	return &delaydv1.UpsertTaskRequest{Namespace: ns, Id: id, Payload: []byte("p"),
		When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Hour)}}
}

// cleanNamespace deletes every key of ns in the Redis at url when t ends
// (never FLUSHDB: Redis is shared): the test kit's cleanup, which also
// takes the namespace's API keys.
func cleanNamespace(t *testing.T, url, ns string) {
	t.Cleanup(func() { testkit.DeleteNamespaceKeys(t, url, ns) })
}

func TestEmbeddedModeServesUpsertAndGet(t *testing.T) {
	t.Parallel()
	s := start(t, Config{}) // no RedisURL: embedded
	ctx := ctxFor(t)
	if _, err := s.tasks.UpsertTask(ctx, upsert("demo", "t1")); err != nil {
		t.Fatal(err)
	}
	got, err := s.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: "demo", Id: "t1"})
	if err != nil || string(got.GetTask().GetPayload()) != "p" || got.GetTask().GetState() != delaydv1.TaskState_TASK_STATE_SCHEDULED {
		t.Fatalf("GetTask = %v, %v", got, err)
	}
	if n := strings.Count(s.log.String(), "NOTHING SURVIVES A RESTART"); n != 1 {
		t.Fatalf("embedded-mode warning logged %d times, want once:\n%s", n, s.log.String())
	}
	if !strings.Contains(s.log.String(), "level=WARN msg=\"embedded mode") {
		t.Fatalf("embedded-mode notice is not a WARN:\n%s", s.log.String())
	}
}

func TestRedisModeServesAndStopsCleanly(t *testing.T) {
	t.Parallel()
	ns := "dmn-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	s := start(t, Config{RedisURL: testRedisURL()})
	ctx := ctxFor(t)
	if _, err := s.tasks.UpsertTask(ctx, upsert(ns, "t1")); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.log.String(), "NOTHING SURVIVES") {
		t.Fatal("Redis mode logged the embedded-mode warning")
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.d.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !strings.Contains(s.log.String(), "delayd stopped cleanly") {
		t.Fatalf("no clean-shutdown log:\n%s", s.log.String())
	}
	if err := s.d.Stop(stopCtx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestStartFailsWhenRedisDoesNotAnswer(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	_, err := Start(t.Context(), Config{Listen: "127.0.0.1:0", RedisURL: "redis://127.0.0.1:" + port}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("Start against a closed port = %v, want a 'does not answer' error", err)
	}
}

// TestStartUndoesWhatItStartedWhenALaterPhaseFails makes Start's last phase
// fail (the ops address is taken): what the earlier phases started — the
// gRPC listener, the dispatcher, the Redis connections — is undone, so the
// gRPC port can be bound again and the daemon's Redis has no client left.
func TestStartUndoesWhatItStartedWhenALaterPhaseFails(t *testing.T) {
	t.Parallel()
	own := testkit.StartRedis(t)
	var lc net.ListenConfig
	taken, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	listen := "127.0.0.1:" + freePort(t)
	_, err = Start(t.Context(), Config{Listen: listen, RedisURL: own.URL, OpsListen: taken.Addr().String()}, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("Start with a taken --ops-listen address succeeded")
	}
	lis, err := lc.Listen(t.Context(), "tcp", listen)
	if err != nil {
		t.Fatalf("the gRPC listener of the failed Start is still bound: %v", err)
	}
	_ = lis.Close()
	c := redis.NewClient(&redis.Options{Addr: own.Addr})
	defer c.Close()
	// The server sees a closed connection a moment after the client closed it.
	testkit.Eventually(t, 10*time.Second, "the failed Start's Redis connections closed", func() bool {
		list, err := c.ClientList(t.Context()).Result()
		return err == nil && strings.Count(strings.TrimSpace(list), "\n") == 0
	})
}

func TestHealthNotServingOnceShutdownBegins(t *testing.T) {
	t.Parallel()
	s := start(t, Config{})
	health := healthpb.NewHealthClient(s.conn)
	watchCtx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	watch, err := health.Watch(watchCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", first, err)
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- s.d.Stop(ctx)
	}()
	if next, err := watch.Recv(); err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after Stop began = %v, %v; want NOT_SERVING", next, err)
	}
	cancel() // end the watch so the drain completes
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

func freePort(t *testing.T) string { return strconv.Itoa(testkit.FreePort(t)) }

// TestRedisDownAnswersUnavailable kills the daemon's Redis: every task RPC
// answers Unavailable with a message that is safe to show (no address, no
// driver text), and the daemon still shuts down.
func TestRedisDownAnswersUnavailable(t *testing.T) {
	t.Parallel()
	own := testkit.StartRedis(t)
	url := own.URL
	s := start(t, Config{RedisURL: url, StoreTimeout: 2 * time.Second})
	ctx := ctxFor(t)
	if _, err := s.tasks.UpsertTask(ctx, upsert("down", "t1")); err != nil {
		t.Fatalf("upsert while Redis is up: %v", err)
	}
	own.Kill()
	port := strings.TrimPrefix(url, "redis://127.0.0.1:")
	calls := map[string]func() error{
		"UpsertTask": func() error { _, err := s.tasks.UpsertTask(ctx, upsert("down", "t2")); return err },
		"BatchUpsertTasks": func() error {
			_, err := s.tasks.BatchUpsertTasks(ctx, &delaydv1.BatchUpsertTasksRequest{Namespace: "down", Tasks: []*delaydv1.UpsertTaskRequest{upsert("", "t3")}})
			return err
		},
		"GetTask": func() error {
			_, err := s.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: "down", Id: "t1"})
			return err
		},
		"RemoveTask": func() error {
			_, err := s.tasks.RemoveTask(ctx, &delaydv1.RemoveTaskRequest{Namespace: "down", Id: "t1"})
			return err
		},
		"ListTasks": func() error {
			_, err := s.tasks.ListTasks(ctx, &delaydv1.ListTasksRequest{Namespace: "down"})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || st.Message() != "store unavailable, safe to retry" {
			t.Errorf("%s with Redis down = %v %q, want Unavailable \"store unavailable, safe to retry\"", name, st.Code(), st.Message())
		}
		for _, raw := range []string{port, "dial", "refused", "redis", "EOF"} {
			if strings.Contains(st.Message(), raw) {
				t.Errorf("%s leaks store text %q: %q", name, raw, st.Message())
			}
		}
	}
}

// holdProxy forwards TCP to a Redis and can hold back any write from
// delayd that mentions a marker (a task id), so a gRPC call sits in
// flight, inside its handler, for as long as the test wants.
type holdProxy struct {
	lis    net.Listener
	target string
	db     int // the test Redis's database, kept in url()

	mu      sync.Mutex
	marker  []byte
	gate    chan struct{} // closed on release
	arrived chan struct{} // closed when a marked write is held

	wg sync.WaitGroup
}

func newHoldProxy(t *testing.T, target string) *holdProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{lis: lis, target: target, db: testRedisOpts(t).DB}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		p.release()
		_ = lis.Close()
		p.wg.Wait()
	})
	return p
}

func (p *holdProxy) url() string {
	return fmt.Sprintf("redis://%s/%d", p.lis.Addr(), p.db)
}

// hold makes writes containing marker wait until release; it returns a
// channel closed once such a write is being held.
func (p *holdProxy) hold(marker string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.gate, p.arrived = []byte(marker), make(chan struct{}), make(chan struct{})
	return p.arrived
}

func (p *holdProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate, p.marker = nil, nil
	}
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		conns = append(conns, c, up)
		p.wg.Add(2)
		go func() { // delayd -> Redis, through the gate
			defer p.wg.Done()
			defer up.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					p.wait(buf[:n])
					if _, werr := up.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // Redis -> delayd
			defer p.wg.Done()
			defer c.Close()
			_, _ = io.Copy(c, up)
		}()
	}
}

func (p *holdProxy) wait(chunk []byte) {
	p.mu.Lock()
	gate, arrived := p.gate, p.arrived
	held := gate != nil && bytes.Contains(chunk, p.marker)
	if held {
		select {
		case <-arrived:
		default:
			close(arrived)
		}
	}
	p.mu.Unlock()
	if held {
		<-gate
	}
}

// TestStopDrainsInFlightCall holds a GetTask inside its store call, begins
// Stop, waits until the listener is closed (the drain has begun), then lets
// the store answer: the call completes with its task and Stop is clean.
func TestStopDrainsInFlightCall(t *testing.T) {
	t.Parallel()
	ns := "dmn-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	proxy := newHoldProxy(t, testRedisOpts(t).Addr)
	s := start(t, Config{RedisURL: proxy.url()})
	ctx := ctxFor(t)
	id := "inflight-" + suffix()
	if _, err := s.tasks.UpsertTask(ctx, upsert(ns, id)); err != nil {
		t.Fatal(err)
	}

	arrived := proxy.hold(id)
	type result struct {
		resp *delaydv1.GetTaskResponse
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := s.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: id})
		got <- result{resp, err}
	}()
	<-arrived // the call is in its handler, waiting for Redis

	stopped := make(chan error, 1)
	go func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- s.d.Stop(stopCtx)
	}()
	waitListenerClosed(t, s.d.Addr())
	proxy.release()

	r := <-got
	if r.err != nil || r.resp.GetTask().GetId() != id {
		t.Fatalf("in-flight GetTask = %v, %v; want it to complete during the drain", r.resp, r.err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// waitListenerClosed waits until addr refuses connections: Stop has begun
// the gRPC drain.
func waitListenerClosed(t *testing.T, addr string) {
	t.Helper()
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		_ = c.Close()
		if i == 2000 {
			t.Fatal("the listener never closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunReturnsWithinShutdownTimeout holds a call in flight forever: Run,
// once its context ends, still returns (after ShutdownTimeout, with an
// error saying the drain was cut short) and the held call fails instead of
// hanging.
func TestRunReturnsWithinShutdownTimeout(t *testing.T) {
	t.Parallel()
	ns := "dmn-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	proxy := newHoldProxy(t, testRedisOpts(t).Addr)
	listen := "127.0.0.1:" + freePort(t)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), nil))

	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	ran := make(chan error, 1)
	go func() {
		ran <- Run(runCtx, Config{Listen: listen, RedisURL: proxy.url(), ShutdownTimeout: 500 * time.Millisecond}, logger)
	}()

	conn, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tasks := delaydv1.NewTaskServiceClient(conn)
	ctx := ctxFor(t)
	id := "stuck-" + suffix()
	// WaitForReady: the daemon may still be starting.
	if _, err := tasks.UpsertTask(ctx, upsert(ns, id), grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	arrived := proxy.hold(id)
	got := make(chan error, 1)
	go func() {
		_, err := tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: id})
		got <- err
	}()
	<-arrived

	cancelRun()
	err = <-ran
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want the drain cut short by ShutdownTimeout", err)
	}
	if code := status.Code(<-got); code != codes.Unavailable && code != codes.Canceled {
		t.Fatalf("held call ended with %v, want Unavailable (connection closed)", code)
	}
	if !strings.Contains(logs.String(), "graceful stop timed out") {
		t.Fatalf("no log of the cut-short drain:\n%s", logs.String())
	}
}

// TestAdminKeyTurnsAuthOn starts a daemon on the real Redis with an admin
// key: a call without a key is refused, the admin key works, and unknown
// namespaces are not created behind the admin's back.
func TestAdminKeyTurnsAuthOn(t *testing.T) {
	t.Parallel()
	const adminKey = "daemon-test-admin-key-0123456789"
	ns := "dmn-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: adminKey})
	ctx := ctxFor(t)

	_, err := s.tasks.UpsertTask(ctx, upsert(ns, "t1"))
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("upsert without a key = %v, want Unauthenticated", err)
	}
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+adminKey)
	_, err = s.tasks.UpsertTask(admin, upsert(ns, "t1"))
	if status.Code(err) != codes.NotFound {
		t.Fatalf("upsert into a namespace nobody created = %v, want NotFound", err)
	}
	if _, err := delaydv1.NewNamespaceServiceClient(s.conn).CreateNamespace(admin, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: ns}}); err != nil {
		t.Fatalf("CreateNamespace: %v", err)
	}
	if _, err := s.tasks.UpsertTask(admin, upsert(ns, "t1")); err != nil {
		t.Fatalf("upsert with the admin key: %v", err)
	}
	// Health stays open: probes carry no key.
	if resp, err := healthpb.NewHealthClient(s.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a key = %v, %v", resp, err)
	}
}

func TestBadAdminKeyRefusesToStart(t *testing.T) {
	t.Parallel()
	_, err := Start(t.Context(), Config{Listen: "127.0.0.1:0", AdminKey: "short"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "admin key") {
		t.Fatalf("Start with a 5-character admin key = %v, want a refusal naming the admin key", err)
	}
}

// TestStoreTimeoutBoundsHungRedis holds one call's Redis traffic forever:
// the call answers Unavailable once StoreTimeout has passed (the client's
// own deadline is much longer), so a hung Redis cannot hold requests.
func TestStoreTimeoutBoundsHungRedis(t *testing.T) {
	t.Parallel()
	ns := "dmn-" + suffix()
	cleanNamespace(t, testRedisURL(), ns)
	proxy := newHoldProxy(t, testRedisOpts(t).Addr)
	// The socket read timeout (30 s) is longer than the client's deadline
	// (10 s): only the store timeout (300 ms) can end the call in time.
	s := start(t, Config{RedisURL: proxy.url() + "?read_timeout=30s", StoreTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := "hung-" + suffix()
	if _, err := s.tasks.UpsertTask(ctx, upsert(ns, id)); err != nil {
		t.Fatal(err)
	}
	proxy.hold(id)
	_, err := s.tasks.GetTask(ctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: id})
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "store unavailable, safe to retry" {
		t.Fatalf("GetTask on a hung Redis = %v %q, want Unavailable", st.Code(), st.Message())
	}
	if ctx.Err() != nil {
		t.Fatal("the call ended only with the client's deadline")
	}
}
