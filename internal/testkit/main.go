package testkit

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Main runs a package's tests (call it from TestMain), then deletes from
// the test Redis every namespace named with a Suffix of this process that
// a test left behind (a namespace a server auto-created, one a failed test
// did not clean), and fails the run if a goroutine outlived the tests
// (goleak, with opts). It stops the SharedCluster, if a test started one.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	stopShared()
	RemoveBuilt()
	if n, err := sweep(RedisURL()); err != nil {
		fmt.Fprintf(os.Stderr, "testkit: sweeping test namespaces: %v\n", err)
	} else if n > 0 && testing.Verbose() {
		fmt.Fprintf(os.Stderr, "testkit: deleted %d namespaces tests left behind\n", n)
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sweep deletes every namespace of the Redis at url whose name ends with a
// suffix this process handed out, and returns how many it found.
func sweep(url string) (int, error) {
	suffixes.Lock()
	mine := make(map[string]bool, len(suffixes.m))
	for s := range suffixes.m {
		mine[s] = true
	}
	suffixes.Unlock()
	if len(mine) == 0 {
		return 0, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	found := map[string]bool{}
	consider := func(ns string) {
		if i := strings.LastIndexAny(ns, "-_"); i >= 0 && mine[ns[i+1:]] {
			found[ns] = true
		} else if len(ns) >= 12 && mine[ns[len(ns)-12:]] {
			found[ns] = true
		}
	}
	iter := c.Scan(ctx, 0, "delayd:{*", 1000).Iterator()
	for iter.Next(ctx) {
		k := strings.TrimPrefix(iter.Val(), "delayd:{")
		if end := strings.LastIndexByte(k, '#'); end > 0 && strings.HasPrefix(iter.Val(), "delayd:{") {
			consider(k[:end])
		}
	}
	if err := iter.Err(); err != nil {
		return 0, err
	}
	names, err := c.ZRange(ctx, "delayd:{registry}:namespaces", 0, -1).Result()
	if err != nil {
		return 0, err
	}
	for _, ns := range names {
		consider(ns)
	}
	for ns := range found {
		deleteNamespaceKeys(ctx, c, ns)
	}
	return len(found), nil
}
