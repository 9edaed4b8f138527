package dispatcher

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/storage"
)

// TestReapHold: the reap hold decided from the recorded store trouble, at
// given instants (no clock).
func TestReapHold(t *testing.T) {
	const hold = 3 * time.Second
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		name string
		s    holdState
		now  time.Duration
		want time.Duration
	}{
		{"never any trouble", holdState{}, 0, 0},
		{"a slow call just now", holdState{trouble: at(0), streak: at(0)}, time.Second, 2 * time.Second},
		{"a hold after the last trouble", holdState{trouble: at(0), streak: at(0)}, hold, 0},
		{"failing: the hold runs from the last failure", holdState{trouble: at(10 * time.Second), streak: at(0), failedAt: at(10 * time.Second), failing: true}, 11 * time.Second, 2 * time.Second},
		{"failing never releases early", holdState{trouble: at(10 * time.Second), streak: at(0), failedAt: at(10 * time.Second), failing: true}, 12*time.Second + 999*time.Millisecond, time.Millisecond},
		{"slow streak: released a hold after it began", holdState{trouble: at(5 * time.Second), streak: at(0)}, 6 * time.Second, 0},
		{"slow streak: released for good while it goes on", holdState{trouble: at(60 * time.Second), streak: at(0)}, 60*time.Second + time.Millisecond, 0},
		{"slow streak: held until the bound", holdState{trouble: at(2 * time.Second), streak: at(0)}, 2 * time.Second, time.Second},
		{"recovered from a stall: a hold after the last failure", holdState{trouble: at(12 * time.Second), streak: at(0), failedAt: at(10 * time.Second)}, 12 * time.Second, time.Second},
		{"recovered from a stall, slow calls go on: released a hold after the last failure", holdState{trouble: at(13 * time.Second), streak: at(0), failedAt: at(10 * time.Second)}, 13 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := reapHold(tc.s, at(tc.now), hold); got != tc.want {
				t.Errorf("reapHold(%+v, t0+%v) = %v, want %v", tc.s, tc.now, got, tc.want)
			}
		})
	}
	if got := reapHold(holdState{trouble: t0, streak: t0, failing: true}, t0, 0); got != 0 {
		t.Errorf("no hold configured (no renewals): reapHold = %v, want 0", got)
	}
}

// TestHealthRecordsStreaks: what observe records, and that the answer of
// heldFor is the same for every reader. Slow calls every half second hold
// reaping for a hold (Liveness/2) from the first, then release it for good,
// for every reader: before, the first reader after the bound took the
// release and re-armed the hold for the next one, so a loop tick that did
// not reap, or the sweeper, could take it round after round while slow
// calls went on, and a dead replica's deliveries were never reaped
// (TestFaultReplicaSIGKILLMidStream: a task unacked for 25 s in a loaded
// CI run). Failing calls hold it until a hold after the last failure.
func TestHealthRecordsStreaks(t *testing.T) {
	h := newHealth(6*time.Second, nil) // slowCall 1 s, hold 3 s
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	slowAt := func(end time.Time, err error) { h.observe(end.Add(-h.slowCall), end, err) }
	var released time.Duration = -1
	for d := time.Duration(0); d <= 20*time.Second; d += 500 * time.Millisecond {
		now := t0.Add(d)
		slowAt(now, nil)
		first, second := h.heldFor(now), h.heldFor(now) // a reader that does not reap, then one that does
		if first != second {
			t.Fatalf("at t0+%v: heldFor answered %v, then %v: the first reader changed the second's answer", d, first, second)
		}
		if released < 0 && first == 0 {
			released = d
		}
		if released >= 0 && first != 0 {
			t.Fatalf("at t0+%v: held again (%v) after the release at t0+%v, with only slow calls since", d, first, released)
		}
	}
	if released != h.maxHold() {
		t.Fatalf("slow calls every 500 ms from t0: released at t0+%v, want t0+%v (a hold after the first)", released, h.maxHold())
	}

	// A stall: failing calls hold reaping whatever the streak.
	stall := t0.Add(30 * time.Second)
	for d := time.Duration(0); d <= 5*time.Second; d += 250 * time.Millisecond {
		h.observe(stall.Add(d), stall.Add(d), fmt.Errorf("pop: %w", storage.ErrUnavailable))
		if got := h.heldFor(stall.Add(d)); got != h.hold {
			t.Fatalf("failing at stall+%v: held %v, want a whole hold %v", d, got, h.hold)
		}
	}
	back := stall.Add(5*time.Second + 100*time.Millisecond)
	h.observe(back, back, nil) // the store answers again, quickly
	if got := h.heldFor(back); got <= 0 {
		t.Fatalf("just after the stall: reaping released; want it held so renewals land first")
	}
	slowAt(back.Add(2*time.Second), nil)
	if got := h.heldFor(back.Add(2 * time.Second)); got <= 0 {
		t.Fatalf("2 s after the stall, slow calls: released; want held until a hold after the last failure")
	}
	if got := h.heldFor(stall.Add(5*time.Second + h.hold)); got != 0 {
		t.Fatalf("a hold after the last failure, calls answering: held %v, want 0", got)
	}
}
