package daemon

import (
	"context"
	"errors"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server"
)

// Issue 42 item 1: streams of the methods that need no key (health Watch,
// reflection) are bounded — per connection, per peer, in lifetime — and
// a connection whose only calls are such streams is idle for the per-peer
// share; a stream of a delayd service takes its key's slot at its headers.

// liveHeap is the live heap after a full collection, in bytes.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

const mib = 1 << 20

// dialGRPCFrom is a gRPC connection to addr from ip, closed when t ends.
func dialGRPCFrom(t *testing.T, from net.IP, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dialFrom(ctx, from, a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// openHealthWatch opens a health Watch on conn and waits for its first
// answer: nil once the stream holds (its first status came), or the
// status it was refused with.
func openHealthWatch(ctx context.Context, conn *grpc.ClientConn) (healthpb.Health_WatchClient, error) {
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, err
	}
	if _, err := w.Recv(); err != nil {
		return nil, err
	}
	return w, nil
}

// TestKeylessWatchFloodIsBounded: 60 connections from one address each try
// 1,000 health Watch streams with no key. At most the per-peer cap of them
// hold; the others are refused ResourceExhausted at once, naming the
// limit; the live heap grows by at most 10 MiB. Before, every one of the
// 60,000 held (one goroutine each: the prober measured +167 MiB).
// Not parallel: it measures the process's heap.
func TestKeylessWatchFloodIsBounded(t *testing.T) {
	needLoopbackPeers(t)
	const conns, perConn = 60, 1000
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clients := make([]*grpc.ClientConn, conns)
	for i := range clients {
		clients[i] = dialGRPCFrom(t, floodPeer, s.d.Addr())
		clients[i].Connect()
	}
	before := liveHeap()
	goBefore := runtime.NumGoroutine()

	var held, refused atomic.Int64
	var wrong sync.Map // an unexpected refusal, by code
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perConn {
				_, err := openHealthWatch(ctx, c)
				switch {
				case err == nil:
					held.Add(1)
				case status.Code(err) == codes.ResourceExhausted:
					refused.Add(1)
				default:
					wrong.Store(status.Code(err), err)
				}
			}
		}()
	}
	wg.Wait()
	growth := int64(liveHeap()) - int64(before)
	t.Logf("%d keyless Watch attempts: %d held, %d refused; live heap %+.1f MiB, goroutines %+d",
		conns*perConn, held.Load(), refused.Load(), float64(growth)/mib, runtime.NumGoroutine()-goBefore)
	wrong.Range(func(code, err any) bool {
		t.Errorf("a Watch attempt failed with %v; want it held or refused ResourceExhausted", err)
		return true
	})
	if n := held.Load(); n > server.DefaultMaxKeylessStreamsPerPeer {
		t.Errorf("%d keyless Watch streams held from one address; want at most the per-peer cap, %d", n, server.DefaultMaxKeylessStreamsPerPeer)
	}
	if growth > 10*mib {
		t.Errorf("the live heap grew by %.1f MiB with the flood's streams open; want at most 10 MiB", float64(growth)/mib)
	}
	octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
	defer ocancel()
	_, err := openHealthWatch(octx, clients[0])
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !containsAll(st.Message(), "--max-keyless-streams-per") {
		t.Errorf("a Watch over the caps: %v; want ResourceExhausted naming the flag", err)
	}
}

