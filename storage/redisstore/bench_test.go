package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// BenchmarkUpsertBatch measures batched upserts of 1,000 tasks with
// 100-byte payloads against the test Redis (go test -bench UpsertBatch).
func BenchmarkUpsertBatch(b *testing.B) {
	s := New(testRedisClient(b), Options{})
	ctx := context.Background()
	ns := testkit.Namespace(b, "bench")
	b.Cleanup(func() { s.rdb.Del(context.Background(), allKeys(keysFor(ns, 0))...) })
	payload := make([]byte, 100)
	specs := make([]storage.UpsertSpec, MaxBatch)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range specs {
			specs[j] = storage.UpsertSpec{ID: fmt.Sprintf("t%d-%d", i%100, j), Payload: payload, Delay: time.Hour}
		}
		if _, err := s.Upsert(ctx, ns, specs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*MaxBatch)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkPopAck measures the delivery path: pop 100 due tasks into a
// lease, then ack them, against the test Redis.
func BenchmarkPopAck(b *testing.B) {
	s := New(testRedisClient(b), Options{})
	ctx := context.Background()
	ns := testkit.Namespace(b, "bench")
	b.Cleanup(func() { s.rdb.Del(context.Background(), allKeys(keysFor(ns, 0))...) })
	payload := make([]byte, 100)
	const batch = 100
	specs := make([]storage.UpsertSpec, batch)
	toks := make([]storage.Token, 0, batch)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range specs {
			specs[j] = storage.UpsertSpec{ID: fmt.Sprintf("t%d-%d", i, j), Payload: payload}
		}
		if _, err := s.Upsert(ctx, ns, specs); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: batch, LeaseFor: time.Minute})
		if err != nil || len(ds) != batch {
			b.Fatalf("pop: %d, %v", len(ds), err)
		}
		toks = toks[:0]
		for _, d := range ds {
			toks = append(toks, d.Token)
		}
		if _, err := s.Ack(ctx, ns, toks); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkRedisCPUPerTask measures what each step of a task's life costs
// Redis: the CPU of a private redis-server's main thread (INFO cpu) per
// task, for batched upserts (1,000 per call, 100-byte payloads, due at
// once), pops (PopBatch-sized: 256 per call) and acks (500 tokens per
// call) of b.N × 10,000 tasks. Unlike wall time it is barely moved by
// other load on the machine, so before/after pairs of a script change can
// be compared (go test -run X -bench RedisCPUPerTask ./storage/redisstore/).
func BenchmarkRedisCPUPerTask(b *testing.B) {
	srv := testkit.StartRedis(b)
	c := srv.Client()
	s := New(c, Options{})
	ctx := context.Background()
	const n = 10_000
	cpu := func() time.Duration { return mainThreadCPU(b, c) }
	payload := make([]byte, 100)
	var up, pop, ack time.Duration
	tasks := 0
	for i := 0; b.Loop(); i++ {
		ns := fmt.Sprintf("cpu%d", i)
		specs := make([]storage.UpsertSpec, MaxBatch)
		t0 := cpu()
		for lo := 0; lo < n; lo += MaxBatch {
			for j := range specs {
				specs[j] = storage.UpsertSpec{ID: "t" + strconv.Itoa(lo+j), Payload: payload}
			}
			if _, err := s.Upsert(ctx, ns, specs); err != nil {
				b.Fatal(err)
			}
		}
		t1 := cpu()
		var toks []storage.Token
		for len(toks) < n {
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 256, LeaseFor: time.Minute})
			if err != nil || len(ds) == 0 {
				b.Fatalf("pop: %d, %v", len(ds), err)
			}
			for _, d := range ds {
				toks = append(toks, d.Token)
			}
		}
		t2 := cpu()
		for lo := 0; lo < len(toks); lo += 500 {
			st, err := s.Ack(ctx, ns, toks[lo:min(lo+500, len(toks))])
			if err != nil || st[0] != storage.TokenOK {
				b.Fatalf("ack: %v, %v", st, err)
			}
		}
		t3 := cpu()
		up, pop, ack = up+t1-t0, pop+t2-t1, ack+t3-t2
		tasks += n
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(tasks) }
	b.ReportMetric(per(up), "upsert-µs/task")
	b.ReportMetric(per(pop), "pop-µs/task")
	b.ReportMetric(per(ack), "ack-µs/task")
	b.ReportMetric(per(up+pop+ack), "redis-µs/task")
}

