package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Workload is one benchmark scenario. Zero fields take the defaults given.
type Workload struct {
	// Name labels the workload in reports ("spread", "backlog", ...).
	Name string `json:"name"`
	// Tasks is how many tasks are upserted and must each be delivered
	// exactly once. Required.
	Tasks int `json:"tasks"`
	// Backlog: every task is already due when it is upserted, and the
	// subscribers connect only after the last upsert, so the drain measures
	// delivery capacity. Otherwise subscribers connect first and the tasks
	// fall due evenly over Spread, starting Lead after the load began.
	Backlog bool `json:"backlog"`
	// Spread is the window the due times are spread evenly over. Zero: all
	// due at the same millisecond.
	Spread time.Duration `json:"spread_ns"`
	// Lead is the time from the start of the load to the first due time;
	// it should exceed the load time (tasks upserted after their due time
	// are counted in Result.UpsertedAfterDue). If zero, 2 s.
	Lead time.Duration `json:"lead_ns"`
	// PayloadBytes is the payload size of every task. Default 0 (empty).
	PayloadBytes int `json:"payload_bytes"`
	// Namespaces the tasks are spread over, round-robin. If zero, 1.
	Namespaces int `json:"namespaces"`
	// Producers is the number of concurrent upserting goroutines. If zero, 16.
	Producers int `json:"producers"`
	// Batch is the tasks per BatchUpsertTasks call (pipelined upserts for
	// the baseline); 0 or 1 means one UpsertTask call per task. At most 1,000.
	Batch int `json:"batch"`
	// Subscribers is the number of Subscribe streams, spread over the
	// namespaces (at least one each). If zero, 4.
	Subscribers int `json:"subscribers"`
	// MaxInFlight is each stream's max_in_flight. If zero, 1,000.
	MaxInFlight int `json:"max_in_flight"`
	// Filler is a number of extra tasks due far in the future (2 hours),
	// loaded with batched upserts before the measured tasks, so rates are
	// measured with that many tasks pending. Redis memory per pending task
	// is measured on them when set.
	Filler int `json:"filler"`
	// FillerPayloadBytes is the payload size of the filler tasks.
	FillerPayloadBytes int `json:"filler_payload_bytes"`
	// Stall ends the wait for deliveries when nothing was delivered or
	// acked for this long after the last due time. If zero, 20 s.
	Stall time.Duration `json:"stall_ns"`
	// Grace is how long the run keeps listening after the last ack, to
	// catch late duplicates. If zero, 300 ms.
	Grace time.Duration `json:"grace_ns"`
}

// withDefaults fills the zero fields.
func (w Workload) withDefaults() Workload {
	if w.Lead == 0 {
		w.Lead = 2 * time.Second
	}
	if w.Namespaces <= 0 {
		w.Namespaces = 1
	}
	if w.Producers <= 0 {
		w.Producers = 16
	}
	if w.Batch > 1000 {
		w.Batch = 1000
	}
	if w.Subscribers <= 0 {
		w.Subscribers = 4
	}
	if w.MaxInFlight <= 0 {
		w.MaxInFlight = 1000
	}
	if w.Stall <= 0 {
		w.Stall = 20 * time.Second
	}
	if w.Grace <= 0 {
		w.Grace = 300 * time.Millisecond
	}
	return w
}

// unary reports whether the workload upserts one task per call.
func (w Workload) unary() bool { return w.Batch <= 1 }

// CPU is the CPU time of one process over the two phases of a run.
type CPU struct {
	// Scope says which process the figure covers.
	Scope string `json:"scope,omitempty"`
	// Load is CPU seconds used while the tasks were upserted.
	Load float64 `json:"load_s"`
	// Deliver is CPU seconds used from the end of the load to the last ack.
	Deliver float64 `json:"deliver_s"`
	// DeliverPercent is Deliver as a percentage of one core over that
	// window (for the idle workload: the CPU an idle delayd uses).
	DeliverPercent float64 `json:"deliver_pct_of_core"`
}

