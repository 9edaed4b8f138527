package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// The fault suite runs real delayd processes (this binary) over private
// redis-servers, does to them what production does (SIGKILL, ...), and
// counts what the subscribers saw: every accepted task delivered (0 lost),
// none before its due time (0 early), duplicates only where README
// "Delivery guarantees" says they can happen.

// replica is one delayd process.
type replica struct {
	t      *testing.T
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has exited
	addr   string
	conn   *grpc.ClientConn
	log    string // the process's log file
}

// servingAddr is the gRPC address in delayd's "delayd serving" log line.
var servingAddr = regexp.MustCompile(`msg="delayd serving" addr=(\S+)`)

// startReplica runs the delayd binary on a loopback port of its own with
// args (and no DELAYD_* from the caller's environment), waits until its
// health service answers SERVING, and kills it when the test ends; the test
// fails if the process reported a data race. The port is the one delayd got
// from the kernel (--listen 127.0.0.1:0), read from its log: a port chosen
// free beforehand could be taken by another process of the parallel tests
// before delayd binds it (it happened: a replica then talked to another
// test's delayd).
func startReplica(t *testing.T, bin string, args ...string) *replica {
	t.Helper()
	// Free ports each: replicas on one host must not contend for :9070.
	cmd := exec.Command(bin, append([]string{"--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0", "--log-format", "text"}, args...)...)
	for _, kv := range os.Environ() {
		if len(kv) < 7 || kv[:7] != "DELAYD_" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "delayd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{t: t, cmd: cmd, exited: make(chan struct{}), log: logf.Name()}
	go func() { _ = cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		r.kill()
		logf.Close()
		out, _ := os.ReadFile(logf.Name())
		if bytes.Contains(out, []byte("WARNING: DATA RACE")) { // a -race build (buildBinary)
			t.Errorf("delayd %s reported a data race", r.addr)
		}
		if t.Failed() {
			t.Logf("delayd %s (pid %d) log:\n%s", r.addr, cmd.Process.Pid, out)
		}
	})
	testkit.Eventually(t, 60*time.Second, "delayd to log its address", func() bool {
		select {
		case <-r.exited:
			out, _ := os.ReadFile(logf.Name())
			t.Fatalf("delayd exited before serving:\n%s", out)
		default:
		}
		out, _ := os.ReadFile(logf.Name())
		if m := servingAddr.FindSubmatch(out); m != nil {
			r.addr = string(m[1])
		}
		return r.addr != ""
	})
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.conn = conn
	testkit.Eventually(t, 60*time.Second, "delayd "+r.addr+" SERVING", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	return r
}

// kill sends SIGKILL and waits for the process; safe to call twice.
func (r *replica) kill() {
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
}

// tally counts what subscribers saw, per task id.
type tally struct {
	mu        sync.Mutex
	due       map[string]time.Time // accepted upserts: id -> due time
	delivered map[string]int
	acked     map[string]bool
	early     []string
	last      time.Time // when the last first-time ack happened
	// arrivals are every delivery's due and receive times, in order.
	arrivals []arrival
	// resubscribed counts streams that ended UNAVAILABLE and were
	// subscribed again (consume).
	resubscribed int
	// acking counts, per id, ack calls sent and not answered yet.
	acking map[string]int
}

// arrival is one delivery as the subscriber saw it.
type arrival struct {
	due, at time.Time
	id      string
	attempt int32
}

// newTally returns an empty tally; if t fails, it logs which accepted
// tasks were never acked and how often each was delivered.
func newTally(t *testing.T) *tally {
	ty := &tally{due: map[string]time.Time{}, delivered: map[string]int{}, acked: map[string]bool{}, acking: map[string]int{}}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ty.mu.Lock()
		defer ty.mu.Unlock()
		var unacked []string
		for id := range ty.due {
			if !ty.acked[id] {
				unacked = append(unacked, fmt.Sprintf("%s (delivered %d times, %d acks unanswered)", id, ty.delivered[id], ty.acking[id]))
			}
		}
		sort.Strings(unacked)
		t.Logf("tally: %d accepted, %d acked, %d never acked: %v", len(ty.due), len(ty.acked), len(unacked), unacked[:min(len(unacked), 50)])
	})
	return ty
}

// received records a delivery at time now.
func (ty *tally) received(d *delaydv1.Delivery, now time.Time) {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	id := d.GetTask().GetId()
	ty.delivered[id]++
	ty.arrivals = append(ty.arrivals, arrival{due: d.GetTask().GetDueTime().AsTime(), at: now, id: id, attempt: d.GetTask().GetAttempt()})
	if due := d.GetTask().GetDueTime().AsTime(); now.Before(due) {
		ty.early = append(ty.early, fmt.Sprintf("%s %v early", id, due.Sub(now)))
	}
}

func (ty *tally) ackedIDs(ids []string) {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	for _, id := range ids {
		if !ty.acked[id] {
			ty.acked[id] = true
			ty.last = time.Now()
		}
	}
}

// counts returns accepted, lost (accepted, never acked), duplicates
// (deliveries beyond the first) and early deliveries.
func (ty *tally) counts() (accepted, lost, dups, early int) {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	for id := range ty.due {
		if !ty.acked[id] {
			lost++
		}
	}
	for _, n := range ty.delivered {
		dups += n - 1
	}
	return len(ty.due), lost, dups, len(ty.early)
}

