package server_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// End-to-end delivery tests: several delayd replicas over one Redis, many
// subscribers, many tasks.

// dlvConsumer drains a subscription, acking everything over its own replica
// in batches, and counts deliveries per task id in seen.
type dlvConsumer struct {
	e    *dlvEnv
	r    *dlvReplica
	s    *dlvSub
	mu   *sync.Mutex
	seen map[string]int
	done chan struct{}
}

func (e *dlvEnv) consume(r *dlvReplica, s *dlvSub, mu *sync.Mutex, seen map[string]int) *dlvConsumer {
	c := &dlvConsumer{e: e, r: r, s: s, mu: mu, seen: seen, done: make(chan struct{})}
	go c.run()
	return c
}

func (c *dlvConsumer) run() {
	defer close(c.done)
	for d := range c.s.ch {
		batch := []*delaydv1.Delivery{d}
	more:
		for len(batch) < 250 {
			select {
			case d, ok := <-c.s.ch:
				if !ok {
					break more
				}
				batch = append(batch, d)
			default:
				break more
			}
		}
		tokens := make([]string, len(batch))
		c.mu.Lock()
		for i, d := range batch {
			c.seen[d.GetTask().GetId()]++
			tokens[i] = d.GetToken()
		}
		c.mu.Unlock()
		resp, err := c.r.dlv.AckTasks(context.Background(), &delaydv1.AckTasksRequest{Namespace: c.e.ns, Tokens: tokens})
		if err != nil {
			c.e.t.Errorf("AckTasks: %v", err)
			return
		}
		for i, res := range resp.GetResults() {
			if res.GetStatus() != delaydv1.TokenStatus_TOKEN_STATUS_OK {
				c.e.t.Errorf("ack of %s: %v, want OK", batch[i].GetTask().GetId(), res.GetStatus())
			}
		}
	}
}