// Result is what one run of one workload on one system measured.
type Result struct {
	Workload string `json:"workload"`
	System   string `json:"system"`
	// Command reproduces this row.
	Command string   `json:"command"`
	Params  Workload `json:"params"`
	// Namespaces are the run's namespaces (baseline: queue names); every
	// key naming them is deleted after the run.
	Namespaces []string `json:"namespaces,omitempty"`
	// Skipped, when set, says why the row was not run.
	Skipped string `json:"skipped,omitempty"`
	// Error, when set, says why the run failed; figures may be partial.
	Error string `json:"error,omitempty"`
	// Violations, when set, lists deliveries that break delayd's promises
	// without faults: early, duplicate, lost or unknown. Run fails then.
	Violations string `json:"violations,omitempty"`

	// UpsertMode is "unary" or "batch".
	UpsertMode    string  `json:"upsert_mode"`
	UpsertSeconds float64 `json:"upsert_s"`
	UpsertsPerSec float64 `json:"upserts_per_s"`
	// UpsertedAfterDue counts tasks whose upsert returned after their due
	// time; non-zero means the load did not finish within Lead and the
	// lateness of those tasks includes load time.
	UpsertedAfterDue int `json:"upserted_after_due"`
	// FillerPerSec is the batched upsert rate of the filler load.
	FillerPerSec float64 `json:"filler_upserts_per_s,omitempty"`

	// DeliverSeconds is the time from the first due time (backlog: from
	// the subscribers connecting) to the last ack.
	DeliverSeconds    float64 `json:"deliver_s"`
	DeliveredAckedSec float64 `json:"delivered_acked_per_s"`
	// Lateness is from due time to arrival at the subscriber, by the Redis
	// clock, over the first delivery of every task.
	Lateness Summary `json:"lateness"`
	// Early counts deliveries that arrived before their due time by the
	// Redis clock (allowing for Clock.Uncertainty).
	Early int `json:"early"`
	Tally
	// AckFailed counts acks answered with anything but OK (or that failed).
	AckFailed    int `json:"ack_failed"`
	StreamErrors int `json:"stream_errors"`

	ServerCPU CPU `json:"server_cpu"`
	RedisCPU  CPU `json:"redis_cpu"`
	// ClientCPU is the delaybench process (the load generator and the
	// subscribers; for a baseline or an in-process delayd, the system
	// too) over the same phases.
	ClientCPU CPU `json:"client_cpu"`
	// Counts are the event counts over the same two phases (meter.go).
	Counts PhaseCounts `json:"counts"`
	// RedisBytesPerTask is the growth of Redis used_memory per pending
	// task, over MemTasks tasks; 0 if not measured.
	RedisBytesPerTask float64 `json:"redis_bytes_per_pending_task"`
	MemTasks          int     `json:"mem_tasks"`
	// MySQLBytesPerTask (durable mode) is the growth of data_length +
	// index_length of the run's MySQL database per pending task, after
	// ANALYZE TABLE; 0 if not measured. MySQLHistoryBytesPerTask is the
	// growth of the history tables (delayd_task_events,
	// delayd_task_history) per task once every task was acked.
	MySQLBytesPerTask        float64 `json:"mysql_bytes_per_pending_task,omitempty"`
	MySQLHistoryBytesPerTask float64 `json:"mysql_history_bytes_per_task,omitempty"`

	Clock Clock `json:"clock"`
	// WallSeconds is the whole run, setup and cleanup included.
	WallSeconds float64 `json:"wall_s"`
}

// env is what a run needs besides the system under test.
type env struct {
	clock    Clock
	redis    *RedisProbe // nil: no Redis figures
	progress *Progress   // nil: quiet
}

// runSink implements sink for one run.
type runSink struct {
	tracker     *Tracker
	dues        []int64 // Unix ms by the Redis clock, per task
	lateness    []time.Duration
	clock       Clock
	early       atomic.Int64
	ackedOK     atomic.Int64
	ackFailed   atomic.Int64
	lastAck     atomic.Int64 // Unix ns, local
	lastChange  atomic.Int64 // Unix ns, local
	earlyWindow time.Duration
}

