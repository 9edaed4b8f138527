package history

import (
	"slices"
	"testing"

	"github.com/delayd/delayd/storage"
)

// TestWriteRunsSplitsByIncarnation: a batch of slots whose calls saw two
// incarnations of the namespace (its cache refreshed between them) is
// written as one write per run, each to its own incarnation, in order,
// with the largest keep of the run.
func TestWriteRunsSplitsByIncarnation(t *testing.T) {
	ev := func(id string) []storage.Event { return []storage.Event{{Kind: storage.EventUpserted, ID: id}} }
	batch := []*slot{
		{life: life{keep: 10, inc: 1}, events: ev("a")},
		{life: life{keep: 20, inc: 1}, events: ev("b")},
		{life: life{keep: 5, inc: 2}, events: ev("c")},
		{life: life{keep: 5, inc: 2}}, // a call with no events keeps its place
		{life: life{keep: 7, inc: 1}, events: ev("d")},
	}
	type write struct {
		l   life
		ids []string
	}
	var got []write
	err := writeRuns(batch, func(l life, events []storage.Event) error {
		w := write{l: l}
		for _, e := range events {
			w.ids = append(w.ids, e.ID)
		}
		got = append(got, w)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []write{{life{20, 1}, []string{"a", "b"}}, {life{5, 2}, []string{"c"}}, {life{7, 1}, []string{"d"}}}
	if len(got) != len(want) {
		t.Fatalf("writes %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].l != want[i].l || !slices.Equal(got[i].ids, want[i].ids) {
			t.Errorf("write %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
