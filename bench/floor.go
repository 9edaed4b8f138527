package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/delayd/delayd/bench/baseline"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// The gRPC floor (delaybench --floor) answers one question the throughput
// ratios raise: how close to the source design can *any* service that
// speaks gRPC get on this machine? It measures, in one process and one run,
// alternating rounds of:
//
//   - unary: the source design's Lua upsert straight to Redis (go-redis,
//     the baseline row); UpsertTask over loopback gRPC to a handler that
//     does nothing (the floor of gRPC itself); and UpsertTask to a handler
//     that runs that same Lua upsert (a gRPC service doing the source
//     design's work in one Redis round trip, with no validation, no
//     tenancy, no durability);
//   - drain: the source design's pop-delete loop (pops of --baseline-batch
//     until short); Subscribe streams fed from memory with acks that only
//     return credit (the floor of streaming deliveries and batched acks);
//     and Subscribe streams fed by those pop-delete pops.
//
// The client and the gRPC server share this process (grpc-go on both ends,
// loopback TCP, the server with delayd's stream workers); the Lua upsert and
// pops go to the run's Redis. Delayd does strictly more per task than the
// third row of each group, so that row's ratio is a ceiling for delayd's.

// floorProducers and floorStreams match the unary and backlog workloads.
const (
	floorProducers   = 32
	floorStreams     = 4
	floorMaxInFlight = 1000
	floorPayload     = 100
)

type floorResult struct {
	group, name string
	rate        float64 // tasks/s
	procCPU     float64 // µs of this process's CPU per task
	redisCPU    float64 // µs of Redis CPU per task
}