func (s *runSink) delivered(_ string, id string, at time.Time) {
	s.lastChange.Store(at.UnixNano())
	i, n := s.tracker.Deliver(id)
	if n == 0 {
		return
	}
	l := s.clock.At(at).Sub(time.UnixMilli(s.dues[i]))
	if l < -s.earlyWindow {
		s.early.Add(1)
	}
	if n == 1 {
		s.lateness[i] = l
	}
}

func (s *runSink) acked(n, failed int, at time.Time) {
	s.ackedOK.Add(int64(n))
	s.ackFailed.Add(int64(failed))
	s.lastAck.Store(at.UnixNano())
	s.lastChange.Store(at.UnixNano())
}

// newRunSink returns the sink of a run of n tasks.
func newRunSink(n int, clock Clock) *runSink {
	return &runSink{
		tracker:     NewTracker(n),
		dues:        make([]int64, n),
		lateness:    make([]time.Duration, n),
		clock:       clock,
		earlyWindow: clock.Uncertainty,
	}
}

// assignDues sets every task's due time for a load that starts at
// loadStart (Redis clock) and returns the first and the last.
func (s *runSink) assignDues(loadStart time.Time, w Workload) (first, last time.Time) {
	first = loadStart.Add(w.Lead)
	for i := range s.dues {
		if w.Backlog {
			s.dues[i] = loadStart.Add(-time.Second).UnixMilli()
		} else {
			s.dues[i] = first.Add(time.Duration(int64(w.Spread) * int64(i) / int64(w.Tasks))).UnixMilli()
		}
	}
	return first, time.UnixMilli(s.dues[len(s.dues)-1])
}

// tally sets res's delivery check, ack failures and lateness from what
// the sink saw.
func (s *runSink) tally(res *Result) {
	res.Tally = s.tracker.Tally()
	res.Early = int(s.early.Load())
	if res.Early+res.Duplicates+res.Lost+res.Unknown > 0 {
		res.Violations = fmt.Sprintf("%d early, %d duplicate, %d lost, %d unknown deliveries", res.Early, res.Duplicates, res.Lost, res.Unknown)
	}
	res.AckFailed = int(s.ackFailed.Load())
	var lat []time.Duration
	for i := range s.lateness {
		if s.tracker.counts[i].Load() > 0 {
			lat = append(lat, s.lateness[i])
		}
	}
	res.Lateness = Summarize(lat)
}

// runNamespaces returns n fresh namespace names for one run.
func runNamespaces(n int) []string {
	run := randomSuffix(5)
	nss := make([]string, n)
	for i := range nss {
		nss[i] = fmt.Sprintf("dbench-%s-%d", run, i)
	}
	return nss
}

