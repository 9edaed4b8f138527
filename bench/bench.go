package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // durable rows create and drop their database
	"github.com/redis/go-redis/v9"
)

// Run runs the workloads cfg selects and writes the report (a table, or
// JSON with cfg.JSON) to stdout; progress and warnings go to stderr. It
// returns an error when the benchmark could not run at all; a row that
// failed (Result.Error) or saw an early, duplicate or lost delivery
// (Result.Violations) makes Run return ErrRowsFailed after the report is
// written.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (err error) {
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.Override == nil {
		cfg.Override = func(*Workload) {}
	}
	rows, err := selectRows(cfg)
	if err != nil {
		return err
	}
	rep := &Report{Machine: machineInfo(), Started: time.Now().UTC().Format(time.RFC3339)}

	redisURL := cfg.RedisURL
	var rdb redis.UniversalClient
	if cfg.OwnRedisCluster > 0 {
		c, err := startOwnCluster(ctx, cfg.RedisServerBin, cfg.OwnRedisCluster)
		if err != nil {
			return err
		}
		defer c.stop()
		redisURL = c.url()
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs, PoolSize: 256})
		defer cc.Close()
		rdb = cc
		rep.Notes = append(rep.Notes, fmt.Sprintf("Redis: a private Redis Cluster of %d masters (no replicas, no persistence) started for this run; Redis CPU and memory are summed over the masters.", cfg.OwnRedisCluster))
	} else if cfg.OwnRedis {
		r, err := startOwnRedis(ctx, cfg.RedisServerBin)
		if err != nil {
			return err
		}
		defer r.stop()
		redisURL = r.url
		rep.Notes = append(rep.Notes, "Redis: a private redis-server started for this run (no persistence), so no other client's load or keys are in the figures.")
	} else {
		rep.Notes = append(rep.Notes, "Redis: "+redactURL(redisURL)+", shared: other clients' load shows in its CPU, memory and count figures.")
	}
	if rdb == nil {
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			return fmt.Errorf("--redis-url: %w", err)
		}
		opt.PoolSize = 256
		c := redis.NewClient(opt)
		defer c.Close()
		rdb = c
	}
	if cfg.HistoryBytes > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("delayd namespaces keep task history: %d bytes each (--history-bytes).", cfg.HistoryBytes))
	}
	if cfg.Shards > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("delayd namespaces: %d shards each (--shards).", cfg.Shards))
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s does not answer: %w", redactURL(redisURL), err)
	}
	probe, err := NewRedisProbe(ctx, rdb)
	if err != nil {
		return err
	}
	rep.Versions.Redis = probe.Version
	rep.Versions.Go = runtime.Version()
	rep.Versions.Delayd = gitDescribe(ctx)
	rep.Versions.MySQL = mysqlVersion(ctx, cfg.MySQLDSN)
	clock, err := MeasureClock(ctx, rdb, 50)
	if err != nil {
		return err
	}
	e := env{clock: clock, redis: probe}
	if !cfg.Quiet {
		e.progress = NewProgress(stderr)
	}

	if cfg.Floor.Rounds > 0 {
		return runFloor(ctx, cfg, rdb, probe, stdout)
	}
	if cfg.Schedules.Count > 0 {
		return runSchedules(ctx, cfg, e, redisURL, stdout, stderr)
	}
	if cfg.Soak.Duration > 0 {
		if cfg.Server != "child" && cfg.Target == "" {
			return errors.New("--soak needs --server child (or --target): its memory, goroutine and log figures are the server process's own")
		}
		return runSoak(ctx, cfg, e, redisURL, stdout, stderr)
	}
	if cfg.DelaydLog == nil {
		cfg.DelaydLog = io.Discard
	}
	if cfg.Slowlog && (cfg.OwnRedis || cfg.OwnRedisCluster > 0) {
		if err := probe.EnableSlowlog(ctx, scriptNames()); err != nil {
			return err
		}
		defer probe.Close()
		rep.Notes = append(rep.Notes, "Redis calls by script name and µs per script call: the private Redis logged every command of the measured phases (SLOWLOG, threshold 0), which adds about 0.5 µs of Redis CPU per command logged.")
	}
	deps := &deployments{cfg: cfg, redisURL: redisURL, log: cfg.DelaydLog, buildOut: stderr}
	defer deps.close()

	for _, row := range rows {
		if ctx.Err() != nil {
			break
		}
		for _, sysName := range row.systems {
			res := runRow(ctx, e, cfg, deps, rdb, row.w, sysName)
			res.Command = command(cfg, row.name, sysName)
			rep.Results = append(rep.Results, res)
			if res.Error != "" || res.Skipped != "" {
				fmt.Fprintf(stderr, "%s/%s: %s%s\n", row.w.Name, sysName, res.Skipped, res.Error)
			}
		}
	}
	switch cfg.Server {
	case "child":
		rep.Notes = append(rep.Notes, "delayd CPU: the delayd child process alone (from /proc/<pid>/stat).")
	default:
		rep.Notes = append(rep.Notes, "delayd CPU: --server inproc runs delayd inside delaybench, so its CPU figure includes the load generator (producers, subscribers, acks); use --server child for delayd alone.")
	}
	if cfg.Target != "" {
		rep.Notes = append(rep.Notes, "delayd: external at "+cfg.Target+".")
	}
	rep.Notes = append(rep.Notes, "Baseline CPU is the delaybench process (its poller and the load generator); the baseline's work happens mostly in Redis.")
	ran := func(sys string) bool {
		return slices.ContainsFunc(rep.Results, func(r Result) bool { return r.System == sys && r.Skipped == "" })
	}
	if ran(SystemDelaydSDK) {
		rep.Notes = append(rep.Notes, "delayd-sdk: the producers call the Go SDK's Client.Upsert (one Client, default batching: concurrent calls coalesce into BatchUpsertTasks); delivery as the SDK receives, on StreamDeliveries with the acks on the stream.")
	}
	if ran(SystemAsynq) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("asynq %s: Enqueue with ProcessAt and TaskID per task (no batch enqueue exists; batch rows loop Enqueue), one asynq server in the delaybench process with Concurrency %d per subscriber and DelayedTaskCheckInterval %s (its default is 5 s); its CPU is the delaybench process, and its ack is the handler's return.", asynqVersion(), asynqConcurrency, asynqCheckInterval))
	}
	rep.Clock = clock
	rep.Machine.LoadAvgEnd = loadAvg()
	rep.Ratios = ratios(rep.Results)
	if cfg.JSONOut != "" {
		f, err := os.Create(cfg.JSONOut)
		if err != nil {
			return fmt.Errorf("--json-out: %w", err)
		}
		err = rep.WriteJSON(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("--json-out: %w", err)
		}
	}
	switch {
	case cfg.JSON:
		err = rep.WriteJSON(stdout)
	case cfg.Markdown:
		err = rep.WriteMarkdown(stdout)
	default:
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		return err
	}
	for _, r := range rep.Results {
		if r.Error != "" || r.Violations != "" {
			return ErrRowsFailed
		}
	}
	return ctx.Err()
}

