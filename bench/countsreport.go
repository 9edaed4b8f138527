package bench

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// table is a report table that prints as aligned text or as Markdown, so
// both forms of a report say the same thing.
type table struct {
	title  string
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// writeText prints the title and the table with aligned columns.
func (t *table) writeText(w io.Writer) error {
	if len(t.rows) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%s\n", t.title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t")+"\t")
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	return tw.Flush()
}

// writeMarkdown prints the title as a paragraph and the table in Markdown.
func (t *table) writeMarkdown(w io.Writer) {
	if len(t.rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s\n\n| %s |\n|%s\n", t.title, strings.Join(t.header, " | "), strings.Repeat("---|", len(t.header)))
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}

// countTables are the tables of a report's counts: Redis calls per task,
// the scripts, and syscalls and context switches per task.
func countTables(results []Result) []*table {
	calls := &table{
		title: "Redis calls per task (load phase: per upserted task; delivery phase: per delivered task). sent = commands clients sent, " +
			"with scripts by name and µs per call; scripts = EVALSHA/EVAL/FCALL calls; run by scripts = the commands the scripts ran (redis.call):",
		header: []string{"#", "workload", "system", "phase", "sent", "scripts", "sent, by command", "run by scripts"},
	}
	scripts := &table{
		title:  "Scripts (from the private Redis's SLOWLOG): calls per task, Redis µs per call, and the commands each call ran with their share of the time:",
		header: []string{"#", "workload", "system", "phase", "script", "calls/task", "µs/call", "commands/call", "µs in commands/call"},
	}
	procs := &table{
		title: "Syscalls and context switches per task (read, write: /proc/<pid>/io syscr, syscw; vcs, ivcs: voluntary, involuntary context switches; " +
			"svc = the service's process, for a baseline or asynq the delaybench process):",
		header: []string{"#", "workload", "system", "phase", "svc read", "svc write", "svc vcs", "svc ivcs", "redis read", "redis write", "redis vcs", "redis ivcs"},
	}
	for i, x := range results {
		if x.Skipped != "" || x.Params.Tasks <= 0 {
			continue
		}
		for _, ph := range []struct {
			name string
			c    Counts
		}{{"load", x.Counts.Load}, {"deliver", x.Counts.Deliver}} {
			head := []string{fmt.Sprint(i + 1), x.Workload, x.System, ph.name}
			n := float64(x.Params.Tasks)
			if row := callsRow(ph.c, n); row != nil {
				calls.add(append(head, row...)...)
			}
			for _, s := range scriptRows(ph.c, n) {
				scripts.add(append(slices.Clone(head), s...)...)
			}
			if ph.c.Service != nil || ph.c.Redis != nil {
				procs.add(append(head, append(procCells(ph.c.Service, n), procCells(ph.c.Redis, n)...)...)...)
			}
		}
	}
	return []*table{calls, scripts, procs}
}

// callsRow is one phase's cells of the calls table, or nil when Redis's
// commands were not read.
func callsRow(c Counts, n float64) []string {
	if c.RedisCommands == nil {
		return nil
	}
	var scriptCalls int64
	for k, s := range c.RedisCommands {
		if scriptCommands[k] {
			scriptCalls += s.Calls
		}
	}
	if c.RedisSent == nil {
		// No slowlog: every command Redis ran, scripts' included, unnamed.
		return []string{"-", perTask(scriptCalls, n), topCalls(c.RedisCommands, n, 8, nil), "(not split: no --slowlog)"}
	}
	var sent int64
	for _, s := range c.RedisSent {
		sent += s.Calls
	}
	inner := map[string]CallStat{}
	for _, s := range c.RedisScripts {
		for k, v := range s.Inner {
			inner[k] = CallStat{Calls: inner[k].Calls + v}
		}
	}
	var ran int64
	for _, v := range inner {
		ran += v.Calls
	}
	by := topCalls(c.RedisSent, n, 6, func(k string, s CallStat) string {
		if strings.Contains(k, " ") { // a script: its time per call
			return fmt.Sprintf(" (%.0f µs)", float64(s.Usec)/float64(s.Calls))
		}
		return ""
	})
	byInner := "-"
	if ran > 0 {
		byInner = perTask(ran, n) + ": " + topCalls(inner, n, 6, nil)
	}
	if lost := sumCalls(c.RedisCommands) - c.RedisLogged; lost > 0 {
		by += fmt.Sprintf(" [the log dropped %d of %d commands: names from the rest]", lost, sumCalls(c.RedisCommands))
	}
	return []string{perTask(sent, n), perTask(scriptCalls, n), by, byInner}
}

// topCalls lists the k most called commands per task, most called first,
// with suffix's text after each.
func topCalls(m map[string]CallStat, n float64, k int, suffix func(string, CallStat) string) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b].Calls, m[a].Calls), strings.Compare(a, b))
	})
	var parts []string
	for i, key := range keys {
		if i == k {
			parts = append(parts, fmt.Sprintf("+%d more", len(keys)-k))
			break
		}
		s := m[key]
		p := upperCommand(key) + " " + perTask(s.Calls, n)
		if suffix != nil {
			p += suffix(key, s)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// upperCommand writes a command name as Redis's documentation does
// (EVALSHA pop, CONFIG|SET), leaving a script's name as it is.
func upperCommand(key string) string {
	cmd, name, ok := strings.Cut(key, " ")
	if !ok {
		return strings.ToUpper(key)
	}
	return strings.ToUpper(cmd) + " " + name
}

// scriptRows are one phase's rows of the scripts table, the most called
// first.
func scriptRows(c Counts, n float64) [][]string {
	keys := slices.SortedFunc(maps.Keys(c.RedisScripts), func(a, b string) int {
		return cmp.Or(cmp.Compare(c.RedisScripts[b].Calls, c.RedisScripts[a].Calls), strings.Compare(a, b))
	})
	var rows [][]string
	for _, k := range keys {
		s := c.RedisScripts[k]
		if s.Calls == 0 {
			continue
		}
		var inner int64
		for _, v := range s.Inner {
			inner += v
		}
		per := float64(s.Calls)
		rows = append(rows, []string{upperCommand(k), perTask(s.Calls, n),
			fmt.Sprintf("%.1f", float64(s.Usec)/per), fmt.Sprintf("%.1f", float64(inner)/per), fmt.Sprintf("%.1f", float64(s.InnerUsec)/per)})
	}
	return rows
}

// procCells are a process's counts per task, or dashes.
func procCells(p *ProcCounts, n float64) []string {
	if p == nil {
		return []string{"-", "-", "-", "-"}
	}
	return []string{perTask(p.Reads, n), perTask(p.Writes, n), perTask(p.Voluntary, n), perTask(p.Involuntary, n)}
}

// perTask prints v/n with two decimals (three below 0.1).
func perTask(v int64, n float64) string {
	x := float64(v) / n
	if x != 0 && x < 0.1 {
		return fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

func sumCalls(m map[string]CallStat) int64 {
	var s int64
	for _, v := range m {
		s += v.Calls
	}
	return s
}

// scriptCallsPerTask is the script calls (EVALSHA, EVAL, FCALL, ...) per
// task, -1 when Redis's commands were not read.
func (c Counts) scriptCallsPerTask(tasks int) float64 {
	if c.RedisCommands == nil || tasks <= 0 {
		return -1
	}
	var n int64
	for k, s := range c.RedisCommands {
		if scriptCommands[k] {
			n += s.Calls
		}
	}
	return float64(n) / float64(tasks)
}

// syscallsPerTask is the service process's read+write syscalls per task,
// -1 when not read.
func (c Counts) syscallsPerTask(tasks int) float64 {
	if c.Service == nil || tasks <= 0 {
		return -1
	}
	return float64(c.Service.Reads+c.Service.Writes) / float64(tasks)
}

// deliverRatios is the table of each delayd row against the rows of its
// workload it is compared with, per delivered task over the delivery
// phase: the figures issue 37's targets are stated in.
func deliverRatios(results []Result, rs []Ratio) *table {
	t := &table{
		title: "Per delivered task, delivery phase (from the end of the load to the last ack), system against each row it is compared with: " +
			"script calls and the service's read+write syscalls side by side (system / against), CPU as ratios, lateness p99 side by side:",
		header: []string{"workload", "system", "against", "script calls/task", "redis CPU", "svc CPU", "svc read+write/task", "p99 ms"},
	}
	p99 := map[[2]string]Result{}
	for _, r := range results {
		p99[[2]string{r.Workload, r.System}] = r
	}
	for _, q := range rs {
		a, b := p99[[2]string{q.Workload, q.System}], p99[[2]string{q.Workload, q.Against}]
		late := "-"
		if !a.Params.Backlog {
			late = fmt.Sprintf("%.1f / %.1f", a.Lateness.P99, b.Lateness.P99)
		}
		t.add(q.Workload, q.System, q.Against, pair(q.ScriptCalls, q.AgainstScriptCalls), fx(q.DeliverRedisCPU),
			fx(q.DeliverServiceCPU), pair(q.Syscalls, q.AgainstSyscalls), late)
	}
	return t
}

// pair prints "a / b", a dash for what was not measured.
func pair(a, b float64) string {
	f := func(v float64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v)
	}
	return f(a) + " / " + f(b)
}