// TestKeylessStreamsCapPerConnection: one connection holds at most
// Limits.MaxKeylessStreamsPerConn streams that need no key, reflection's
// included; another connection of the same address gets its own.
func TestKeylessStreamsCapPerConnection(t *testing.T) {
	t.Parallel()
	needLoopbackPeers(t)
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error", Reflection: true,
		Limits: server.Limits{MaxKeylessStreamsPerConn: 2}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	one := dialGRPCFrom(t, politePeer, s.d.Addr())
	for i := range 2 {
		if _, err := openHealthWatch(ctx, one); err != nil {
			t.Fatalf("Watch %d of 2 on one connection: %v", i+1, err)
		}
	}
	_, err := openHealthWatch(ctx, one)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !containsAll(st.Message(), "--max-keyless-streams-per-conn", "2") {
		t.Errorf("a third Watch on one connection: %v; want ResourceExhausted naming --max-keyless-streams-per-conn", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	r, err := reflectionpb.NewServerReflectionClient(one).ServerReflectionInfo(rctx)
	if err == nil {
		_, err = r.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a reflection stream on the full connection: %v; want ResourceExhausted", err)
	}
	// Unary health checks are no streams: they still answer.
	if _, err := healthpb.NewHealthClient(one).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("Check on the full connection: %v", err)
	}
	two := dialGRPCFrom(t, politePeer, s.d.Addr())
	if _, err := openHealthWatch(ctx, two); err != nil {
		t.Errorf("a Watch on a second connection: %v", err)
	}
}

// TestKeylessStreamsEndAfterTheirLifetime: a health Watch and a reflection
// stream that the client keeps open end with Unavailable after
// Limits.KeylessStreamLifetime, and their slots are free again.
func TestKeylessStreamsEndAfterTheirLifetime(t *testing.T) {
	t.Parallel()
	const life = 300 * time.Millisecond
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error", Reflection: true,
		Limits: server.Limits{KeylessStreamLifetime: life, MaxKeylessStreamsPerConn: 2}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := openHealthWatch(ctx, s.conn)
	if err != nil {
		t.Fatal(err)
	}
	r, err := reflectionpb.NewServerReflectionClient(s.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Recv(); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	_, werr := w.Recv()
	_, rerr := r.Recv() // the client never closes its side: only the server ends it
	took := time.Since(opened)
	for name, err := range map[string]error{"health Watch": werr, "reflection": rerr} {
		if st := status.Convert(err); st.Code() != codes.Unavailable || !containsAll(st.Message(), "--keyless-stream-lifetime") {
			t.Errorf("%s kept open by its client ended with %v; want Unavailable naming --keyless-stream-lifetime", name, err)
		}
	}
	t.Logf("both ended %s after opening (lifetime %s)", took, life)
	// Their slots are free: two more fit on the connection.
	for i := range 2 {
		if _, err := openHealthWatch(ctx, s.conn); err != nil {
			t.Errorf("Watch %d after the lifetime freed the slots: %v", i+1, err)
		}
	}
}

// TestKeylessWatchesDoNotLockOutOtherAddresses: with --max-connections 200
// and one address holding all 200 with a health Watch each (per-peer cap
// raised so that each holds one), a client from another address gets in
// 15 times out of 15: a connection whose only calls need no key is idle
// for the per-peer share, so the flood's go first. Before, a connection
// with any call in progress counted as busy and the other address failed
// 15 of 15.
func TestKeylessWatchesDoNotLockOutOtherAddresses(t *testing.T) {
	t.Parallel()
	needLoopbackPeers(t)
	const capConns = 200
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error",
		Limits: server.Limits{MaxConnections: capConns, MaxKeylessStreamsPerPeer: 10 * capConns, CrowdedIdleTimeout: time.Hour}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range capConns {
		if _, err := openHealthWatch(ctx, dialGRPCFrom(t, floodPeer, s.d.Addr())); err != nil {
			t.Fatalf("the flood's Watch %d: %v", i+1, err)
		}
	}
	in := 0
	for range 15 {
		conn := dialGRPCFrom(t, callerPeer, s.d.Addr())
		cctx, ccancel := context.WithTimeout(asKey(ctx, guardAdminKey), 5*time.Second)
		_, err := delaydv1.NewNamespaceServiceClient(conn).WhoAmI(cctx, &delaydv1.WhoAmIRequest{}, grpc.WaitForReady(true))
		ccancel()
		_ = conn.Close()
		if err == nil {
			in++
		} else {
			t.Logf("a caller from another address: %v", err)
		}
	}
	if in != 15 {
		t.Errorf("a caller from another address got in %d times of 15 with the listener full of keyless Watch streams; want 15", in)
	}
}

// TestSilentStreamsTakeTheirKeySlot: StreamDeliveries streams that never
// send their first message hold their key's stream slot from their
// headers: past --max-streams-per-key they are refused at once. Before,
// the slot was taken at the first message, and one consume key held
// 20,000 such streams (+74 MiB).
func TestSilentStreamsTakeTheirKeySlot(t *testing.T) {
	t.Parallel()
	const perKey, tries = 10, 30
	s := start(t, Config{RedisURL: testRedisURL(), AdminKey: guardAdminKey, LogLevel: "error",
		Limits: server.Limits{MaxStreamsPerKey: perKey}})
	e := newGuardEnv(t, s, "silent-")
	_, secret := e.key(delaydv1.KeyScope_KEY_SCOPE_CONSUME)
	ctx, cancel := context.WithCancel(asKey(context.Background(), secret))
	defer cancel()
	ended := make(chan error, tries)
	for range tries {
		st, err := e.dlv.StreamDeliveries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := st.Recv()
			ended <- err
		}()
	}
	refused := 0
	for refused < tries-perKey {
		select {
		case err := <-ended:
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !containsAll(st.Message(), "--max-streams-per-key") {
				t.Fatalf("a silent stream ended with %v; want ResourceExhausted naming --max-streams-per-key", err)
			}
			refused++
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d silent streams of one key refused; want %d (the key holds %d)", refused, tries, tries-perKey, perKey)
		}
	}
	select {
	case err := <-ended:
		t.Fatalf("more silent streams ended than the key's cap leaves: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	cancel()
	for range perKey {
		if err := <-ended; !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
			t.Errorf("a held silent stream ended with %v when its client cancelled; want Canceled", err)
		}
	}
}

// containsAll reports whether s holds every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
