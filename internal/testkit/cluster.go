package testkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of private redis-servers on free loopback
// ports below 55535 (each node's bus is its port + 10000), made with
// `redis-cli --cluster create`, with no persistence. Kill SIGKILLs one node
// (a crash), so a test can watch the cluster promote its replica.
type Cluster struct {
	// Nodes in the order they were started: the first Masters are the
	// masters `redis-cli --cluster create` chose (it makes the first nodes
	// masters), the rest their replicas. Roles change after a failover;
	// Role asks the cluster.
	Nodes   []*ClusterNode
	Masters int
	root    string
	stop    sync.Once
}

// ClusterNode is one redis-server of a Cluster.
type ClusterNode struct {
	Addr string // 127.0.0.1:port
	cmd  *exec.Cmd
	dir  string
}

// clusterNodeTimeout is cluster-node-timeout: how long a master may be
// unreachable before its replica is promoted. Short, so a failover test
// takes seconds; long enough that a loaded machine does not fail over a
// node that is only slow.
const clusterNodeTimeout = 2 * time.Second

// StartCluster starts a cluster of masters masters with replicas replicas
// each, waits until every node says cluster_state:ok and every replica has
// synced, and stops it (every process killed, its files removed) when t
// ends.
func StartCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	c, err := startCluster(masters, replicas)
	if err != nil {
		t.Fatalf("start redis cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

var shared struct {
	sync.Mutex
	c   *Cluster
	err error
}

// SharedCluster is one 3-master, 3-replica cluster per test process,
// started by the first test that asks and stopped by Main when the
// package's tests are done: the cluster suites of a package share it to
// save the start-up (about a second per node). Tests must use namespaces
// of their own on it and must not kill its nodes (StartCluster for that).
func SharedCluster(t testing.TB) *Cluster {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.c, shared.err = startCluster(3, 1)
	}
	if shared.err != nil {
		t.Fatalf("start the shared redis cluster: %v", shared.err)
	}
	return shared.c
}

// stopShared stops the shared cluster, if a test started it (Main).
func stopShared() {
	shared.Lock()
	defer shared.Unlock()
	if shared.c != nil {
		shared.c.Stop()
		shared.c = nil
	}
}

func startCluster(masters, replicas int) (_ *Cluster, err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed (Debian: apt-get install -y redis-server): %w", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redis-cli is not installed (Debian: apt-get install -y redis-tools): %w", err)
	}
	root, err := os.MkdirTemp("", "delayd-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Masters: masters, root: root}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	n := masters * (1 + replicas)
	for i := range n {
		node, err := startClusterNode(bin, filepath.Join(root, strconv.Itoa(i)))
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}
	args := []string{"--cluster", "create"}
	for _, node := range c.Nodes {
		args = append(args, node.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.WaitHealthy(60 * time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

func startClusterNode(bin, dir string) (*ClusterNode, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 { // a port taken between FreePort and the bind: try another
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		node := &ClusterNode{Addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir}
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout.Milliseconds())),
			"--save", "", "--appendonly", "no", "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		node.cmd = cmd
		if lastErr = node.waitPing(10 * time.Second); lastErr == nil {
			return node, nil
		}
		node.Kill()
		_ = os.Remove(filepath.Join(dir, "nodes.conf"))
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	return nil, fmt.Errorf("cluster node did not start: %w\n%s", lastErr, log)
}

// freePort is FreePort without a test: a free loopback port below 55535.
func freePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port < 55535 {
			return port, nil
		}
	}
	return 0, errors.New("no free loopback port below 55535")
}

func (n *ClusterNode) waitPing(within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		if n.cmd.ProcessState != nil {
			return fmt.Errorf("redis-server exited: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Alive reports whether the node's process runs (not killed).
func (n *ClusterNode) Alive() bool { return n.cmd != nil && n.cmd.ProcessState == nil }

// Kill SIGKILLs the node (a crash: nothing is saved) and waits for it.
func (n *ClusterNode) Kill() {
	if !n.Alive() {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGCONT) // a paused process must run to die
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
}

// Pause sends SIGSTOP: the node answers nothing and stops replicating, as
// a hung or partitioned node does; Resume undoes it.
func (n *ClusterNode) Pause() error { return n.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume sends SIGCONT after Pause.
func (n *ClusterNode) Resume() error { return n.cmd.Process.Signal(syscall.SIGCONT) }

// Client is a plain client of this node alone (the caller closes it).
func (n *ClusterNode) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
}

// Role is "master" or "slave", as the node's INFO replication says.
func (n *ClusterNode) Role(ctx context.Context) (string, error) {
	c := n.Client()
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	return infoField(info, "role"), nil
}

func infoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// ReplicaOf is a live replica of master, nil if it has none.
func (c *Cluster) ReplicaOf(ctx context.Context, master *ClusterNode) (*ClusterNode, error) {
	for _, n := range c.Nodes {
		if !n.Alive() || n == master {
			continue
		}
		cl := n.Client()
		repl, err := cl.Info(ctx, "replication").Result()
		cl.Close()
		if err != nil {
			return nil, err
		}
		if infoField(repl, "role") == "slave" &&
			infoField(repl, "master_host")+":"+infoField(repl, "master_port") == master.Addr {
			return n, nil
		}
	}
	return nil, nil
}

// Addrs are the addresses of the nodes still alive.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		if n.Alive() {
			out = append(out, n.Addr)
		}
	}
	return out
}

// URL is the cluster as delayd's --redis-url takes it:
// redis-cluster://host:port,host:port,...
func (c *Cluster) URL() string { return "redis-cluster://" + strings.Join(c.Addrs(), ",") }

// Client returns a ClusterClient of the cluster (the caller closes it).
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
}