// ErrRowsFailed is returned by Run when at least one row failed or saw an
// early, duplicate, lost or unknown delivery.
var ErrRowsFailed = errors.New("some benchmark rows failed")

// row is one workload and the systems it runs on.
type row struct {
	name    string
	w       Workload
	systems []string
}

// selectRows resolves cfg.Workloads and cfg.Systems into rows.
func selectRows(cfg Config) ([]row, error) {
	ps := presets(cfg.Short)
	var names []string
	for _, n := range cfg.Workloads {
		if n == "all" {
			for _, p := range Presets() {
				if _, ok := ps[p]; ok {
					names = append(names, p)
				}
			}
			continue
		}
		names = append(names, n)
	}
	var rows []row
	for _, n := range names {
		p, ok := ps[n]
		if n == "custom" {
			p, ok = preset{Workload{Name: "custom"}, compared}, true
		}
		if !ok {
			return nil, fmt.Errorf("--workload %q: allowed: %s, all, custom (scale-1m, scale-10m and steady-500 are not in --short)", n, strings.Join(Presets(), ", "))
		}
		w := p.w
		cfg.Override(&w)
		if w.Tasks <= 0 {
			return nil, fmt.Errorf("workload %s: --tasks must be > 0", n)
		}
		systems := p.systems
		if len(cfg.Systems) > 0 {
			systems = cfg.Systems
		}
		for _, s := range systems {
			if !slices.Contains(allSystems, s) {
				return nil, fmt.Errorf("--systems %q: allowed: %s", s, strings.Join(allSystems, ", "))
			}
		}
		rows = append(rows, row{name: n, w: w, systems: systems})
	}
	return rows, nil
}