// runFloor runs cfg.Floor.Rounds alternating rounds of the floor rows with
// cfg.Floor.Tasks tasks each and prints the median of each row.
func runFloor(ctx context.Context, cfg Config, rdb redis.UniversalClient, probe *RedisProbe, out io.Writer) error {
	rounds, tasks := cfg.Floor.Rounds, cfg.Floor.Tasks
	if tasks <= 0 {
		tasks = 50_000
	}
	prefix := "delaybench-floor-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	q := baseline.New(rdb, prefix)
	// The unary rows leave their tasks (due in an hour) behind until here.
	defer func() { _, _ = q.Cleanup(context.WithoutCancel(ctx)) }()

	fs, err := startFloorServer(q)
	if err != nil {
		return err
	}
	defer fs.stop()
	conns := max(cfg.Conns, 1)
	var clients []*grpc.ClientConn
	for range conns {
		cc, err := grpc.NewClient(fs.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("floor: dial: %w", err)
		}
		defer cc.Close()
		clients = append(clients, cc)
	}
	batch := cfg.BaselineBatch
	if batch <= 0 {
		batch = 200
	}
	ackBatch := max(cfg.AckBatch, 1)
	payload := make([]byte, floorPayload)

	var all []floorResult
	measure := func(group, name string, fn func(ctx context.Context) error) error {
		runtime.GC()
		c0 := SelfCPU()
		r0, err := probe.CPU(ctx)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := fn(ctx); err != nil {
			return fmt.Errorf("floor %s %s: %w", group, name, err)
		}
		d := time.Since(t0)
		r1, err := probe.CPU(ctx)
		if err != nil {
			return err
		}
		all = append(all, floorResult{group: group, name: name, rate: float64(tasks) / d.Seconds(),
			procCPU:  float64((SelfCPU() - c0).Microseconds()) / float64(tasks),
			redisCPU: float64((r1 - r0).Microseconds()) / float64(tasks)})
		return nil
	}
	unary := func(call func(ctx context.Context, i int) error) func(context.Context) error {
		return func(ctx context.Context) error {
			return forEachConcurrently(ctx, tasks, floorProducers, call)
		}
	}
	for r := range rounds {
		due := time.Now().Add(time.Hour)
		qu := "u" + strconv.Itoa(r)
		tc := func(i int) delaydv1.TaskServiceClient { return delaydv1.NewTaskServiceClient(clients[i%len(clients)]) }
		req := func(ns string, i int) *delaydv1.UpsertTaskRequest {
			return &delaydv1.UpsertTaskRequest{Namespace: ns, Id: "t" + strconv.Itoa(i), Payload: payload,
				When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(due)}}
		}
		db, dg := "d"+strconv.Itoa(r)+"b", "d"+strconv.Itoa(r)+"g"
		steps := []struct {
			group, name string
			prep, fn    func(context.Context) error // prep is not measured
		}{
			{"unary", "source design: Lua upsert to Redis", nil, unary(func(ctx context.Context, i int) error {
				return q.Upsert(ctx, qu+"b", baseline.Item{ID: "t" + strconv.Itoa(i), Due: due, Record: payload})
			})},
			{"unary", "gRPC UpsertTask, handler does nothing", nil, unary(func(ctx context.Context, i int) error {
				_, err := tc(i).UpsertTask(ctx, req(floorNoop, i))
				return err
			})},
			{"unary", "gRPC UpsertTask, handler runs the Lua upsert", nil, unary(func(ctx context.Context, i int) error {
				_, err := tc(i).UpsertTask(ctx, req(qu+"g", i))
				return err
			})},
			{"drain", "source design: pop-delete loop",
				func(ctx context.Context) error { return fillDue(ctx, q, db, tasks, payload) },
				func(ctx context.Context) error { return popAll(ctx, q, db, tasks, batch) }},
			{"drain", "gRPC Subscribe from memory, acks return credit",
				func(context.Context) error { fs.feedMemory(tasks); return nil },
				func(ctx context.Context) error { return drainStreams(ctx, clients, floorNoop, tasks, ackBatch) }},
			{"drain", "gRPC Subscribe fed by pop-delete pops",
				func(ctx context.Context) error { return fillDue(ctx, q, dg, tasks, payload) },
				func(ctx context.Context) error { return drainStreams(ctx, clients, dg, tasks, ackBatch) }},
		}
		for _, s := range steps {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if s.prep != nil {
				if err := s.prep(ctx); err != nil {
					return fmt.Errorf("floor %s %s: %w", s.group, s.name, err)
				}
			}
			if err := measure(s.group, s.name, s.fn); err != nil {
				return err
			}
		}
	}
	printFloor(out, all, rounds, tasks)
	return nil
}

// floorNoop is the namespace the floor server answers without touching
// Redis.
const floorNoop = "noop"

type floorServer struct {
	delaydv1.UnimplementedTaskServiceServer
	delaydv1.UnimplementedDeliveryServiceServer
	q      *baseline.Queue
	gs     *grpc.Server
	addr   string
	memory atomic.Int64 // deliveries left to send from memory

	mu      sync.Mutex
	credits map[string]chan struct{} // stream id → credit
	nextID  atomic.Int64
}

func startFloorServer(q *baseline.Queue) (*floorServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("floor: listen: %w", err)
	}
	s := &floorServer{q: q, credits: map[string]chan struct{}{}, addr: lis.Addr().String()}
	// The same stream workers delayd runs with (daemon: 32 per core).
	s.gs = grpc.NewServer(grpc.NumStreamWorkers(uint32(32 * runtime.GOMAXPROCS(0))))
	delaydv1.RegisterTaskServiceServer(s.gs, s)
	delaydv1.RegisterDeliveryServiceServer(s.gs, s)
	go func() { _ = s.gs.Serve(lis) }()
	return s, nil
}

func (s *floorServer) stop() { s.gs.Stop() }

func (s *floorServer) feedMemory(n int) { s.memory.Store(int64(n)) }

