package schedule

import (
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// TestLead: the lookahead is the configured one until a step comes late by
// more than half of it; then twice the worst lag (whole seconds, at most a
// minute) for the rest of that window and the next; a lag above a minute
// (an outage) does not count.
func TestLead(t *testing.T) {
	t.Parallel()
	t0 := utc("2026-05-01T10:00:00Z")
	l := &lead{base: 10 * time.Second}
	steps := []struct {
		at   time.Duration // since t0
		lag  time.Duration // noted at `at` (0: none)
		want time.Duration
	}{
		{0, 0, 10 * time.Second},
		{time.Second, 4 * time.Second, 10 * time.Second},
		{2 * time.Second, 7200 * time.Millisecond, 15 * time.Second},
		{3 * time.Second, 2 * time.Hour, 15 * time.Second},
		{4 * time.Second, 45 * time.Second, time.Minute},
		{6 * time.Minute, 0, time.Minute}, // the next window still remembers it
		{6*time.Minute + time.Second, 6 * time.Second, time.Minute},
		{11 * time.Minute, 0, 12 * time.Second}, // the 45 s lag's window is gone
		{30 * time.Minute, 0, 10 * time.Second}, // both windows gone
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		if s.lag != 0 {
			l.note(s.lag, now)
		}
		if got := l.lookahead(now); got != s.want {
			t.Fatalf("at +%v after lag %v: lookahead %v, want %v", s.at, s.lag, got, s.want)
		}
	}
}

// TestLateStepsWidenLookahead: a look that comes 8 s after a schedule's
// Advance (a slow pass) still creates the firing before its slot, and the
// next slot is decided 16 s ahead instead of 10; ten quiet minutes later
// the lookahead is back to 10 s.
func TestLateStepsWidenLookahead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "2026-05-01T10:00:55Z", storage.Policy{})
	e.create(minutely("tick"))
	e.at("2026-05-01T10:01:58Z") // Advance was 10:01:50
	sc, err := e.store.GetSchedule(t.Context(), e.ns, "tick")
	if err != nil {
		t.Fatal(err)
	}
	if !sc.Advance.Equal(utc("2026-05-01T10:02:44Z")) {
		t.Fatalf("after a step 8 s late: advance %v, want 10:02:44", sc.Advance)
	}
	for m := 2; m < 14; m++ {
		e.at(sc.Advance.Format(time.RFC3339))
		if sc, err = e.store.GetSchedule(t.Context(), e.ns, "tick"); err != nil {
			t.Fatal(err)
		}
	}
	if got := sc.NextSlot.Sub(sc.Advance); got != 10*time.Second {
		t.Fatalf("after quiet minutes: decided %v ahead, want 10s", got)
	}
	// One slot per minute from 10:01 on, none missing (the look at an
	// Advance decided 16 s ahead, made once the lookahead is 10 s again,
	// creates nothing and moves the Advance; the next look fires it).
	if got := e.tasks(); len(got) != 13 || got[12] != "10:13:00 v1" {
		t.Fatalf("firings: %v", got)
	}
}