// batchUpsert upserts n tasks named prefix-i, due at due(i), in batches of
// 250 spread over the replicas.
func (e *dlvEnv) batchUpsert(rs []*dlvReplica, prefix string, n int, due func(i int) *timestamppb.Timestamp) {
	e.t.Helper()
	var wg sync.WaitGroup
	const batch = 250
	errs := make(chan error, n/batch+1)
	for lo := 0; lo < n; lo += batch {
		hi := min(lo+batch, n)
		r := rs[(lo/batch)%len(rs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &delaydv1.BatchUpsertTasksRequest{Namespace: e.ns}
			for i := lo; i < hi; i++ {
				req.Tasks = append(req.Tasks, &delaydv1.UpsertTaskRequest{
					Id: fmt.Sprintf("%s-%d", prefix, i), Payload: []byte(strconv.Itoa(i)),
					When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: due(i)},
				})
			}
			resp, err := r.tasks.BatchUpsertTasks(context.Background(), req)
			if err != nil {
				errs <- err
				return
			}
			for _, res := range resp.GetResults() {
				if res.GetError() != nil {
					errs <- fmt.Errorf("item: %v", res.GetError())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("BatchUpsertTasks: %v", err)
	}
}

// dlvWaitAll waits until seen holds n distinct ids, then lets duplicates show
// for a moment, and fails unless every id was delivered exactly once.
func dlvWaitAll(t *testing.T, mu *sync.Mutex, seen map[string]int, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		mu.Lock()
		got := len(seen)
		mu.Unlock()
		if got == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks delivered within %s: lost", got, n, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(dlvQuiet)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("%d distinct tasks delivered, want %d", len(seen), n)
	}
	dups := 0
	for id, c := range seen {
		if c != 1 {
			dups++
			if dups <= 5 {
				t.Errorf("task %s delivered %d times", id, c)
			}
		}
	}
	if dups > 0 {
		t.Fatalf("%d tasks delivered more than once without a fault", dups)
	}
}

func (e *dlvEnv) wantEmpty(r *dlvReplica) {
	e.t.Helper()
	st, err := r.admin.GetNamespaceStats(context.Background(), &delaydv1.GetNamespaceStatsRequest{Namespace: e.ns})
	if err != nil {
		e.t.Fatal(err)
	}
	if st.GetScheduled()+st.GetDelivered()+st.GetDead() != 0 {
		e.t.Fatalf("namespace not empty after every ack: %v", st)
	}
}

func TestE2ETwoReplicasThreeSubscribersNoDuplicateNoLoss(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy()) // lease: one hour, so no fault-free redelivery
	a, b := e.replica(), e.replica()
	var mu sync.Mutex
	seen := map[string]int{}
	consumers := []*dlvConsumer{
		e.consume(a, e.subscribe(a, 50), &mu, seen),
		e.consume(a, e.subscribe(a, 20), &mu, seen),
		e.consume(b, e.subscribe(b, 50), &mu, seen),
	}
	const n = 3000
	start := e.redisNow()
	e.batchUpsert([]*dlvReplica{a, b}, "t", n, func(i int) *timestamppb.Timestamp {
		return timestamppb.New(start.Add(time.Duration(i%1000) * time.Millisecond)) // due over one second
	})
	dlvWaitAll(t, &mu, seen, n, 2*time.Minute)
	e.wantEmpty(a)
	for _, c := range consumers {
		c.s.end()
		<-c.done
	}
}

// dlvOwnRedis starts a redis-server of the test's own (see
// testkit.StartRedis) and returns its URL. SLOWLOG measures wall time: on a
// busy machine (this test runs 50,000 deliveries under -race next to it,
// other work may run beside it) a command that costs a few milliseconds can
// wait tens of milliseconds for a CPU, so the server gets the CPU first
// where the test may (Prioritize).
func dlvOwnRedis(t *testing.T) string {
	t.Helper()
	srv := testkit.StartRedis(t)
	srv.Prioritize()
	return srv.URL
}

func TestE2EFiftyThousandDueInOneMillisecond(t *testing.T) {
	if testing.Short() {
		t.Skip("50,000 tasks: not in -short")
	}
	// Not parallel: the package's other tests wait, so they do not compete
	// with this Redis for the CPU. Its own Redis, so SLOWLOG shows this
	// test's commands only.
	e := newDlvEnvAt(t, dlvOwnRedis(t), dlvPolicy())
	ctx := context.Background()
	if err := e.rdb.ConfigSet(ctx, "slowlog-log-slower-than", "50000").Err(); err != nil { // µs
		t.Fatal(err)
	}
	if err := e.rdb.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	a, b := e.replica(), e.replica()
	var mu sync.Mutex
	seen := map[string]int{}
	consumers := []*dlvConsumer{
		e.consume(a, e.subscribe(a, 1000), &mu, seen),
		e.consume(a, e.subscribe(a, 1000), &mu, seen),
		e.consume(b, e.subscribe(b, 1000), &mu, seen),
	}
	const n = 50000
	due := timestamppb.New(e.redisNow().Add(2 * time.Second).Truncate(time.Millisecond))
	e.batchUpsert([]*dlvReplica{a, b}, "m", n, func(int) *timestamppb.Timestamp { return due })
	dlvWaitAll(t, &mu, seen, n, 150*time.Second)
	e.wantEmpty(a)

	slow, err := e.rdb.SlowLogGet(ctx, 128).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slow {
		t.Errorf("Redis command took %s (over 50ms): %v", s.Duration, s.Args)
	}
	for _, c := range consumers {
		c.s.end()
		<-c.done
	}
}

func TestE2EDueIn200msNotBeforeDue(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy())
	r := e.replica()
	s := e.subscribe(r, 100)
	const n = 20
	for i := 0; i < n; i++ {
		e.upsert(r, fmt.Sprintf("soon-%d", i), 200*time.Millisecond+time.Duration(i)*7*time.Millisecond)
	}
	for i := 0; i < n; i++ {
		d := s.next(t)
		due := d.GetTask().GetDueTime().AsTime()
		// The lease starts when the pop ran, by Redis TIME.
		popped := d.GetLeaseDeadline().AsTime().Add(-e.pol.AckTimeout)
		if popped.Before(due) {
			t.Errorf("%s popped at %v by Redis TIME, before it was due at %v", d.GetTask().GetId(), popped, due)
		}
		if now := e.redisNow(); now.Before(due) {
			t.Errorf("%s received at %v by Redis TIME, before it was due at %v", d.GetTask().GetId(), now, due)
		}
		e.ack(r, d.GetToken())
	}
}

func TestE2EShutdownSubscriberReconnectsElsewhere(t *testing.T) {
	t.Parallel()
	e := newDlvEnv(t, dlvPolicy()) // lease: one hour
	a, b := e.replica(), e.replica()
	s := e.subscribe(a, 10)
	e.upsert(a, "moving", 0)
	first := s.next(t)

	ctx, cancel := context.WithTimeout(context.Background(), dlvWait)
	defer cancel()
	if err := a.d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for range s.ch {
	}
	wantCode(t, <-s.err, codes.Unavailable, "reconnect")

	// What a client does on Unavailable: subscribe elsewhere, and ack the
	// work it finished there. Nothing is redelivered (a rolling deploy
	// duplicates nothing).
	s2 := e.subscribe(b, 10)
	if st := e.ack(b, first.GetToken()); st[0] != delaydv1.TokenStatus_TOKEN_STATUS_OK {
		t.Fatalf("ack on the other replica: %v, want OK", st[0])
	}
	e.upsert(b, "after", 0)
	if d := s2.next(t); d.GetTask().GetId() != "after" {
		t.Fatalf("on the other replica: %s, want only the new task", d.GetTask().GetId())
	}
}
