package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testRedisClient returns a client of the shared test Redis
// (TEST_REDIS_URL, default redis://127.0.0.1:6379), closed when t ends.
func testRedisClient(t testing.TB) *redis.Client {
	t.Helper()
	url := os.Getenv("TEST_REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379"
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("test Redis at %s: %v", url, err)
	}
	return c
}

// testMiniClient returns a client of a fresh in-process miniredis (the
// embedded mode's store), closed when t ends.
func testMiniClient(t testing.TB) *redis.Client {
	t.Helper()
	m := miniredis.RunT(t)
	miniByAddr.Store(m.Addr(), m)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() {
		c.Close()
		miniByAddr.Delete(m.Addr())
	})
	return c
}

// freePort returns a loopback TCP port nobody listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisServer is a redis-server this test started.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

// startRedisServer starts a private redis-server on a free loopback port
// (no persistence) with the extra arguments, and stops it when t ends.
func startRedisServer(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	bin := "/usr/bin/redis-server"
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("redis-server"); err != nil {
			t.Skip("redis-server not installed")
		}
	}
	port := freePort(t)
	dir := t.TempDir()
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log")}, extra...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	t.Cleanup(s.stop)
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server on %s did not start: %v\n%s", s.addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server and waits for it; safe to call twice.
func (s *redisServer) stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// startCluster starts a Redis Cluster of n masters (no replicas) on private
// redis-servers, slots split evenly, and returns a ClusterClient of it.
func startCluster(t testing.TB, n int) *redis.ClusterClient {
	t.Helper()
	var nodes []*redisServer
	for range n {
		nodes = append(nodes, startRedisServer(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "5000"))
	}
	ctx := context.Background()
	for i, node := range nodes {
		c := redis.NewClient(&redis.Options{Addr: node.addr})
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("cluster addslots: %v", err)
		}
		if i > 0 {
			host, port, _ := net.SplitHostPort(nodes[0].addr)
			if err := c.Do(ctx, "CLUSTER", "MEET", host, port).Err(); err != nil {
				t.Fatalf("cluster meet: %v", err)
			}
		}
		c.Close()
	}
	// wait until every node sees all slots covered
	deadline := time.Now().Add(30 * time.Second)
	for _, node := range nodes {
		c := redis.NewClient(&redis.Options{Addr: node.addr})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster did not come up: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	var addrs []string
	for _, node := range nodes {
		addrs = append(addrs, node.addr)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	return cc
}

var fmtSscanf = fmt.Sscanf

// miniByAddr finds the miniredis of a test client by its address.
var miniByAddr sync.Map

// randomNS returns a random suffix for a test namespace.
func randomNS(t testing.TB) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
