package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// WriteMarkdown writes the report as Markdown tables (the form
// docs/BENCHMARKS.md uses): conditions, one row per run with its figures,
// the ratios, problems, and the command of every row.
func (r *Report) WriteMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w)
	load := fmt.Sprintf("Load average %s at start, %s at end.", r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd)
	if r.Machine.LoadAvgEnd == "" { // merged by Render
		load = "Load average (start → end, per run): " + r.Machine.LoadAvgStart + "."
	}
	fmt.Fprintf(bw, "Machine: %d CPUs (%s), %s memory. %s\n\n", r.Machine.CPUs, r.Machine.Model, r.Machine.MemTotal, load)
	fmt.Fprintf(bw, "Versions: Go %s, Redis %s", r.Versions.Go, r.Versions.Redis)
	if r.Versions.MySQL != "" {
		fmt.Fprintf(bw, ", MySQL %s", r.Versions.MySQL)
	}
	if r.Versions.Delayd != "" {
		fmt.Fprintf(bw, ", delayd %s", r.Versions.Delayd)
	}
	fmt.Fprintf(bw, ". Started %s.\n\n", r.Started)
	io.WriteString(bw, "| # | workload | system | tasks | upserts/s | deliv+ack/s | lateness p50 / p90 / p99 / max ms | early | dup | lost | svc CPU s (deliver %core) | redis CPU s | redis B/task |\n")
	io.WriteString(bw, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for i, x := range r.Results {
		if x.Skipped != "" {
			fmt.Fprintf(bw, "| %d | %s | %s | %d | skipped: %s | | | | | | | | |\n", i+1, x.Workload, x.System, x.Params.Tasks, x.Skipped)
			continue
		}
		late := fmt.Sprintf("%.1f / %.1f / %.1f / %.1f", x.Lateness.P50, x.Lateness.P90, x.Lateness.P99, x.Lateness.Max)
		if x.Params.Backlog {
			late = "(backlog)"
		}
		mem := "-"
		if x.MemTasks > 0 && x.RedisBytesPerTask > 0 {
			mem = fmt.Sprintf("%.0f", x.RedisBytesPerTask)
		}
		cpu := "-"
		if x.ServerCPU.Scope != "" {
			cpu = fmt.Sprintf("%.2f (%.1f%%)", x.ServerCPU.Load+x.ServerCPU.Deliver, x.ServerCPU.DeliverPercent)
		}
		fail := ""
		if x.Error != "" {
			fail = " **FAILED: " + x.Error + "**"
		}
		if x.Violations != "" {
			fail += " **FAILED the delivery check: " + x.Violations + "**"
		}
		fmt.Fprintf(bw, "| %d | %s | %s | %d | %.0f %s | %.0f | %s | %d | %d | %d | %s | %.2f | %s |%s\n",
			i+1, x.Workload, x.System, x.Params.Tasks, x.UpsertsPerSec, x.UpsertMode, x.DeliveredAckedSec,
			late, x.Early, x.Duplicates, x.Lost, cpu, x.RedisCPU.Load+x.RedisCPU.Deliver, mem, fail)
	}
	if len(r.Ratios) > 0 {
		io.WriteString(bw, "\nRatios (system ÷ against; p99 lateness: against's ÷ system's, so above 1 means more punctual):\n\n")
		io.WriteString(bw, "| workload | system | against | upserts | deliv+ack | p99 lateness | redis CPU | redis B/task |\n|---|---|---|--:|--:|--:|--:|--:|\n")
		for _, q := range r.Ratios {
			fmt.Fprintf(bw, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", q.Workload, q.System, q.Against,
				fx(q.Upserts), fx(q.DeliveredAcked), fx(q.LatenessP99), fx(q.RedisCPU), fx(q.RedisBytes))
		}
	}
	io.WriteString(bw, "\nCPU per task, µs (whole run: load + delivery; delivery phase alone: from the end of the load to the last ack; client = the delaybench process, which for a baseline or asynq runs the system too):\n\n")
	io.WriteString(bw, "| # | workload | system | redis | svc | client | redis (deliver) | svc (deliver) | client (deliver) |\n|---|---|---|--:|--:|--:|--:|--:|--:|\n")
	for i, x := range r.Results {
		if x.Skipped != "" || x.Error != "" {
			continue
		}
		c, d := x.Cost(), x.DeliverCost()
		svc, svcD := "-", "-"
		if x.ServerCPU.Scope != "" {
			svc, svcD = fmt.Sprintf("%.1f", c.Service), fmt.Sprintf("%.1f", d.Service)
		}
		fmt.Fprintf(bw, "| %d | %s | %s | %.1f | %s | %.1f | %.1f | %s | %.1f |\n", i+1, x.Workload, x.System,
			c.Redis, svc, c.Client, d.Redis, svcD, d.Client)
	}
	for _, t := range append([]*table{deliverRatios(r.Results, r.Ratios)}, countTables(r.Results)...) {
		t.writeMarkdown(bw)
	}
	io.WriteString(bw, "\nCommands (row number: command):\n\n")
	for i, x := range r.Results {
		fmt.Fprintf(bw, "%d. `%s`\n", i+1, x.Command)
	}
	var notes []string
	for _, x := range r.Results {
		if x.UpsertedAfterDue > 0 {
			notes = append(notes, fmt.Sprintf("%s/%s: %d tasks were upserted after their due time; their lateness includes load time.", x.Workload, x.System, x.UpsertedAfterDue))
		}
		if x.AckFailed > 0 || x.StreamErrors > 0 || x.Unknown > 0 {
			notes = append(notes, fmt.Sprintf("%s/%s: %d acks not OK, %d stream errors, %d unknown ids.", x.Workload, x.System, x.AckFailed, x.StreamErrors, x.Unknown))
		}
		if x.FillerPerSec > 0 {
			notes = append(notes, fmt.Sprintf("%s/%s: %d filler tasks loaded in batches at %.0f/s; memory per pending task measured on them.", x.Workload, x.System, x.Params.Filler, x.FillerPerSec))
		}
		if n := x.mysqlNote(); n != "" {
			notes = append(notes, n)
		}
	}
	notes = append(notes, r.Notes...)
	if len(notes) > 0 {
		io.WriteString(bw, "\nNotes:\n\n")
		for _, n := range notes {
			fmt.Fprintf(bw, "- %s\n", strings.TrimPrefix(n, "note: "))
		}
	}
	return bw.Flush()
}

// Render reads JSON reports written by --json-out and writes them as one
// Markdown report to w: the results of every file in order (a later row of
// the same workload and system replaces an earlier one), the machine and
// versions of the first file, the load averages of all.
func Render(paths []string, w io.Writer) error {
	var out *Report
	var loads []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("render: %w", err)
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("render %s: %w", p, err)
		}
		loads = append(loads, r.Machine.LoadAvgStart+" → "+r.Machine.LoadAvgEnd)
		if out == nil {
			out = &r
			continue
		}
		for _, x := range r.Results {
			replaced := false
			for i, y := range out.Results {
				if y.Workload == x.Workload && y.System == x.System {
					out.Results[i], replaced = x, true
				}
			}
			if !replaced {
				out.Results = append(out.Results, x)
			}
		}
		for _, n := range r.Notes {
			if !contains(out.Notes, n) {
				out.Notes = append(out.Notes, n)
			}
		}
	}
	if out == nil {
		return fmt.Errorf("render: no files")
	}
	if len(loads) > 1 {
		out.Machine.LoadAvgStart = strings.Join(loads, "; ")
		out.Machine.LoadAvgEnd = ""
	}
	out.Ratios = ratios(out.Results)
	return out.WriteMarkdown(w)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
