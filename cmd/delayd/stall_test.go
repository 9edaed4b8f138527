package main

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/testkit"
)

// TestFaultRedisStallKeepsLiveStreams (issue 30 item 2): two replicas
// deliver 1,000 tasks due over 10 s, and Redis stalls (SIGSTOP) for 5 s in
// the middle, less than the 30 s ack timeout. Every task is delivered and
// acked once: no delivery of a stream that stayed connected is made again
// (the renewals that failed while Redis was stopped are retried as soon as
// it answers, before any reaper takes a lease back), in Redis-only and in
// durable mode. How soon deliveries resume after SIGCONT, and the worst
// lateness, are logged (figures, not asserted: the machine is shared).
func TestFaultRedisStallKeepsLiveStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, mode := range []string{"redis-only", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rs := testkit.StartRedis(t)
			args := []string{"--redis-url", rs.URL, "--no-auth"}
			if mode == "durable" {
				args = append(args, "--mysql-dsn", testkit.Database(t, "delayd_fault"), "--reconcile-interval", "2s")
			}
			a, b := startReplica(t, bin, args...), startReplica(t, bin, args...)
			ns := "fault-stall-" + mode
			ty := newTally(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			consume(ctx, t, a.conn, ns, 0, ty)
			consume(ctx, t, b.conn, ns, 0, ty)
			const n, stall = 1000, 5 * time.Second
			first := time.Now().Add(2 * time.Second)
			upsertSpread(t, b.conn, ns, 0, n, time.Until(first), 10*time.Second, ty)
			time.Sleep(time.Until(first.Add(3 * time.Second)))
			rs.Pause()
			paused := true
			defer func() {
				if paused {
					rs.Resume()
				}
			}()
			time.Sleep(stall)
			rs.Resume()
			paused = false
			resumed := time.Now()
			testkit.Eventually(t, 90*time.Second, "every task acked after SIGCONT", func() bool {
				_, lost, _, _ := ty.counts()
				return lost == 0
			})
			accepted, lost, dups, early := ty.counts()
			ty.mu.Lock()
			var worst, worstAfter, firstAfter time.Duration = 0, 0, -1
			// A task whose first delivery to a subscriber is its second
			// attempt or later was popped and never sent: a pop whose answer
			// was lost (it ran in Redis after its caller gave up) leaves its
			// tasks leased to nobody until the liveness lease runs out.
			seen := map[string]bool{}
			unsent, worstUnsent := 0, time.Duration(0)
			for _, ar := range ty.arrivals {
				if !seen[ar.id] {
					seen[ar.id] = true
					if ar.attempt > 1 {
						unsent++
						worstUnsent = max(worstUnsent, ar.at.Sub(maxTime(ar.due, resumed)))
					}
				}
				worst = max(worst, ar.at.Sub(ar.due))
				if !ar.at.Before(resumed) {
					// How late past the later of its due time and SIGCONT.
					worstAfter = max(worstAfter, ar.at.Sub(maxTime(ar.due, resumed)))
					if firstAfter < 0 || ar.at.Sub(resumed) < firstAfter {
						firstAfter = ar.at.Sub(resumed)
					}
				}
			}
			resub := ty.resubscribed
			// Where the time after SIGCONT went: the backlog (tasks due by
			// SIGCONT and not delivered before it), and the deliveries in
			// each quarter second after it.
			backlog := 0
			for id, due := range ty.due {
				if !due.After(resumed) && firstArrival(ty.arrivals, id).Compare(resumed) >= 0 {
					backlog++
				}
			}
			var slots [24]int
			for _, ar := range ty.arrivals {
				if i := int(ar.at.Sub(resumed) / (250 * time.Millisecond)); ar.at.Compare(resumed) >= 0 && i < len(slots) {
					slots[i]++
				}
			}
			// The five latest past the later of due time and SIGCONT, to
			// show where the delay after a stall comes from.
			late := slices.Clone(ty.arrivals)
			ty.mu.Unlock()
			after := func(ar arrival) time.Duration { return ar.at.Sub(maxTime(ar.due, resumed)) }
			slices.SortFunc(late, func(a, b arrival) int { return cmp.Compare(after(b), after(a)) })
			for _, ar := range late[:min(5, len(late))] {
				t.Logf("late: %s attempt %d due %v after SIGCONT, delivered %v after it", ar.id, ar.attempt,
					ar.due.Sub(resumed).Round(time.Millisecond), ar.at.Sub(resumed).Round(time.Millisecond))
			}
			t.Logf("%s: %d tasks due by SIGCONT waited for it; deliveries per 250 ms after SIGCONT: %v", mode, backlog, slots)
			t.Logf("%s: accepted %d, lost %d, redeliveries %d, early %d, streams resubscribed %d; Redis stopped %v; first delivery %v after SIGCONT; worst lateness %v (past the later of due time and SIGCONT: %v); %d tasks first reached a subscriber on attempt 2 or later (popped, never sent), the worst %v past the later of due time and SIGCONT",
				mode, accepted, lost, dups, early, resub, stall, firstAfter.Round(time.Millisecond), worst.Round(time.Millisecond), worstAfter.Round(time.Millisecond), unsent, worstUnsent.Round(time.Millisecond))
			if lost != 0 || early != 0 || dups != 0 {
				t.Fatalf("lost %d, early %d, redeliveries %d (%v); want 0, 0, 0", lost, early, dups, ty.early)
			}
		})
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// firstArrival is when id first reached a subscriber (zero: never).
func firstArrival(arrivals []arrival, id string) time.Time {
	for _, ar := range arrivals {
		if ar.id == id {
			return ar.at
		}
	}
	return time.Time{}
}
