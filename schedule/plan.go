package schedule

import (
	"encoding/binary"
	"hash/fnv"
	"time"

	"github.com/delayd/delayd/storage"
)

// Options are the loop's settings the rules read.
type Options struct {
	// Lookahead is how long before its slot a firing's task is created
	// (overlap allow): the task then waits in the index like any task, and
	// the dispatcher delivers it at its due time with its usual precision.
	Lookahead time.Duration
	// Grace is how late a slot may be decided and still count as on time;
	// a slot decided later than that was missed (see CatchUp).
	Grace time.Duration
	// Shards is the namespace's shard count (firing ids land in the
	// schedule's shard; storage.FiringID).
	Shards int
}

// Firing is one slot a step fires.
type Firing struct {
	// Slot is the slot's time; Due the task's due time (Slot + jitter).
	Slot, Due time.Time
	// ID is the task's id (storage.FiringID).
	ID string
	// Missed: the slot's time had passed by more than Grace (a catch-up).
	Missed bool
}

// Step is what one advance of a schedule does: the firings to create and
// the schedule's state after them.
type Step struct {
	// Fire are the slots to fire, in slot order.
	Fire []Firing
	// Next is the schedule with its state moved past the decided slots
	// (Cursor, Fired, Skipped, LastSlot, LastTaskID, NextSlot, Done,
	// Advance); its definition and Version are the input's.
	Next storage.Schedule
}

// maxCount bounds how many skipped cron slots a step counts one by one (a
// long outage of a minutely schedule); past it Skipped grows by the bound.
const maxCount = 100_000

// Plan decides the slots of s after its cursor up to now (+ the lookahead
// for overlap allow), by the store's clock now, without any I/O:
//
//   - slots whose time passed more than Grace ago were missed: CatchUp
//     decides them (none skips them, latest fires the latest within the
//     window, all fires those within the window, the latest
//     storage.MaxFiringsPerStep at most);
//   - the others fire; with OverlapSkip a slot is decided at its time (no
//     lookahead), and skipped while the previous firing is pending:
//     prevPending for the first one, and true after a firing of the step;
//   - Start, End and MaxFirings bound it all; a schedule with no slot left
//     is Done.
//
// A paused or done schedule is returned unchanged with no firing. The
// returned Advance is when the next slot is due for a decision: its time
// minus the lookahead (OverlapSkip: its time).
func Plan(s storage.Schedule, r Rule, now time.Time, prevPending bool, o Options) Step {
	st := Step{Next: s}
	n := &st.Next
	if s.Paused || s.Done {
		n.Advance = time.Time{}
		return st
	}
	horizon := now.Add(o.Lookahead)
	if s.Overlap == storage.OverlapSkip {
		horizon = now
	}
	missedBefore := now.Add(-o.Grace)
	pending := prevPending
	fire := func(slot time.Time, missed bool) {
		if s.Overlap == storage.OverlapSkip && pending {
			n.Skipped++
			return
		}
		f := Firing{Slot: slot, Due: slot.Add(JitterOf(s.Namespace, s.ID, slot, s.Jitter)), Missed: missed,
			ID: storage.FiringID(s.Template.IDPrefix, s.ID, slot, o.Shards)}
		st.Fire = append(st.Fire, f)
		n.Fired++
		n.LastSlot, n.LastTaskID = slot, f.ID
		pending = true
	}
	full := func() bool {
		return len(st.Fire) >= storage.MaxFiringsPerStep || (s.MaxFirings > 0 && n.Fired >= s.MaxFirings)
	}

	t, ok := firstAfter(s, r, s.Cursor)
	// Missed slots: [t, last] with last < missedBefore.
	if ok && t.Before(missedBefore) {
		last, _ := r.Prev(missedBefore.Add(-time.Millisecond))
		if !s.End.IsZero() && last.After(s.End) {
			last, _ = r.Prev(s.End)
		}
		from := t
		if s.CatchUpWindow > 0 {
			if w := now.Add(-s.CatchUpWindow); from.Before(w) {
				from = w
			}
		}
		var chosen []time.Time
		switch s.CatchUp {
		case storage.CatchUpLatest:
			if !last.Before(from) {
				chosen = []time.Time{last}
			}
		case storage.CatchUpAll:
			limit := storage.MaxFiringsPerStep
			if s.MaxFirings > 0 {
				limit = int(min(int64(limit), s.MaxFirings-n.Fired))
			}
			for c := last; !c.Before(from) && len(chosen) < limit; {
				chosen = append(chosen, c)
				var ok bool
				if c, ok = r.Prev(c.Add(-time.Millisecond)); !ok {
					break
				}
			}
			for i, j := 0, len(chosen)-1; i < j; i, j = i+1, j-1 {
				chosen[i], chosen[j] = chosen[j], chosen[i]
			}
		}
		n.Skipped += countSlots(r, t, last) - int64(len(chosen))
		for _, c := range chosen {
			fire(c, true)
		}
		n.Cursor = last
		t, ok = r.Next(last)
		if ok && !s.End.IsZero() && t.After(s.End) {
			ok = false
		}
	}
	// On-time slots up to the horizon.
	for ok && !t.After(horizon) && !full() {
		fire(t, false)
		n.Cursor = t
		t, ok = r.Next(t)
		if ok && !s.End.IsZero() && t.After(s.End) {
			ok = false
		}
	}
	if !ok || (s.MaxFirings > 0 && n.Fired >= s.MaxFirings) {
		n.Done, n.NextSlot, n.Advance = true, time.Time{}, time.Time{}
		return st
	}
	n.NextSlot = t
	n.Advance = t.Add(-o.Lookahead)
	if s.Overlap == storage.OverlapSkip {
		n.Advance = t
	}
	return st
}

