package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Soak is a steady-flow run (delaybench --soak): Rate tasks per second for
// Duration, each upserted with one UpsertTask call and due DueAfter later,
// while Subscribers streams receive and ack them. It is the workload an
// operator tries before production, and the one that shows what a short
// burst never does: stalls that come once in minutes, memory or goroutines
// that creep, and how much log the server writes at its default level.
type Soak struct {
	// Duration is how long tasks are produced. Zero: no soak.
	Duration time.Duration `json:"duration_ns"`
	// Rate is the tasks upserted per second. If zero, 500.
	Rate int `json:"rate"`
	// DueAfter is the time from a task's upsert to its due time. If zero, 2 s.
	DueAfter time.Duration `json:"due_after_ns"`
	// Sample is how often the server's RSS, goroutines, threads and log
	// volume are read. If zero, 10 s.
	Sample time.Duration `json:"sample_ns"`
	// LateMark is the lateness above which a due-time second is listed
	// as a late burst. If zero, 50 ms.
	LateMark time.Duration `json:"late_mark_ns"`
	// LogLevel is the child delayd's --log-level; empty: its default, so
	// the log volume is what an operator gets.
	LogLevel string `json:"log_level,omitempty"`
	// LogFile, if set, keeps the child delayd's log there.
	LogFile string `json:"-"`
	// Noise, if set, runs a neighbour that spins one core for the whole
	// soak (a busy-loop process, see startNoise), as on a machine shared
	// with other work.
	Noise bool `json:"noise,omitempty"`
}

func (s Soak) withDefaults() Soak {
	if s.Rate <= 0 {
		s.Rate = 500
	}
	if s.DueAfter <= 0 {
		s.DueAfter = 2 * time.Second
	}
	if s.Sample <= 0 {
		s.Sample = 10 * time.Second
	}
	if s.LateMark <= 0 {
		s.LateMark = 50 * time.Millisecond
	}
	return s
}

// SoakSample is one reading of the server during a soak.
type SoakSample struct {
	// At is the time since the first upsert, in seconds.
	At float64 `json:"at_s"`
	// Upserted, Delivered and Acked are cumulative task counts.
	Upserted  int64 `json:"upserted"`
	Delivered int64 `json:"delivered"`
	Acked     int64 `json:"acked"`
	// RSSBytes is the server's resident memory (VmRSS); 0 if unknown.
	RSSBytes int64 `json:"rss_bytes"`
	// Threads is the server's OS thread count; 0 if unknown.
	Threads int `json:"threads"`
	// Goroutines is the server's go_goroutines from its ops listener's
	// /metrics; -1 if it has none.
	Goroutines int `json:"goroutines"`
	// LogBytes is the server's log written so far.
	LogBytes int64 `json:"log_bytes"`
	// CPUSeconds is the server's CPU time so far.
	CPUSeconds float64 `json:"cpu_s"`
}

// LateBurst is one second of due times in which some task was delivered
// later than Soak.LateMark.
type LateBurst struct {
	// Second is the due time's offset from the first due time, in seconds.
	Second int `json:"second"`
	// Late counts the tasks of that second later than the mark.
	Late int `json:"late"`
	// MaxMS is the worst lateness among them.
	MaxMS float64 `json:"max_ms"`
}

// SoakReport is what a soak measured.
type SoakReport struct {
	Machine  Machine `json:"machine"`
	Started  string  `json:"started"`
	Delayd   string  `json:"delayd,omitempty"`
	Params   Soak    `json:"params"`
	Workload struct {
		Producers    int `json:"producers"`
		Subscribers  int `json:"subscribers"`
		MaxInFlight  int `json:"max_in_flight"`
		PayloadBytes int `json:"payload_bytes"`
	} `json:"workload"`
	Clock Clock `json:"clock"`
	Tally
	Early int `json:"early"`
	// Lateness over the first delivery of every task, in ms.
	Lateness Summary `json:"lateness"`
	// P999 is the 99.9th percentile of lateness, in ms.
	P999 float64 `json:"p999_ms"`
	// Behind is the furthest the producers fell behind their schedule.
	BehindMS float64 `json:"producers_behind_max_ms"`
	// UpsertRetries counts UpsertTask calls answered UNAVAILABLE and
	// retried, as delayd tells clients to ("safe to retry").
	UpsertRetries int64 `json:"upsert_retries"`
	// Bursts lists the due-time seconds with a task later than LateMark.
	Bursts  []LateBurst  `json:"late_bursts"`
	Samples []SoakSample `json:"samples"`
	// LogBytes is the server's whole log over the run.
	LogBytes int64  `json:"log_bytes"`
	Error    string `json:"error,omitempty"`
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return c.w.Write(p)
}

