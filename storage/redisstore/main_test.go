package redisstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) {
	testkit.Main(m)
}

// testRedisClient returns a client of the shared test Redis (see
// internal/testkit), closed when t ends.
func testRedisClient(t testing.TB) *redis.Client { return testkit.Redis(t) }

// testMiniClient returns a client of a fresh in-process miniredis (the
// embedded mode's store), closed when t ends.
func testMiniClient(t testing.TB) *redis.Client {
	t.Helper()
	m := miniredis.RunT(t)
	miniByAddr.Store(m.Addr(), m)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	// As daemon's embedded mode does: tell miniredis the time passed, so
	// keys with a TTL (the records of pops) expire.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		c.Close()
		miniByAddr.Delete(m.Addr())
	})
	return c
}

var fmtSscanf = fmt.Sscanf

// miniByAddr finds the miniredis of a test client by its address.
var miniByAddr sync.Map
