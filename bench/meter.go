package bench

import (
	"context"
	"os"
	"time"
)

// Counts are the event counts of one phase of a run: per task they say
// where the CPU goes in terms that barely move with the machine's load
// (docs/BENCHMARKS.md, "Reading the counts").
type Counts struct {
	// Service is the process that runs the system: the delayd child (or
	// --target-pid); the delaybench process for the baseline, asynq and an
	// in-process delayd. Nil when it cannot be read.
	Service *ProcCounts `json:"service,omitempty"`
	// Redis is the redis-server process (summed over a cluster's masters);
	// nil when it is not on this host.
	Redis *ProcCounts `json:"redis,omitempty"`
	// Client is the delaybench process (load generator and subscribers).
	Client *ProcCounts `json:"client,omitempty"`
	// RedisCommands are INFO commandstats deltas by command ("evalsha",
	// "zadd", "config|set"): every command Redis ran, those scripts ran
	// included, without delaybench's own probe commands.
	RedisCommands map[string]CallStat `json:"redis_commands,omitempty"`
	// RedisSent are the commands clients sent, by command, with script
	// calls by script ("evalsha pop", "fcall pop"): from the SLOWLOG of a
	// private Redis (--slowlog), nil otherwise.
	RedisSent map[string]CallStat `json:"redis_sent,omitempty"`
	// RedisScripts are the script calls by the same keys, with the
	// commands each ran.
	RedisScripts map[string]*ScriptStat `json:"redis_scripts,omitempty"`
	// RedisLogged counts the slowlog entries read (RedisCommands' calls
	// less any the log dropped: if it is below their sum, RedisSent and
	// RedisScripts cover the newest part of the phase only).
	RedisLogged int64 `json:"redis_logged,omitempty"`
}

// PhaseCounts are a run's counts over its load phase and its delivery
// phase (the same windows as its CPU figures).
type PhaseCounts struct {
	Load    Counts `json:"load"`
	Deliver Counts `json:"deliver"`
}

// meter reads every counter of a run at the phase boundaries: the CPU time
// and the counts of the service, Redis and this process, and Redis's
// command statistics.
type meter struct {
	e   env
	sys system
	// svcPID is the service's process (0: not readable).
	svcPID int
}

// reading is every counter at one instant.
type reading struct {
	svcCPU    time.Duration
	svcScope  string
	svcOK     bool
	redisCPU  time.Duration // -1: unknown
	clientCPU time.Duration
	svc       *ProcCounts
	redis     *ProcCounts
	client    *ProcCounts
	cmds      map[string]CallStat // nil: unknown
}

// read takes a reading: the CPU times first, then the counters.
func (m meter) read(ctx context.Context) reading {
	var r reading
	r.svcCPU, r.svcScope, r.svcOK = m.sys.cpu()
	r.redisCPU = m.e.redisCPU(ctx)
	r.clientCPU = SelfCPU()
	if m.svcPID > 0 {
		if c, err := ReadProcCounts(m.svcPID); err == nil {
			r.svc = &c
		}
	}
	if c, err := ReadProcCounts(os.Getpid()); err == nil {
		r.client = &c
	}
	if m.e.redis != nil {
		if c, ok := m.e.redis.ProcCounts(); ok {
			r.redis = &c
		}
		// With the slowlog, its drains read the statistics.
		if !m.e.redis.Slowlog() {
			if s, err := m.e.redis.CommandStats(ctx); err == nil {
				r.cmds = s
			}
		}
	}
	return r
}

// counts returns what happened between readings a and b. With the slowlog
// read at the phase's start (logA) and end (logB), the command statistics
// are theirs, which cover exactly the commands logged.
func counts(a, b reading, logA, logB *slowlogTally) Counts {
	var c Counts
	sub := func(x, y *ProcCounts) *ProcCounts {
		if x == nil || y == nil {
			return nil
		}
		d := y.sub(*x)
		return &d
	}
	c.Service, c.Redis, c.Client = sub(a.svc, b.svc), sub(a.redis, b.redis), sub(a.client, b.client)
	switch {
	case logA != nil && logB != nil:
		c.RedisCommands = subStats(logB.Commands, logA.Commands)
		c.RedisSent, c.RedisScripts, c.RedisLogged = logB.Sent, logB.Scripts, logB.Logged
	case a.cmds != nil && b.cmds != nil:
		c.RedisCommands = subStats(b.cmds, a.cmds)
	}
	return c
}

// cpu returns the CPU of one process over the load (a to b) and the
// delivery (c to d) phases; deliverWall is the delivery phase's length.
func phaseCPU(scope string, a, b, c, d time.Duration, deliverWall time.Duration) CPU {
	x := CPU{Scope: scope, Load: (b - a).Seconds(), Deliver: (d - c).Seconds()}
	if deliverWall > 0 {
		x.DeliverPercent = 100 * x.Deliver / deliverWall.Seconds()
	}
	return x
}

// fillCPU sets res's CPU figures from the readings at the start of the
// load (r0), its end (r1), the start of the delivery (r2) and its end (r3).
func fillCPU(res *Result, r0, r1, r2, r3 reading, deliverWall time.Duration) {
	if r0.svcOK && r3.svcOK {
		res.ServerCPU = phaseCPU(r0.svcScope, r0.svcCPU, r1.svcCPU, r2.svcCPU, r3.svcCPU, deliverWall)
	}
	res.ClientCPU = phaseCPU("delaybench process", r0.clientCPU, r1.clientCPU, r2.clientCPU, r3.clientCPU, deliverWall)
	if r0.redisCPU >= 0 && r1.redisCPU >= 0 && r2.redisCPU >= 0 && r3.redisCPU >= 0 {
		res.RedisCPU = phaseCPU("redis-server process", r0.redisCPU, r1.redisCPU, r2.redisCPU, r3.redisCPU, deliverWall)
	}
}

// slowlogStart starts logging every command of a private Redis for the
// run's measured phases (a no-op without --slowlog or a private Redis).
func (e env) slowlogStart(ctx context.Context) (*slowlogTally, error) {
	if e.redis == nil {
		return nil, nil
	}
	return e.redis.SlowlogStart(ctx)
}

// slowlogDrain reads what the log holds and clears it (nil without it).
func (e env) slowlogDrain(ctx context.Context) (*slowlogTally, error) {
	if e.redis == nil {
		return nil, nil
	}
	return e.redis.SlowlogDrain(ctx)
}

// slowlogStop stops logging and frees the log.
func (e env) slowlogStop(ctx context.Context) error {
	if e.redis == nil {
		return nil
	}
	return e.redis.SlowlogStop(ctx)
}
