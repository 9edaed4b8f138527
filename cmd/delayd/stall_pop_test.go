package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
)

// TestFaultStallLosesNoPop (issue 38 item 1): a pop whose answer is lost
// costs nothing. Two replicas on one private redis-server deliver tasks
// due at stallRate a second to three acking Subscribe streams (two on one
// replica, one on the other; acks retried through the other replica) that
// stay connected throughout; the redis-server is SIGSTOPped mid-delivery
// for 5 s, 6 s and 12 s (equal to, just over and well over the 5 s store
// timeout), then SIGCONT; and for 6 s in durable mode. A pop sent just before the stop, or (with a
// stall over the store timeout) any pop sent during it, runs when Redis
// resumes, after its caller gave up: before pops could be asked again, its
// tasks stayed leased to nobody until the liveness lease ran out and
// reached a subscriber as attempt 2, seconds late. Now the dispatcher asks
// the lost pop again by its request id and gets the same deliveries: every
// task's first delivery is attempt 1; 0 lost, 0 duplicates, 0 early. On
// main before this, 227, 228 and 227 tasks (durable: 227) first reached a
// subscriber on attempt 2 (the lost pops' tasks, after the 6 s liveness
// lease; up to 13 s late after a 6 s stall).
//
// The rate is 200 tasks a second, not the 1,000 the issue tried: two
// race-built replicas on a loaded 2-core machine do not keep 1,000 a
// second with an ack RPC per task (a first try delivered ~400 a second
// after SIGCONT, 28 s late at worst). How late the tasks are (the worst
// lateness, and when the last task due before the stop arrived) is logged,
// not asserted (a wall-clock bound on a shared machine): in a quiet run
// the lost pops were asked again 20 ms after SIGCONT and the worst
// lateness of a 12 s stall was 12.02 s; under other load deliveries
// resumed up to 2 s after SIGCONT, and the backlog that fell due during
// the stall drains at what the machine gives.
func TestFaultStallLosesNoPop(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, tc := range []stallCase{
		{"redis-only", 5 * time.Second}, {"redis-only", 6 * time.Second}, {"redis-only", 12 * time.Second},
		// durable mode pops on the Redis index. (A sharded namespace is not
		// run here: its pop's first call is a read-only peek, which is what
		// a stall catches, so on main before this it lost no pop either;
		// storetest's PopAgain runs on sharded stores and a cluster.)
		{"durable", 6 * time.Second},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.mode, tc.stall), func(t *testing.T) { stallLosesNoPop(t, bin, tc) })
	}
}

// stallCase is one run of TestFaultStallLosesNoPop: the mode and how long
// Redis stalls.
type stallCase struct {
	mode  string
	stall time.Duration
}

// stallRate is how many tasks fall due a second, over stallSpan.
const (
	stallRate = 200
	stallSpan = 20 * time.Second
)

func stallLosesNoPop(t *testing.T, bin string, tc stallCase) {
	stall := tc.stall
	rs := testkit.StartRedis(t)
	args := []string{"--redis-url", rs.URL, "--no-auth", "--store-timeout", "5s"}
	if tc.mode == "durable" {
		args = append(args, "--mysql-dsn", testkit.Database(t, "delayd_fault"), "--reconcile-interval", "2s")
	}
	a, b := startReplica(t, bin, args...), startReplica(t, bin, args...)
	ns := fmt.Sprintf("fault-lostpop-%s-%d", tc.mode, stall/time.Second)
	ty := newTally(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consume(ctx, t, a.conn, ns, 0, ty, b.conn)
	consume(ctx, t, a.conn, ns, 0, ty, b.conn)
	consume(ctx, t, b.conn, ns, 0, ty, a.conn)
	n := int(stallRate * stallSpan / time.Second)
	first := time.Now().Add(3 * time.Second)
	// one batch call per second of tasks, all before the first falls due
	for i := 0; i < n; i += stallRate {
		c := b
		if i/stallRate%2 == 0 {
			c = a
		}
		upsertSpread(t, c.conn, ns, i, stallRate, time.Until(first.Add(time.Duration(i)*time.Second/stallRate)), time.Second, ty)
	}
	if time.Now().After(first) {
		t.Logf("the upserts ended %v after the first task fell due (a loaded machine)", time.Since(first).Round(time.Millisecond))
	}
	time.Sleep(time.Until(first.Add(4 * time.Second)))
	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	stopped := time.Now()
	time.Sleep(stall)
	rs.Resume()
	paused = false
	resumed := time.Now()
	testkit.Eventually(t, 2*time.Minute, "every task acked after SIGCONT", func() bool {
		_, lost, _, _ := ty.counts()
		return lost == 0
	})
	accepted, lost, dups, early := ty.counts()
	// The records of pops (their answers, kept 6 x the store timeout)
	// alive now: bounded by the pops of the last 30 s, not by the run.
	rc := rs.Client()
	records, recordBytes := 0, int64(0)
	iter := rc.Scan(context.Background(), 0, "delayd:*:req:*", 1000).Iterator()
	for iter.Next(context.Background()) {
		records++
		if n, err := rc.MemoryUsage(context.Background(), iter.Val()).Result(); err == nil {
			recordBytes += n
		}
	}
	_ = rc.Close()
	ty.mu.Lock()
	seen := map[string]bool{}
	// worstBefore: the latest arrival, after the stop, of a task due
	// before it
	second, worst, worstSecond, worstBefore := 0, time.Duration(0), time.Duration(0), time.Duration(0)
	var slots [8]int // first deliveries per second after SIGCONT
	for _, ar := range ty.arrivals {
		if seen[ar.id] {
			continue
		}
		seen[ar.id] = true
		// from the due time it was upserted with: a delivery after a
		// lease ran out carries the due time the reaper gave it
		due := ty.due[ar.id]
		late := ar.at.Sub(due)
		worst = max(worst, late)
		if due.Before(stopped) {
			worstBefore = max(worstBefore, ar.at.Sub(stopped))
		}
		if ar.attempt > 1 {
			second++
			worstSecond = max(worstSecond, late)
		}
		if i := int(ar.at.Sub(resumed) / time.Second); ar.at.After(resumed) && i < len(slots) {
			slots[i]++
		}
	}
	resub := ty.resubscribed
	ty.mu.Unlock()
	t.Logf("SIGSTOP at %s, SIGCONT at %s", stopped.UTC().Format("15:04:05.000"), resumed.UTC().Format("15:04:05.000"))
	t.Logf("%s, stall %v (Redis stopped %v): accepted %d, lost %d, duplicates %d, early %d, streams resubscribed %d; first deliveries on attempt 2 or later: %d (worst %v late); worst lateness %v; the last task due before the stop arrived %v after it; first deliveries per second after SIGCONT: %v; pop records alive at the end: %d, %d bytes (MEMORY USAGE)",
		tc.mode, stall, resumed.Sub(stopped).Round(time.Millisecond), accepted, lost, dups, early, resub, second, worstSecond.Round(time.Millisecond), worst.Round(time.Millisecond), worstBefore.Round(time.Millisecond), slots, records, recordBytes)
	if lost != 0 || dups != 0 || early != 0 {
		t.Errorf("lost %d, duplicates %d, early %d (%v); want 0, 0, 0", lost, dups, early, ty.early)
	}
	if resub != 0 {
		t.Errorf("%d streams were cut and subscribed again; the streams must stay connected through a stall", resub)
	}
	if second != 0 {
		t.Errorf("%d tasks first reached a subscriber on attempt 2 or later (popped, never sent: a pop's answer was lost); want 0", second)
	}
}
