package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

// testPopAgain: a pop with a request id can be asked again
// (storage.PopParams.RequestID). A pop whose answer was lost, asked again
// with the same id and limit 0, answers the same deliveries (same tokens
// and lease deadlines) and leases nothing more; a pop asked again (so
// cancelled) before it ran leases nothing when it runs late; a record
// expires after its window.
func testPopAgain(t *testing.T, newStore func(t *testing.T) storage.Store) {
	runTable(t, newStore, []transition{{
		name:  "asked again after a lost answer: the same deliveries, nothing more leased",
		seeds: []Seed{{ID: "d1", Due: -3 * time.Minute}, {ID: "d2", Due: -2 * time.Minute}, {ID: "d3", Due: -1 * time.Minute}},
		run: func(e *env) {
			first := e.popAsked("lost-1", 2) // its answer is lost
			if len(first) != 2 {
				e.t.Fatalf("first pop = %d deliveries, want 2", len(first))
			}
			again := e.popAsked("lost-1", 0)
			if diff := cmp.Diff(deliveryKeys(first), deliveryKeys(again)); diff != "" {
				e.t.Errorf("asked again (-first +again):\n%s", diff)
			}
			for _, d := range again {
				if string(d.Task.Payload) != string(payloadOf(d.Task.ID)) || d.Task.Attempt != 1 {
					e.t.Errorf("asked again: task %+v, want its payload, attempt 1", d.Task)
				}
			}
			// asked once more: still the same, and the first tokens ack
			if diff := cmp.Diff(deliveryKeys(first), deliveryKeys(e.popAsked("lost-1", 0))); diff != "" {
				e.t.Errorf("asked a third time (-first +again):\n%s", diff)
			}
			st, err := e.s.Ack(e.ctx, e.ns, []storage.Token{again[0].Token})
			if err != nil || len(st) != 1 || st[0] != storage.TokenOK {
				e.t.Errorf("ack of the token asked again = %v, %v; want OK", st, err)
			}
		},
		want: []Row{row("d3", sched, 1, 0, ""), row("d2", deliv, 1, 1, "")},
	}, {
		name:  "asked again before it ran: the late pop leases nothing",
		seeds: []Seed{{ID: "d1", Due: -2 * time.Minute}, {ID: "d2", Due: -1 * time.Minute}},
		run: func(e *env) {
			if ds := e.popAsked("cancelled-1", 0); len(ds) != 0 {
				e.t.Fatalf("asked again before the pop ran = %v, want nothing", ds)
			}
			if ds := e.popAsked("cancelled-1", 10); len(ds) != 0 {
				e.t.Errorf("the pop run late = %v, want nothing", ds)
			}
			// another pop takes them
			if ds := e.popAsked("other-1", 10); len(ds) != 2 {
				e.t.Errorf("a pop of another id = %d deliveries, want 2", len(ds))
			}
		},
		want: []Row{row("d1", deliv, 1, 1, ""), row("d2", deliv, 1, 1, "")},
	}, {
		name:  "a record expires after its window",
		seeds: []Seed{{ID: "d1", Due: -2 * time.Minute}},
		run: func(e *env) {
			p := storage.PopParams{RequestID: "short-1", Limit: 1, LeaseFor: time.Hour, RequestWindow: 50 * time.Millisecond}
			ds, err := e.s.Pop(e.ctx, e.ns, p)
			if err != nil || len(ds) != 1 {
				e.t.Fatalf("pop = %v, %v; want d1", ds, err)
			}
			p.Limit = 0
			poll(e.t, "the record to expire", func() bool {
				again, err := e.s.Pop(e.ctx, e.ns, p)
				if err != nil {
					e.t.Fatalf("asked again: %v", err)
				}
				return len(again) == 0
			})
		},
		want: []Row{row("d1", deliv, 1, 1, "")},
	}})
}

// popAsked pops at most limit tasks with request id id (a 1 h lease).
func (e *env) popAsked(id string, limit int) []storage.Delivery {
	e.t.Helper()
	ds, err := e.s.Pop(e.ctx, e.ns, storage.PopParams{RequestID: id, Limit: limit, LeaseFor: time.Hour})
	if err != nil {
		e.t.Fatalf("pop %s: %v", id, err)
	}
	return ds
}

// deliveryKey is what a delivery asked again must repeat.
type deliveryKey struct {
	Token    storage.Token
	Deadline time.Time
}

func deliveryKeys(ds []storage.Delivery) []deliveryKey {
	var out []deliveryKey
	for _, d := range ds {
		out = append(out, deliveryKey{d.Token, d.LeaseDeadline})
	}
	return out
}
