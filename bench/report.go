package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
)

// Report is everything one invocation measured, with the conditions it ran
// under. WriteJSON writes it for scripts, WriteTable for people.
type Report struct {
	Machine  Machine `json:"machine"`
	Versions struct {
		Go    string `json:"go"`
		Redis string `json:"redis"`
		MySQL string `json:"mysql,omitempty"`
		// Delayd is `git describe --always --dirty` of the working tree,
		// when delaybench runs inside the repository.
		Delayd string `json:"delayd,omitempty"`
	} `json:"versions"`
	Started string   `json:"started"`
	Clock   Clock    `json:"clock"`
	Results []Result `json:"results"`
	Ratios  []Ratio  `json:"ratios"`
	Notes   []string `json:"notes"`
}

// Machine describes the host.
type Machine struct {
	CPUs     int    `json:"cpus"`
	Model    string `json:"cpu_model"`
	MemTotal string `json:"mem_total"`
	// LoadAvgStart and LoadAvgEnd are /proc/loadavg before and after: on a
	// shared machine they show what else was running.
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
}

// machineInfo reads the host's CPU count, CPU model, memory and load.
func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU(), LoadAvgStart: loadAvg()}
	m.Model = procField("/proc/cpuinfo", "model name")
	m.MemTotal = procField("/proc/meminfo", "MemTotal")
	return m
}

// procField returns the value of the first "key: value" line of a /proc
// file with that key.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAvg returns the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Ratio compares one row with another of the same workload: delayd with a
// baseline, or durable delayd with Redis-only delayd.
type Ratio struct {
	Workload string `json:"workload"`
	System   string `json:"system"`
	Against  string `json:"against"`
	// Upserts and DeliveredAcked are System's rate divided by Against's
	// (above 1: System is faster).
	Upserts        float64 `json:"upserts"`
	DeliveredAcked float64 `json:"delivered_acked"`
	// LatenessP99 is Against's p99 lateness divided by System's (above 1:
	// System is that many times more punctual); 0 when either is <= 0 or
	// the workload is a backlog (lateness there is queueing time).
	LatenessP99 float64 `json:"lateness_p99_times_lower"`
	// RedisCPU and RedisBytes are System's Redis CPU seconds (load and
	// deliver) and memory per task divided by Against's (below 1: System
	// costs Redis less).
	RedisCPU   float64 `json:"redis_cpu"`
	RedisBytes float64 `json:"redis_bytes_per_task"`
	// Per delivered task over the delivery phase (what delivering and
	// acking costs, without the upserts): Redis's CPU and the service
	// process's CPU divided by Against's (for a baseline or asynq, its
	// process is delaybench's); and beside each other, the script calls
	// (EVALSHA/EVAL/FCALL) and the service process's read+write syscalls
	// per delivered task of System and of Against (-1: not measured).
	DeliverRedisCPU    float64 `json:"deliver_redis_cpu"`
	DeliverServiceCPU  float64 `json:"deliver_service_cpu"`
	ScriptCalls        float64 `json:"script_calls_per_task"`
	AgainstScriptCalls float64 `json:"against_script_calls_per_task"`
	Syscalls           float64 `json:"service_syscalls_per_task"`
	AgainstSyscalls    float64 `json:"against_service_syscalls_per_task"`
}

// ratios compares every delayd row with every baseline row of its
// workload, and durable delayd with Redis-only delayd.
func ratios(rs []Result) []Ratio {
	var out []Ratio
	ok := func(r Result) bool { return r.Skipped == "" && r.Error == "" }
	for _, a := range rs {
		if !ok(a) || !strings.HasPrefix(a.System, "delayd") {
			continue
		}
		for _, b := range rs {
			if !ok(b) || b.Workload != a.Workload {
				continue
			}
			if !strings.HasPrefix(b.System, "baseline") && b.System != SystemAsynq &&
				!(a.System == SystemDelaydDurable && b.System == SystemDelayd) &&
				!(a.System == SystemDelaydSDK && b.System == SystemDelayd) {
				continue
			}
			lat := div(b.Lateness.P99, a.Lateness.P99)
			if a.Params.Backlog {
				lat = 0 // due before the load began: queueing time, not precision
			}
			out = append(out, Ratio{
				Workload:       a.Workload,
				System:         a.System,
				Against:        b.System,
				Upserts:        div(a.UpsertsPerSec, b.UpsertsPerSec),
				DeliveredAcked: div(a.DeliveredAckedSec, b.DeliveredAckedSec),
				LatenessP99:    lat,
				RedisCPU:       div(a.RedisCPU.Load+a.RedisCPU.Deliver, b.RedisCPU.Load+b.RedisCPU.Deliver),
				RedisBytes:     div(a.RedisBytesPerTask, b.RedisBytesPerTask),

				DeliverRedisCPU:    div(a.DeliverCost().Redis, b.DeliverCost().Redis),
				DeliverServiceCPU:  div(a.DeliverCost().Service, b.DeliverCost().Service),
				ScriptCalls:        a.Counts.Deliver.scriptCallsPerTask(a.Params.Tasks),
				AgainstScriptCalls: b.Counts.Deliver.scriptCallsPerTask(b.Params.Tasks),
				Syscalls:           a.Counts.Deliver.syscallsPerTask(a.Params.Tasks),
				AgainstSyscalls:    b.Counts.Deliver.syscallsPerTask(b.Params.Tasks),
			})
		}
	}
	return out
}

