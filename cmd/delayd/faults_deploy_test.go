package main

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// TestFaultRollingDeploy (issue 10 items 4 and 7): a rolling deploy. Two
// replicas serve a namespace whose tasks have one attempt each
// (max_attempts 1). The subscriber of replica A takes 8 s per task, longer
// than a dead replica's leases live (about 6 s); the subscriber of B acks
// at once. While A's subscriber holds deliveries, A is stopped gracefully
// (SIGTERM, as a deploy does): its stream ends, the subscriber subscribes to
// B (a load balancer moves it) and acks there what it had been sent,
// after finishing its 8 s of work. Nothing is delivered twice, every
// delivery is its task's first attempt, nothing goes to dead letters, 0
// lost, 0 early: A left what it had sent leased until the deadline its
// subscriber was told, and handed back what it had popped and not sent
// without counting an attempt. Before, a deploy redelivered every task in
// progress and, with max_attempts 1, sent them to dead letters.
func TestFaultRollingDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, mode := range []string{"redis", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rs := testkit.StartRedis(t)
			args := []string{"--redis-url", rs.URL, "--no-auth"}
			if mode == "durable" {
				args = append(args, "--mysql-dsn", testkit.Database(t, "delayd_fault"))
			}
			a, b := startReplica(t, bin, args...), startReplica(t, bin, args...)
			ns := "fault-deploy-" + mode
			retryUnavailable(t, "create namespace", func(ctx context.Context) error {
				_, err := delaydv1.NewNamespaceServiceClient(b.conn).CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{
					Namespace: &delaydv1.Namespace{Name: ns, Policy: &delaydv1.NamespacePolicy{
						MaxAttempts: 1, AckTimeout: durationpb.New(30 * time.Second)}}})
				if status.Code(err) == codes.AlreadyExists {
					return nil
				}
				return err
			})
			ty := newTally(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			var notFirst []string // deliveries that were not their task's first attempt
			aLive := true
			// pick is the replica a client's calls go to: A until it is
			// stopped, then B.
			pick := func() delaydv1.DeliveryServiceClient {
				mu.Lock()
				defer mu.Unlock()
				if aLive {
					return delaydv1.NewDeliveryServiceClient(a.conn)
				}
				return delaydv1.NewDeliveryServiceClient(b.conn)
			}
			held := 0
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			// A's subscriber: 8 s per task; acks (retried while UNAVAILABLE)
			// and re-subscribes through whichever replica is live.
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 100}
				for ctx.Err() == nil {
					stream, err := pick().Subscribe(ctx, req)
					if err != nil {
						time.Sleep(200 * time.Millisecond)
						continue
					}
					for {
						resp, err := stream.Recv()
						if err != nil {
							break
						}
						d := resp.GetDelivery()
						ty.received(d, time.Now())
						mu.Lock()
						held++
						if d.GetTask().GetAttempt() != 1 {
							notFirst = append(notFirst, fmt.Sprintf("%s attempt %d", d.GetTask().GetId(), d.GetTask().GetAttempt()))
						}
						mu.Unlock()
						wg.Add(1)
						go func() {
							defer wg.Done()
							select {
							case <-time.After(8 * time.Second):
							case <-ctx.Done():
								return
							}
							for ctx.Err() == nil {
								actx, acancel := context.WithTimeout(ctx, 10*time.Second)
								res, err := pick().AckTasks(actx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: []string{d.GetToken()}})
								acancel()
								if err == nil {
									if res.GetResults()[0].GetStatus() == delaydv1.TokenStatus_TOKEN_STATUS_OK {
										ty.ackedIDs([]string{d.GetTask().GetId()})
									} else {
										t.Errorf("ack of %s after 8 s: %v", d.GetTask().GetId(), res.GetResults()[0].GetStatus())
									}
									break
								}
								if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
									t.Errorf("ack of %s: %v", d.GetTask().GetId(), err)
									break
								}
								time.Sleep(200 * time.Millisecond)
							}
							mu.Lock()
							held--
							mu.Unlock()
						}()
					}
					time.Sleep(200 * time.Millisecond) // the stream ended (A stopping): subscribe again
				}
			}()
			// B's subscriber acks at once.
			wg.Add(1)
			go func() {
				defer wg.Done()
				dc := delaydv1.NewDeliveryServiceClient(b.conn)
				stream, err := dc.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: 100})
				if err != nil {
					t.Errorf("subscribe to B: %v", err)
					return
				}
				for {
					resp, err := stream.Recv()
					if err != nil {
						return
					}
					d := resp.GetDelivery()
					ty.received(d, time.Now())
					if d.GetTask().GetAttempt() != 1 {
						mu.Lock()
						notFirst = append(notFirst, fmt.Sprintf("%s attempt %d", d.GetTask().GetId(), d.GetTask().GetAttempt()))
						mu.Unlock()
					}
					if ackRetrying(ctx, dc, ns, d.GetToken()) {
						ty.ackedIDs([]string{d.GetTask().GetId()})
					}
				}
			}()
			const n = 300
			upsertRange(t, b.conn, ns, 0, n, 500*time.Millisecond, ty)
			testkit.Eventually(t, 30*time.Second, "A's subscriber to hold deliveries", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return held >= 10
			})
			mu.Lock()
			inFlight := held
			mu.Unlock()
			if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.exited:
			case <-time.After(30 * time.Second):
				t.Fatal("A did not exit within 30 s of SIGTERM")
			}
			mu.Lock()
			aLive = false
			mu.Unlock()
			// Well under the 30 s ack timeout: a delivery handed back or
			// reaped would come back within it.
			testkit.Eventually(t, 25*time.Second, "every task acked", func() bool {
				_, lost, _, _ := ty.counts()
				return lost == 0
			})
			time.Sleep(2 * time.Second) // a redelivery after the last ack would be counted
			accepted, lost, dups, early := ty.counts()
			mu.Lock()
			defer mu.Unlock()
			t.Logf("accepted %d, lost %d, duplicates %d, early %d; A's subscriber held %d unacked at the SIGTERM; %d deliveries not their task's first attempt",
				accepted, lost, dups, early, inFlight, len(notFirst))
			if lost != 0 || early != 0 || dups != 0 || len(notFirst) != 0 {
				t.Fatalf("lost %d, early %d (%v), duplicates %d, not first attempts %v; want 0 of each",
					lost, early, ty.early, dups, notFirst[:min(len(notFirst), 20)])
			}
			st, err := delaydv1.NewNamespaceServiceClient(b.conn).GetNamespaceStats(context.Background(), &delaydv1.GetNamespaceStatsRequest{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			if st.GetDead() != 0 {
				t.Fatalf("%d dead letters after the deploy; want 0", st.GetDead())
			}
		})
	}
}
