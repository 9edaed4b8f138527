package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// firingStamp is how a firing's id writes its slot (storage.FiringStampLayout;
// this suite talks to delayd over the wire only).
const firingStamp = "20060102T150405Z"

// scheduleFaultRun is how long TestFaultScheduleReplicaSIGKILL runs its
// schedules: long enough for a minutely cron to fire more than once.
const scheduleFaultRun = 150 * time.Second

// TestFaultScheduleReplicaSIGKILL: three replicas (every one runs the
// schedule loop) fire a 1-second rate schedule and a 1-minute cron for
// several minutes; one of them is SIGKILLed a third of the way through and
// started again later. Subscribers on the two others take every firing.
// Each slot is delivered exactly once and none is missing: the slots
// delivered are every second (every minute) from the first slot after the
// schedule's creation to the last one it fired, each once, and their count
// is what the schedule says it fired. Run in Redis-only mode (the index
// applies a step in one script) and in durable mode (MySQL, the authority,
// in one transaction).
func TestFaultScheduleReplicaSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: real processes for minutes; not in -short")
	}
	t.Parallel()
	bin := buildBinary(t)
	for _, mode := range []string{"redis", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rs := testkit.StartRedis(t)
			args := []string{"--redis-url", rs.URL, "--no-auth"}
			if mode == "durable" {
				args = append(args, "--mysql-dsn", testkit.Database(t, "delayd_fault"))
			}
			a, b, c := startReplica(t, bin, args...), startReplica(t, bin, args...), startReplica(t, bin, args...)
			ns := "fault-sched"
			ty := newTally(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// Subscribers on the replicas that live: a kill then costs no
			// delivery in flight, so every duplicate would be a firing's.
			consume(ctx, t, b.conn, ns, 0, ty, c.conn)
			consume(ctx, t, c.conn, ns, 0, ty, b.conn)

			sc := delaydv1.NewScheduleServiceClient(a.conn)
			// Catch-up ALL: a loaded machine that decides a slot late
			// still fires it, so a missing slot can only be a lost one.
			mk := func(s *delaydv1.Schedule) *delaydv1.Schedule {
				s.Namespace, s.CatchUp, s.CatchUpWindow = ns, delaydv1.CatchUpPolicy_CATCH_UP_POLICY_ALL, durationpb.New(time.Hour)
				return s
			}
			created := map[string]*delaydv1.Schedule{}
			for _, s := range []*delaydv1.Schedule{
				mk(&delaydv1.Schedule{Id: "sec", Rule: &delaydv1.Schedule_Every{Every: durationpb.New(time.Second)}}),
				mk(&delaydv1.Schedule{Id: "min", Rule: &delaydv1.Schedule_Cron{Cron: "* * * * *"}}),
			} {
				retryUnavailable(t, "create "+s.GetId(), func(ctx context.Context) error {
					resp, err := sc.CreateSchedule(ctx, &delaydv1.CreateScheduleRequest{Schedule: s})
					created[s.GetId()] = resp.GetSchedule()
					return err
				})
			}
			start := time.Now()
			time.Sleep(scheduleFaultRun / 3)
			a.kill()
			t.Logf("replica %s SIGKILLed after %v", a.addr, time.Since(start).Round(time.Second))
			time.Sleep(scheduleFaultRun / 6)
			a = startReplica(t, bin, args...)
			t.Logf("replica started again: %s", a.addr)
			time.Sleep(scheduleFaultRun - time.Since(start))

			// Stop the schedules (a pause removes the firings not due
			// yet), then wait for what they fired to be delivered.
			final := map[string]*delaydv1.Schedule{}
			sb := delaydv1.NewScheduleServiceClient(b.conn)
			for id := range created {
				retryUnavailable(t, "pause "+id, func(ctx context.Context) error {
					resp, err := sb.PauseSchedule(ctx, &delaydv1.PauseScheduleRequest{Namespace: ns, Id: id})
					final[id] = resp.GetSchedule()
					return err
				})
			}
			want := int64(0)
			for _, s := range final {
				want += s.GetFired()
			}
			testkit.Eventually(t, 90*time.Second, "every firing delivered", func() bool {
				ty.mu.Lock()
				defer ty.mu.Unlock()
				return int64(len(ty.delivered)) >= want
			})
			for id, s := range final {
				step := time.Second
				if id == "min" {
					step = time.Minute
				}
				checkSlots(t, ty, id, created[id].GetCreateTime().AsTime(), step, s)
			}
			_, _, dups, early := ty.counts()
			if dups != 0 || early != 0 {
				t.Fatalf("%d duplicate deliveries, %d early (%v); want 0 and 0", dups, early, ty.early)
			}
		})
	}
}

// checkSlots checks that schedule id's firings were delivered once each,
// every step from the first slot after created to its last fired slot,
// as many as it says it fired, none skipped.
func checkSlots(t *testing.T, ty *tally, id string, created time.Time, step time.Duration, final *delaydv1.Schedule) {
	t.Helper()
	ty.mu.Lock()
	var slots []time.Time
	for task, n := range ty.delivered {
		stamp, ok := strings.CutPrefix(task, id+".")
		if !ok {
			continue
		}
		slot, err := time.Parse(firingStamp, stamp)
		if err != nil {
			t.Errorf("delivery %q is no firing of %s", task, id)
			continue
		}
		if n != 1 {
			t.Errorf("%s delivered %d times", task, n)
		}
		slots = append(slots, slot)
	}
	ty.mu.Unlock()
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	first := created.Truncate(step).Add(step)
	var missing []string
	for i, at := 0, first; len(slots) > 0 && !at.After(slots[len(slots)-1]); at = at.Add(step) {
		if i < len(slots) && slots[i].Equal(at) {
			i++
			continue
		}
		missing = append(missing, at.Format(time.TimeOnly))
	}
	t.Logf("%s: %d slots delivered (%v to %v), fired %d, skipped %d", id, len(slots), first.Format(time.TimeOnly),
		final.GetLastSlotTime().AsTime().Format(time.TimeOnly), final.GetFired(), final.GetSkipped())
	switch {
	case len(slots) == 0:
		t.Fatalf("%s: nothing delivered", id)
	case !slots[0].Equal(first):
		t.Errorf("%s: the first slot delivered is %v, want %v (the first after its creation)", id, slots[0], first)
	case len(missing) > 0:
		t.Errorf("%s: slots missing: %v", id, missing)
	case int64(len(slots)) != final.GetFired() || final.GetSkipped() != 0:
		t.Errorf("%s: %d slots delivered, the schedule fired %d and skipped %d", id, len(slots), final.GetFired(), final.GetSkipped())
	}
	if t.Failed() {
		t.Log(fmt.Sprint(slots))
	}
}