// randomSuffix returns n random bytes in hex.
func randomSuffix(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// runWorkload runs w once on sys and returns what it measured. Setup
// errors end the run early with Result.Error set; the stores are cleaned up
// in every case.
func runWorkload(ctx context.Context, e env, sys system, w Workload) (res Result) {
	w = w.withDefaults()
	wallStart := time.Now()
	res = Result{Workload: w.Name, System: sys.name(), Params: w, Clock: e.clock, UpsertMode: "unary"}
	switch {
	case !w.unary():
		res.UpsertMode = "batch"
	case sys.name() == SystemDelaydSDK:
		res.UpsertMode = "sdk" // unary Client.Upsert calls, batched by the SDK
	}
	nss := runNamespaces(w.Namespaces)
	res.Namespaces = nss
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := sys.cleanup(cctx, nss); err != nil && res.Error == "" {
			res.Error = "cleanup: " + err.Error()
		}
		res.WallSeconds = time.Since(wallStart).Seconds()
	}()
	fail := func(err error) Result {
		res.Error = err.Error()
		return res
	}
	if err := sys.setup(ctx, nss); err != nil {
		return fail(err)
	}
	e.progress.begin(fmt.Sprintf("%s/%s", w.Name, sys.name()))
	defer e.progress.end()
	if e.redis != nil {
		if err := e.redis.WaitLazyFree(ctx, 2*time.Minute); err != nil {
			return fail(err)
		}
	}

	if err := loadFiller(ctx, e, sys, w, nss, &res); err != nil {
		return fail(err)
	}

	sk := newRunSink(w.Tasks, e.clock)
	var stop func()
	consume := func() error {
		var err error
		stop, err = sys.consume(ctx, nss, w.Subscribers, w.MaxInFlight, sk)
		return err
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	if !w.Backlog {
		if err := consume(); err != nil {
			return fail(fmt.Errorf("subscribe: %w", err))
		}
	}

	// The measured load.
	ds, _ := sys.(*delaydSystem)
	before := readSizes(ctx, e, ds)
	startLog, err := e.slowlogStart(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := e.slowlogStop(context.WithoutCancel(ctx)); err != nil && res.Error == "" {
			res.Error = err.Error()
		}
	}()
	m := meter{e: e, sys: sys, svcPID: sys.pid()}
	r0 := m.read(ctx)
	firstDue, lastDue := sk.assignDues(e.clock.Now(), w)
	if err := loadTasks(ctx, e, sys, w, nss, sk, &res); err != nil {
		return fail(err)
	}
	r1 := m.read(ctx)
	// Reading the slowlog also frees its memory before Redis's is read;
	// neither falls in a measured window.
	loadLog, err := e.slowlogDrain(ctx)
	if err != nil {
		return fail(err)
	}
	res.Counts.Load = counts(r0, r1, startLog, loadLog)
	if sk.tracker.Delivered() == 0 {
		before.pendingGrowth(ctx, e, ds, w, &res)
	}
	r2 := m.read(ctx)
	loadEnd := time.Now()

	// Deliveries.
	drainStart := e.clock.At(time.Now())
	if w.Backlog {
		if err := consume(); err != nil {
			return fail(fmt.Errorf("subscribe: %w", err))
		}
	} else {
		drainStart = firstDue
	}
	e.progress.phase("deliver", int64(w.Tasks))
	e.progress.track(sk)
	res.Error = waitDelivered(ctx, e, w, sk, lastDue)
	r3 := m.read(ctx)
	deliverLog, err := e.slowlogDrain(ctx)
	if err != nil && res.Error == "" {
		res.Error = err.Error()
	}
	res.Counts.Deliver = counts(r2, r3, loadLog, deliverLog)
	if res.Error == "" {
		// Keep listening briefly: a duplicate would show up now.
		time.Sleep(w.Grace)
	}
	stop()
	stop = nil
	// What MySQL keeps of the tasks once they are acked: the event log
	// and the acked-task history.
	if before.sqlOK && res.Error == "" {
		if after, ok := ds.mysqlSizesOrNil(ctx); ok {
			res.MySQLHistoryBytesPerTask = float64(after.total(historyTables...)-before.sql.total(historyTables...)) / float64(w.Tasks)
		}
	}

	sk.tally(&res)
	if ds != nil {
		res.StreamErrors = int(ds.streamErrs.Load())
	}
	fillCPU(&res, r0, r1, r2, r3, sk.deliveryRate(&res, e.clock, drainStart, loadEnd))
	return res
}

// deliveryRate sets res's delivery time and rate, from drainStart (Redis
// clock) to the last ack, and returns the delivery phase's length, from
// loadEnd (local clock) to the last ack (or now, if nothing was acked).
func (s *runSink) deliveryRate(res *Result, clock Clock, drainStart, loadEnd time.Time) time.Duration {
	lastAck := time.Unix(0, s.lastAck.Load())
	if s.lastAck.Load() != 0 {
		res.DeliverSeconds = clock.At(lastAck).Sub(drainStart).Seconds()
		if res.DeliverSeconds > 0 {
			res.DeliveredAckedSec = float64(s.ackedOK.Load()) / res.DeliverSeconds
		}
	}
	wall := lastAck.Sub(loadEnd)
	if s.lastAck.Load() == 0 || wall <= 0 {
		wall = time.Since(loadEnd)
	}
	return wall
}

// loadFiller upserts w.Filler far-future tasks (due in 2 h) so that the
// measured tasks run against a large pending set, and measures Redis
// memory per pending task on them.
func loadFiller(ctx context.Context, e env, sys system, w Workload, nss []string, res *Result) error {
	if w.Filler <= 0 {
		return nil
	}
	memStart := e.memory(ctx)
	e.progress.phase("filler", int64(w.Filler))
	fillerDue := time.UnixMilli(e.clock.Now().Add(2 * time.Hour).UnixMilli())
	t0 := time.Now()
	err := produce(ctx, w.Filler, 1000, max(w.Producers, 4), nss, func(ctx context.Context, ns string, lo, hi int) error {
		items := make([]item, 0, hi-lo)
		for i := lo; i < hi; i++ {
			items = append(items, item{id: "f" + itoa(i), due: fillerDue})
		}
		err := sys.upsert(ctx, ns, items, make([]byte, w.FillerPayloadBytes), false)
		e.progress.add(int64(hi - lo))
		return err
	})
	if err != nil {
		return fmt.Errorf("filler load: %w", err)
	}
	res.FillerPerSec = float64(w.Filler) / time.Since(t0).Seconds()
	if memStart > 0 {
		if m := e.memory(ctx); m > 0 {
			res.RedisBytesPerTask = float64(m-memStart) / float64(w.Filler)
			res.MemTasks = w.Filler
		}
	}
	return nil
}

// loadTasks upserts the run's tasks (due as sk says) and sets the load
// figures of res.
func loadTasks(ctx context.Context, e env, sys system, w Workload, nss []string, sk *runSink, res *Result) error {
	var afterDue atomic.Int64
	payload := make([]byte, w.PayloadBytes)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	e.progress.phase("upsert", int64(w.Tasks))
	t0 := time.Now()
	err := produce(ctx, w.Tasks, max(w.Batch, 1), w.Producers, nss, func(ctx context.Context, ns string, lo, hi int) error {
		items := make([]item, 0, hi-lo)
		for i := lo; i < hi; i++ {
			items = append(items, item{id: TaskID(i), due: time.UnixMilli(sk.dues[i])})
		}
		if err := sys.upsert(ctx, ns, items, payload, w.unary()); err != nil {
			return err
		}
		e.progress.add(int64(hi - lo))
		if !w.Backlog {
			now := e.clock.Now().UnixMilli()
			for i := lo; i < hi; i++ {
				if sk.dues[i] < now {
					afterDue.Add(1)
				}
			}
		}
		return nil
	})
	loadDur := time.Since(t0)
	if err != nil {
		return fmt.Errorf("upsert: %w", err)
	}
	res.UpsertSeconds = loadDur.Seconds()
	res.UpsertsPerSec = float64(w.Tasks) / loadDur.Seconds()
	res.UpsertedAfterDue = int(afterDue.Load())
	return nil
}

// waitDelivered waits until every task was delivered and acked, and
// returns "" then; or why it stopped waiting: the context ended, or
// nothing was delivered or acked for w.Stall, counted from the last
// delivery or ack, or from the last due time if that is later.
func waitDelivered(ctx context.Context, e env, w Workload, sk *runSink, lastDue time.Time) string {
	sk.lastChange.Store(time.Now().UnixNano())
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return "interrupted: " + ctx.Err().Error()
		case <-tick.C:
		}
		if sk.tracker.Delivered() >= int64(w.Tasks) && sk.ackedOK.Load() >= int64(w.Tasks) {
			return ""
		}
		since := time.Unix(0, sk.lastChange.Load())
		if due := lastDue.Add(-e.clock.Offset); due.After(since) {
			since = due
		}
		if time.Since(since) > w.Stall {
			return fmt.Sprintf("stalled: nothing delivered or acked for %s", w.Stall)
		}
	}
}