// MasterNodes are the nodes that are masters now (alive ones only).
func (c *Cluster) MasterNodes(ctx context.Context) ([]*ClusterNode, error) {
	var out []*ClusterNode
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		role, err := n.Role(ctx)
		if err != nil {
			return nil, err
		}
		if role == "master" {
			out = append(out, n)
		}
	}
	return out, nil
}

// WaitHealthy waits until every live node says cluster_state:ok, knows the
// same masters, and every live replica's link to its master is up with no
// sync in progress.
func (c *Cluster) WaitHealthy(within time.Duration) error {
	ctx := context.Background()
	deadline := time.Now().Add(within)
	var why string
	for {
		why = c.unhealthy(ctx)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster not healthy within %s: %s", within, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) unhealthy(ctx context.Context) string {
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		cl := n.Client()
		info, err := cl.ClusterInfo(ctx).Result()
		if err == nil && !strings.Contains(info, "cluster_state:ok") {
			err = errors.New("cluster_state is not ok")
		}
		var repl string
		if err == nil {
			repl, err = cl.Info(ctx, "replication").Result()
		}
		cl.Close()
		if err != nil {
			return n.Addr + ": " + err.Error()
		}
		if infoField(repl, "role") == "slave" &&
			(infoField(repl, "master_link_status") != "up" || infoField(repl, "master_sync_in_progress") != "0") {
			return n.Addr + ": replica not synced"
		}
	}
	return ""
}