func (s *floorServer) UpsertTask(ctx context.Context, r *delaydv1.UpsertTaskRequest) (*delaydv1.UpsertTaskResponse, error) {
	if r.GetNamespace() != floorNoop {
		if err := s.q.Upsert(ctx, r.GetNamespace(), baseline.Item{ID: r.GetId(), Due: r.GetDueTime().AsTime(), Record: r.GetPayload()}); err != nil {
			return nil, err
		}
	}
	return &delaydv1.UpsertTaskResponse{Created: true}, nil
}

// Subscribe sends deliveries while the stream has credit; AckTasks returns
// it. Tokens are "<stream>:<n>".
func (s *floorServer) Subscribe(r *delaydv1.SubscribeRequest, st grpc.ServerStreamingServer[delaydv1.SubscribeResponse]) error {
	ctx := st.Context()
	id := strconv.FormatInt(s.nextID.Add(1), 36)
	credit := make(chan struct{}, max(r.GetMaxInFlight(), 1))
	for range cap(credit) {
		credit <- struct{}{}
	}
	s.mu.Lock()
	s.credits[id] = credit
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.credits, id)
		s.mu.Unlock()
	}()
	var seq int
	send := func(taskID string, due time.Time, payload []byte) error {
		seq++
		return st.Send(&delaydv1.SubscribeResponse{Delivery: &delaydv1.Delivery{
			Task: &delaydv1.Task{Namespace: r.GetNamespace(), Id: taskID, Payload: payload,
				DueTime: timestamppb.New(due), State: delaydv1.TaskState_TASK_STATE_DELIVERED, Attempt: 1, Generation: 1},
			Token:         id + ":" + strconv.Itoa(seq),
			LeaseDeadline: timestamppb.New(time.Now().Add(30 * time.Second)),
		}})
	}
	payload := make([]byte, floorPayload)
	for {
		// Wait for one credit, then take what else is free.
		select {
		case <-ctx.Done():
			return nil
		case <-credit:
		}
		n := 1
		for n < cap(credit) {
			select {
			case <-credit:
				n++
				continue
			default:
			}
			break
		}
		if r.GetNamespace() == floorNoop {
			left := s.memory.Add(-int64(n))
			if left < 0 {
				n += int(left)
				s.memory.Add(-left) // give back what was over-taken
			}
			for i := range max(n, 0) {
				if err := send("m"+strconv.Itoa(i), time.Now(), payload); err != nil {
					return err
				}
			}
			if n <= 0 {
				// Nothing left: idle until cancelled (the client stops
				// when it has everything).
				<-ctx.Done()
				return nil
			}
			continue
		}
		tasks, err := s.q.Pop(ctx, r.GetNamespace(), time.Now(), min(n, baseline.MaxPopBatch))
		if err != nil {
			return err
		}
		for _, t := range tasks {
			if err := send(t.ID, t.Due, t.Record); err != nil {
				return err
			}
		}
		// Return the credit not used by this pop.
		for range n - len(tasks) {
			credit <- struct{}{}
		}
		if len(tasks) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Millisecond):
			}
		}
	}
}

