package schedule

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

// TestPlan: seeded schedule and clock → Plan → the slots fired and the
// state after, for each catch-up and overlap policy, the bounds (start,
// end, max firings) and the lookahead. No clock, no I/O.
func TestPlan(t *testing.T) {
	t.Parallel()
	o := Options{Lookahead: 10 * time.Second, Grace: 10 * time.Second, Shards: 1}
	minutely := func(mod func(*storage.Schedule)) storage.Schedule {
		s := storage.Schedule{Namespace: "ns", ID: "tick", Every: time.Minute, Cursor: utc("2026-05-01T10:00:00Z"),
			LastSlot: utc("2026-05-01T10:00:00Z"), LastTaskID: "tick.20260501T100000Z", Fired: 1}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	type want struct {
		fire              []string // slots fired, "!" prefix: missed
		cursor, next, adv string
		fired, skipped    int64
		done              bool
	}
	cases := []struct {
		name        string
		s           storage.Schedule
		now         string
		prevPending bool
		want        want
	}{
		{"on time: the next slot is created a lookahead ahead", minutely(nil), "2026-05-01T10:00:52Z", false,
			want{fire: []string{"10:01:00"}, cursor: "10:01:00", next: "10:02:00", adv: "10:01:50", fired: 2}},
		{"not yet within the lookahead", minutely(nil), "2026-05-01T10:00:49Z", false,
			want{cursor: "10:00:00", next: "10:01:00", adv: "10:00:50", fired: 1}},
		{"a slot decided within the grace is on time", minutely(nil), "2026-05-01T10:01:09Z", false,
			want{fire: []string{"10:01:00"}, cursor: "10:01:00", next: "10:02:00", adv: "10:01:50", fired: 2}},
		{"10-minute outage, catch-up none: missed slots skipped", minutely(nil), "2026-05-01T10:10:30Z", false,
			want{cursor: "10:10:00", next: "10:11:00", adv: "10:10:50", fired: 1, skipped: 10}},
		{"10-minute outage, catch-up latest: the latest missed fires", minutely(func(s *storage.Schedule) { s.CatchUp = storage.CatchUpLatest }),
			"2026-05-01T10:10:30Z", false,
			want{fire: []string{"!10:10:00"}, cursor: "10:10:00", next: "10:11:00", adv: "10:10:50", fired: 2, skipped: 9}},
		{"catch-up latest outside its window fires nothing", minutely(func(s *storage.Schedule) {
			s.CatchUp, s.CatchUpWindow = storage.CatchUpLatest, 15*time.Second
		}), "2026-05-01T10:10:30Z", false,
			want{cursor: "10:10:00", next: "10:11:00", adv: "10:10:50", fired: 1, skipped: 10}},
		{"10-minute outage, catch-up all within 5 minutes", minutely(func(s *storage.Schedule) {
			s.CatchUp, s.CatchUpWindow = storage.CatchUpAll, 5*time.Minute
		}), "2026-05-01T10:10:30Z", false,
			want{fire: []string{"!10:06:00", "!10:07:00", "!10:08:00", "!10:09:00", "!10:10:00"}, cursor: "10:10:00",
				next: "10:11:00", adv: "10:10:50", fired: 6, skipped: 5}},
		{"catch-up all, then the on-time slot in the lookahead", minutely(func(s *storage.Schedule) {
			s.CatchUp, s.CatchUpWindow = storage.CatchUpAll, 5*time.Minute
		}), "2026-05-01T10:02:55Z", false,
			want{fire: []string{"!10:01:00", "!10:02:00", "10:03:00"}, cursor: "10:03:00", next: "10:04:00", adv: "10:03:50", fired: 4}},
		{"catch-up all with a max firings left", minutely(func(s *storage.Schedule) {
			s.CatchUp, s.CatchUpWindow, s.MaxFirings = storage.CatchUpAll, time.Hour, 3
		}), "2026-05-01T10:10:30Z", false,
			want{fire: []string{"!10:09:00", "!10:10:00"}, cursor: "10:10:00", fired: 3, skipped: 8, done: true}},
		{"overlap skip: decided at the slot, without lookahead", minutely(func(s *storage.Schedule) { s.Overlap = storage.OverlapSkip }),
			"2026-05-01T10:00:55Z", false,
			want{cursor: "10:00:00", next: "10:01:00", adv: "10:01:00", fired: 1}},
		{"overlap skip: fires when the previous is done", minutely(func(s *storage.Schedule) { s.Overlap = storage.OverlapSkip }),
			"2026-05-01T10:01:00.004Z", false,
			want{fire: []string{"10:01:00"}, cursor: "10:01:00", next: "10:02:00", adv: "10:02:00", fired: 2}},
		{"overlap skip: skipped while the previous is pending", minutely(func(s *storage.Schedule) { s.Overlap = storage.OverlapSkip }),
			"2026-05-01T10:01:00.004Z", true,
			want{cursor: "10:01:00", next: "10:02:00", adv: "10:02:00", fired: 1, skipped: 1}},
		{"overlap skip with catch-up all: one firing, the rest overlap", minutely(func(s *storage.Schedule) {
			s.Overlap, s.CatchUp, s.CatchUpWindow = storage.OverlapSkip, storage.CatchUpAll, time.Hour
		}), "2026-05-01T10:03:30Z", false,
			want{fire: []string{"!10:01:00"}, cursor: "10:03:00", next: "10:04:00", adv: "10:04:00", fired: 2, skipped: 2}},
		{"max firings reached: done", minutely(func(s *storage.Schedule) { s.MaxFirings = 2 }), "2026-05-01T10:00:52Z", false,
			want{fire: []string{"10:01:00"}, cursor: "10:01:00", fired: 2, done: true}},
		{"end reached: done", minutely(func(s *storage.Schedule) { s.End = utc("2026-05-01T10:01:30Z") }), "2026-05-01T10:00:52Z", false,
			want{fire: []string{"10:01:00"}, cursor: "10:01:00", fired: 2, done: true}},
		{"start in the future: waits for it", minutely(func(s *storage.Schedule) { s.Start = utc("2026-05-01T12:00:30Z") }),
			"2026-05-01T10:00:52Z", false,
			want{cursor: "10:00:00", next: "12:00:30", adv: "12:00:20", fired: 1}},
		{"paused: nothing, no advance", minutely(func(s *storage.Schedule) { s.Paused = true }), "2026-05-01T10:10:30Z", false,
			want{cursor: "10:00:00", fired: 1}},
		{"a fast rate fills the lookahead", storage.Schedule{Namespace: "ns", ID: "fast", Every: 3 * time.Second,
			Cursor: utc("2026-05-01T10:00:00Z")}, "2026-05-01T10:00:00.5Z", false,
			want{fire: []string{"10:00:03", "10:00:06", "10:00:09"}, cursor: "10:00:09", next: "10:00:12", adv: "10:00:02", fired: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := Rate(tc.s.Every, tc.s.Start, time.UTC)
			if err != nil {
				t.Fatal(err)
			}
			st := Plan(tc.s, r, utc(tc.now), tc.prevPending, o)
			var fired []string
			for _, f := range st.Fire {
				s := f.Slot.UTC().Format("15:04:05")
				if f.Missed {
					s = "!" + s
				}
				fired = append(fired, s)
				if f.ID != storage.FiringID("", tc.s.ID, f.Slot, 1) || !f.Due.Equal(f.Slot) {
					t.Errorf("firing %+v: id or due is not the slot's", f)
				}
			}
			n := st.Next
			got := want{fire: fired, cursor: n.Cursor.UTC().Format("15:04:05"), fired: n.Fired, skipped: n.Skipped, done: n.Done}
			if !n.NextSlot.IsZero() {
				got.next = n.NextSlot.UTC().Format("15:04:05")
			}
			if !n.Advance.IsZero() {
				got.adv = n.Advance.UTC().Format("15:04:05")
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestJitterIsDeterministicAndBounded: the same slot always gets the same
// delay, within [0, jitter), and slots get different ones.
func TestJitterIsDeterministicAndBounded(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	base := utc("2026-05-01T00:00:00Z")
	for i := range 200 {
		slot := base.Add(time.Duration(i) * time.Minute)
		d := JitterOf("ns", "s", slot, 30*time.Second)
		if d < 0 || d >= 30*time.Second || d != JitterOf("ns", "s", slot, 30*time.Second) {
			t.Fatalf("slot %d: jitter %v not in [0, 30s) or not stable", i, d)
		}
		seen[d] = true
	}
	if len(seen) < 150 {
		t.Fatalf("200 slots got only %d distinct delays", len(seen))
	}
	if JitterOf("ns", "s", base, 0) != 0 {
		t.Fatal("no jitter, yet a delay")
	}
}

// TestFiringIDLandsInTheSchedulesShard: with several shards, a firing's
// id lands in its schedule's shard; with one it has no suffix.
func TestFiringIDLandsInTheSchedulesShard(t *testing.T) {
	t.Parallel()
	slot := utc("2026-05-01T09:00:00Z")
	if got := storage.FiringID("rem-", "daily", slot, 1); got != "rem-daily.20260501T090000Z" {
		t.Fatalf("FiringID = %q", got)
	}
	for _, n := range []int{2, 6, 256} {
		for i := range 50 {
			id := storage.FiringID("p", "sched", slot.Add(time.Duration(i)*time.Hour), n)
			if storage.ShardOf(id, n) != storage.ShardOf("sched", n) || storage.ValidateTaskID(id) != nil {
				t.Fatalf("%d shards: %q is in shard %d, the schedule in %d", n, id, storage.ShardOf(id, n), storage.ShardOf("sched", n))
			}
		}
	}
}
