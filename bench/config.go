package bench

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
)

// Config is one invocation of the benchmark. RegisterFlags binds it to
// command-line flags; the zero value is not useful, use the flag defaults.
type Config struct {
	// Workloads to run, by preset name (see Presets), "all", or "custom"
	// (built from the workload flags alone).
	Workloads []string
	// Short runs the reduced set `make bench` uses (under 3 minutes).
	Short bool
	// Systems restricts the systems each workload runs on (delayd,
	// delayd-durable, baseline-1s, baseline-10ms); empty = the workload's
	// own list.
	Systems []string

	// Server is how delaybench gets its delayd: "inproc" (daemon.Start in
	// this process; CPU figures then include the load generator) or
	// "child" (the delayd binary as a child process; CPU is delayd's own).
	Server string
	// DelaydBin is the delayd binary for Server "child"; empty = go build
	// ./cmd/delayd into a temporary directory.
	DelaydBin string
	// NoOps runs delayd without its ops listener, so without any metrics
	// (--ops-listen ''), to measure what the metrics cost. Default: on, on
	// a free loopback port, as in production.
	NoOps bool
	// DelaydArgs are extra flags passed to a child delayd.
	DelaydArgs []string
	// DelaydLogLevel is a child delayd's --log-level; empty: its own
	// default. Workload runs use "warn" (RegisterFlags' default), so the
	// log costs nothing in their figures; a soak uses the default.
	DelaydLogLevel string
	// Target, if set, is an external delayd (host:port) used instead of
	// starting one; TargetPID, if set, is its pid for CPU figures.
	Target    string
	TargetPID int
	// APIKey is sent as a bearer token to delayd.
	APIKey string

	// RedisURL is the Redis delayd and the baseline use.
	RedisURL string
	// OwnRedis starts a private redis-server (RedisServerBin) instead, so
	// that no other client's load or keys disturb the figures.
	OwnRedis       bool
	RedisServerBin string
	// OwnRedisCluster, if > 0, starts a private Redis Cluster of that many
	// masters (no replicas) instead, and delayd gets redis-cluster://.
	OwnRedisCluster int
	// Shards is the shard count of the namespaces a run creates
	// (NamespacePolicy.shards); 0 = the server default (1).
	Shards int
	// HistoryBytes is the history_retention_bytes of the namespaces a run
	// creates (task history on); 0 = off.
	HistoryBytes int64
	// Slowlog, with a private Redis (OwnRedis, OwnRedisCluster), logs
	// every command Redis runs during the measured phases (SLOWLOG at
	// threshold 0) so that script calls are split by script name and
	// timed; it costs Redis about half a microsecond per command logged
	// (docs/BENCHMARKS.md). A shared Redis's slowlog is never touched.
	Slowlog bool
	// MySQLDSN is the MySQL server for durable rows, without a database
	// name: each run creates a database of its own and drops it afterwards.
	MySQLDSN string

	// Soak, when its Duration is set, runs a steady flow instead of the
	// workloads (see Soak).
	Soak Soak
	// Schedules, when its Count is set, runs recurring tasks instead of
	// the workloads (see Schedules).
	Schedules Schedules
	// Floor, if Rounds > 0, runs the gRPC floor (floor.go) instead of the
	// workloads: how close any gRPC service can get to the source design
	// on this machine.
	Floor struct {
		Rounds int
		Tasks  int
	}

	// Override changes every workload after the presets are chosen (the
	// workload flags that were given explicitly).
	Override func(*Workload)
	// OverrideArgs are those flags as given, for the reproduce commands.
	OverrideArgs []string

	// BaselineBatch is the baseline poller's pop limit.
	BaselineBatch int
	// Conns is the number of gRPC connections to delayd.
	Conns int
	// AckBatch is the most tokens per AckTasks call.
	AckBatch int
	// SDKBatch is the Go SDK's batching for the delayd-sdk system; the
	// zero value is the SDK's default.
	SDKBatch struct{ MaxOutstanding int }
	// FixedWindows makes the raw delayd rows' connections fix their gRPC
	// flow-control windows (no BDP pings), as docs/client-guide.md tells
	// the authors of stubs to; false keeps grpc-go's defaults, as
	// generated stubs have them. The delayd-sdk rows use the SDK's own
	// connection either way.
	FixedWindows bool

	// JSON prints a JSON report instead of the table.
	JSON bool
	// Markdown prints the report as Markdown (docs/BENCHMARKS.md's form).
	Markdown bool
	// JSONOut, if set, also writes the JSON report to this file.
	JSONOut string
	// Quiet turns off the progress line.
	Quiet bool
	// CPUProfile, if set, writes a CPU profile of this process (which holds
	// an in-process delayd) to that file.
	CPUProfile string
	// Timeout bounds the whole invocation.
	Timeout time.Duration
	// Logger for the benchmark's warnings. If nil, they are discarded.
	Logger *slog.Logger
	// DelaydLog receives the log of the delayd that delaybench starts (the
	// in-process one's records, a child's stderr). If nil, it is discarded.
	DelaydLog io.Writer
}

