package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit"
)

// Conditional writes and bulk removal through the SDK against a real
// delayd, in Redis-only mode and in durable mode (MySQL decides).
func TestConditionalWrites(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"redis", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cfg := daemon.Config{}
			if mode == "durable" {
				cfg.MySQLDSN = testkit.Database(t, "delayd_client_cond")
			}
			srv := startDelaydWith(t, cfg)
			// Batches of 1,000 through durable mode's group commit: 5 s (the
			// default) is tight when the whole suite loads the machine.
			c := newClient(t, srv.addr(), client.WithTimeout(30*time.Second))
			ns := namespace(t, c)
			ctx := t.Context()

			// Create-only: a retry after a (simulated) timeout leaves the
			// due time where the first try put it.
			spec := client.TaskSpec{ID: "order-1", Kind: "order.close", Payload: []byte("1"), When: client.After(time.Hour), CreateOnly: true}
			first, err := c.Upsert(ctx, ns, spec)
			if err != nil || !first.Created {
				t.Fatalf("create-only = %+v, %v; want created", first, err)
			}
			time.Sleep(10 * time.Millisecond)
			_, err = c.Upsert(ctx, ns, spec)
			cf, ok := client.ConflictOf(err)
			if status.Code(err) != codes.AlreadyExists || !ok || !cf.Exists || cf.Generation != 1 || cf.Task == nil ||
				!cf.Task.DueTime.Equal(first.Task.DueTime) {
				t.Fatalf("retried create-only: err %v, conflict %+v; want AlreadyExists holding the first task (due %v)", err, cf, first.Task.DueTime)
			}
			if got, err := c.Get(ctx, ns, "order-1"); err != nil || !got.DueTime.Equal(first.Task.DueTime) || got.Generation != 1 {
				t.Fatalf("get = %+v, %v; want the first due time at generation 1", got, err)
			}

			// Compare-and-set: many writers read generation 1; exactly one wins.
			var (
				mu   sync.Mutex
				wins []int
				wg   sync.WaitGroup
			)
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := c.Upsert(ctx, ns, client.TaskSpec{ID: "order-1", Payload: []byte(fmt.Sprint(i)), When: client.After(2 * time.Hour), IfGeneration: 1})
					if err == nil {
						mu.Lock()
						wins = append(wins, i)
						mu.Unlock()
						return
					}
					if cf, ok := client.ConflictOf(err); !ok || cf.Exists || cf.Generation != 2 || cf.Expected != 1 {
						t.Errorf("writer %d: %v (conflict %+v); want FailedPrecondition at generation 2", i, err, cf)
					}
				}()
			}
			wg.Wait()
			if len(wins) != 1 {
				t.Fatalf("%d compare-and-set writers won, want exactly 1", len(wins))
			}

			// The loan race: a return that read generation 1 must not
			// cancel the renewed (generation 2) task.
			_, err = c.RemoveIf(ctx, ns, "order-1", client.Version{Generation: 1})
			if cf, ok := client.ConflictOf(err); status.Code(err) != codes.FailedPrecondition || !ok || cf.Generation != 2 ||
				cf.Task == nil || string(cf.Task.Payload) != fmt.Sprint(wins[0]) {
				t.Fatalf("stale RemoveIf: %v (conflict %+v); want FailedPrecondition holding the winner's task", err, cf)
			}
			before, err := c.Get(ctx, ns, "order-1")
			if err != nil {
				t.Fatal(err)
			}
			if rr, err := c.RemoveIf(ctx, ns, "order-1", before.Version()); err != nil || !rr.Removed {
				t.Fatalf("RemoveIf at %+v = %+v, %v; want removed", before.Version(), rr, err)
			}
			// The id is created again: generation 1 once more, a new
			// incarnation. A compare-and-set of the version read before
			// the removal never matches it.
			again, err := c.Upsert(ctx, ns, client.TaskSpec{ID: "order-1", When: client.After(time.Hour)})
			if err != nil || again.Task.Incarnation <= before.Incarnation {
				t.Fatalf("re-create = %+v, %v; want a larger incarnation than %d", again, err, before.Incarnation)
			}
			stale := client.Version{Incarnation: before.Incarnation, Generation: again.Task.Generation}
			_, err = c.RemoveIf(ctx, ns, "order-1", stale)
			if cf, ok := client.ConflictOf(err); !ok || cf.Incarnation != again.Task.Incarnation || cf.ExpectedIncarnation != before.Incarnation {
				t.Fatalf("RemoveIf of the old life: %v (conflict %+v); want FailedPrecondition naming both incarnations", err, cf)
			}
			if rr, err := c.RemoveIf(ctx, ns, "order-1", again.Task.Version()); err != nil || !rr.Removed {
				t.Fatalf("RemoveIf of the new life = %+v, %v; want removed", rr, err)
			}

			// Batch items answer per item, with the conflicting task.
			br, err := c.BatchUpsert(ctx, ns, []client.TaskSpec{
				{ID: "b", When: client.After(time.Hour), CreateOnly: true},
				{ID: "b", When: client.After(time.Hour), CreateOnly: true},
				{ID: "b", When: client.After(time.Hour), IfGeneration: 5},
			})
			if err != nil {
				t.Fatal(err)
			}
			if br[0].Err != nil || !br[0].Created {
				t.Errorf("item 0 = %+v, want created", br[0])
			}
			if cf, ok := client.ConflictOf(br[1].Err); !ok || !cf.Exists || br[1].Task.ID != "b" {
				t.Errorf("item 1 = %+v (conflict %+v), want AlreadyExists with the task", br[1], cf)
			}
			if cf, ok := client.ConflictOf(br[2].Err); !ok || cf.Exists || cf.Generation != 1 || cf.Expected != 5 {
				t.Errorf("item 2 = %+v (conflict %+v), want FailedPrecondition at generation 1, expected 5", br[2], cf)
			}

			// Bulk removal by filter, across several pages.
			var specs []client.TaskSpec
			for i := range 2200 {
				kind := "loan.overdue"
				if i%4 == 0 {
					kind = "loan.remind"
				}
				specs = append(specs, client.TaskSpec{ID: fmt.Sprintf("loan-%04d", i), Kind: kind, When: client.After(time.Duration(i+1) * time.Minute)})
			}
			if _, err := c.BatchUpsert(ctx, ns, specs); err != nil {
				t.Fatal(err)
			}
			n, err := c.RemoveMatching(ctx, ns, client.TaskFilter{Kind: "loan.overdue"})
			if err != nil || n != 1650 {
				t.Fatalf("RemoveMatching = %d, %v; want 1650", n, err)
			}
			n, err = c.RemoveIDs(ctx, ns, []string{"loan-0000", "loan-0001", "b"})
			if err != nil || n != 2 {
				t.Fatalf("RemoveIDs = %d, %v; want 2 (loan-0001 was removed by the filter)", n, err)
			}
			left := 0
			for task, err := range c.List(ctx, ns, client.ListOptions{PageSize: 1000}) {
				if err != nil {
					t.Fatal(err)
				}
				if task.Kind != "loan.remind" {
					t.Errorf("left %s of kind %q", task.ID, task.Kind)
				}
				left++
			}
			if left != 549 {
				t.Errorf("%d tasks left, want 549 reminders", left)
			}
		})
	}
}

