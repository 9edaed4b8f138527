package bench

import (
	"github.com/delayd/delayd/internal/testkit"

	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// runReport runs cfg (which must ask for JSON) and returns its report.
func runReport(t *testing.T, cfg Config) Report {
	t.Helper()
	var out bytes.Buffer
	if err := Run(context.Background(), cfg, &out, io.Discard); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, out.String())
	}
	return rep
}

// A tiny run through the whole tool — an in-process delayd on the test
// Redis and the baseline poller beside it, a spread and a backlog workload —
// delivers every task exactly once and never early, and leaves no key
// behind. Timing is not asserted.
func TestSmokeTinyRunLosesNothing(t *testing.T) {
	t.Parallel()
	url := testkit.RedisURL()
	rdb := testRedis(t)
	spread := Workload{Tasks: 300, Spread: 300 * time.Millisecond, Lead: time.Second, PayloadBytes: 100,
		Namespaces: 2, Producers: 4, Subscribers: 3, MaxInFlight: 50}
	cases := []struct {
		name     string
		override func(*Workload)
	}{
		{"spread", func(w *Workload) { *w = spread; w.Name = "custom" }},
		{"backlog", func(w *Workload) {
			*w = spread
			w.Name, w.Backlog, w.Batch, w.Filler, w.FillerPayloadBytes = "custom", true, 64, 500, 16
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{
				Workloads: []string{"custom"}, Systems: []string{SystemDelayd, SystemBaseline10ms},
				Server: "inproc", RedisURL: url, MySQLDSN: "root@tcp(127.0.0.1:3306)/",
				BaselineBatch: 50, Conns: 2, AckBatch: 20, JSON: true, Quiet: true,
				Timeout: 2 * time.Minute, Override: c.override,
			}
			rep := runReport(t, cfg)
			if len(rep.Results) != 2 {
				t.Fatalf("%d results, want 2 (delayd and baseline)", len(rep.Results))
			}
			for _, r := range rep.Results {
				if r.Error != "" || r.Skipped != "" {
					t.Errorf("%s: error %q skipped %q", r.System, r.Error, r.Skipped)
				}
				want := Tally{Expected: 300, Delivered: 300}
				if r.Tally != want {
					t.Errorf("%s: tally %+v, want %+v", r.System, r.Tally, want)
				}
				if r.Early != 0 || r.AckFailed != 0 || r.Lateness.N != 300 {
					t.Errorf("%s: %d early, %d acks failed, lateness over %d tasks", r.System, r.Early, r.AckFailed, r.Lateness.N)
				}
				if r.Command == "" {
					t.Errorf("%s: no reproduce command", r.System)
				}
				if c.name == "backlog" && (r.MemTasks != 500 || r.RedisBytesPerTask <= 0) {
					// Memory is measured on the shared Redis, so its value
					// is noisy; it must at least have been measured.
					t.Logf("%s: memory per task %.0f over %d tasks", r.System, r.RedisBytesPerTask, r.MemTasks)
				}
				for _, ns := range r.Namespaces {
					keys, _, err := rdb.Scan(context.Background(), 0, "*"+ns+"*", 1_000_000).Result()
					if err != nil || len(keys) != 0 {
						t.Errorf("%s: keys left for %s: %v %v", r.System, ns, keys, err)
					}
				}
			}
			if len(rep.Ratios) != 1 || rep.Ratios[0].Against != SystemBaseline10ms {
				t.Errorf("ratios = %+v, want delayd vs baseline-10ms", rep.Ratios)
			}
		})
	}
}

// A sparse run — one task due well after the load, nothing happening
// before — must wait for it rather than call the quiet time a stall.
func TestSparseRunWaitsForLateDueTask(t *testing.T) {
	t.Parallel()
	url := testkit.RedisURL()
	cfg := Config{
		Workloads: []string{"custom"}, Systems: []string{SystemDelayd, SystemBaseline10ms},
		Server: "inproc", RedisURL: url, MySQLDSN: "root@tcp(127.0.0.1:3306)/",
		BaselineBatch: 50, JSON: true, Quiet: true, Timeout: time.Minute,
		Override: func(w *Workload) {
			*w = Workload{Name: "custom", Tasks: 1, Lead: 2 * time.Second, Stall: 500 * time.Millisecond}
		},
	}
	rep := runReport(t, cfg)
	for _, r := range rep.Results {
		if r.Error != "" || r.Lost != 0 || r.Delivered != 1 {
			t.Errorf("%s: error %q, delivered %d, lost %d", r.System, r.Error, r.Delivered, r.Lost)
		}
	}
}