// firstAfter is the first slot of s after `after` that is at or after
// Start and at or before End; false when there is none.
func firstAfter(s storage.Schedule, r Rule, after time.Time) (time.Time, bool) {
	if !s.Start.IsZero() && after.Before(s.Start) {
		after = s.Start.Add(-time.Millisecond)
	}
	t, ok := r.Next(after)
	if !ok || (!s.End.IsZero() && t.After(s.End)) {
		return time.Time{}, false
	}
	return t, true
}

// countSlots counts the slots in [from, to] (at most maxCount for cron).
func countSlots(r Rule, from, to time.Time) int64 {
	if to.Before(from) {
		return 0
	}
	if r.IsRate() {
		return int64(to.Sub(from)/r.every) + 1
	}
	var n int64
	for t, ok := from, true; ok && !t.After(to) && n < maxCount; t, ok = r.Next(t) {
		n++
	}
	return n
}

// JitterOf is the delay of a firing's due time after its slot: a value in
// [0, jitter) (whole milliseconds) drawn from FNV-1a of the namespace, the
// schedule id and the slot, so every replica, every retry and every
// preview agree on it. Zero without jitter.
func JitterOf(ns, id string, slot time.Time, jitter time.Duration) time.Duration {
	ms := jitter.Milliseconds()
	if ms <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(ns))
	h.Write([]byte{0})
	h.Write([]byte(id))
	h.Write([]byte{0})
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(slot.UnixMilli()))
	h.Write(b[:])
	return time.Duration(h.Sum64()%uint64(ms)) * time.Millisecond
}

// Upcoming returns the next n slots of s after `after` (bounded by Start,
// End and the firings MaxFirings leaves), as a preview shows them; a
// paused or done schedule has none.
func Upcoming(s storage.Schedule, r Rule, after time.Time, n int) []time.Time {
	if s.Done || n <= 0 {
		return nil
	}
	if after.Before(s.Cursor) {
		after = s.Cursor
	}
	left := n
	if s.MaxFirings > 0 {
		left = int(min(int64(n), s.MaxFirings-s.Fired))
	}
	var out []time.Time
	t, ok := firstAfter(s, r, after)
	for ok && len(out) < left {
		out = append(out, t)
		t, ok = r.Next(t)
		if ok && !s.End.IsZero() && t.After(s.End) {
			ok = false
		}
	}
	return out
}

// countIn counts the slots of s in (a, b], after its cursor and within its
// start and end; a cron rule stops counting at *budget slots (it walks them
// one by one, taking each from the budget), a rate counts in O(1).
func countIn(s storage.Schedule, r Rule, a, b time.Time, budget *int) int64 {
	if a.Before(s.Cursor) {
		a = s.Cursor
	}
	if !s.Start.IsZero() && a.Before(s.Start.Add(-time.Millisecond)) {
		a = s.Start.Add(-time.Millisecond)
	}
	if !s.End.IsZero() && b.After(s.End) {
		b = s.End
	}
	if !b.After(a) {
		return 0
	}
	if r.IsRate() {
		last, ok := r.Prev(b)
		if !ok || !last.After(a) {
			return 0
		}
		first, _ := r.Next(a)
		return int64(last.Sub(first)/r.every) + 1
	}
	var n int64
	for t, ok := r.Next(a); ok && !t.After(b) && *budget > 0; t, ok = r.Next(t) {
		n++
		*budget--
	}
	return n
}