// ackRetrying acks one delivery as a client does: it retries while the
// call answers UNAVAILABLE or runs out of its deadline (a loaded MySQL may
// answer an ack late: the store timeout is 2 s in some tests), for up to a
// minute or until ctx ends. It reports whether the delivery is settled: OK,
// or NOT_FOUND after such a retry (the failed attempt may have deleted the
// task before its answer was lost).
//
// Each retry goes to the next of dc and others, as a client behind a load
// balancer moves to another replica: a replica SIGKILLed after the store
// applied an ack but before its answer left would otherwise be retried
// for a minute on a dead connection, and the task — acked, so rightly
// never delivered again — would be tallied as lost (the cause of
// TestFaultReplicaSIGKILLMidStream's rare "never re-delivered" failure
// under load, when A's subscriber was mid-ack at the kill).
func ackRetrying(ctx context.Context, dc delaydv1.DeliveryServiceClient, ns, token string, others ...delaydv1.DeliveryServiceClient) bool {
	giveUp := time.Now().Add(time.Minute)
	retried := false
	via := append([]delaydv1.DeliveryServiceClient{dc}, others...)
	for try := 0; ; try++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := via[try%len(via)].AckTasks(actx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: []string{token}})
		cancel()
		if err == nil {
			st := res.GetResults()[0].GetStatus()
			return st == delaydv1.TokenStatus_TOKEN_STATUS_OK || (retried && st == delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND)
		}
		if c := status.Code(err); (c != codes.Unavailable && c != codes.DeadlineExceeded) || ctx.Err() != nil || time.Now().After(giveUp) {
			return false
		}
		retried = true
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// consume subscribes to ns on conn and acks each delivery after hold (0:
// at once) until ctx ends; it returns how many deliveries it holds unacked.
// When the stream ends with UNAVAILABLE (the store or the replica down, or
// too slow to create the namespace on a loaded machine) it subscribes
// again, as a client does. An ack that fails UNAVAILABLE is retried through
// ackVia (other replicas), if any.
func consume(ctx context.Context, t *testing.T, conn *grpc.ClientConn, ns string, hold time.Duration, ty *tally, ackVia ...*grpc.ClientConn) func() int {
	var mu sync.Mutex
	pending := 0
	dc := delaydv1.NewDeliveryServiceClient(conn)
	var others []delaydv1.DeliveryServiceClient
	for _, c := range ackVia {
		others = append(others, delaydv1.NewDeliveryServiceClient(c))
	}
	req := &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 100}
	stream, err := dc.Subscribe(ctx, req)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	receive := func(stream grpc.ServerStreamingClient[delaydv1.SubscribeResponse]) error {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return err
			}
			d := resp.GetDelivery()
			ty.received(d, time.Now())
			mu.Lock()
			pending++
			mu.Unlock()
			go func() {
				select {
				case <-time.After(hold):
				case <-ctx.Done():
					return
				}
				id := d.GetTask().GetId()
				ty.mu.Lock()
				ty.acking[id]++
				ty.mu.Unlock()
				ok := ackRetrying(ctx, dc, ns, d.GetToken(), others...)
				ty.mu.Lock()
				ty.acking[id]--
				ty.mu.Unlock()
				if ok {
					ty.ackedIDs([]string{id})
				}
				mu.Lock()
				pending--
				mu.Unlock()
			}()
		}
	}
	go func() {
		for {
			err := receive(stream)
			if ctx.Err() != nil || status.Code(err) != codes.Unavailable {
				return
			}
			ty.mu.Lock()
			ty.resubscribed++
			ty.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			if stream, err = dc.Subscribe(ctx, req); err != nil {
				return
			}
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return pending }
}

// retryUnavailable calls f, with a 10 s deadline per attempt, until it
// succeeds, retrying as a client does while it answers UNAVAILABLE or runs
// out of its deadline (the calls it is used for are idempotent upserts; on
// a loaded machine a store may answer late before any fault is injected).
// It fails t after a minute or on any other error.
func retryUnavailable(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	giveUp := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		if c := status.Code(err); (c != codes.Unavailable && c != codes.DeadlineExceeded) || time.Now().After(giveUp) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// upsertAll upserts n tasks of ns due spread over the next second, through
// conn, retrying each until it is accepted; it records the accepted ones.
func upsertAll(t *testing.T, conn *grpc.ClientConn, ns string, n int, ty *tally) {
	t.Helper()
	tc := delaydv1.NewTaskServiceClient(conn)
	start := time.Now().Add(500 * time.Millisecond)
	for i := range n {
		id := fmt.Sprintf("task-%04d", i)
		due := start.Add(time.Duration(i) * time.Second / time.Duration(n)).Truncate(time.Millisecond)
		req := &delaydv1.UpsertTaskRequest{Namespace: ns, Id: id, Payload: []byte("p"),
			When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(due)}}
		retryUnavailable(t, "upsert "+id, func(ctx context.Context) error {
			_, err := tc.UpsertTask(ctx, req)
			return err
		})
		ty.mu.Lock()
		ty.due[id] = due
		ty.mu.Unlock()
	}
}