// WaitReplicasCaughtUp waits until every live replica's offset reached its
// master's (nothing written is only on a master).
func (c *Cluster) WaitReplicasCaughtUp(within time.Duration) error {
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		behind := ""
		offsets := map[string]int64{} // master addr -> offset
		var replicas [][2]string      // replica offset, master addr
		for _, n := range c.Nodes {
			if !n.Alive() {
				continue
			}
			cl := n.Client()
			repl, err := cl.Info(ctx, "replication").Result()
			cl.Close()
			if err != nil {
				behind = err.Error()
				break
			}
			if infoField(repl, "role") == "master" {
				off, _ := strconv.ParseInt(infoField(repl, "master_repl_offset"), 10, 64)
				offsets[n.Addr] = off
			} else {
				master := infoField(repl, "master_host") + ":" + infoField(repl, "master_port")
				replicas = append(replicas, [2]string{infoField(repl, "slave_repl_offset"), master})
			}
		}
		for _, r := range replicas {
			off, _ := strconv.ParseInt(r[0], 10, 64)
			if want, ok := offsets[r[1]]; ok && off < want {
				behind = fmt.Sprintf("a replica of %s at %d of %d", r[1], off, want)
			}
		}
		if behind == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicas did not catch up within %s: %s", within, behind)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AddMaster starts one more node and joins it to the cluster as a master
// that serves no slot yet, with CLUSTER MEET, as an operator or an
// orchestrator grows a cluster; MoveSlot gives it slots. The node starts
// empty: unlike redis-cli --cluster add-node (which copies the functions of
// an existing node onto the new one), CLUSTER MEET brings no Redis
// Functions along. It waits until every node knows it.
func (c *Cluster) AddMaster(ctx context.Context) (*ClusterNode, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	node, err := startClusterNode(bin, filepath.Join(c.root, strconv.Itoa(len(c.Nodes))))
	if err != nil {
		return nil, err
	}
	var existing *ClusterNode
	for _, n := range c.Nodes {
		if n.Alive() {
			existing = n
			break
		}
	}
	c.Nodes = append(c.Nodes, node)
	host, port, _ := net.SplitHostPort(existing.Addr)
	nc := node.Client()
	err = nc.ClusterMeet(ctx, host, port).Err()
	nc.Close()
	if err != nil {
		return nil, fmt.Errorf("cluster meet: %w", err)
	}
	id, err := node.id(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		known := true
		for _, n := range c.Nodes {
			if !n.Alive() || n == node {
				continue
			}
			cl := n.Client()
			nodes, err := cl.ClusterNodes(ctx).Result()
			cl.Close()
			if err != nil || !strings.Contains(nodes, id) {
				known = false
				break
			}
		}
		if known {
			return node, c.WaitHealthy(30 * time.Second)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the cluster did not learn of node %s within 30s", node.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// id is the node's cluster id (CLUSTER MYID).
func (n *ClusterNode) id(ctx context.Context) (string, error) {
	cl := n.Client()
	defer cl.Close()
	return cl.Do(ctx, "CLUSTER", "MYID").Text()
}

// MoveSlot moves hash slot slot, keys and all, from the master that serves
// it to the master to, the way redis-cli --cluster reshard moves each slot
// (SETSLOT IMPORTING and MIGRATING, MIGRATE of its keys, SETSLOT NODE on
// every master), and waits until the cluster is healthy.
func (c *Cluster) MoveSlot(ctx context.Context, slot int, to *ClusterNode) error {
	masters, err := c.MasterNodes(ctx)
	if err != nil {
		return err
	}
	var from *ClusterNode
	for _, m := range masters {
		cl := m.Client()
		slots, err := cl.ClusterSlots(ctx).Result()
		cl.Close()
		if err != nil {
			return err
		}
		for _, r := range slots {
			if slot >= int(r.Start) && slot <= int(r.End) && len(r.Nodes) > 0 && r.Nodes[0].Addr == m.Addr {
				from = m
			}
		}
	}
	if from == nil {
		return fmt.Errorf("no master serves slot %d", slot)
	}
	if from == to {
		return nil
	}
	fromID, err := from.id(ctx)
	if err != nil {
		return err
	}
	toID, err := to.id(ctx)
	if err != nil {
		return err
	}
	src, dst := from.Client(), to.Client()
	defer src.Close()
	defer dst.Close()
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID).Err(); err != nil {
		return err
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID).Err(); err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(to.Addr)
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		for _, k := range keys {
			if err := src.Migrate(ctx, host, port, k, 0, 5*time.Second).Err(); err != nil {
				return fmt.Errorf("migrate %s: %w", k, err)
			}
		}
	}
	if !slices.Contains(masters, to) {
		masters = append(masters, to)
	}
	for _, m := range masters {
		cl := m.Client()
		err := cl.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", toID).Err()
		cl.Close()
		if err != nil {
			return fmt.Errorf("setslot on %s: %w", m.Addr, err)
		}
	}
	return c.WaitHealthy(30 * time.Second)
}

// Stop kills every node and removes the cluster's files.
func (c *Cluster) Stop() {
	c.stop.Do(func() {
		for _, n := range slices.Backward(c.Nodes) {
			n.Kill()
		}
		_ = os.RemoveAll(c.root)
	})
}