// div is a/b, or 0 when either is not positive.
func div(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as aligned text tables.
func (r *Report) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "machine: %d CPUs, %s, %s memory; load average %s at start, %s at end\n",
		r.Machine.CPUs, r.Machine.Model, r.Machine.MemTotal, r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd)
	fmt.Fprintf(bw, "versions: go %s, redis %s", r.Versions.Go, r.Versions.Redis)
	if r.Versions.Delayd != "" {
		fmt.Fprintf(bw, ", delayd %s", r.Versions.Delayd)
	}
	if r.Versions.MySQL != "" {
		fmt.Fprintf(bw, ", mysql %s", r.Versions.MySQL)
	}
	fmt.Fprintf(bw, "; clock offset to Redis %s ± %s\n\n", r.Clock.Offset, r.Clock.Uncertainty)

	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
	io.WriteString(tw, "workload\tsystem\ttasks\tupserts/s\tdeliv+ack/s\tlate p50\tp90\tp99\tmax ms\tearly\tdup\tlost\tsvc CPU s\tsvc %core\tredis CPU s\tredis B/task\t\n")
	for _, x := range r.Results {
		if x.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t%d\tskipped\t\t\t\t\t\t\t\t\t\t\t\t\t\n", x.Workload, x.System, x.Params.Tasks)
			continue
		}
		mem := "-"
		if x.MemTasks > 0 && x.RedisBytesPerTask <= 0 {
			mem = "n/a" // another client freed memory meanwhile (shared Redis)
		} else if x.MemTasks > 0 {
			mem = fmt.Sprintf("%.0f", x.RedisBytesPerTask)
		}
		// A backlog's tasks were due before the load began: their lateness
		// is load and queueing time, not timing precision.
		late := fmt.Sprintf("%.1f\t%.1f\t%.1f\t%.1f", x.Lateness.P50, x.Lateness.P90, x.Lateness.P99, x.Lateness.Max)
		if x.Params.Backlog {
			late = "-\t-\t-\t-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f %s\t%.0f\t%s\t%d\t%d\t%d\t%.2f\t%.1f\t%.2f\t%s\t\n",
			x.Workload, x.System, x.Params.Tasks, x.UpsertsPerSec, x.UpsertMode, x.DeliveredAckedSec,
			late, x.Early, x.Duplicates, x.Lost,
			x.ServerCPU.Load+x.ServerCPU.Deliver, x.ServerCPU.DeliverPercent,
			x.RedisCPU.Load+x.RedisCPU.Deliver, mem)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(bw, "\nratios (system ÷ against; lateness: against's p99 ÷ system's, i.e. times lower):")
		tw = tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "workload\tsystem\tagainst\tupserts\tdeliv+ack\tp99 lateness\tredis CPU\tredis B/task\t")
		for _, q := range r.Ratios {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", q.Workload, q.System, q.Against,
				fx(q.Upserts), fx(q.DeliveredAcked), fx(q.LatenessP99), fx(q.RedisCPU), fx(q.RedisBytes))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(bw, "\ncost per task (µs of CPU per task over load + delivery; client = the delaybench process, which for a baseline or --server inproc runs the system too):")
	tw = tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tsystem\tredis µs\tsvc µs\tclient µs\tdeliver: redis µs\tsvc µs\tclient µs\t")
	for _, x := range r.Results {
		if x.Skipped != "" || x.Error != "" {
			continue
		}
		c, d := x.Cost(), x.DeliverCost()
		svc, svcD := "-", "-"
		if x.ServerCPU.Scope != "" {
			svc, svcD = fmt.Sprintf("%.1f", c.Service), fmt.Sprintf("%.1f", d.Service)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%.1f\t%.1f\t%s\t%.1f\t\n", x.Workload, x.System, c.Redis, svc, c.Client, d.Redis, svcD, d.Client)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range append([]*table{deliverRatios(r.Results, r.Ratios)}, countTables(r.Results)...) {
		if err := t.writeText(bw); err != nil {
			return err
		}
	}
	var problems []string
	for _, x := range r.Results {
		switch {
		case x.Skipped != "":
			problems = append(problems, fmt.Sprintf("%s/%s skipped: %s", x.Workload, x.System, x.Skipped))
		case x.Error != "":
			problems = append(problems, fmt.Sprintf("%s/%s FAILED: %s", x.Workload, x.System, x.Error))
		}
		if x.Violations != "" {
			problems = append(problems, fmt.Sprintf("%s/%s FAILED the delivery check: %s", x.Workload, x.System, x.Violations))
		}
		if x.UpsertedAfterDue > 0 {
			problems = append(problems, fmt.Sprintf("%s/%s: %d tasks were upserted after their due time (load slower than --lead); their lateness includes load time", x.Workload, x.System, x.UpsertedAfterDue))
		}
		if x.AckFailed > 0 || x.StreamErrors > 0 || x.Unknown > 0 {
			problems = append(problems, fmt.Sprintf("%s/%s: %d acks not OK, %d stream errors, %d unknown ids", x.Workload, x.System, x.AckFailed, x.StreamErrors, x.Unknown))
		}
	}
	if len(problems) > 0 {
		fmt.Fprintln(bw)
		for _, p := range problems {
			fmt.Fprintln(bw, "! "+p)
		}
	}
	fmt.Fprintln(bw)
	for _, x := range r.Results {
		if n := x.mysqlNote(); n != "" {
			fmt.Fprintln(bw, "note: "+n)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintln(bw, "note: "+n)
	}
	io.WriteString(bw, "note: upserts/s is the load phase (unary = one UpsertTask per call, sdk = one Go SDK Client.Upsert per task, batched by the SDK, batch = BatchUpsertTasks / pipelined baseline); deliv+ack/s runs from the first due time (backlog: from subscribing) to the last ack; lateness is due time -> arrival at the subscriber by the Redis clock; svc %core is the service CPU over the delivery phase."+"\n")
	return bw.Flush()
}

// fx prints a ratio, or "-" when there is none.
func fx(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}