// sizes are Redis's memory and a durable delayd's MySQL table sizes at
// one instant.
type sizes struct {
	mem   int64 // 0: not read
	sql   tableBytes
	sqlOK bool
}

// readSizes reads them (ds is nil for a system that is not delayd).
func readSizes(ctx context.Context, e env, ds *delaydSystem) sizes {
	sql, ok := ds.mysqlSizesOrNil(ctx)
	return sizes{mem: e.memory(ctx), sql: sql, sqlOK: ok}
}

// pendingGrowth sets res's Redis and MySQL bytes per pending task from
// the growth since b, over the run's tasks (call it while nothing was
// delivered, outside the CPU windows: ANALYZE TABLE runs first). Below
// 1,000 tasks the namespace's fixed keys outweigh the tasks; with filler
// tasks, Redis's was measured on them.
func (b sizes) pendingGrowth(ctx context.Context, e env, ds *delaydSystem, w Workload, res *Result) {
	if w.Tasks < 1000 {
		return
	}
	if w.Filler == 0 && b.mem > 0 {
		if mem := e.memory(ctx); mem > 0 {
			res.RedisBytesPerTask = float64(mem-b.mem) / float64(w.Tasks)
			res.MemTasks = w.Tasks
		}
	}
	if b.sqlOK {
		if after, ok := ds.mysqlSizesOrNil(ctx); ok {
			res.MySQLBytesPerTask = float64(after.total()-b.sql.total()) / float64(w.Tasks)
		}
	}
}

