package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/internal/testkit"
)

// A process's read and write syscalls and context switches, for this
// process and for another (a private redis-server), grow by at least what
// was done to them.
func TestReadProcCountsCountsWhatHappened(t *testing.T) {
	t.Parallel()
	self := os.Getpid()
	c0, err := ReadProcCounts(self)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	for range 50 {
		if _, err := f.ReadAt(buf, 0); err != nil && err != io.EOF {
			t.Fatal(err)
		}
	}
	c1, _ := ReadProcCounts(self)
	if d := c1.sub(c0); d.Reads < 50 {
		t.Errorf("this process: %d read syscalls counted for 50 preads", d.Reads)
	}

	srv := testkit.StartRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	r0, err := ReadProcCounts(srv.Pid())
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r1, _ := ReadProcCounts(srv.Pid())
	d := r1.sub(r0)
	// Each PING is one read and one write; between them Redis sleeps in
	// epoll_wait, a voluntary switch (it may find the next already there).
	if d.Reads < 100 || d.Writes < 100 {
		t.Errorf("redis-server: %d reads, %d writes for 100 PINGs; want >= 100 each", d.Reads, d.Writes)
	}
	if d.Voluntary <= 0 {
		t.Errorf("redis-server: %d voluntary context switches over 100 round trips", d.Voluntary)
	}
	if _, err := ReadProcCounts(1 << 30); err == nil {
		t.Error("ReadProcCounts of no process: no error")
	}
}