// --own-redis-cluster with --shards: a tiny backlog run on a private
// 3-master cluster, namespaces of 6 shards, delivers every task exactly
// once, measures Redis CPU and memory over the masters, skips the baseline
// (one Redis only), and its reproduce command names both flags.
func TestSmokeOwnClusterShards(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Workloads: []string{"custom"}, Systems: []string{SystemDelayd, SystemBaseline10ms},
		Server: "inproc", OwnRedisCluster: 3, Shards: 6, RedisServerBin: "redis-server", Slowlog: true,
		MySQLDSN: "root@tcp(127.0.0.1:3306)/", BaselineBatch: 50, Conns: 2, AckBatch: 20, JSON: true, Quiet: true,
		Timeout: 2 * time.Minute, Override: func(w *Workload) {
			*w = Workload{Name: "custom", Tasks: 300, Backlog: true, Batch: 64, PayloadBytes: 100,
				Namespaces: 2, Producers: 2, Subscribers: 2, MaxInFlight: 50}
		},
	}
	rep := runReport(t, cfg)
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	d, b := rep.Results[0], rep.Results[1]
	if d.Error != "" || d.Skipped != "" || d.Tally != (Tally{Expected: 300, Delivered: 300}) || d.Early != 0 {
		t.Errorf("delayd on the cluster: error %q skipped %q tally %+v early %d", d.Error, d.Skipped, d.Tally, d.Early)
	}
	if d.RedisCPU.Load+d.RedisCPU.Deliver <= 0 {
		t.Errorf("Redis CPU over the masters = %+v, want > 0", d.RedisCPU)
	}
	// Counts are summed over the masters; their slowlogs cover every
	// command their statistics count.
	if c := d.Counts.Deliver; c.Redis == nil || scriptCalls(c.RedisSent, "pop") == 0 || c.RedisLogged != sumCalls(c.RedisCommands) {
		t.Errorf("delayd on the cluster, delivery counts: redis %v, pops %d, %d logged of %d commands",
			c.Redis, scriptCalls(c.RedisSent, "pop"), c.RedisLogged, sumCalls(c.RedisCommands))
	}
	if !strings.Contains(d.Command, "--own-redis-cluster=3") || !strings.Contains(d.Command, "--shards=6") {
		t.Errorf("command %q does not name --own-redis-cluster=3 --shards=6", d.Command)
	}
	if b.Skipped == "" {
		t.Errorf("baseline on a cluster: not skipped (%+v)", b)
	}
}

// The gRPC floor (--floor) runs its six rows to completion — every drain
// row receives every task it was fed — prints one table row each, and
// leaves no key behind.
func TestSmokeFloor(t *testing.T) {
	t.Parallel()
	rdb := testRedis(t)
	cfg := Config{Server: "inproc", RedisURL: testkit.RedisURL(), MySQLDSN: "root@tcp(127.0.0.1:3306)/",
		BaselineBatch: 50, Conns: 2, AckBatch: 20, Quiet: true, Timeout: 2 * time.Minute}
	cfg.Floor.Rounds, cfg.Floor.Tasks = 2, 1000
	floorKeys := func() map[string]bool {
		ks, err := rdb.Keys(context.Background(), "delaybench:{delaybench-floor-*").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, k := range ks {
			m[k] = true
		}
		return m
	}
	before := floorKeys()
	var out bytes.Buffer
	if err := Run(context.Background(), cfg, &out, io.Discard); err != nil {
		t.Fatalf("Run --floor: %v\n%s", err, out.String())
	}
	var rows []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| unary |") || strings.HasPrefix(l, "| drain |") {
			rows = append(rows, l)
		}
	}
	if len(rows) != 6 {
		t.Fatalf("%d table rows, want 6 (3 unary, 3 drain):\n%s", len(rows), out.String())
	}
	for _, r := range rows[:1] {
		if !strings.Contains(r, "| 1.00× |") {
			t.Errorf("the first row is the source design, ratio 1.00×: %s", r)
		}
	}
	for k := range floorKeys() {
		if !before[k] {
			t.Errorf("key left behind: %s", k)
		}
	}
}

// A durable run with task history on reports what MySQL holds per pending
// task and what its history tables keep per acked task (issue 28's cost
// figures); the values depend on InnoDB's page allocation, so only their
// presence is asserted.
func TestSmokeDurableMySQLBytes(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Workloads: []string{"custom"}, Systems: []string{SystemDelaydDurable},
		Server: "inproc", RedisURL: testkit.RedisURL(), MySQLDSN: "root@tcp(127.0.0.1:3306)/",
		Conns: 2, AckBatch: 100, JSON: true, Quiet: true, HistoryBytes: 1 << 20,
		Timeout: 2 * time.Minute,
		Override: func(w *Workload) {
			*w = Workload{Name: "custom", Tasks: 2000, Backlog: true, Batch: 500, PayloadBytes: 100,
				Namespaces: 1, Producers: 2, Subscribers: 2, MaxInFlight: 200}
		},
	}
	rep := runReport(t, cfg)
	if len(rep.Results) != 1 || rep.Results[0].Error != "" || rep.Results[0].Skipped != "" {
		t.Fatalf("results %+v", rep.Results)
	}
	r := rep.Results[0]
	if r.MySQLBytesPerTask <= 0 || r.MySQLHistoryBytesPerTask <= 0 {
		t.Fatalf("MySQL bytes per pending task %.0f, history bytes per task %.0f; want both measured", r.MySQLBytesPerTask, r.MySQLHistoryBytesPerTask)
	}
	t.Logf("MySQL %.0f B per pending task, history %.0f B per task", r.MySQLBytesPerTask, r.MySQLHistoryBytesPerTask)
}