// memory returns Redis used_memory, or 0 when it cannot be read.
func (e env) memory(ctx context.Context) int64 {
	if e.redis == nil {
		return 0
	}
	m, err := e.redis.UsedMemory(ctx)
	if err != nil {
		return 0
	}
	return m
}

// redisCPU returns the Redis server's CPU time, or -1 when it cannot be read.
func (e env) redisCPU(ctx context.Context) time.Duration {
	if e.redis == nil {
		return -1
	}
	d, err := e.redis.CPU(ctx)
	if err != nil {
		return -1
	}
	return d
}

// produce runs producers goroutines that call fn for chunks [lo, hi) of
// tasks 0..n-1 of at most batch tasks each; chunk c goes to namespace
// nss[c % len(nss)]. It returns the first error and stops the others.
func produce(ctx context.Context, n, batch, producers int, nss []string, fn func(ctx context.Context, ns string, lo, hi int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := (n + batch - 1) / batch
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c := int(next.Add(1) - 1)
				if c >= chunks {
					return
				}
				lo := c * batch
				hi := min(lo+batch, n)
				if err := fn(ctx, nss[c%len(nss)], lo, hi); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return firstErr
}

// itoa is strconv.Itoa.
func itoa(i int) string { return strconv.Itoa(i) }

// CostPerTask is CPU per task over load and delivery, in microseconds: of
// Redis, of the service (with --server child, delayd alone), and of the
// delaybench process. Zero where not measured.
type CostPerTask struct {
	Redis, Service, Client float64
}

// Cost returns the run's CPU per task (see CostPerTask).
func (r *Result) Cost() CostPerTask {
	n := float64(r.Params.Tasks)
	if n <= 0 {
		return CostPerTask{}
	}
	us := func(c CPU) float64 { return (c.Load + c.Deliver) * 1e6 / n }
	return CostPerTask{Redis: us(r.RedisCPU), Service: us(r.ServerCPU), Client: us(r.ClientCPU)}
}

// DeliverCost is CostPerTask over the delivery phase alone (from the end
// of the load to the last ack): what delivering and acking a task costs,
// without its upsert.
func (r *Result) DeliverCost() CostPerTask {
	n := float64(r.Params.Tasks)
	if n <= 0 {
		return CostPerTask{}
	}
	us := func(c CPU) float64 { return c.Deliver * 1e6 / n }
	return CostPerTask{Redis: us(r.RedisCPU), Service: us(r.ServerCPU), Client: us(r.ClientCPU)}
}

// mysqlNote says what a durable row measured in MySQL, or "".
func (r *Result) mysqlNote() string {
	if r.MySQLBytesPerTask == 0 && r.MySQLHistoryBytesPerTask == 0 {
		return ""
	}
	return fmt.Sprintf("%s/%s: MySQL %.0f B per pending task (data_length + index_length of the run's database after ANALYZE TABLE, growth over the load); the history tables (delayd_task_events, delayd_task_history) grew %.0f B per task by the end of the run.",
		r.Workload, r.System, r.MySQLBytesPerTask, r.MySQLHistoryBytesPerTask)
}