// twoReplicas starts replicas A and B of delayd (Redis-only, no auth) on
// a private redis-server, with a tally for ns that, when the test fails,
// logs where each task it never saw acked is in Redis.
func twoReplicas(t *testing.T, ns string) (a, b *replica, ty *tally) {
	t.Helper()
	bin := buildBinary(t)
	rs := testkit.StartRedis(t)
	args := []string{"--redis-url", rs.URL, "--no-auth"}
	a, b = startReplica(t, bin, args...), startReplica(t, bin, args...)
	ty = newTally(t)
	t.Cleanup(func() {
		if t.Failed() {
			logStoreState(t, rs, ns, ty)
		}
	})
	return a, b, ty
}

// TestFaultReplicaSIGKILLMidStream: two replicas serve one namespace; the
// subscriber of replica A works 2 s per task. A is SIGKILLed while it holds
// deliveries its subscriber has not acked. Every task is still delivered
// and acked (0 lost, 0 early); the duplicates are at most the deliveries A
// had sent and not acked; and A's deliveries come back long before their
// 30 s ack timeout, because A's lease renewals stopped with it (issue 10
// items 4 and 7).
func TestFaultReplicaSIGKILLMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	ns := "fault-kill"
	a, b, ty := twoReplicas(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := consume(ctx, t, a.conn, ns, 2*time.Second, ty, b.conn) // slow: holds what it gets; acks move to B when A dies
	consume(ctx, t, b.conn, ns, 0, ty)
	const n = 300
	upsertAll(t, b.conn, ns, n, ty)
	testkit.Eventually(t, 30*time.Second, "replica A's subscriber to hold deliveries", func() bool { return held() >= 10 })
	inFlight := held()
	killed := time.Now()
	a.kill()
	testkit.Eventually(t, 25*time.Second, "every task acked (25 s < the 30 s ack timeout)", func() bool {
		_, lost, _, _ := ty.counts()
		return lost == 0
	})
	accepted, lost, dups, early := ty.counts()
	ty.mu.Lock()
	took := ty.last.Sub(killed)
	ty.mu.Unlock()
	t.Logf("accepted %d, lost %d, duplicates %d (A held %d unacked at the kill), early %d; last ack %v after the kill",
		accepted, lost, dups, inFlight, early, took.Round(100*time.Millisecond))
	if lost != 0 || early != 0 {
		t.Fatalf("lost %d, early %d (%v); want 0 and 0", lost, early, ty.early)
	}
	if dups > inFlight+100 { // A's stream may have had up to max_in_flight more in its buffers
		t.Fatalf("%d duplicates; want at most what A had sent and not acked (%d, plus its stream's buffer)", dups, inFlight)
	}
}

// TestFaultReplicaSIGKILLWhileAcking: replica A is SIGKILLed while its
// subscriber's acks are in flight (each delivery acked 300 ms after it
// came). An ack the store applied whose answer died with A must count as
// settled when the client retries it through B (NOT_FOUND after a retry),
// and every task not acked must come back through B: 0 lost, 0 early.
// Before acks moved to another replica, 2 of 300 such tasks were tallied
// lost although Redis had deleted them as acked (the reviewer's
// experiment), which is how TestFaultReplicaSIGKILLMidStream flaked.
func TestFaultReplicaSIGKILLWhileAcking(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	ns := "fault-kill-acking"
	a, b, ty := twoReplicas(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consume(ctx, t, a.conn, ns, 300*time.Millisecond, ty, b.conn)
	consume(ctx, t, b.conn, ns, 0, ty)
	const n = 300
	upsertAll(t, b.conn, ns, n, ty)
	testkit.Eventually(t, 30*time.Second, "acks flowing on both replicas", func() bool {
		ty.mu.Lock()
		defer ty.mu.Unlock()
		inFlight := 0
		for _, k := range ty.acking {
			inFlight += k
		}
		return len(ty.acked) >= 20 && inFlight > 0
	})
	a.kill()
	testkit.Eventually(t, 25*time.Second, "every task acked (25 s < the 30 s ack timeout)", func() bool {
		_, lost, _, _ := ty.counts()
		return lost == 0
	})
	accepted, lost, dups, early := ty.counts()
	t.Logf("accepted %d, lost %d, duplicates %d, early %d", accepted, lost, dups, early)
	if lost != 0 || early != 0 {
		t.Fatalf("lost %d, early %d (%v); want 0 and 0", lost, early, ty.early)
	}
}

// logStoreState logs where each accepted task that the tally never saw
// acked is in Redis (one shard): its due and inflight scores and header,
// or that it is gone.
func logStoreState(t *testing.T, rs *testkit.RedisServer, ns string, ty *tally) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := rs.Client()
	now, _ := c.Time(ctx).Result()
	ty.mu.Lock()
	defer ty.mu.Unlock()
	tag := "delayd:{" + ns + "#0}:"
	for id := range ty.due {
		if ty.acked[id] {
			continue
		}
		due, derr := c.ZScore(ctx, tag+"due", id).Result()
		inf, ierr := c.ZScore(ctx, tag+"inflight", id).Result()
		h, herr := c.HGet(ctx, tag+"meta", id).Result()
		t.Logf("store: %s at Redis time %d ms: due %v (%v), inflight %v (%v), meta %q (%v)", id, now.UnixMilli(), int64(due), derr, int64(inf), ierr, h, herr)
	}
}

