package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ProcCounts are event counters of one process over a phase: its read and
// write system calls and its context switches. They count events, not
// time, so a busy neighbour on the machine moves them far less than CPU
// seconds (docs/BENCHMARKS.md, "Reading the counts").
type ProcCounts struct {
	// Reads and Writes are /proc/<pid>/io syscr and syscw, over every
	// thread: calls of read(2), readv(2), pread(2) and of write(2),
	// writev(2), pwrite(2), on sockets and files alike, including those
	// that returned EAGAIN. Not counted: sendmsg/recvmsg, epoll_wait,
	// futex and the other system calls.
	Reads  int64 `json:"read_syscalls"`
	Writes int64 `json:"write_syscalls"`
	// Voluntary context switches: a thread of the process blocked (on a
	// socket, a futex, a timer) and was woken again later, so each is one
	// wake-up. Involuntary: the scheduler took the CPU from a runnable
	// thread; these grow with the machine's load.
	Voluntary   int64 `json:"voluntary_ctxt_switches"`
	Involuntary int64 `json:"nonvoluntary_ctxt_switches"`
}

// sub returns c - o.
func (c ProcCounts) sub(o ProcCounts) ProcCounts {
	return ProcCounts{Reads: c.Reads - o.Reads, Writes: c.Writes - o.Writes,
		Voluntary: c.Voluntary - o.Voluntary, Involuntary: c.Involuntary - o.Involuntary}
}

// add returns c + o.
func (c ProcCounts) add(o ProcCounts) ProcCounts {
	return ProcCounts{Reads: c.Reads + o.Reads, Writes: c.Writes + o.Writes,
		Voluntary: c.Voluntary + o.Voluntary, Involuntary: c.Involuntary + o.Involuntary}
}

// ReadProcCounts returns the counters of process pid so far (Linux only;
// another user's process needs the rights to read its /proc/<pid>/io).
// For this process the context switches come from getrusage, which keeps
// those of exited threads; for another, they are summed over its live
// threads (/proc/<pid>/task/*/status), so a thread that exited during a
// phase takes its switches with it (Go runtimes and redis-server keep
// their threads).
func ReadProcCounts(pid int) (ProcCounts, error) {
	var c ProcCounts
	io, err := readKeyValues(filepath.Join("/proc", strconv.Itoa(pid), "io"))
	if err != nil {
		return c, fmt.Errorf("process counts: %w", err)
	}
	c.Reads, c.Writes = io["syscr"], io["syscw"]
	if pid == os.Getpid() {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return c, fmt.Errorf("process counts: getrusage: %w", err)
		}
		c.Voluntary, c.Involuntary = ru.Nvcsw, ru.Nivcsw
		return c, nil
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "status"))
	if err != nil || len(tasks) == 0 {
		return c, fmt.Errorf("process counts: no threads of %d", pid)
	}
	for _, t := range tasks {
		st, err := readKeyValues(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		c.Voluntary += st["voluntary_ctxt_switches"]
		c.Involuntary += st["nonvoluntary_ctxt_switches"]
	}
	return c, nil
}

// readKeyValues reads the integer "key: value" lines of a /proc file;
// lines whose value is not one integer are left out.
func readKeyValues(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			m[strings.TrimSpace(k)] = n
		}
	}
	return m, sc.Err()
}

// CallStat is how often a Redis command (or a script, by name) ran over a
// phase and the time Redis spent in it.
type CallStat struct {
	Calls int64 `json:"calls"`
	// Usec is Redis's time inside the command, in microseconds (INFO
	// commandstats usec, or the SLOWLOG durations); a script's includes
	// the commands it ran.
	Usec int64 `json:"usec"`
}

// commandStats parses INFO commandstats into command -> counts
// ("evalsha", "config|set").
func commandStats(info map[string]string) map[string]CallStat {
	out := map[string]CallStat{}
	for k, v := range info {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var s CallStat
		for _, f := range strings.Split(v, ",") {
			fk, fv, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(fv, 10, 64)
			if err != nil {
				continue
			}
			switch fk {
			case "calls":
				s.Calls = n
			case "usec":
				s.Usec = n
			}
		}
		out[name] = s
	}
	return out
}

// probeCommands are the commands delaybench itself sends to Redis to
// measure it (INFO, SLOWLOG, CONFIG, the MULTI that reads the slowlog);
// they are left out of the per-task figures. No system under test sends
// them while it runs.
var probeCommands = map[string]bool{
	"info": true, "multi": true, "exec": true, "client|setname": true,
	"slowlog|get": true, "slowlog|reset": true, "slowlog|len": true,
	"config|set": true, "config|get": true,
}

// subStats returns the growth of every command from before to after,
// without delaybench's probe commands and commands that did not run.
func subStats(after, before map[string]CallStat) map[string]CallStat {
	out := map[string]CallStat{}
	for k, a := range after {
		if probeCommands[k] {
			continue
		}
		b := before[k]
		if d := (CallStat{Calls: a.Calls - b.Calls, Usec: a.Usec - b.Usec}); d.Calls > 0 {
			out[k] = d
		}
	}
	return out
}

// scriptCommands are the commands that run a script.
var scriptCommands = map[string]bool{"evalsha": true, "eval": true, "fcall": true, "fcall_ro": true, "evalsha_ro": true, "eval_ro": true}