// BenchmarkOneTaskCalls measures the fixed price of a store call on the
// steady-traffic path, one task per call (issue 37): a one-task Upsert, a
// one-task Pop and a one-token Ack against an idle private redis-server,
// with 1,000 tasks scheduled an hour ahead so the sets are not empty. It
// reports, per call, Redis's own time (INFO commandstats: the script
// command's usec, which includes the commands the script calls) and the
// redis.calls the script made (the commandstats calls of every other
// command), for the library's functions (FCALL) and, in the same rounds so
// the machine's load moves both alike, for its EVALSHA build ("evalsha-");
// "best-" is the round of 1,000 calls least disturbed by other load:
// a change to the scripts or to how they are loaded is compared in counts
// as well as in µs (go test -run X -bench OneTaskCalls ./storage/redisstore/).
func BenchmarkOneTaskCalls(b *testing.B) {
	srv := testkit.StartRedis(b)
	srv.Prioritize()
	c := srv.Client()
	ctx := context.Background()
	fn := New(c, Options{NoCoalesce: true})
	if err := fn.LoadLibrary(ctx); err != nil {
		b.Fatal(err)
	}
	ev := New(c, Options{NoCoalesce: true})
	ev.loader.useEvalsha(nil)
	payload := make([]byte, 100)
	modes := []struct {
		name  string
		s     *Store
		costs [5]callCost // upsert, pop, ack, a pop that carries an ack, a pop with a request id
	}{{name: "", s: fn}, {name: "evalsha-", s: ev}}
	for i, m := range modes {
		ns := "onetask" + strconv.Itoa(i)
		var future []storage.UpsertSpec
		for i := range MaxBatch {
			future = append(future, storage.UpsertSpec{ID: "later-" + strconv.Itoa(i), Payload: payload, Delay: time.Hour})
		}
		if _, err := m.s.Upsert(ctx, ns, future); err != nil {
			b.Fatal(err)
		}
		// Once through each call first: the scripts are loaded before
		// anything is counted.
		oneTaskRound(b, c, m.s, ns, "warm", 1, payload, nil)
	}
	for r := 0; b.Loop(); r++ {
		for i := range modes {
			oneTaskRound(b, c, modes[i].s, "onetask"+strconv.Itoa(i), "r"+strconv.Itoa(r), 1000, payload, &modes[i].costs)
		}
	}
	for _, m := range modes {
		for i, op := range []string{"upsert", "pop", "ack", "popack", "popid"} {
			m.costs[i].report(b, m.name+op)
		}
	}
}