// TestFaultRedisLossDurable: in durable mode Redis loses everything while
// tasks are due and being delivered — SIGKILL and a restart without
// persistence, or FLUSHALL. Every accepted task is still delivered and
// acked (0 lost, 0 early): the index is rebuilt from MySQL. Duplicates are
// allowed here (README: deliveries in flight at the loss are made again).
func TestFaultRedisLossDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, rs *testkit.RedisServer)
	}{
		{"sigkill-restart", func(_ *testing.T, rs *testkit.RedisServer) { rs.Restart() }},
		{"flushall", func(t *testing.T, rs *testkit.RedisServer) {
			if err := rs.Client().FlushAll(context.Background()).Err(); err != nil {
				t.Errorf("FLUSHALL: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs := testkit.StartRedis(t)
			r := startReplica(t, bin, "--redis-url", rs.URL, "--no-auth", "--mysql-dsn", testkit.Database(t, "delayd_fault"),
				"--reconcile-interval", "2s")
			ns := "fault-" + tc.name
			ty := newTally(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			consume(ctx, t, r.conn, ns, 0, ty)
			const n = 300
			upsertRange(t, r.conn, ns, 0, n, 500*time.Millisecond, ty) // one call: 300 durable upserts one by one take 45 s at load 15
			testkit.Eventually(t, 30*time.Second, "a third of the tasks acked", func() bool {
				ty.mu.Lock()
				defer ty.mu.Unlock()
				return len(ty.acked) >= n/3
			})
			tc.lose(t, rs)
			// The stream may have ended with Redis; subscribe again, as a
			// client does.
			consume(ctx, t, r.conn, ns, 0, ty)
			testkit.Eventually(t, 90*time.Second, "every task acked after the loss", func() bool {
				_, lost, _, _ := ty.counts()
				return lost == 0
			})
			accepted, lost, dups, early := ty.counts()
			t.Logf("accepted %d, lost %d, duplicates %d, early %d", accepted, lost, dups, early)
			if lost != 0 || early != 0 {
				t.Fatalf("lost %d, early %d (%v); want 0 and 0", lost, early, ty.early)
			}
		})
	}
}

// TestFaultRedisSIGSTOP: Redis hangs (SIGSTOP) under a running delayd. The
// first call waits out the store timeout; the following ones answer
// UNAVAILABLE at once instead of each holding its caller for the whole
// timeout; after SIGCONT everything accepted before is delivered (0 lost,
// 0 early) (issue 10 items 5 and 7).
func TestFaultRedisSIGSTOP(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	rs := testkit.StartRedis(t)
	r := startReplica(t, bin, "--redis-url", rs.URL, "--no-auth", "--store-timeout", "2s")
	ns := "fault-sigstop"
	ty := newTally(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consume(ctx, t, r.conn, ns, 0, ty)
	upsertAll(t, r.conn, ns, 100, ty)
	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	tc := delaydv1.NewTaskServiceClient(r.conn)
	call := func() (time.Duration, error) {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		_, err := tc.GetTask(cctx, &delaydv1.GetTaskRequest{Namespace: ns, Id: "task-0000"})
		return time.Since(start), err
	}
	first, err := call()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("GetTask with Redis stopped: %v, want Unavailable", err)
	}
	var slowest time.Duration
	for range 5 {
		d, err := call()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("GetTask with Redis known down: %v, want Unavailable", err)
		}
		slowest = max(slowest, d)
	}
	t.Logf("first call %v; slowest of the next five %v", first.Round(time.Millisecond), slowest.Round(time.Millisecond))
	if slowest*4 > first {
		t.Fatalf("calls with Redis known down took up to %v (the first %v): want them to fail fast", slowest, first)
	}
	rs.Resume()
	paused = false
	testkit.Eventually(t, 60*time.Second, "every task acked after SIGCONT", func() bool {
		_, lost, _, _ := ty.counts()
		return lost == 0
	})
	accepted, lost, dups, early := ty.counts()
	t.Logf("accepted %d, lost %d, duplicates %d, early %d", accepted, lost, dups, early)
	if lost != 0 || early != 0 {
		t.Fatalf("lost %d, early %d (%v); want 0 and 0", lost, early, ty.early)
	}
}

// TestFaultDelaydSIGKILLDuringWrites: a producer upserts through replica A
// and, when a call fails (A is SIGKILLed mid-way), retries it through
// replica B, as a client behind a load balancer does. Every task is then
// delivered and acked (0 lost, 0 early): a write A answered is in Redis, a
// write A did not answer is retried, and an upsert is idempotent.
func TestFaultDelaydSIGKILLDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	rs := testkit.StartRedis(t)
	args := []string{"--redis-url", rs.URL, "--no-auth"}
	a, b := startReplica(t, bin, args...), startReplica(t, bin, args...)
	ns := "fault-writes"
	ty := newTally(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consume(ctx, t, b.conn, ns, 0, ty)
	const n = 400
	ta, tb := delaydv1.NewTaskServiceClient(a.conn), delaydv1.NewTaskServiceClient(b.conn)
	start := time.Now().Add(time.Second)
	retried := 0
	for i := range n {
		if i == n/2 {
			go a.kill() // mid-way, while calls are in flight
		}
		id := fmt.Sprintf("task-%04d", i)
		due := start.Add(time.Duration(i) * 2 * time.Millisecond).Truncate(time.Millisecond)
		req := &delaydv1.UpsertTaskRequest{Namespace: ns, Id: id, Payload: []byte("p"),
			When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(due)}}
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := ta.UpsertTask(cctx, req)
		ccancel()
		if err != nil {
			retried++
			retryUnavailable(t, "upsert "+id+" through B", func(ctx context.Context) error {
				_, err := tb.UpsertTask(ctx, req)
				return err
			})
		}
		ty.mu.Lock()
		ty.due[id] = due
		ty.mu.Unlock()
	}
	testkit.Eventually(t, 60*time.Second, "every task acked", func() bool {
		_, lost, _, _ := ty.counts()
		return lost == 0
	})
	accepted, lost, dups, early := ty.counts()
	t.Logf("accepted %d (%d retried through B after A died), lost %d, duplicates %d, early %d", accepted, retried, lost, dups, early)
	if retried == 0 {
		t.Fatal("no upsert failed over to B: the kill did not happen mid-way")
	}
	if lost != 0 || early != 0 || dups != 0 {
		t.Fatalf("lost %d, early %d (%v), duplicates %d; want 0, 0, 0", lost, early, ty.early, dups)
	}
}

