package testkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server a test started on a free loopback port,
// with no persistence unless its arguments ask for it. It is killed when
// the test ends. Kill, Pause, Resume and Restart let a test act out a
// crash, a hang and a restart on the same address.
type RedisServer struct {
	t    testing.TB
	Addr string // host:port
	URL  string // redis://host:port
	args []string
	dir  string
	cmd  *exec.Cmd
}

// redisServerBin finds redis-server, failing t when it is not installed.
func redisServerBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (Debian: apt-get install -y redis-server): %v", err)
	}
	return bin
}

// FreePort returns a loopback TCP port nobody listens on right now, below
// 55535 (Redis Cluster uses port+10000 for its bus).
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port < 55535 {
			return port
		}
	}
	t.Fatal("no free loopback port below 55535")
	return 0
}

// StartRedis starts a private redis-server on a free loopback port (no RDB,
// no AOF, its own directory) with the extra arguments, waits until it
// answers, and kills it when t ends. A port chosen free can be taken by
// another process (tests running in parallel) before redis-server binds it:
// then it tries another port, up to five times.
func StartRedis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	dir := t.TempDir()
	s := &RedisServer{t: t, dir: dir}
	t.Cleanup(s.kill)
	for attempt := 1; ; attempt++ {
		port := FreePort(t)
		s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		s.URL = "redis://" + s.Addr
		s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log")}, extra...)
		err := s.startOnce()
		if err == nil {
			return s
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatal(err)
		}
		s.kill()
		_ = os.Remove(filepath.Join(dir, "redis.log")) // its "Address already in use"
	}
}

// errPortTaken: another process had the port before redis-server bound it.
var errPortTaken = errors.New("port taken")

func (s *RedisServer) start() {
	s.t.Helper()
	if err := s.startOnce(); err != nil {
		s.t.Fatal(err)
	}
}

// startOnce starts redis-server and waits until it answers on s.Addr, and
// checks that the server answering is this process (not another test's
// server that got the port first).
func (s *RedisServer) startOnce() error {
	cmd := exec.Command(redisServerBin(s.t), s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	logFile := filepath.Join(s.dir, "redis.log")
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := c.Info(context.Background(), "server").Result()
		if err == nil {
			if !strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
				return fmt.Errorf("redis-server on %s: another process answers there: %w", s.Addr, errPortTaken)
			}
			return nil
		}
		if log, _ := os.ReadFile(logFile); strings.Contains(string(log), "Address already in use") {
			return fmt.Errorf("redis-server on %s: %w", s.Addr, errPortTaken)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			return fmt.Errorf("redis-server on %s did not start: %v\n%s", s.Addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the server's process id.
func (s *RedisServer) Pid() int { return s.cmd.Process.Pid }

// Client returns a client of the server, closed when the test ends.
func (s *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill sends SIGKILL (a crash: nothing is saved) and waits for the process.
func (s *RedisServer) Kill() { s.kill() }

func (s *RedisServer) kill() {
	if s.cmd == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process must run to die
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// Pause sends SIGSTOP: the server keeps its connections open and answers
// nothing, as a hung Redis does.
func (s *RedisServer) Pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("SIGSTOP redis-server: %v", err)
	}
}

// Resume sends SIGCONT after Pause.
func (s *RedisServer) Resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("SIGCONT redis-server: %v", err)
	}
}

// Restart kills the server if it runs and starts it again on the same
// address with the same arguments (empty, unless they make it load data).
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.kill()
	s.start()
}

// ReplicaOf makes the server a replica of primary (REPLICAOF host port).
func (s *RedisServer) ReplicaOf(primary *RedisServer) {
	s.t.Helper()
	s.ReplicaOfAddr(primary.Addr)
}

// ReplicaOfAddr makes the server a replica of the primary at addr
// (host:port), e.g. through a Proxy whose Hold makes the replica lag.
func (s *RedisServer) ReplicaOfAddr(addr string) {
	s.t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "REPLICAOF", host, port).Err(); err != nil {
		s.t.Fatalf("REPLICAOF: %v", err)
	}
}

// Promote makes a replica a primary (REPLICAOF NO ONE), as a failover does.
func (s *RedisServer) Promote() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		s.t.Fatalf("REPLICAOF NO ONE: %v", err)
	}
}

// ReplOffset is the server's replication offset: master_repl_offset of a
// primary, slave_repl_offset of a replica (0 if it has none yet).
func (s *RedisServer) ReplOffset() int64 {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil {
		s.t.Fatalf("INFO replication: %v", err)
	}
	key := "master_repl_offset:"
	if strings.Contains(info, "role:slave") {
		key = "slave_repl_offset:"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// Prioritize gives the server the CPU first where the test may (root on
// Linux): a test that measures Redis's own command times (SLOWLOG) on a
// busy machine then measures the commands, not the scheduler.
func (s *RedisServer) Prioritize() {
	pid := s.cmd.Process.Pid
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, pid, -20)
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte("-20"), 0)
}
