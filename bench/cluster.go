package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ownCluster is a Redis Cluster of private redis-servers (no replicas, no
// persistence) this tool started for its own use: --own-redis-cluster.
type ownCluster struct {
	nodes []*ownRedis
	dirs  []string
	addrs []string
}

// url is the cluster as delayd's --redis-url takes it.
func (c *ownCluster) url() string { return "redis-cluster://" + strings.Join(c.addrs, ",") }

// startOwnCluster starts masters redis-servers with cluster mode on (each
// on a free loopback port below 55535, so its bus port fits), joins them
// with `redis-cli --cluster create` (slots split evenly) and waits until
// every node says cluster_state:ok.
func startOwnCluster(ctx context.Context, bin string, masters int) (_ *ownCluster, err error) {
	c := &ownCluster{}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	for range masters {
		dir, err := os.MkdirTemp("", "delaybench-cluster-")
		if err != nil {
			return nil, err
		}
		c.dirs = append(c.dirs, dir)
		r, err := startOwnRedisArgs(ctx, bin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000", "--dir", dir)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, r)
		c.addrs = append(c.addrs, strings.TrimPrefix(r.url, "redis://"))
	}
	args := append([]string{"--cluster", "create"}, c.addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cli := strings.TrimSuffix(bin, "redis-server") + "redis-cli"
	if _, err := os.Stat(cli); err != nil {
		cli = "redis-cli"
	}
	cmd := exec.CommandContext(ctx, cli, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	deadline := time.Now().Add(time.Minute)
	for _, a := range c.addrs {
		cl := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				return nil, fmt.Errorf("redis cluster node %s not ok within a minute: %v", a, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cl.Close()
	}
	return c, nil
}

// stop stops every node and removes their files.
func (c *ownCluster) stop() {
	for _, n := range c.nodes {
		n.stop()
	}
	for _, d := range c.dirs {
		_ = os.RemoveAll(d)
	}
}