// runSoak runs cfg.Soak against a child delayd (or --target) on redisURL.
func runSoak(ctx context.Context, cfg Config, e env, redisURL string, stdout, stderr io.Writer) error {
	sc := cfg.Soak.withDefaults()
	var w Workload
	w.PayloadBytes, w.Producers, w.Subscribers, w.MaxInFlight = 100, 8, 4, 1000
	cfg.Override(&w)
	w = w.withDefaults()
	n := int(int64(sc.Rate) * int64(sc.Duration) / int64(time.Second))
	if n <= 0 {
		return fmt.Errorf("--soak %s at --rate %d is no task", sc.Duration, sc.Rate)
	}

	var logDst io.Writer = io.Discard
	if cfg.DelaydLog != nil {
		logDst = cfg.DelaydLog
	}
	if sc.LogFile != "" {
		f, err := os.Create(sc.LogFile)
		if err != nil {
			return fmt.Errorf("--soak-log: %w", err)
		}
		defer f.Close()
		logDst = io.MultiWriter(logDst, f)
	}
	logs := &countingWriter{w: logDst}
	cfg.DelaydLogLevel = sc.LogLevel
	deps := &deployments{cfg: cfg, redisURL: redisURL, log: logs, buildOut: stderr}
	defer deps.close()
	d, err := deps.get(ctx, deployRedis)
	if err != nil {
		return err
	}
	key := d.apiKey
	if cfg.APIKey != "" {
		key = cfg.APIKey
	}
	ds, err := newDelaydSystem(delaydConfig{Addr: d.addr, APIKey: key, Conns: cfg.Conns, AckBatch: cfg.AckBatch,
		CPU: d.cpu, Redis: e.redis.rdb, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	defer ds.close()

	rep := &SoakReport{Machine: machineInfo(), Started: time.Now().UTC().Format(time.RFC3339), Params: sc, Clock: e.clock}
	rep.Delayd = gitDescribe(ctx)
	rep.Workload.Producers, rep.Workload.Subscribers = w.Producers, w.Subscribers
	rep.Workload.MaxInFlight, rep.Workload.PayloadBytes = w.MaxInFlight, w.PayloadBytes

	nss := []string{"dbench-" + randomSuffix(5) + "-soak"}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		_ = ds.cleanup(cctx, nss)
	}()
	if err := ds.setup(ctx, nss); err != nil {
		return err
	}
	sk := &runSink{
		tracker:     NewTracker(n),
		dues:        make([]int64, n),
		lateness:    make([]time.Duration, n),
		clock:       e.clock,
		earlyWindow: e.clock.Uncertainty,
	}
	stop, err := ds.consume(ctx, nss, w.Subscribers, w.MaxInFlight, sk)
	if err != nil {
		return err
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()

	if sc.Noise {
		stopNoise, err := startNoise()
		if err != nil {
			return fmt.Errorf("--noise: %w", err)
		}
		defer stopNoise()
	}

	// Sampler.
	var upserted atomic.Int64
	start := time.Now()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	var samplesMu sync.Mutex
	take := func() {
		s := SoakSample{At: time.Since(start).Seconds(), Upserted: upserted.Load(),
			Delivered: sk.tracker.Delivered(), Acked: sk.ackedOK.Load(), LogBytes: logs.n.Load(), Goroutines: -1}
		if d.pid > 0 {
			s.RSSBytes, s.Threads = procStatus(d.pid)
		}
		if c, _, ok := ds.cpu(); ok {
			s.CPUSeconds = c.Seconds()
		}
		if d.opsAddr != "" {
			s.Goroutines = scrapeGauge(sampleCtx, d.opsAddr, "go_goroutines")
		}
		samplesMu.Lock()
		rep.Samples = append(rep.Samples, s)
		samplesMu.Unlock()
		fmt.Fprintf(stderr, "soak %6.0fs  upserted %8d  delivered %8d  acked %8d  rss %6.1f MB  goroutines %4d  threads %3d  log %8.2f MB  cpu %7.1fs\n",
			s.At, s.Upserted, s.Delivered, s.Acked, float64(s.RSSBytes)/(1<<20), s.Goroutines, s.Threads, float64(s.LogBytes)/(1<<20), s.CPUSeconds)
	}
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		t := time.NewTicker(sc.Sample)
		defer t.Stop()
		take()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
				take()
			}
		}
	}()

	// Producers: task i is upserted at start + i/Rate, due DueAfter later.
	var next atomic.Int64
	var behind atomic.Int64
	var prodErr error
	var errOnce sync.Once
	var retries atomic.Int64
	pctx, cancelProd := context.WithCancel(ctx)
	payload := make([]byte, w.PayloadBytes)
	var prod sync.WaitGroup
	for range w.Producers {
		prod.Go(func() {
			for pctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				at := start.Add(time.Duration(int64(i) * int64(time.Second) / int64(sc.Rate)))
				if wait := time.Until(at); wait > 0 {
					time.Sleep(wait)
				} else if -wait > time.Duration(behind.Load()) {
					behind.Store(int64(-wait))
				}
				due := e.clock.Now().Add(sc.DueAfter).UnixMilli()
				sk.dues[i] = due
				if err := upsertRetrying(pctx, func() error {
					return ds.upsert(pctx, nss[0], []item{{id: TaskID(i), due: time.UnixMilli(due)}}, payload, true)
				}, &retries); err != nil {
					errOnce.Do(func() { prodErr = err; cancelProd() })
					return
				}
				upserted.Add(1)
			}
		})
	}
	prod.Wait()
	cancelProd()
	if prodErr != nil {
		rep.Error = "upsert: " + prodErr.Error()
	}
	rep.BehindMS = ms(time.Duration(behind.Load()))
	rep.UpsertRetries = retries.Load()

	// Wait for the last deliveries and acks.
	lastDue := time.UnixMilli(slices.Max(sk.dues))
	const stall = 20 * time.Second
	for rep.Error == "" {
		if sk.tracker.Delivered() >= int64(n) && sk.ackedOK.Load() >= int64(n) {
			break
		}
		since := time.Unix(0, max(sk.lastChange.Load(), lastDue.Add(-e.clock.Offset).UnixNano()))
		if time.Since(since) > stall {
			rep.Error = fmt.Sprintf("stalled: nothing delivered or acked for %s", stall)
			break
		}
		select {
		case <-ctx.Done():
			rep.Error = "interrupted: " + ctx.Err().Error()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if rep.Error == "" {
		time.Sleep(500 * time.Millisecond) // a late duplicate shows up now
	}
	stopSampling()
	sampling.Wait()
	take()
	stop()
	stop = nil

	rep.Tally = sk.tracker.Tally()
	rep.Early = int(sk.early.Load())
	firstDue := slices.Min(sk.dues)
	bursts := map[int]*LateBurst{}
	var lat []time.Duration
	for i, l := range sk.lateness {
		if sk.tracker.counts[i].Load() == 0 {
			continue
		}
		lat = append(lat, l)
		if l > sc.LateMark {
			sec := int((sk.dues[i] - firstDue) / 1000)
			b := bursts[sec]
			if b == nil {
				b = &LateBurst{Second: sec}
				bursts[sec] = b
			}
			b.Late++
			b.MaxMS = max(b.MaxMS, ms(l))
		}
	}
	rep.Lateness = Summarize(lat)
	if len(lat) > 0 {
		rep.P999 = ms(Percentile(lat, 99.9))
	}
	for _, b := range bursts {
		rep.Bursts = append(rep.Bursts, *b)
	}
	slices.SortFunc(rep.Bursts, func(a, b LateBurst) int { return a.Second - b.Second })
	rep.LogBytes = logs.n.Load()
	rep.Machine.LoadAvgEnd = loadAvg()

	if cfg.JSONOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.JSONOut, b, 0o644); err != nil {
			return fmt.Errorf("--json-out: %w", err)
		}
	}
	if cfg.JSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		_, err = stdout.Write(append(b, '\n'))
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if rep.Error != "" || rep.Lost+rep.Duplicates+rep.Early+rep.Unknown > 0 {
		return ErrRowsFailed
	}
	return nil
}