// writeLoad upserts unique tasks due due after each call, from writers
// goroutines through conn, each call with a deadline of deadline, until
// stop is closed. Accepted tasks go into ty; ok counts them; slow records
// calls that ran out of their deadline or failed.
type writeLoad struct {
	ok       atomic.Int64
	failed   atomic.Int64
	mu       sync.Mutex
	codes    map[codes.Code]int
	slowest  time.Duration
	stop     chan struct{}
	finished sync.WaitGroup
}

func startWriteLoad(t *testing.T, conn *grpc.ClientConn, ns string, writers int, deadline, due time.Duration, ty *tally) *writeLoad {
	w := &writeLoad{codes: map[codes.Code]int{}, stop: make(chan struct{})}
	tc := delaydv1.NewTaskServiceClient(conn)
	var seq atomic.Int64
	for range writers {
		w.finished.Add(1)
		go func() {
			defer w.finished.Done()
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				id := fmt.Sprintf("w-%06d", seq.Add(1))
				at := time.Now().Add(due).Truncate(time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				_, err := tc.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: id, Payload: []byte("p"),
					When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(at)}})
				took := time.Since(start)
				cancel()
				w.mu.Lock()
				w.slowest = max(w.slowest, took)
				if err != nil {
					w.codes[status.Code(err)]++
				}
				w.mu.Unlock()
				if err != nil {
					w.failed.Add(1)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				ty.mu.Lock()
				ty.due[id] = at
				ty.mu.Unlock()
				w.ok.Add(1)
			}
		}()
	}
	t.Cleanup(w.end)
	return w
}

// end stops the writers and waits for them; safe to call twice.
func (w *writeLoad) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.finished.Wait()
}

// window counts the accepted writes over d.
func (w *writeLoad) window(d time.Duration) int64 {
	before := w.ok.Load()
	time.Sleep(d)
	return w.ok.Load() - before
}

// reset clears the failure counters and the slowest call.
func (w *writeLoad) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.codes, w.slowest = map[codes.Code]int{}, 0
	w.failed.Store(0)
}

// TestFaultRedisSIGSTOPDurable (issue 10 item 5): in durable mode Redis
// hangs (SIGSTOP) under a steady write load whose calls have an 8 s
// deadline, shorter than the 10 s store timeout (and long enough that a
// loaded test machine does not miss it for reasons of its own: at load 15
// some writes took over 3 s, the deadline this test had). MySQL keeps committing and
// the writers keep being answered: the writes accepted in a window while
// Redis is stopped are at least a tenth of those in a window before
// (before the fix the committers waited for each index write, so commits
// nearly stopped and callers saw DEADLINE_EXCEEDED), and no call fails.
// After SIGCONT every accepted task is delivered (0 lost, 0 early): the
// index writes that failed are repaired from MySQL.
func TestFaultRedisSIGSTOPDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	rs := testkit.StartRedis(t)
	r := startReplica(t, bin, "--redis-url", rs.URL, "--no-auth", "--mysql-dsn", testkit.Database(t, "delayd_fault"),
		"--reconcile-interval", "2s", "--store-timeout", "10s")
	ns := "fault-sigstop-durable"
	// With a pending-task quota, so the quota's count (read from the Redis
	// index) is on every write's path too.
	retryUnavailable(t, "create namespace", func(ctx context.Context) error {
		_, err := delaydv1.NewNamespaceServiceClient(r.conn).CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{
			Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{MaxPendingTasks: 1_000_000}}})
		if status.Code(err) == codes.AlreadyExists { // an attempt that ran out of its deadline created it
			return nil
		}
		return err
	})
	ty := newTally(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consume(ctx, t, r.conn, ns, 0, ty)
	w := startWriteLoad(t, r.conn, ns, 8, 8*time.Second, 3*time.Second, ty)
	w.window(2 * time.Second) // warm up
	w.reset()
	before := w.window(4 * time.Second)
	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	during := w.window(4 * time.Second)
	w.mu.Lock()
	failedCodes, slowest := maps.Clone(w.codes), w.slowest
	failed := w.failed.Load()
	w.mu.Unlock()
	rs.Resume()
	paused = false
	w.end()
	t.Logf("accepted writes: %d in 4 s before the SIGSTOP, %d in 4 s while stopped (ratio %.2f); failed calls %d %v; slowest call %v",
		before, during, float64(during)/float64(max(before, 1)), failed, failedCodes, slowest.Round(time.Millisecond))
	if before == 0 {
		t.Fatal("no write accepted before the SIGSTOP")
	}
	// The call deadline (8 s, under the 10 s store timeout) is what catches
	// a hung index holding writes: such calls fail. The rate is only a
	// coarse check, since the machine's other load may change between
	// the two windows (the whole suite runs beside this test): before the
	// fix commits all but stopped (about 4 batches per 5 s).
	if during*10 < before {
		t.Errorf("writes while Redis was stopped: %d in 4 s, less than a tenth of the %d before: the index holds MySQL commits back", during, before)
	}
	if failed != 0 {
		t.Errorf("%d writes failed while Redis was stopped (%v): a hung index must not fail or hold durable writes", failed, failedCodes)
	}
	testkit.Eventually(t, 120*time.Second, "every accepted task acked after SIGCONT", func() bool {
		_, lost, _, _ := ty.counts()
		return lost == 0
	})
	accepted, lost, dups, early := ty.counts()
	t.Logf("accepted %d, lost %d, duplicates %d, early %d", accepted, lost, dups, early)
	if lost != 0 || early != 0 {
		t.Fatalf("lost %d, early %d (%v); want 0 and 0", lost, early, ty.early)
	}
}