// runRow runs one workload on one system.
func runRow(ctx context.Context, e env, cfg Config, deps *deployments, rdb redis.UniversalClient, w Workload, sysName string) Result {
	var sys system
	switch sysName {
	case SystemBaseline1s, SystemBaseline10ms:
		if cfg.OwnRedisCluster > 0 {
			return Result{Workload: w.Name, System: sysName, Params: w, Skipped: "the baseline runs on one Redis, not a cluster (--own-redis-cluster)"}
		}
		iv := time.Second
		if sysName == SystemBaseline10ms {
			iv = 10 * time.Millisecond
		}
		sys = newBaselineSystem(rdb, "b"+randomSuffix(5), iv, cfg.BaselineBatch, e.clock, cfg.Logger)
	case SystemAsynq:
		if cfg.OwnRedisCluster > 0 {
			return Result{Workload: w.Name, System: sysName, Params: w, Skipped: "asynq runs on one Redis here, not a cluster (--own-redis-cluster)"}
		}
		sys = newAsynqSystem(rdb)
	default:
		dep := deployRedis
		if sysName == SystemDelaydDurable {
			dep = deployDurable
		}
		d, err := deps.get(ctx, dep)
		if err != nil {
			return Result{Workload: w.Name, System: sysName, Params: w, Skipped: err.Error()}
		}
		key := d.apiKey
		if cfg.APIKey != "" {
			key = cfg.APIKey
		}
		ds, err := newDelaydSystem(delaydConfig{
			Addr: d.addr, APIKey: key, Conns: cfg.Conns, AckBatch: cfg.AckBatch,
			CPU: d.cpu, PID: d.procID(), Redis: rdb, Label: sysName, Logger: cfg.Logger, Shards: cfg.Shards, HistoryBytes: cfg.HistoryBytes,
			SDK: sysName == SystemDelaydSDK, SDKMaxOutstanding: cfg.SDKBatch.MaxOutstanding, MySQL: d.mysql,
			FixedWindows: cfg.FixedWindows,
		})
		if err != nil {
			return Result{Workload: w.Name, System: sysName, Params: w, Error: err.Error()}
		}
		defer ds.close()
		sys = ds
	}
	return runWorkload(ctx, e, sys, w)
}

// deployments starts each kind of delayd once, on first use.
type deployments struct {
	cfg      Config
	redisURL string
	// log receives delayd's log; buildOut the output of go build.
	log      io.Writer
	buildOut io.Writer
	started  map[string]*delayd
	failed   map[string]error
	bin      string
	tmp      string
	dropDBs  []func()
}

// get returns the delayd of deployment dep, starting it if needed.
func (d *deployments) get(ctx context.Context, dep string) (*delayd, error) {
	if s, ok := d.started[dep]; ok {
		return s, nil
	}
	if err, ok := d.failed[dep]; ok {
		return nil, err
	}
	s, err := d.start(ctx, dep)
	if d.started == nil {
		d.started, d.failed = map[string]*delayd{}, map[string]error{}
	}
	if err != nil {
		d.failed[dep] = err
		return nil, err
	}
	d.started[dep] = s
	return s, nil
}

func (d *deployments) start(ctx context.Context, dep string) (*delayd, error) {
	if d.cfg.Target != "" {
		if dep == deployDurable {
			return nil, errors.New("not run: with --target, start the durable delayd yourself and point --target at it with --systems delayd")
		}
		return external(d.cfg.Target, d.cfg.TargetPID), nil
	}
	dsn := ""
	var sizer *mysqlSizer
	if dep == deployDurable {
		var err error
		dsn, sizer, err = d.createDatabase(ctx)
		if err != nil {
			return nil, err
		}
	}
	s, err := d.startProcess(ctx, dsn)
	if s != nil {
		s.mysql = sizer
	}
	return s, err
}