// WriteText prints the soak report for people (Markdown-friendly lines).
func (r *SoakReport) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	p := r.Params
	noise := "none"
	if p.Noise {
		noise = "one core spun by a busy loop"
	}
	fmt.Fprintf(bw, "soak: %s at %d tasks/s (%d tasks), each due %s after its upsert; %d producers (unary UpsertTask), %d subscribers (max_in_flight %d), %d-byte payloads; delayd %s log level %q; neighbour: %s\n",
		p.Duration, p.Rate, r.Expected, p.DueAfter, r.Workload.Producers, r.Workload.Subscribers, r.Workload.MaxInFlight, r.Workload.PayloadBytes, r.Delayd, p.LogLevel, noise)
	fmt.Fprintf(bw, "machine: %d CPUs %s, load average %s -> %s; started %s\n", r.Machine.CPUs, r.Machine.Model, r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd, r.Started)
	fmt.Fprintf(bw, "tasks: %d delivered, %d lost, %d duplicate, %d early, %d unknown\n", r.Delivered, r.Lost, r.Duplicates, r.Early, r.Unknown)
	l := r.Lateness
	fmt.Fprintf(bw, "lateness ms: p50 %.1f / p99 %.1f / p99.9 %.1f / max %.1f (min %.1f); producers at most %.0f ms behind schedule; %d upserts retried after UNAVAILABLE\n", l.P50, l.P99, r.P999, l.Max, l.Min, r.BehindMS, r.UpsertRetries)
	fmt.Fprintf(bw, "server log: %.2f MB (%.0f bytes per task)\n", float64(r.LogBytes)/(1<<20), float64(r.LogBytes)/float64(max(r.Expected, 1)))
	if len(r.Bursts) == 0 {
		fmt.Fprintf(bw, "late bursts: none over %s\n", p.LateMark)
	} else {
		fmt.Fprintf(bw, "late bursts (due-time second: tasks over %s, worst ms):", p.LateMark)
		for _, b := range r.Bursts {
			fmt.Fprintf(bw, " %ds: %d, %.0f;", b.Second, b.Late, b.MaxMS)
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintf(bw, "\n| t s | upserted | delivered | acked | RSS MB | goroutines | threads | log MB | CPU s |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range r.Samples {
		g := "-"
		if s.Goroutines >= 0 {
			g = strconv.Itoa(s.Goroutines)
		}
		fmt.Fprintf(bw, "| %.0f | %d | %d | %d | %.1f | %s | %d | %.2f | %.1f |\n", s.At, s.Upserted, s.Delivered, s.Acked,
			float64(s.RSSBytes)/(1<<20), g, s.Threads, float64(s.LogBytes)/(1<<20), s.CPUSeconds)
	}
	if r.Error != "" {
		fmt.Fprintf(bw, "\nerror: %s\n", r.Error)
	}
	return bw.Flush()
}

// procStatus returns a process's VmRSS in bytes and its thread count, from
// /proc/<pid>/status; zeros when it cannot be read.
func procStatus(pid int) (rss int64, threads int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			rss = kb << 10
		case "Threads":
			threads, _ = strconv.Atoi(f[0])
		}
	}
	return rss, threads
}

// scrapeGauge reads one unlabelled gauge from a Prometheus text /metrics at
// addr; -1 when it cannot.
func scrapeGauge(ctx context.Context, addr, name string) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return -1
			}
			return int(f)
		}
	}
	return -1
}

// startNoise starts a process that spins one core (a shell busy loop, the
// same as scripts/hog.sh) and returns what ends it. The neighbour is a
// process of its own, not goroutines of delaybench, so it competes with
// delayd and Redis as another program on the machine would, without
// taking the measuring client's Go scheduler.
func startNoise() (stop func(), err error) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}, nil
}

// upsertRetrying calls upsert until it succeeds, retrying an UNAVAILABLE
// answer every 100 ms for up to a minute, as delayd tells clients to
// ("store unavailable, safe to retry": an upsert is idempotent); each retry
// is counted in retries. A soak on a loaded machine used to end at the
// first such answer (a 20-minute NOISE=1 run stopped at 901 s).
func upsertRetrying(ctx context.Context, upsert func() error, retries *atomic.Int64) error {
	giveUp := time.Now().Add(time.Minute)
	for {
		err := upsert()
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(giveUp) || ctx.Err() != nil {
			return err
		}
		retries.Add(1)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
