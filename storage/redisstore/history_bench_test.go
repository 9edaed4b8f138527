package redisstore

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// historyBenchEvents is how many events BenchmarkTaskHistory's namespace
// holds: 10,000 tasks with 3 events each (upserted, delivered, acked),
// each task's events a few hundred entries apart, as a busy namespace
// writes them.
const historyBenchEvents = 30_000

// BenchmarkTaskHistory measures what GetTaskHistory costs Redis per call
// over a namespace history of 30,000 events, on an idle private
// redis-server: Redis's own time (INFO commandstats usec, every command
// but INFO) and commands per call, for a task id with no events (the
// whole walk to the end of its pages, and its first call alone), for the
// oldest task and the newest, and GetTask beside them (go test -run X
// -bench TaskHistory ./storage/redisstore/).
func BenchmarkTaskHistory(b *testing.B) {
	srv := testkit.StartRedis(b)
	srv.Prioritize()
	c := srv.Client()
	s := New(c, Options{NoCoalesce: true})
	ctx := context.Background()
	const ns, inc = "histbench", 1_700_000_000_000
	var batch []storage.Event
	const tasks = historyBenchEvents / 3
	kinds := []storage.EventKind{storage.EventUpserted, storage.EventDelivered, storage.EventAcked}
	for i := range historyBenchEvents {
		// Task t's events are at i = t, t+200, t+400 (mod the window of
		// 200 tasks in flight): interleaved with other tasks'.
		w, r := i/600, i%600
		t := w*200 + r%200
		batch = append(batch, storage.Event{Kind: kinds[r/200], ID: "t" + strconv.Itoa(t), KeyID: "k"})
		if len(batch) == 500 {
			if err := s.RecordEvents(ctx, ns, storage.RecordParams{Incarnation: inc, Keep: 1 << 20, Events: batch}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "t0"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Get(ctx, ns, "t0"); err != nil { // its script loaded before anything is counted
		b.Fatal(err)
	}
	read := func(id string, whole bool) func() int {
		return func() int {
			calls, cursor, got := 0, "", 0
			for {
				evs, next, err := s.TaskHistory(ctx, ns, storage.HistoryParams{Incarnation: inc, ID: id, Limit: 100, Cursor: cursor})
				if err != nil {
					b.Fatal(err)
				}
				calls, got = calls+1, got+len(evs)
				if cursor = next; cursor == "" || !whole {
					break
				}
			}
			if want := map[bool]int{true: 0, false: 3}[id == "absent"]; whole && got != want {
				b.Fatalf("%d events of %s, want %d", got, id, want)
			}
			return calls
		}
	}
	cases := []struct {
		name string
		run  func() int
	}{
		{"absent-walk", read("absent", true)},
		{"absent-first", read("absent", false)},
		{"oldest", read("t0", true)},
		{"newest", read("t"+strconv.Itoa(tasks-1), true)},
	}
	costs := make([]redisCost, len(cases))
	var get callCost // one script call per GetTask; its usec includes the commands it calls
	for b.Loop() {
		for i, cs := range cases {
			costs[i].add(b, c, cs.run)
		}
		get.add(b, c, func() {
			if _, err := s.Get(ctx, ns, "t0"); err != nil {
				b.Fatal(err)
			}
		}, 1)
	}
	for i, cs := range cases {
		costs[i].report(b, cs.name)
	}
	get.report(b, "gettask")
}

// redisCost sums what calls of one kind cost Redis, every command counted
// (commandStats deltas, INFO itself left out): for calls that run no
// script, whose commands' usec would count twice.
type redisCost struct {
	calls, usec, commands int64
}

// add runs f, which makes store calls of one kind and nothing else and
// says how many, and adds what Redis counted meanwhile.
func (rc *redisCost) add(b *testing.B, c *redis.Client, f func() int) {
	b.Helper()
	before := commandStats(b, c)
	n := f()
	after := commandStats(b, c)
	for name, a := range after {
		if name == "info" {
			continue
		}
		rc.commands += a.calls - before[name].calls
		rc.usec += a.usec - before[name].usec
	}
	rc.calls += int64(n)
}

// report reports Redis µs and commands per store call.
func (rc *redisCost) report(b *testing.B, name string) {
	if rc.calls == 0 {
		return
	}
	b.ReportMetric(float64(rc.usec)/float64(rc.calls), name+"-µs/call")
	b.ReportMetric(float64(rc.commands)/float64(rc.calls), name+"-cmds/call")
}

// BenchmarkRecordEvents measures what recording a call's events costs
// Redis on an idle private redis-server, per RecordEvents call of 1 event
// (an UpsertTask) and of 50 (a batch): Redis's own time and commands per
// call, beside the wall time of the call (its round trips) (go test -run X
// -bench RecordEvents ./storage/redisstore/).
func BenchmarkRecordEvents(b *testing.B) {
	srv := testkit.StartRedis(b)
	srv.Prioritize()
	c := srv.Client()
	s := New(c, Options{NoCoalesce: true})
	ctx := context.Background()
	for _, size := range []int{1, 50} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			ns := "recbench" + strconv.Itoa(size)
			var cost redisCost
			next := 0
			for b.Loop() {
				evs := make([]storage.Event, size)
				for i := range evs {
					evs[i] = storage.Event{Kind: storage.EventUpserted, ID: "t" + strconv.Itoa(next), KeyID: "k"}
					next++
				}
				cost.add(b, c, func() int {
					if err := s.RecordEvents(ctx, ns, storage.RecordParams{Incarnation: 1, Keep: 10_000, Events: evs}); err != nil {
						b.Fatal(err)
					}
					return 1
				})
			}
			cost.report(b, "record")
		})
	}
}