func (s *floorServer) AckTasks(_ context.Context, r *delaydv1.AckTasksRequest) (*delaydv1.AckTasksResponse, error) {
	res := make([]*delaydv1.TokenResult, len(r.GetTokens()))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, tok := range r.GetTokens() {
		res[i] = &delaydv1.TokenResult{Token: tok, Status: delaydv1.TokenStatus_TOKEN_STATUS_OK}
		stream, _, _ := strings.Cut(tok, ":")
		if c, ok := s.credits[stream]; ok {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}
	return &delaydv1.AckTasksResponse{Results: res}, nil
}

// forEachConcurrently calls fn for 0..n-1 from workers goroutines and
// returns the first error.
func forEachConcurrently(ctx context.Context, n, workers int, fn func(context.Context, int) error) error {
	var next atomic.Int64
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// fillDue loads n tasks already due into queue with pipelined upserts.
func fillDue(ctx context.Context, q *baseline.Queue, queue string, n int, payload []byte) error {
	due := time.Now().Add(-time.Second)
	for lo := 0; lo < n; lo += 1000 {
		items := make([]baseline.Item, 0, 1000)
		for i := lo; i < min(lo+1000, n); i++ {
			items = append(items, baseline.Item{ID: "t" + strconv.Itoa(i), Due: due, Record: payload})
		}
		if err := q.UpsertPipelined(ctx, queue, items); err != nil {
			return err
		}
	}
	return nil
}

// popAll is the source design's poller draining a backlog: pop batch due
// tasks, hand them on, loop until a pop comes back short.
func popAll(ctx context.Context, q *baseline.Queue, queue string, n, batch int) error {
	got := 0
	for got < n {
		ts, err := q.Pop(ctx, queue, time.Now(), batch)
		if err != nil {
			return err
		}
		got += len(ts)
		if len(ts) == 0 {
			return fmt.Errorf("pop-delete loop: %d of %d tasks, then none", got, n)
		}
	}
	return nil
}

// drainStreams opens floorStreams Subscribe streams on ns, receives until n
// deliveries have arrived in all, and acks them in batches of up to
// ackBatch tokens.
func drainStreams(ctx context.Context, conns []*grpc.ClientConn, ns string, n, ackBatch int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 2*floorStreams)
	var wg sync.WaitGroup
	for i := range floorStreams {
		dc := delaydv1.NewDeliveryServiceClient(conns[i%len(conns)])
		st, err := dc.Subscribe(ctx, &delaydv1.SubscribeRequest{Namespace: ns, MaxInFlight: floorMaxInFlight})
		if err != nil {
			return err
		}
		tokens := make(chan string, floorMaxInFlight)
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer close(tokens)
			for {
				m, err := st.Recv()
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				tokens <- m.GetDelivery().GetToken()
				if got.Add(1) == int64(n) {
					once.Do(func() { close(done) })
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]string, 0, ackBatch)
			for tok := range tokens {
				buf = append(buf[:0], tok)
			more:
				for len(buf) < ackBatch {
					select {
					case t, ok := <-tokens:
						if !ok {
							break more
						}
						buf = append(buf, t)
					default:
						break more
					}
				}
				if _, err := dc.AckTasks(ctx, &delaydv1.AckTasksRequest{Namespace: ns, Tokens: buf}); err != nil && ctx.Err() == nil {
					errc <- err
					return
				}
			}
		}()
	}
	select {
	case <-done:
	case err := <-errc:
		cancel()
		wg.Wait()
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
	cancel()
	wg.Wait()
	return nil
}

func printFloor(out io.Writer, all []floorResult, rounds, tasks int) {
	fmt.Fprintf(out, "gRPC floor: %d rounds of %d tasks, %d unary producers, %d streams of max_in_flight %d; median of each row (process CPU is client and gRPC server together)\n\n",
		rounds, tasks, floorProducers, floorStreams, floorMaxInFlight)
	fmt.Fprintln(out, "| group | row | tasks/s (median) | each round | ratio to the source design | process µs/task | Redis µs/task |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	type key struct{ group, name string }
	var order []key
	by := map[key][]floorResult{}
	for _, r := range all {
		k := key{r.group, r.name}
		if _, ok := by[k]; !ok {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	median := func(rs []floorResult, f func(floorResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	base := map[string]float64{}
	for _, k := range order {
		rs := by[k]
		rate := median(rs, func(r floorResult) float64 { return r.rate })
		if _, ok := base[k.group]; !ok {
			base[k.group] = rate
		}
		var each []string
		for _, r := range rs {
			each = append(each, strconv.FormatFloat(r.rate, 'f', 0, 64))
		}
		fmt.Fprintf(out, "| %s | %s | %.0f | %s | %.2f× | %.1f | %.1f |\n", k.group, k.name, rate, strings.Join(each, ", "),
			rate/base[k.group], median(rs, func(r floorResult) float64 { return r.procCPU }), median(rs, func(r floorResult) float64 { return r.redisCPU }))
	}
}
