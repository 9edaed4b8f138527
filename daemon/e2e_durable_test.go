package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// This is the end-to-end side of storage/durable's TestFlushAllMidway: the
// same outage, with delayd's dispatcher and gRPC between the store and the
// consumers. It lives here, above the stores, because it wires a whole
// daemon (docs/ARCHITECTURE.md, internal/boundary).

// startDurableDaemon runs delayd in durable mode on a loopback port and
// returns a client connection to it, once health reports SERVING.
func startDurableDaemon(t *testing.T, redisURL, dsn string) *grpc.ClientConn {
	t.Helper()
	ctx := context.Background()
	d, err := Start(ctx, Config{
		Listen:            "127.0.0.1:0",
		RedisURL:          redisURL,
		MySQLDSN:          dsn,
		ReconcileInterval: 2 * time.Second,
		ShutdownTimeout:   10 * time.Second,
	}, testkit.Logger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	})
	conn, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	testkit.Eventually(t, time.Minute, "health SERVING", func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	return conn
}

// grpcConsumer subscribes to ns with n streams and acks every delivery in
// small batches, counting deliveries and OK acks per task id.
type grpcConsumer struct {
	mu        sync.Mutex
	delivered map[string]int
	acked     map[string]bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

func startGRPCConsumers(t *testing.T, conn *grpc.ClientConn, ns string, n int) *grpcConsumer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &grpcConsumer{delivered: map[string]int{}, acked: map[string]bool{}, cancel: cancel}
	dc := delaydv1.NewDeliveryServiceClient(conn)
	for range n {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for ctx.Err() == nil {
				c.subscribe(ctx, t, dc, ns)
			}
		}()
	}
	t.Cleanup(c.halt)
	return c
}

// subscribe runs one stream until it breaks, acking what it receives.
func (c *grpcConsumer) subscribe(ctx context.Context, t *testing.T, dc delaydv1.DeliveryServiceClient, ns string) {
	stream, err := dc.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 256})
	if err != nil {
		time.Sleep(50 * time.Millisecond)
		return
	}
	tokens := make(chan string, 256)
	var ackers sync.WaitGroup
	ackers.Add(1)
	go func() {
		defer ackers.Done()
		for tok := range tokens {
			batch := []string{tok}
		more:
			for len(batch) < 100 {
				select {
				case tok, ok := <-tokens:
					if !ok {
						break more
					}
					batch = append(batch, tok)
				default:
					break more
				}
			}
			resp, err := dc.AckTasks(context.WithoutCancel(ctx), &delaydv1.AckTasksRequest{Namespace: ns, Tokens: batch})
			if err != nil {
				continue // the tasks will be delivered again
			}
			c.mu.Lock()
			for _, r := range resp.GetResults() {
				if r.GetStatus() == delaydv1.TokenStatus_TOKEN_STATUS_OK {
					c.acked[r.GetToken()] = true
				}
			}
			c.mu.Unlock()
		}
	}()
	defer func() { close(tokens); ackers.Wait() }()
	for {
		m, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
			return
		}
		d := m.GetDelivery()
		c.mu.Lock()
		c.delivered[d.GetTask().GetId()]++
		c.mu.Unlock()
		tokens <- d.GetToken()
	}
}

func (c *grpcConsumer) halt() {
	c.cancel()
	c.wg.Wait()
}

// counts returns the distinct tasks delivered, the OK acks and the
// duplicate deliveries.
func (c *grpcConsumer) counts() (delivered, acked, dups int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.delivered {
		dups += n - 1
	}
	return len(c.delivered), len(c.acked), dups
}

// TestE2EDurableFlushAllMidway: delayd in durable mode (daemon, dispatcher,
// gRPC) with a redis-server of the test's own; 10,000 tasks are produced
// over gRPC and consumed by four Subscribe streams; Redis is FLUSHALLed
// midway. Every task is delivered and acked (none lost), MySQL ends empty,
// and the duplicates are counted and printed.
func TestE2EDurableFlushAllMidway(t *testing.T) {
	t.Parallel()
	const total = 10_000
	url := testkit.StartRedis(t).URL
	dsn := testkit.Database(t, "delayd_test")
	conn := startDurableDaemon(t, url, dsn)
	ctx := context.Background()
	ns := testkit.Namespace(t, "du")
	tc := delaydv1.NewTaskServiceClient(conn)
	for i := 0; i < total; i += 500 {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns}
		for j := i; j < i+500; j++ {
			req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{
				Namespace: ns, Id: fmt.Sprintf("d%05d", j), Payload: []byte("payload"),
				When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Duration(j%3000) * time.Millisecond)},
			})
		}
		if _, err := tc.BatchUpsertTasks(ctx, req); err != nil {
			t.Fatalf("batch upsert: %v", err)
		}
	}
	c := startGRPCConsumers(t, conn, ns, 4)
	testkit.Eventually(t, time.Minute, "half of the tasks to be acked", func() bool { _, a, _ := c.counts(); return a >= total/2 })
	db := testkit.DB(t, dsn)
	inMySQL := func() int {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM delayd_tasks WHERE namespace = ?", ns).Scan(&n); err != nil {
			t.Fatalf("count the namespace's tasks in MySQL: %v", err)
		}
		return n
	}
	if err := testkit.RedisAt(t, url).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_, ackedAtFlush, _ := c.counts()
	testkit.Eventually(t, time.Minute, "every task to be delivered and gone from mysql", func() bool {
		d, _, _ := c.counts()
		return d == total && inMySQL() == 0
	})
	c.halt()
	d, a, dups := c.counts()
	t.Logf("FLUSHALL after %d acks: %d of %d tasks delivered over gRPC, %d acked OK, %d duplicates, %d lost", ackedAtFlush, d, total, a, dups, total-d)
	if d != total {
		t.Fatalf("%d tasks lost", total-d)
	}
}