// startProcess starts a delayd (child or in this process) on dsn ("" =
// Redis-only).
func (d *deployments) startProcess(ctx context.Context, dsn string) (*delayd, error) {
	if d.cfg.Server == "child" {
		if d.bin == "" {
			d.bin = d.cfg.DelaydBin
			if d.bin == "" {
				tmp, err := os.MkdirTemp("", "delaybench-")
				if err != nil {
					return nil, err
				}
				d.tmp = tmp
				if d.bin, err = buildDelayd(ctx, tmp, d.buildOut); err != nil {
					return nil, err
				}
			}
		}
		return startChild(ctx, d.bin, d.redisURL, dsn, d.cfg.DelaydLogLevel, d.cfg.NoOps, d.cfg.DelaydArgs, d.log)
	}
	return startInProcess(ctx, d.redisURL, dsn, opsListen(d.cfg), slog.New(slog.NewTextHandler(d.log, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// createDatabase creates a fresh MySQL database for a durable delayd and
// returns its DSN; close drops it.
func (d *deployments) createDatabase(ctx context.Context) (string, *mysqlSizer, error) {
	base, params, _ := strings.Cut(d.cfg.MySQLDSN, "?")
	base = strings.TrimSuffix(base, "/") + "/"
	db, err := sql.Open("mysql", base+"?"+params)
	if err != nil {
		return "", nil, fmt.Errorf("durable mode: mysql dsn: %w", err)
	}
	name := "delaybench_" + randomSuffix(5)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(cctx, "CREATE DATABASE "+name); err != nil {
		db.Close()
		return "", nil, fmt.Errorf("durable mode: create database: %w", err)
	}
	d.dropDBs = append(d.dropDBs, func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.ExecContext(c, "DROP DATABASE IF EXISTS "+name)
		db.Close()
	})
	dsn := base + name
	if params != "" {
		dsn += "?" + params
	}
	return dsn, &mysqlSizer{db: db, name: name}, nil
}

// close stops every delayd started, then drops the durable databases and
// removes the built binary.
func (d *deployments) close() {
	for _, s := range d.started {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = s.stop(ctx)
		cancel()
	}
	for _, drop := range d.dropDBs {
		drop()
	}
	if d.tmp != "" {
		_ = os.RemoveAll(d.tmp)
	}
}

// mysqlVersion returns SELECT VERSION() of the server behind dsn, or "" if
// it does not answer within 2 s.
func mysqlVersion(ctx context.Context, dsn string) string {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return ""
	}
	defer db.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var v string
	if err := db.QueryRowContext(cctx, "SELECT VERSION()").Scan(&v); err != nil {
		return ""
	}
	return v
}

// redactURL hides a password in a Redis URL.
func redactURL(u string) string {
	if at := strings.LastIndex(u, "@"); at >= 0 {
		if s := strings.Index(u, "://"); s >= 0 && s+3 < at {
			return u[:s+3] + "***" + u[at:]
		}
	}
	return u
}

// command is a delaybench invocation that reproduces one row.
func command(cfg Config, workload, system string) string {
	args := []string{"go run ./cmd/delaybench", "--workload=" + workload, "--systems=" + system}
	if cfg.Short {
		args = append(args, "--short")
	}
	if cfg.Server != "inproc" {
		args = append(args, "--server="+cfg.Server)
	}
	if cfg.OwnRedis {
		args = append(args, "--own-redis")
	}
	if cfg.OwnRedisCluster > 0 {
		args = append(args, fmt.Sprintf("--own-redis-cluster=%d", cfg.OwnRedisCluster))
	}
	if cfg.Shards > 0 && strings.HasPrefix(system, "delayd") {
		args = append(args, fmt.Sprintf("--shards=%d", cfg.Shards))
	}
	if cfg.HistoryBytes > 0 && strings.HasPrefix(system, "delayd") {
		args = append(args, fmt.Sprintf("--history-bytes=%d", cfg.HistoryBytes))
	}
	if cfg.Target != "" {
		args = append(args, "--target="+cfg.Target)
	}
	if cfg.NoOps && strings.HasPrefix(system, "delayd") {
		args = append(args, "--no-ops")
	}
	if cfg.FixedWindows && strings.HasPrefix(system, "delayd") && system != SystemDelaydSDK {
		args = append(args, "--fixed-windows")
	}
	if cfg.SDKBatch.MaxOutstanding != 0 && system == SystemDelaydSDK {
		args = append(args, fmt.Sprintf("--sdk-max-outstanding=%d", cfg.SDKBatch.MaxOutstanding))
	}
	if cfg.BaselineBatch != 200 && strings.HasPrefix(system, "baseline") {
		args = append(args, fmt.Sprintf("--baseline-batch=%d", cfg.BaselineBatch))
	}
	args = append(args, cfg.OverrideArgs...)
	return strings.Join(args, " ")
}

// gitDescribe returns `git describe --always --dirty` of the current
// directory, or "" outside a git work tree.
func gitDescribe(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