// On a private redis-server, the slowlog drain names every script call —
// EVALSHA by the SHA's name, FCALL by its function — counts the commands
// each ran, and covers exactly the commands INFO commandstats counts over
// the same window; a log that overflows shows as fewer entries than
// commands.
func TestSlowlogSplitsScriptCallsByName(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	sha, err := rdb.ScriptLoad(ctx, "redis.call('set', KEYS[1], ARGV[1]); redis.call('incr', KEYS[2]); return redis.call('get', KEYS[1])").Result()
	if err != nil {
		t.Fatal(err)
	}
	lib := "#!lua name=t1\nredis.register_function{function_name='peek', callback=function(keys) return redis.call('get', keys[1]) end, flags={'no-writes'}}"
	if err := rdb.FunctionLoad(ctx, lib).Err(); err != nil {
		t.Fatal(err)
	}
	p, err := NewRedisProbe(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.EnableSlowlog(ctx, map[string]string{sha: "setincr"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	start, err := p.SlowlogStart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if err := rdb.EvalSha(ctx, sha, []string{"{x}a", "{x}n"}, i).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := rdb.FCallRO(ctx, "peek", []string{"{x}a"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Get(ctx, "{x}n").Err(); err != nil {
		t.Fatal(err)
	}
	// What delaybench sends to measure is left out.
	if _, err := p.CommandStats(ctx); err != nil {
		t.Fatal(err)
	}
	end, err := p.SlowlogDrain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := counts(reading{}, reading{}, start, end)
	wantSent := map[string]CallStat{"evalsha setincr": {Calls: 7}, "fcall_ro peek": {Calls: 3}, "get": {Calls: 1}}
	if d := cmp.Diff(wantSent, c.RedisSent, cmpCalls); d != "" {
		t.Errorf("sent (-want +got):\n%s", d)
	}
	if s := c.RedisScripts["evalsha setincr"]; s == nil || !cmp.Equal(s.Inner, map[string]int64{"set": 7, "incr": 7, "get": 7}) {
		t.Errorf("setincr ran %+v, want 7 each of SET, INCR, GET", s)
	} else if s.InnerUsec <= 0 || s.Usec < s.InnerUsec {
		t.Errorf("setincr: %d µs in all, %d in its commands", s.Usec, s.InnerUsec)
	}
	if s := c.RedisScripts["fcall_ro peek"]; s == nil || s.Inner["get"] != 3 {
		t.Errorf("peek ran %+v, want 3 GETs", s)
	}
	wantCmds := map[string]CallStat{"evalsha": {Calls: 7}, "fcall_ro": {Calls: 3}, "set": {Calls: 7}, "incr": {Calls: 7}, "get": {Calls: 11}}
	if d := cmp.Diff(wantCmds, c.RedisCommands, cmpCalls); d != "" {
		t.Errorf("commandstats (-want +got):\n%s", d)
	}
	if c.RedisLogged != sumCalls(c.RedisCommands) {
		t.Errorf("logged %d entries, commandstats counted %d commands", c.RedisLogged, sumCalls(c.RedisCommands))
	}
	if got := c.scriptCallsPerTask(10); got != 1 {
		t.Errorf("script calls per task over 10 tasks = %v, want 1", got)
	}

	// A log shorter than the phase drops its oldest entries: the count
	// says so, and the report says the names come from the rest.
	if err := rdb.ConfigSet(ctx, "slowlog-max-len", "5").Err(); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		rdb.Get(ctx, "{x}a")
	}
	over, err := p.SlowlogDrain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c = counts(reading{}, reading{}, end, over)
	if sumCalls(c.RedisCommands) != 20 || c.RedisLogged >= 20 {
		t.Errorf("overflowed log: %d commands, %d logged; want 20 and fewer", sumCalls(c.RedisCommands), c.RedisLogged)
	}
	if row := callsRow(c, 20); !strings.Contains(row[2], "the log dropped") {
		t.Errorf("calls row %q does not say the log dropped entries", row)
	}
	if err := p.SlowlogStop(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.ConfigGet(ctx, "slowlog-log-slower-than").Result(); v["slowlog-log-slower-than"] != "-1" {
		t.Errorf("after stop, slowlog-log-slower-than = %v, want -1", v)
	}
}

// cmpCalls compares call counts only: times vary.
var cmpCalls = cmp.Comparer(func(a, b CallStat) bool { return a.Calls == b.Calls })

func TestScriptNameAndKeyShape(t *testing.T) {
	t.Parallel()
	names := map[string]string{"abc123": "pop", "delayd_v1_pop": "pop"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"evalsha", "ABC123", "2", "k"}, "pop"},
		{[]string{"fcall", "delayd_v1_pop", "1", "k"}, "pop"},
		{[]string{"fcall_ro", "other_fn", "0"}, "other_fn"},
		{[]string{"fcall", "delayd_0123456789ab_ack", "1", "k"}, "ack"},
		{[]string{"fcall", "delayd_0123456789a_ack", "1", "k"}, "delayd_0123456789a_ack"},
		{[]string{"evalsha", "8ce6b38a00ff", "1", "asynq:{q-1}:t:t42"}, "sha 8ce6b38a asynq:{…}:t"},
		{[]string{"evalsha", "3c8548ad00ff", "1", "asynq:servers:{h:1:x}"}, "sha 3c8548ad asynq:servers:{…}"},
		{[]string{"evalsha", "deadbeef00", "0"}, "sha deadbeef"},
		{[]string{"eval", "return 1", "0"}, "(source)"},
	}
	for _, c := range cases {
		if got := scriptName(c.args, names); got != c.want {
			t.Errorf("scriptName(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// delaybench on its own private Redis, delayd in-process and the source
// design beside it, on a small backlog loaded by unary upserts: every row's counts are read for both phases, the
// slowlog covers every command Redis counted, the scripts carry their
// names, and the source design's unary load is exactly one upsert script
// call per task.
func TestSmokeCountsOnPrivateRedis(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Workloads: []string{"custom"}, Systems: []string{SystemDelayd, SystemBaseline10ms},
		Server: "inproc", OwnRedis: true, RedisServerBin: "redis-server", Slowlog: true,
		MySQLDSN: "root@tcp(127.0.0.1:3306)/", BaselineBatch: 50, Conns: 2, AckBatch: 20, JSON: true, Quiet: true,
		Timeout: 2 * time.Minute, Override: func(w *Workload) {
			// A backlog: every pop and ack falls in the delivery phase
			// however slow the load is on a busy machine.
			*w = Workload{Name: "custom", Tasks: 400, Backlog: true,
				PayloadBytes: 100, Producers: 4, Subscribers: 2, MaxInFlight: 50}
		},
	}
	rep := runReport(t, cfg)
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Error != "" || r.Tally != (Tally{Expected: 400, Delivered: 400}) {
			t.Fatalf("%s: error %q tally %+v", r.System, r.Error, r.Tally)
		}
		for ph, c := range map[string]Counts{"load": r.Counts.Load, "deliver": r.Counts.Deliver} {
			if c.Service == nil || c.Redis == nil || c.Client == nil {
				t.Errorf("%s %s: process counts missing: service %v redis %v client %v", r.System, ph, c.Service, c.Redis, c.Client)
				continue
			}
			if c.Redis.Reads <= 0 || c.Redis.Writes <= 0 || c.Service.Reads <= 0 {
				t.Errorf("%s %s: redis %+v, service %+v", r.System, ph, *c.Redis, *c.Service)
			}
			if c.RedisLogged == 0 || c.RedisLogged != sumCalls(c.RedisCommands) {
				t.Errorf("%s %s: the slowlog read %d entries, commandstats counted %d commands", r.System, ph, c.RedisLogged, sumCalls(c.RedisCommands))
			}
			for k := range c.RedisSent {
				if strings.Contains(k, " sha ") {
					t.Errorf("%s %s: script %q has no name", r.System, ph, k)
				}
			}
		}
		if scriptCalls(r.Counts.Deliver.RedisSent, "pop") == 0 {
			t.Errorf("%s: no pop script calls while delivering: %v", r.System, r.Counts.Deliver.RedisSent)
		}
	}
	d, b := rep.Results[0], rep.Results[1]
	// delayd's acks are settled in settle.lua calls, or carried by the pops
	// of the next wakes (issue 37 item 3): one of them ran while acks came.
	if scriptCalls(d.Counts.Deliver.RedisSent, "settle")+scriptCalls(d.Counts.Deliver.RedisSent, "pop") == 0 {
		t.Errorf("delayd: no settle or pop script calls while delivering: %v", d.Counts.Deliver.RedisSent)
	}
	if got := b.Counts.Load.RedisSent["evalsha upsert"].Calls; got != 400 {
		t.Errorf("baseline: %d upsert script calls for 400 unary upserts", got)
	}
	if len(rep.Ratios) != 1 || rep.Ratios[0].ScriptCalls <= 0 || rep.Ratios[0].Syscalls <= 0 || rep.Ratios[0].AgainstScriptCalls <= 0 {
		t.Errorf("ratios %+v: want delayd's and the baseline's script calls and delayd's syscalls per task", rep.Ratios)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Redis calls per task", "EVALSHA pop", "Syscalls and context switches per task", "script calls/task"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("the Markdown report lacks %q", want)
		}
	}
}

// scriptCalls sums the calls of script name however they were sent: FCALL
// (delayd's library on Redis 7), FCALL_RO, EVALSHA (the source design, and
// delayd on a server without Functions).
func scriptCalls(sent map[string]CallStat, name string) int64 {
	var n int64
	for _, cmd := range []string{"fcall", "fcall_ro", "evalsha", "eval"} {
		n += sent[cmd+" "+name].Calls
	}
	return n
}
