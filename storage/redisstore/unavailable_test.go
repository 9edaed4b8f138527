package redisstore

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// everyOp calls each store operation once and returns the errors by name.
func everyOp(ctx context.Context, s *Store, ns string) map[string]error {
	tok := []storage.Token{{Namespace: ns, ID: "x", Incarnation: 1, Generation: 1, Attempt: 1, Delivery: 1}}
	errs := map[string]error{}
	_, errs["upsert"] = s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x"}})
	_, errs["remove"] = s.Remove(ctx, ns, "x", storage.Version{})
	_, errs["get"] = s.Get(ctx, ns, "x")
	_, _, errs["list"] = s.List(ctx, ns, storage.ListParams{State: storage.StateScheduled, Limit: 10})
	_, errs["pop"] = s.Pop(ctx, ns, storage.PopParams{Limit: 10, LeaseFor: time.Minute})
	_, errs["ack"] = s.Ack(ctx, ns, tok)
	_, _, errs["nack"] = s.Nack(ctx, ns, tok, storage.NackOptions{})
	_, errs["extend"] = s.Extend(ctx, ns, tok, time.Minute)
	_, errs["reap"] = s.Reap(ctx, ns, 10, storage.NackOptions{})
	_, _, _, errs["nextwake"] = s.NextWake(ctx, ns)
	_, errs["requeue"] = s.Requeue(ctx, ns, storage.RequeueParams{All: true, Limit: 10})
	_, errs["purge"] = s.Purge(ctx, ns, storage.PurgeParams{All: true, Limit: 10})
	_, errs["stats"] = s.Stats(ctx, ns)
	_, errs["restore"] = s.Restore(ctx, ns, []storage.Task{{ID: "x", Generation: 1, State: storage.StateScheduled}}, storage.RestoreParams{})
	_, _, errs["versions"] = s.Versions(ctx, ns, []string{"x"})
	_, errs["indexed"] = s.Indexed(ctx, ns)
	errs["markindexed"] = s.MarkIndexed(ctx, ns)
	_, errs["trylead"] = s.TryLead(ctx, "t-"+ns, "me", time.Second)
	_, errs["namespaces"] = s.Namespaces(ctx)
	errs["subscribe"] = s.SubscribeWakeups(ctx, func() {}, func(storage.Wakeup) {})
	errs["publishpolicy"] = s.PublishPolicyChanged(ctx, ns)
	return errs
}

func wantUnavailable(t *testing.T, errs map[string]error) {
	t.Helper()
	for op, err := range errs {
		if !errors.Is(err, storage.ErrUnavailable) {
			t.Errorf("%s: err = %v, want ErrUnavailable", op, err)
		}
	}
}

// TestUnavailableWhenRedisIsDown: every operation against a Redis that was
// killed fails with ErrUnavailable.
func TestUnavailableWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{Timeout: 2 * time.Second})
	ctx := context.Background()
	ns := testkit.Namespace(t, "down")
	if _, err := s.Upsert(ctx, ns, []storage.UpsertSpec{{ID: "x"}}); err != nil {
		t.Fatalf("upsert while up: %v", err)
	}
	srv.Kill()
	wantUnavailable(t, everyOp(ctx, s, ns))
}

// TestUnavailableOnTimeout: a Redis that accepts connections but never
// answers makes every operation fail with ErrUnavailable after the
// per-call timeout. (go-redis bounds socket reads by the context deadline
// only with ContextTimeoutEnabled; without it, by ReadTimeout.)
func TestUnavailableOnTimeout(t *testing.T) {
	t.Parallel()
	addr := fakeRedis(t, func(string) string { return "" }) // never answers
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { c.Close() })
	s := New(c, Options{Timeout: 100 * time.Millisecond})
	wantUnavailable(t, everyOp(context.Background(), s, "slow"))
}

// TestUnavailableWhileLoading: LOADING, CLUSTERDOWN, MASTERDOWN and
// TRYAGAIN replies mean "cannot serve now": ErrUnavailable, with no raw
// reply text lost for the log.
func TestUnavailableWhileLoading(t *testing.T) {
	t.Parallel()
	for _, reply := range []string{
		"-LOADING Redis is loading the dataset in memory",
		"-CLUSTERDOWN The cluster is down",
		"-MASTERDOWN Link with MASTER is down",
		"-TRYAGAIN Multiple keys request during rehashing of slot",
	} {
		addr := fakeRedis(t, func(cmd string) string {
			switch cmd {
			case "HELLO":
				return "-ERR unknown command 'HELLO'"
			case "CLIENT", "PING":
				return "+OK"
			}
			return reply
		})
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		s := New(c, Options{Timeout: time.Second})
		_, err := s.Upsert(context.Background(), "x", []storage.UpsertSpec{{ID: "x"}})
		if !errors.Is(err, storage.ErrUnavailable) || !strings.Contains(err.Error(), reply[1:8]) {
			t.Errorf("reply %q: err = %v, want ErrUnavailable", reply, err)
		}
		c.Close()
	}
}

// TestScriptErrorIsNotUnavailable: an error Redis answers for a bad
// request is not reported as an outage.
func TestScriptErrorIsNotUnavailable(t *testing.T) {
	t.Parallel()
	s := New(testRedisClient(t), Options{})
	ns := testkit.Namespace(t, "err")
	k := keysFor(ns, 0)
	t.Cleanup(func() { s.rdb.Del(context.Background(), allKeys(k)...) })
	// an argument the script cannot use: the script fails on it
	_, err := s.run(context.Background(), "pop", scripts.pop, []string{k.due, k.inflight, k.dead, k.meta, k.body}, "not-a-number", 1)
	if err == nil || errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("pop with a bad limit: err = %v, want a non-Unavailable error", err)
	}
}

// fakeRedis serves RESP on a loopback port: for each command it writes
// answer(command name) as a RESP line ("" = no answer at all). It stops
// when t ends.
func fakeRedis(t *testing.T, answer func(cmd string) string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					cmd, err := readCommand(r)
					if err != nil {
						return
					}
					if a := answer(strings.ToUpper(cmd)); a != "" {
						if _, err := conn.Write([]byte(a + "\r\n")); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// readCommand reads one RESP array of bulk strings and returns its first
// element.
func readCommand(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	var n int
	if _, err := fmtSscanf(line, "*%d", &n); err != nil {
		return "", err
	}
	var first string
	for i := range n {
		if _, err := r.ReadString('\n'); err != nil { // $len
			return "", err
		}
		arg, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		if i == 0 {
			first = strings.TrimRight(arg, "\r\n")
		}
	}
	return first, nil
}
