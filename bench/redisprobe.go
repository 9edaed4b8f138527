package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisProbe reads a Redis server's CPU time and memory. CPU comes from
// /proc/<pid>/stat when the server runs on this host (its pid from INFO
// server), otherwise from INFO cpu; both are the whole server process.
type RedisProbe struct {
	rdb redis.UniversalClient
	// PID is the server's process id, 0 if it is not on this host.
	PID int
	// nodes, on a Redis Cluster, probe each master; the figures are their
	// sums.
	nodes []*RedisProbe
	// Version is the server's redis_version.
	Version string
	// log reads the server's SLOWLOG once EnableSlowlog was called (a
	// private server only); nil otherwise.
	log *slowlog
	// names maps script SHAs and function names to script names.
	names map[string]string
}

// NewRedisProbe inspects the server behind rdb.
func NewRedisProbe(ctx context.Context, rdb redis.UniversalClient) (*RedisProbe, error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		p := &RedisProbe{rdb: rdb}
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n, err := NewRedisProbe(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				p.nodes = append(p.nodes, n)
				p.Version = n.Version
			}
			return err
		})
		return p, err
	}
	info, err := redisInfo(ctx, rdb, "server")
	if err != nil {
		return nil, err
	}
	p := &RedisProbe{rdb: rdb, Version: info["redis_version"]}
	if pid, err := strconv.Atoi(info["process_id"]); err == nil {
		// The pid is only ours to read if /proc has a redis process by
		// that number (a server in another host or container does not).
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil && strings.Contains(string(b), "redis") {
			p.PID = pid
		}
	}
	return p, nil
}

// CPU returns the server's user+system CPU time so far.
func (p *RedisProbe) CPU(ctx context.Context) (time.Duration, error) {
	if p.nodes != nil {
		var sum time.Duration
		for _, n := range p.nodes {
			d, err := n.CPU(ctx)
			if err != nil {
				return 0, err
			}
			sum += d
		}
		return sum, nil
	}
	if p.PID != 0 {
		if d, err := ProcCPU(p.PID); err == nil {
			return d, nil
		}
	}
	info, err := redisInfo(ctx, p.rdb, "cpu")
	if err != nil {
		return 0, err
	}
	us, err1 := strconv.ParseFloat(info["used_cpu_user"], 64)
	sy, err2 := strconv.ParseFloat(info["used_cpu_sys"], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("redis cpu: INFO cpu lacks used_cpu_user/used_cpu_sys")
	}
	return time.Duration((us + sy) * float64(time.Second)), nil
}

// CommandStats returns INFO commandstats (summed over a cluster's masters):
// every command's calls and microseconds so far, those scripts ran
// included.
func (p *RedisProbe) CommandStats(ctx context.Context) (map[string]CallStat, error) {
	if p.nodes != nil {
		sum := map[string]CallStat{}
		for _, n := range p.nodes {
			m, err := n.CommandStats(ctx)
			if err != nil {
				return nil, err
			}
			for k, v := range m {
				s := sum[k]
				sum[k] = CallStat{Calls: s.Calls + v.Calls, Usec: s.Usec + v.Usec}
			}
		}
		return sum, nil
	}
	info, err := redisInfo(ctx, p.rdb, "commandstats")
	if err != nil {
		return nil, err
	}
	return commandStats(info), nil
}

// ProcCounts returns the server's read/write syscalls and context switches
// so far (summed over a cluster's masters); ok is false when its process
// is not readable on this host.
func (p *RedisProbe) ProcCounts() (c ProcCounts, ok bool) {
	if p.nodes != nil {
		for _, n := range p.nodes {
			nc, nok := n.ProcCounts()
			if !nok {
				return ProcCounts{}, false
			}
			c = c.add(nc)
		}
		return c, true
	}
	if p.PID == 0 {
		return c, false
	}
	c, err := ReadProcCounts(p.PID)
	return c, err == nil
}

// UsedMemory returns INFO memory used_memory in bytes.
func (p *RedisProbe) UsedMemory(ctx context.Context) (int64, error) {
	if p.nodes != nil {
		var sum int64
		for _, n := range p.nodes {
			m, err := n.UsedMemory(ctx)
			if err != nil {
				return 0, err
			}
			sum += m
		}
		return sum, nil
	}
	info, err := redisInfo(ctx, p.rdb, "memory")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(info["used_memory"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis memory: INFO memory lacks used_memory")
	}
	return n, nil
}

// WaitLazyFree waits until Redis has no objects left to free in the
// background (INFO memory lazyfree_pending_objects is 0), or up to limit:
// the previous run's UNLINKed keys would otherwise shrink used_memory and
// add CPU while the next run measures.
func (p *RedisProbe) WaitLazyFree(ctx context.Context, limit time.Duration) error {
	for _, n := range p.nodes {
		if err := n.WaitLazyFree(ctx, limit); err != nil {
			return err
		}
	}
	if p.nodes != nil {
		return nil
	}
	deadline := time.Now().Add(limit)
	for {
		info, err := redisInfo(ctx, p.rdb, "memory")
		if err != nil {
			return err
		}
		if n, err := strconv.ParseInt(info["lazyfree_pending_objects"], 10, 64); err != nil || n == 0 {
			return nil // 0, or a server that does not report it
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis still freeing %s objects after %s", info["lazyfree_pending_objects"], limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// redisInfo returns the key:value lines of one INFO section.
func redisInfo(ctx context.Context, rdb redis.UniversalClient, section string) (map[string]string, error) {
	s, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO %s: %w", section, err)
	}
	return parseInfo(s), nil
}

// parseInfo parses INFO output into key -> value.
func parseInfo(s string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
