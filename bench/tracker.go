package bench

import (
	"strconv"
	"sync/atomic"
)

// Tracker counts deliveries per task of a run, so that every task id is
// checked: a task delivered more than once is a duplicate, one never
// delivered is lost. Tasks are numbered 0..n-1 and named by TaskID. It is
// safe for concurrent use.
type Tracker struct {
	counts    []atomic.Uint32
	delivered atomic.Int64 // distinct tasks delivered at least once
	total     atomic.Int64 // all deliveries, duplicates and unknown included
	unknown   atomic.Int64 // deliveries of ids that are not tasks of the run
}

// NewTracker returns a Tracker for n tasks.
func NewTracker(n int) *Tracker { return &Tracker{counts: make([]atomic.Uint32, n)} }

// TaskID is the id of task i of a run: "t" and i in decimal.
func TaskID(i int) string { return "t" + strconv.Itoa(i) }

// ParseTaskID returns the task number of a TaskID, and false for any other
// string.
func ParseTaskID(id string) (int, bool) {
	if len(id) < 2 || id[0] != 't' {
		return 0, false
	}
	i, err := strconv.Atoi(id[1:])
	if err != nil || i < 0 || strconv.Itoa(i) != id[1:] {
		return 0, false
	}
	return i, true
}

// Deliver records one delivery of id. It returns the task number and how
// many times the task has been delivered, this time included: 1 the first
// time, more for a duplicate, 0 for an id that is not a task of the run.
func (t *Tracker) Deliver(id string) (int, uint32) {
	t.total.Add(1)
	i, ok := ParseTaskID(id)
	if !ok || i >= len(t.counts) {
		t.unknown.Add(1)
		return 0, 0
	}
	n := t.counts[i].Add(1)
	if n == 1 {
		t.delivered.Add(1)
	}
	return i, n
}

// Delivered returns how many distinct tasks were delivered so far.
func (t *Tracker) Delivered() int64 { return t.delivered.Load() }

// Tally is the outcome of a run's deliveries.
type Tally struct {
	// Expected is the number of tasks of the run.
	Expected int `json:"expected"`
	// Delivered counts distinct tasks delivered at least once.
	Delivered int `json:"delivered"`
	// Duplicates counts deliveries beyond the first of a task.
	Duplicates int `json:"duplicates"`
	// Lost counts tasks never delivered.
	Lost int `json:"lost"`
	// Unknown counts deliveries of ids that are not tasks of the run.
	Unknown int `json:"unknown"`
}

// Tally counts duplicates and losses over every task. Call it once the
// deliveries have stopped.
func (t *Tracker) Tally() Tally {
	r := Tally{Expected: len(t.counts), Unknown: int(t.unknown.Load())}
	for i := range t.counts {
		switch c := t.counts[i].Load(); {
		case c == 0:
			r.Lost++
		default:
			r.Delivered++
			r.Duplicates += int(c) - 1
		}
	}
	return r
}