// mysqlViaProxy returns a database of the test's own and its DSN through a
// TCP proxy the test can cut.
func mysqlViaProxy(t *testing.T) (direct, viaProxy string, p *testkit.Proxy) {
	t.Helper()
	direct = testkit.Database(t, "delayd_fault")
	cfg, err := mysql.ParseDSN(direct)
	if err != nil {
		t.Fatal(err)
	}
	p = testkit.NewProxy(t, cfg.Addr)
	cfg.Addr = p.Addr()
	return direct, cfg.FormatDSN(), p
}

// ackBatches acks tokens in calls of 10, all at once, and returns each
// token's status (TOKEN_STATUS_UNSPECIFIED where its call failed) and each
// failed call's code.
func ackBatches(dc delaydv1.DeliveryServiceClient, ns string, tokens []string) ([]delaydv1.TokenStatus, []codes.Code) {
	out := make([]delaydv1.TokenStatus, len(tokens))
	var mu sync.Mutex
	var failed []codes.Code
	var wg sync.WaitGroup
	for lo := 0; lo < len(tokens); lo += 10 {
		hi := min(lo+10, len(tokens))
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := dc.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: tokens[lo:hi]})
			if err != nil {
				mu.Lock()
				failed = append(failed, status.Code(err))
				mu.Unlock()
				return
			}
			for i, r := range res.GetResults() {
				out[lo+i] = r.GetStatus()
			}
		})
	}
	wg.Wait()
	return out, failed
}