// oneTaskRound makes n one-task upserts of tasks due at once, n one-task
// pops and n one-token acks of them; then n more upserts and n one-task
// pops each carrying the ack of the task before (as a wake of a steady
// flow does, issue 37 item 3); then n more upserts and n one-task pops
// with a request id each (as the dispatcher's pops, issue 38). It adds
// what each kind cost Redis to costs (if not nil).
func oneTaskRound(b *testing.B, c *redis.Client, s *Store, ns, round string, n int, payload []byte, costs *[5]callCost) {
	ctx := context.Background()
	measure := func(i int, f func()) {
		if costs == nil {
			f()
			return
		}
		costs[i].add(b, c, f, n)
	}
	measure(0, func() {
		for i := range n {
			id := round + "-" + strconv.Itoa(i)
			if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: payload}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	toks := make([]storage.Token, 0, n)
	measure(1, func() {
		for range n {
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
			if err != nil || len(ds) != 1 {
				b.Fatalf("pop: %d, %v", len(ds), err)
			}
			toks = append(toks, ds[0].Token)
		}
	})
	measure(2, func() {
		for _, t := range toks {
			st, err := s.Ack(ctx, ns, []storage.Token{t})
			if err != nil || st[0] != storage.TokenOK {
				b.Fatalf("ack: %v, %v", st, err)
			}
		}
	})
	for i := range n {
		id := round + "-r" + strconv.Itoa(i)
		if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: payload}}); err != nil {
			b.Fatal(err)
		}
	}
	sh := s.shardOfN(ns, 0, 1)
	ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute})
	if err != nil || len(ds) != 1 {
		b.Fatalf("pop: %d, %v", len(ds), err)
	}
	prev := ds[0].Token
	measure(3, func() {
		for i := 1; i < n; i++ {
			ack := &settleCall{ctx: ctx, tokens: []storage.Token{prev}}
			r, err := sh.popWith(ctx, storage.PopParams{Limit: 1, LeaseFor: time.Minute}, newSection([]*settleCall{ack}))
			if err != nil || len(r.Deliveries) != 1 || ack.statuses[0] != storage.TokenOK {
				b.Fatalf("pop carrying an ack: %d, %v, %v", len(r.Deliveries), ack.statuses, err)
			}
			prev = r.Deliveries[0].Token
		}
		if _, err := s.Ack(ctx, ns, []storage.Token{prev}); err != nil { // the last task's, alone
			b.Fatal(err)
		}
	})
	for i := range n {
		id := round + "-i" + strconv.Itoa(i)
		if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: id, Payload: payload}}); err != nil {
			b.Fatal(err)
		}
	}
	toks = toks[:0]
	measure(4, func() {
		for i := range n {
			ds, err := s.Pop(ctx, ns, storage.PopParams{Limit: 1, LeaseFor: time.Minute, RequestID: round + "-" + strconv.Itoa(i)})
			if err != nil || len(ds) != 1 {
				b.Fatalf("pop with a request id: %d, %v", len(ds), err)
			}
			toks = append(toks, ds[0].Token)
		}
	})
	if _, err := s.Ack(ctx, ns, toks); err != nil {
		b.Fatal(err)
	}
}

// callCost sums what calls of one kind cost Redis (commandStats deltas).
type callCost struct {
	calls, usec, inner int64
	// best is the lowest usec per call of one add (one round): the round
	// the machine's other load disturbed least.
	best float64
}

// add runs f, which makes n store calls of one kind and nothing else, and
// adds what Redis counted meanwhile. Each store call must be exactly one
// script call.
func (cc *callCost) add(b *testing.B, c *redis.Client, f func(), n int) {
	b.Helper()
	before := commandStats(b, c)
	f()
	after := commandStats(b, c)
	var scripts, usec, inner int64
	for name, a := range after {
		d := a.calls - before[name].calls
		switch name {
		case "evalsha", "eval", "fcall", "fcall_ro":
			scripts += d
			usec += a.usec - before[name].usec
		case "info", "script|load", "function|load":
		default:
			inner += d
		}
	}
	if scripts != int64(n) {
		b.Fatalf("%d script calls for %d store calls; want one each", scripts, n)
	}
	cc.calls += scripts
	cc.usec += usec
	cc.inner += inner
	if per := float64(usec) / float64(scripts); cc.best == 0 || per < cc.best {
		cc.best = per
	}
}

// report reports µs and redis.calls per script call.
func (cc *callCost) report(b *testing.B, name string) {
	if cc.calls == 0 {
		return
	}
	b.ReportMetric(float64(cc.usec)/float64(cc.calls), name+"-µs/call")
	b.ReportMetric(cc.best, name+"-best-µs/call")
	b.ReportMetric(float64(cc.inner)/float64(cc.calls), name+"-redis.calls/call")
}

// mainThreadCPU is the CPU time Redis's main thread has used (INFO cpu).
func mainThreadCPU(b *testing.B, c *redis.Client) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user_main_thread" || k == "used_cpu_sys_main_thread" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += time.Duration(f * float64(time.Second))
		}
	}
	return total
}

type cmdStat struct{ calls, usec int64 }

// commandStats reads INFO commandstats: per command, its calls and usec.
func commandStats(b testing.TB, c *redis.Client) map[string]cmdStat {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || name == line {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[name] = st
	}
	return out
}