// loseAnswers is a client interceptor that lets the next n calls reach the
// server and be applied, then answers them DeadlineExceeded: what a
// producer sees when the answer is lost to a timeout.
type loseAnswers struct{ n atomic.Int32 }

func (l *loseAnswers) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && l.n.Add(-1) >= 0 {
		return status.Error(codes.DeadlineExceeded, "context deadline exceeded (the answer was lost; the call was applied)")
	}
	return err
}

// TestCreateOnlyRetryAfterTimeout: a producer's upsert is applied but its
// answer is lost to a timeout; the producer retries the same relative
// schedule. A plain upsert's retry pushes the due time back by the time the
// retry took; a create-only retry answers AlreadyExists and the due time
// stays where the first, applied, try put it. Both modes.
func TestCreateOnlyRetryAfterTimeout(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"redis", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cfg := daemon.Config{}
			if mode == "durable" {
				cfg.MySQLDSN = testkit.Database(t, "delayd_client_retry")
			}
			srv := startDelaydWith(t, cfg)
			lose := &loseAnswers{}
			c := newClient(t, srv.addr(), client.WithDialOptions(grpc.WithChainUnaryInterceptor(lose.intercept)))
			ns := namespace(t, c)
			ctx := t.Context()

			for _, createOnly := range []bool{false, true} {
				id := fmt.Sprintf("order-create-only-%v", createOnly)
				spec := client.TaskSpec{ID: id, Kind: "order.close", When: client.After(15 * time.Minute), CreateOnly: createOnly}
				lose.n.Store(1)
				if _, err := c.Upsert(ctx, ns, spec); status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("first try: %v, want the lost answer", err)
				}
				applied, err := c.Get(ctx, ns, id)
				if err != nil {
					t.Fatalf("the first try was not applied: %v", err)
				}
				time.Sleep(20 * time.Millisecond) // the retry comes later
				_, err = c.Upsert(ctx, ns, spec)
				now, gerr := c.Get(ctx, ns, id)
				if gerr != nil {
					t.Fatal(gerr)
				}
				if !createOnly {
					// Why create-only exists: the plain retry moved the due time.
					if err != nil || !now.DueTime.After(applied.DueTime) {
						t.Fatalf("plain retry: %v, due %v → %v; want applied and later", err, applied.DueTime, now.DueTime)
					}
					continue
				}
				if cf, ok := client.ConflictOf(err); !ok || !cf.Exists || !cf.Task.DueTime.Equal(applied.DueTime) {
					t.Fatalf("create-only retry: %v (conflict %+v), want AlreadyExists holding the applied task", err, cf)
				}
				if !now.DueTime.Equal(applied.DueTime) || now.Generation != 1 {
					t.Fatalf("create-only retry moved the task: due %v → %v, generation %d", applied.DueTime, now.DueTime, now.Generation)
				}
			}
		})
	}
}