// listFlag is a comma-separated list flag.
type listFlag struct{ p *[]string }

func (l listFlag) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}
func (l listFlag) Set(s string) error {
	*l.p = nil
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*l.p = append(*l.p, f)
		}
	}
	return nil
}

// RegisterFlags binds c to flags on fs, with their defaults. The workload
// flags are kept in w; call Finish after parsing to turn the ones given
// into c.Override.
func (c *Config) RegisterFlags(fs *flag.FlagSet, w *Workload) {
	c.Workloads = []string{"all"}
	fs.Var(listFlag{&c.Workloads}, "workload", "comma-separated workloads: "+strings.Join(Presets(), ", ")+", all, or custom (only the workload flags)")
	fs.BoolVar(&c.Short, "short", false, "run the short set (under 3 minutes; what `make bench` runs)")
	fs.Var(listFlag{&c.Systems}, "systems", "comma-separated systems to run each workload on: delayd, delayd-sdk (the Go SDK), delayd-durable, baseline-1s, baseline-10ms, asynq (default: each workload's own)")
	fs.StringVar(&c.Server, "server", "inproc", "how to run delayd: inproc (in this process; CPU includes the load generator) or child (./cmd/delayd as a child process; CPU is delayd's own)")
	fs.StringVar(&c.DelaydBin, "delayd-bin", "", "delayd binary for --server child (default: go build ./cmd/delayd)")
	fs.BoolVar(&c.NoOps, "no-ops", false, "run delayd with --ops-listen '' (no ops listener, no metrics), to measure the metrics' overhead against a run without this flag")
	fs.Var(listFlag{&c.DelaydArgs}, "delayd-args", "comma-separated extra flags for a child delayd")
	fs.StringVar(&c.DelaydLogLevel, "delayd-log-level", "warn", "--log-level of a child delayd for workload runs (a soak uses --soak-log-level)")
	fs.StringVar(&c.Target, "target", "", "drive an external delayd at host:port instead of starting one")
	fs.IntVar(&c.TargetPID, "target-pid", 0, "pid of the --target delayd on this host, for its CPU figures")
	fs.StringVar(&c.APIKey, "api-key", "", "API key sent as a bearer token")
	fs.StringVar(&c.RedisURL, "redis-url", "redis://127.0.0.1:6379", "Redis for delayd and the baseline (keys go under a fresh random namespace/prefix and are deleted after; never FLUSHDB)")
	fs.BoolVar(&c.OwnRedis, "own-redis", false, "start a private redis-server on a free port instead of --redis-url (clean CPU and memory figures)")
	fs.StringVar(&c.RedisServerBin, "redis-server", "redis-server", "redis-server binary for --own-redis")
	fs.IntVar(&c.OwnRedisCluster, "own-redis-cluster", 0, "start a private Redis Cluster of this many masters (no replicas, no persistence; redis-cli joins them) instead of --redis-url; delayd uses redis-cluster://, the Redis figures sum every master; baseline rows are skipped")
	fs.BoolVar(&c.Slowlog, "slowlog", true, "with --own-redis or --own-redis-cluster: log every Redis command of the measured phases (SLOWLOG at threshold 0) to split script calls by name and time them; costs Redis ~0.5 µs per command logged")
	fs.Int64Var(&c.HistoryBytes, "history-bytes", 0, "history_retention_bytes of every namespace a delayd run creates (task history on, 65536-1073741824); 0 = off")
	fs.IntVar(&c.Shards, "shards", 0, "shards of every namespace a delayd run creates (NamespacePolicy.shards, 1-256); 0 = the server default, 1")
	fs.StringVar(&c.MySQLDSN, "mysql-dsn", "root@tcp(127.0.0.1:3306)/", "MySQL for durable rows, without a database: each run creates and drops its own")
	fs.IntVar(&c.BaselineBatch, "baseline-batch", 200, "baseline poller pop limit (ids per ZRANGEBYSCORE LIMIT)")
	fs.IntVar(&c.Conns, "conns", 4, "gRPC connections to delayd, shared round-robin")
	fs.IntVar(&c.AckBatch, "ack-batch", 500, "most tokens per AckTasks call")
	fs.BoolVar(&c.FixedWindows, "fixed-windows", false, "delayd, delayd-durable: the raw client's connections fix their gRPC flow-control windows (no BDP pings, as docs/client-guide.md advises stubs); default: grpc-go's defaults, as generated stubs have them")
	fs.IntVar(&c.SDKBatch.MaxOutstanding, "sdk-max-outstanding", 0, "delayd-sdk: the SDK's BatchSettings.MaxOutstanding (batches per namespace in flight); 0 = the SDK's default, 2")
	fs.BoolVar(&c.JSON, "json", false, "print a JSON report on stdout instead of the table")
	fs.BoolVar(&c.Markdown, "markdown", false, "print the report as Markdown tables")
	fs.StringVar(&c.JSONOut, "json-out", "", "also write the JSON report to this file")
	fs.BoolVar(&c.Quiet, "quiet", false, "no live progress line on stderr")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of this process (with --server inproc: delayd and the load generator) to this file")
	fs.DurationVar(&c.Timeout, "timeout", time.Hour, "bound on the whole run (a --soak gets its duration plus 15m unless this is set)")
	fs.DurationVar(&c.Soak.Duration, "soak", 0, "run a steady flow for this long instead of the workloads (make soak); the workload flags --producers, --subscribers, --max-in-flight and --payload apply")
	fs.IntVar(&c.Floor.Rounds, "floor", 0, "run this many rounds of the gRPC floor instead of the workloads: the source design's Lua upsert and pop-delete loop beside a no-op gRPC service and one that does the same Redis work, in one process (docs/BENCHMARKS.md)")
	fs.IntVar(&c.Floor.Tasks, "floor-tasks", 50_000, "tasks per row and round of --floor")
	fs.IntVar(&c.Schedules.Count, "schedules", 0, "run this many schedules firing every minute instead of the workloads: lateness of their firings, each slot once, Redis calls per firing (docs/BENCHMARKS.md, Schedules)")
	fs.IntVar(&c.Schedules.Minutes, "schedule-minutes", 2, "schedules: minute slots measured")
	fs.IntVar(&c.Schedules.Namespaces, "schedule-namespaces", 10, "schedules: namespaces the schedules are spread over")
	fs.BoolVar(&c.Schedules.Durable, "schedule-durable", false, "schedules: delayd in durable mode (--mysql-dsn)")
	fs.DurationVar(&c.Schedules.Jitter, "schedule-jitter", 0, "schedules: each schedule's jitter, spreading its firings over [slot, slot+jitter) (0: all due at :00)")
	fs.IntVar(&c.Soak.Rate, "rate", 500, "soak: tasks upserted per second, one UpsertTask each")
	fs.DurationVar(&c.Soak.DueAfter, "due-after", 2*time.Second, "soak: time from a task's upsert to its due time")
	fs.DurationVar(&c.Soak.Sample, "soak-sample", 10*time.Second, "soak: how often delayd's RSS, goroutines, threads and log volume are read")
	fs.DurationVar(&c.Soak.LateMark, "late-mark", 50*time.Millisecond, "soak: lateness above which a due-time second is listed as a late burst")
	fs.StringVar(&c.Soak.LogLevel, "soak-log-level", "", "soak: the child delayd's --log-level (default: delayd's own default, so the log volume is an operator's)")
	fs.StringVar(&c.Soak.LogFile, "soak-log", "", "soak: keep the child delayd's log in this file")
	fs.BoolVar(&c.Soak.Noise, "noise", false, "soak: run a neighbour process that spins one core for the whole soak (make soak NOISE=1)")

	fs.IntVar(&w.Tasks, "tasks", 0, "tasks per run (each checked for early, duplicate and lost delivery)")
	fs.DurationVar(&w.Spread, "spread", 0, "window the due times are spread over")
	fs.DurationVar(&w.Lead, "lead", 0, "time from the start of the load to the first due time")
	fs.BoolVar(&w.Backlog, "backlog", false, "tasks already due; subscribers connect after the load (drain capacity)")
	fs.IntVar(&w.PayloadBytes, "payload", 0, "payload bytes per task")
	fs.IntVar(&w.Namespaces, "namespaces", 0, "namespaces the tasks are spread over")
	fs.IntVar(&w.Producers, "producers", 0, "concurrent producers")
	fs.IntVar(&w.Batch, "batch", 0, "tasks per BatchUpsertTasks call; 0 or 1 = unary UpsertTask")
	fs.IntVar(&w.Subscribers, "subscribers", 0, "Subscribe streams")
	fs.IntVar(&w.MaxInFlight, "max-in-flight", 0, "max_in_flight per stream")
	fs.IntVar(&w.Filler, "filler", 0, "extra pending tasks (due in 2 h) loaded before the measured ones")
	fs.IntVar(&w.FillerPayloadBytes, "filler-payload", 0, "payload bytes per filler task")
}