// TestFaultMySQLCutDurable (issue 10 items 3 and 7): in durable mode the
// connections to MySQL are cut (a proxy closes them and refuses new ones),
// or held (kept open, no byte passes: a hung MySQL), while a subscriber
// holds 100 deliveries. Upserts then answer
// UNAVAILABLE (not accepted), and so do the acks of the held deliveries:
// their MySQL delete failed. After MySQL is back the same acks, retried,
// answer OK (or NOT_FOUND if the reconciler settled them first: the task
// is gone either way), and however many reconciler passes run, none of
// those tasks is delivered again: 0 lost, 0 early, 0 duplicates. Before
// the ack markers, the retry answered NOT_FOUND and the reconciler brought
// the tasks back (1,050 duplicates of 10,000 in the review's run).
func TestFaultMySQLCutDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, mode := range []struct {
		name string
		fail func(p *testkit.Proxy)
	}{
		{"cut", (*testkit.Proxy).Cut},   // connections closed, new ones refused
		{"hold", (*testkit.Proxy).Hold}, // connections open, no byte passes (a hung MySQL)
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			rs := testkit.StartRedis(t)
			_, viaProxy, p := mysqlViaProxy(t)
			r := startReplica(t, bin, "--redis-url", rs.URL, "--no-auth", "--mysql-dsn", viaProxy,
				"--reconcile-interval", "1s", "--store-timeout", "2s")
			ns := "fault-mysql-" + mode.name
			// Leases of 10 minutes: the test holds 100 deliveries from
			// the upserts to the retried acks, which on a loaded machine
			// can take longer than the default 30 s ack timeout; a lease
			// that ran out would bring a task back for reasons this test
			// is not about.
			retryUnavailable(t, "create namespace", func(ctx context.Context) error {
				_, err := delaydv1.NewNamespaceServiceClient(r.conn).CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{
					Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{AckTimeout: durationpb.New(10 * time.Minute)}}})
				if status.Code(err) == codes.AlreadyExists { // an attempt that ran out of its deadline created it
					return nil
				}
				return err
			})
			ty := newTally(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dc := delaydv1.NewDeliveryServiceClient(r.conn)
			sub := &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 100}
			stream, err := dc.Subscribe(ctx, sub)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *delaydv1.Delivery, 10000)
			go func() {
				for {
					resp, err := stream.Recv()
					if err == nil {
						ty.received(resp.GetDelivery(), time.Now())
						got <- resp.GetDelivery()
						continue
					}
					// UNAVAILABLE: subscribe again, as a client does (a
					// loaded MySQL may be slow to create the namespace).
					if ctx.Err() != nil || status.Code(err) != codes.Unavailable {
						return
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(200 * time.Millisecond):
					}
					if stream, err = dc.Subscribe(ctx, sub); err != nil {
						return
					}
				}
			}()
			const n = 300
			upsertRange(t, r.conn, ns, 0, n, 500*time.Millisecond, ty) // one call: 300 durable upserts one by one take 45 s at load 15
			var held []*delaydv1.Delivery
			for len(held) < 100 {
				select {
				case d := <-got:
					held = append(held, d)
				case <-time.After(60 * time.Second):
					t.Fatalf("only %d deliveries within 60 s", len(held))
				}
			}
			tokens := make([]string, len(held))
			for i, d := range held {
				tokens[i] = d.GetToken()
			}

			mode.fail(p)
			tc := delaydv1.NewTaskServiceClient(r.conn)
			uctx, ucancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err = tc.UpsertTask(uctx, &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "during-outage",
				When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Second)}})
			ucancel()
			if status.Code(err) != codes.Unavailable {
				t.Errorf("upsert with MySQL %s: %v, want Unavailable", mode.name, err)
			}
			st, failed := ackBatches(dc, ns, tokens)
			unavailable := 0
			for _, c := range failed {
				if c == codes.Unavailable {
					unavailable++
				}
			}
			t.Logf("acks during the %s: %d calls of 10 failed (%d Unavailable: %v)", mode.name, len(failed), unavailable, failed)
			if unavailable != 10 {
				t.Errorf("acks with MySQL %s: %d of 10 calls answered Unavailable (%v, statuses %v); want all", mode.name, unavailable, failed, st)
			}
			time.Sleep(3 * time.Second) // reconciler passes fail meanwhile
			p.Restore()

			st, failed = ackBatches(dc, ns, tokens)
			// A call that still fails right after the restore (the pool
			// reconnecting, a loaded MySQL over the 2 s store timeout) is
			// retried, as a client does, for up to a minute.
			for giveUp := time.Now().Add(time.Minute); time.Now().Before(giveUp); {
				var again []int
				for i, s := range st {
					if s == delaydv1.TokenStatus_TOKEN_STATUS_UNSPECIFIED {
						again = append(again, i)
					}
				}
				if len(again) == 0 {
					break
				}
				time.Sleep(200 * time.Millisecond)
				sub := make([]string, len(again))
				for j, i := range again {
					sub[j] = tokens[i]
				}
				var subSt []delaydv1.TokenStatus
				subSt, failed = ackBatches(dc, ns, sub)
				for j, i := range again {
					st[i] = subSt[j]
				}
			}
			okN, gone := 0, 0
			for i, s := range st {
				switch s {
				case delaydv1.TokenStatus_TOKEN_STATUS_OK:
					okN++
				case delaydv1.TokenStatus_TOKEN_STATUS_NOT_FOUND:
					gone++
				default:
					t.Errorf("retried ack of %s after MySQL is back: %v (call errors %v)", held[i].GetTask().GetId(), s, failed)
				}
				ty.ackedIDs([]string{held[i].GetTask().GetId()})
			}
			t.Logf("retried acks after the %s: %d OK, %d NOT_FOUND (settled by the reconciler first)", mode.name, okN, gone)
			ackedAt := time.Now()
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case d := <-got:
						if ackRetrying(ctx, dc, ns, d.GetToken()) {
							ty.ackedIDs([]string{d.GetTask().GetId()})
						}
					}
				}
			}()
			testkit.Eventually(t, 90*time.Second, "every accepted task acked", func() bool {
				_, lost, _, _ := ty.counts()
				return lost == 0
			})
			// Several more incremental reconciler passes: none may bring an acked
			// task back.
			time.Sleep(max(0, 6*time.Second-time.Since(ackedAt)))
			accepted, lost, dups, early := ty.counts()
			t.Logf("accepted %d, lost %d, duplicates %d, early %d", accepted, lost, dups, early)
			if lost != 0 || early != 0 || dups != 0 {
				ty.mu.Lock()
				var again []string
				for id, c := range ty.delivered {
					if c > 1 {
						again = append(again, id)
					}
				}
				ty.mu.Unlock()
				t.Fatalf("lost %d, early %d (%v), duplicates %d (%v); want 0, 0, 0", lost, early, ty.early, dups, again)
			}
		})
	}
}

// upsertRange upserts tasks task-<from> .. task-<from+n-1> of ns due
// spread over the second that starts after, in one BatchUpsertTasks call
// (so a loaded machine does not eat into after).
func upsertRange(t *testing.T, conn *grpc.ClientConn, ns string, from, n int, after time.Duration, ty *tally) {
	t.Helper()
	upsertSpread(t, conn, ns, from, n, after, time.Second, ty)
}

