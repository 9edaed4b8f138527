package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/storage"
)

// TestWatchCopiesRoundTrip: PUBLISH answers 0 while nobody subscribes to a
// namespace's watch channel; a subscriber gets each copy of its namespace,
// whole (payload bytes, times, Dropped), and none of another namespace.
func TestWatchCopiesRoundTrip(t *testing.T) {
	t.Parallel()
	s := New(testkit.Redis(t), Options{})
	ns, other := "watch-"+testkit.Suffix(), "watch-"+testkit.Suffix()
	at := time.UnixMilli(1_700_000_000_123).UTC()
	copyOf := func(ns, id string) storage.WatchCopy {
		return storage.WatchCopy{
			Task: storage.Task{Namespace: ns, ID: id, Kind: "k", Payload: []byte{0, 1, 0xff}, State: storage.StateDelivered,
				Attempt: 2, Generation: 3, DueTime: at, LeaseDeadline: at.Add(time.Minute)},
			LeaseDeadline: at.Add(time.Minute), SentAt: at.Add(time.Millisecond), Dropped: 4,
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n, err := s.PublishWatchCopies(ctx, []storage.WatchCopy{copyOf(ns, "a")})
	if err != nil || len(n) != 1 || n[0] != 0 {
		t.Fatalf("publish with nobody watching = %v, %v; want [0]", n, err)
	}

	ready := make(chan struct{})
	got := make(chan storage.WatchCopy, 10)
	subCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- s.SubscribeWatchCopies(subCtx, ns, func() error { close(ready); return nil },
			func(c storage.WatchCopy) error { got <- c; return nil })
	}()
	<-ready
	n, err = s.PublishWatchCopies(ctx, []storage.WatchCopy{copyOf(other, "x"), copyOf(ns, "b")})
	if err != nil || len(n) != 2 || n[0] != 0 || n[1] != 1 {
		t.Fatalf("publish with one watcher of %s = %v, %v; want [0 1]", ns, n, err)
	}
	select {
	case c := <-got:
		if diff := cmp.Diff(copyOf(ns, "b"), c); diff != "" {
			t.Errorf("copy (-want +got):\n%s", diff)
		}
	case <-ctx.Done():
		t.Fatal("no copy arrived")
	}
	stop()
	if err := <-done; err != context.Canceled {
		t.Errorf("SubscribeWatchCopies after cancel: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("extra copies: %v", <-got)
	}
}

// TestWatchSubscriptionsShareOneConnection: 60 subscriptions over 6
// namespaces hold one pub/sub connection to Redis, each gets its own
// namespace's copies, and after the last ends the connection holds no
// subscription (it is closed watchHubLinger later).
// Before, each subscription opened its own connection: 2,100 watches ran
// Redis out of clients.
func TestWatchSubscriptionsShareOneConnection(t *testing.T) {
	t.Parallel()
	rds := testkit.StartRedis(t)
	s := New(rds.Client(), Options{})
	admin := rds.Client()
	pubsubClients := func() int {
		out, err := admin.Do(t.Context(), "CLIENT", "LIST", "TYPE", "pubsub").Text()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.TrimSpace(line) != "" {
				n++
			}
		}
		return n
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	subCtx, stop := context.WithCancel(ctx)
	const perNS, spaces = 10, 6
	got := make([]atomic.Int64, perNS*spaces)
	var wg sync.WaitGroup
	for i := range perNS * spaces {
		ready := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns := fmt.Sprintf("share-%d", i%spaces)
			err := s.SubscribeWatchCopies(subCtx, ns, func() error { close(ready); return nil },
				func(c storage.WatchCopy) error {
					if c.Task.Namespace == ns {
						got[i].Add(1)
					}
					return nil
				})
			if err != context.Canceled {
				t.Errorf("subscription %d ended with %v", i, err)
			}
		}()
		<-ready
	}
	if n := pubsubClients(); n != 1 {
		t.Errorf("%d subscriptions hold %d pub/sub connections; want 1", perNS*spaces, n)
	}
	var copies []storage.WatchCopy
	for k := range spaces {
		copies = append(copies, storage.WatchCopy{Task: storage.Task{Namespace: fmt.Sprintf("share-%d", k), ID: "t"}})
	}
	if _, err := s.PublishWatchCopies(ctx, copies); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		for got[i].Load() == 0 && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if n := got[i].Load(); n != 1 {
			t.Errorf("subscription %d got %d copies of its namespace; want 1", i, n)
		}
	}
	stop()
	wg.Wait()
	for pubsubClients() != 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := pubsubClients(); n != 0 {
		t.Errorf("after every subscription ended, %d pub/sub connections are open", n)
	}
}

// TestWatchChurnReusesOneConnection (issue 42 item 7): watch subscriptions
// opened and closed 50 times one after the other, then 50 times by each of
// 4 workers, over 2 namespaces, connect to Redis at most twice in all: the hub keeps its pub/sub
// connection for watchHubLinger after its last subscriber, so a watch that
// opens while none is open reuses it. Before, the connection was closed the
// moment nobody subscribed and the next watch opened another: the issue's
// 4 workers made 2,029 connections in 5 s (2,037 sockets in TIME_WAIT).
func TestWatchChurnReusesOneConnection(t *testing.T) {
	t.Parallel()
	rds := testkit.StartRedis(t)
	s := New(rds.Client(), Options{})
	admin := rds.Client()
	connections := func() int64 {
		info, err := admin.Info(t.Context(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatal("INFO stats has no total_connections_received")
		return 0
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	connections() // the admin client's own connection, before counting
	before := connections()
	const cycles = 50
	churn := func(workers int) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := range cycles {
					subCtx, stop := context.WithCancel(ctx)
					err := s.SubscribeWatchCopies(subCtx, fmt.Sprintf("churn-%d", (w+c)%2),
						func() error { stop(); return nil }, // open, then close at once
						func(storage.WatchCopy) error { return nil })
					stop()
					if err != context.Canceled {
						t.Errorf("worker %d cycle %d: %v", w, c, err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	churn(1) // one after the other: nobody subscribes between two watches
	churn(4)
	const workers = 5 // in all
	grown := connections() - before
	t.Logf("%d watch open/close cycles: %d Redis connections opened", workers*cycles, grown)
	if grown > 2 {
		t.Errorf("%d watch open/close cycles opened %d Redis connections; want at most 2 (one pub/sub connection kept between watches)", workers*cycles, grown)
	}
}