// workloadFlags are the flags RegisterFlags binds to the Workload.
var workloadFlags = map[string]func(dst *Workload, src Workload){
	"tasks":          func(d *Workload, s Workload) { d.Tasks = s.Tasks },
	"spread":         func(d *Workload, s Workload) { d.Spread = s.Spread },
	"lead":           func(d *Workload, s Workload) { d.Lead = s.Lead },
	"backlog":        func(d *Workload, s Workload) { d.Backlog = s.Backlog },
	"payload":        func(d *Workload, s Workload) { d.PayloadBytes = s.PayloadBytes },
	"namespaces":     func(d *Workload, s Workload) { d.Namespaces = s.Namespaces },
	"producers":      func(d *Workload, s Workload) { d.Producers = s.Producers },
	"batch":          func(d *Workload, s Workload) { d.Batch = s.Batch },
	"subscribers":    func(d *Workload, s Workload) { d.Subscribers = s.Subscribers },
	"max-in-flight":  func(d *Workload, s Workload) { d.MaxInFlight = s.MaxInFlight },
	"filler":         func(d *Workload, s Workload) { d.Filler = s.Filler },
	"filler-payload": func(d *Workload, s Workload) { d.FillerPayloadBytes = s.FillerPayloadBytes },
}

// Finish turns the workload flags given explicitly on fs into c.Override
// and c.OverrideArgs. Call it after fs.Parse.
func (c *Config) Finish(fs *flag.FlagSet, w *Workload) error {
	var set []func(*Workload)
	timeoutSet := false
	fs.Visit(func(f *flag.Flag) {
		timeoutSet = timeoutSet || f.Name == "timeout"
		if apply, ok := workloadFlags[f.Name]; ok {
			src := *w
			set = append(set, func(d *Workload) { apply(d, src) })
			c.OverrideArgs = append(c.OverrideArgs, "--"+f.Name+"="+f.Value.String())
		}
	})
	c.Override = func(d *Workload) {
		for _, f := range set {
			f(d)
		}
	}
	switch c.Server {
	case "inproc", "child":
	default:
		return fmt.Errorf("--server %q: allowed: inproc, child", c.Server)
	}
	if c.Floor.Rounds < 0 || c.Floor.Rounds > 20 {
		return fmt.Errorf("--floor %d: allowed: 0 (off) to 20 rounds", c.Floor.Rounds)
	}
	if c.Floor.Tasks < 1000 || c.Floor.Tasks > 10_000_000 {
		return fmt.Errorf("--floor-tasks %d: allowed: 1000 to 10000000", c.Floor.Tasks)
	}
	// A soak runs for its duration plus set-up, the drain of the last
	// tasks and the report: the whole-run bound must cover that, or the
	// last upserts fail with DeadlineExceeded and the tasks not yet due are
	// counted lost (a 60-minute soak under the 1-hour default did).
	if need := c.Soak.Duration + soakTimeoutMargin; c.Soak.Duration > 0 && c.Timeout < need {
		if timeoutSet {
			return fmt.Errorf("--timeout %s is shorter than --soak %s needs: allowed: at least %s (the soak plus %s for set-up, drain and report), or leave --timeout unset",
				c.Timeout, c.Soak.Duration, need, soakTimeoutMargin)
		}
		c.Timeout = need
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// soakTimeoutMargin is what a soak's whole-run bound (--timeout) allows
// beyond its duration.
const soakTimeoutMargin = 15 * time.Minute