// upsertSpread is upsertRange with the tasks due spread over span.
func upsertSpread(t *testing.T, conn *grpc.ClientConn, ns string, from, n int, after, span time.Duration, ty *tally) {
	t.Helper()
	tc := delaydv1.NewTaskServiceClient(conn)
	start := time.Now().Add(after)
	req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns}
	dues := make([]time.Time, n)
	for i := range n {
		dues[i] = start.Add(time.Duration(i) * span / time.Duration(n)).Truncate(time.Millisecond)
		req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{Id: fmt.Sprintf("task-%04d", from+i), Payload: []byte("p"),
			When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(dues[i])}})
	}
	var res *delaydv1.BatchUpsertTasksResponse
	retryUnavailable(t, "batch upsert", func(ctx context.Context) (err error) {
		res, err = tc.BatchUpsertTasks(ctx, req)
		return err
	})
	for i, r := range res.GetResults() {
		if r.GetError() != nil {
			t.Fatalf("upsert %s: %v", req.Tasks[i].GetId(), r.GetError())
		}
		ty.mu.Lock()
		ty.due[req.Tasks[i].GetId()] = dues[i]
		ty.mu.Unlock()
	}
}

// TestFaultLaggingReplicaPromoted (issue 10 item 7): Redis fails over to a
// replica that lags. A real `redis-server` follows the primary through a
// proxy. 200 tasks due in 6-7 s are upserted and replicated; then the
// proxy holds the replication link (the replica lags from here), 200 more
// tasks due in 8-9 s are upserted, and the first 200 fall due, are
// delivered and acked on the primary. Then the primary is SIGKILLed, the
// replica promoted (REPLICAOF NO ONE) and delayd's Redis address moved to
// it (a proxy retargeted, as a virtual IP moves). The promoted replica
// holds the first 200 as not yet delivered and lacks the second 200.
//
//   - durable mode: 0 lost, 0 early. The second 200 are re-indexed from
//     MySQL by the reconciler's incremental pass; the first 200 are
//     delivered again (duplicates: what was acked or in flight during the
//     lag, and no more).
//   - Redis-only: the tasks accepted during the lag are lost, and nothing
//     else (every task accepted before the lag is delivered, 0 early);
//     duplicates as in durable mode. The counts are logged.
func TestFaultLaggingReplicaPromoted(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, durable := range []bool{true, false} {
		name := map[bool]string{true: "durable", false: "redis-only"}[durable]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			primary, replica := testkit.StartRedis(t), testkit.StartRedis(t)
			link := testkit.NewProxy(t, primary.Addr)
			replica.ReplicaOfAddr(link.Addr())
			front := testkit.NewProxy(t, primary.Addr)
			args := []string{"--redis-url", "redis://" + front.Addr(), "--no-auth"}
			if durable {
				args = append(args, "--mysql-dsn", testkit.Database(t, "delayd_fault"), "--reconcile-interval", "1s")
			}
			r := startReplica(t, bin, args...)
			ns := "fault-promote-" + name
			ty := newTally(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			consume(ctx, t, r.conn, ns, 0, ty)
			const n = 200
			upsertRange(t, r.conn, ns, 0, n, 6*time.Second, ty)
			testkit.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
				return replica.ReplOffset() >= primary.ReplOffset()
			})
			ty.mu.Lock()
			ackedBefore := len(ty.acked)
			ty.mu.Unlock()
			if ackedBefore != 0 {
				t.Fatalf("%d tasks acked before the lag began; the test needs them due during it", ackedBefore)
			}

			link.Hold() // the replica lags from here
			upsertRange(t, r.conn, ns, n, n, 8*time.Second, ty)
			testkit.Eventually(t, 30*time.Second, "the first tasks acked on the primary", func() bool {
				ty.mu.Lock()
				defer ty.mu.Unlock()
				return len(ty.acked) >= n
			})
			ty.mu.Lock()
			ackedInLag := len(ty.acked) - ackedBefore
			ty.mu.Unlock()
			primaryOff, replicaOff := primary.ReplOffset(), replica.ReplOffset()
			primary.Kill()
			replica.Promote()
			front.Retarget(replica.Addr)
			t.Logf("failover: the replica was %d bytes of replication stream behind", primaryOff-replicaOff)
			consume(ctx, t, r.conn, ns, 0, ty) // the stream may have ended with the old primary

			if durable {
				testkit.Eventually(t, 90*time.Second, "every accepted task acked after the failover", func() bool {
					_, lost, _, _ := ty.counts()
					return lost == 0
				})
			} else {
				testkit.Eventually(t, 60*time.Second, "every task accepted before the lag acked", func() bool {
					ty.mu.Lock()
					defer ty.mu.Unlock()
					for i := range n {
						if !ty.acked[fmt.Sprintf("task-%04d", i)] {
							return false
						}
					}
					return true
				})
			}
			time.Sleep(5 * time.Second) // reaped leases and late redeliveries arrive
			accepted, lost, dups, early := ty.counts()
			t.Logf("accepted %d (%d during the lag), lost %d, duplicates %d (acked on the primary during the lag: %d), early %d",
				accepted, n, lost, dups, ackedInLag, early)
			if early != 0 {
				t.Errorf("early %d (%v); want 0", early, ty.early)
			}
			if durable && lost != 0 {
				t.Errorf("durable mode lost %d tasks in the failover; want 0", lost)
			}
			if lost > n {
				t.Errorf("lost %d, more than the %d tasks accepted during the lag", lost, n)
			}
			if dups > ackedInLag+100 {
				t.Errorf("%d duplicates, more than the %d acked during the lag plus 100 in flight", dups, ackedInLag)
			}
			if replicaOff >= primaryOff {
				t.Errorf("the replica did not lag (offset %d, primary %d): the test tested nothing", replicaOff, primaryOff)
			}
		})
	}
}
