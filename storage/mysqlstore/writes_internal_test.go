package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// The parts of execUpserts, each tested alone (issue 38 item 4): which rows
// in which order, how they are cut into statements, which rows are read
// back, whether a conditional write raced, and the results.

func upsertOp(ns string, now int64, rows ...authority.UpsertRow) *authority.Write {
	return &authority.Write{Kind: authority.WriteUpsert, NS: ns, NowMS: now, Rows: rows}
}

func refKeys(refs []upsertRef) []string {
	var out []string
	for _, rf := range refs {
		out = append(out, rf.o.NS+"/"+rf.o.Rows[rf.i].ID+"@"+rf.o.Rows[rf.i].Kind)
	}
	return out
}

func TestCollectUpsertsSortsByTaskStably(t *testing.T) {
	a := upsertOp("b", 1, authority.UpsertRow{ID: "x", Kind: "1"}, authority.UpsertRow{ID: "a", Kind: "2"})
	b := upsertOp("a", 1, authority.UpsertRow{ID: "z", Kind: "3"})
	c := upsertOp("b", 1, authority.UpsertRow{ID: "x", Kind: "4"})
	refs, cond := collectUpserts([]*authority.Write{a, b, c})
	if diff := cmp.Diff([]string{"a/z@3", "b/a@2", "b/x@1", "b/x@4"}, refKeys(refs)); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if cond {
		t.Error("cond = true without a condition")
	}
	if len(a.Upserts) != 2 || len(b.Upserts) != 1 || len(c.Upserts) != 1 {
		t.Errorf("results not made for every row: %d %d %d", len(a.Upserts), len(b.Upserts), len(c.Upserts))
	}
	for _, row := range []authority.UpsertRow{{ID: "c", CreateOnly: true}, {ID: "g", IfGen: 3}} {
		if _, cond := collectUpserts([]*authority.Write{upsertOp("n", 1, authority.UpsertRow{ID: "p"}, row)}); !cond {
			t.Errorf("cond = false with %+v", row)
		}
	}
}

func TestInsertChunksByRowsAndBytes(t *testing.T) {
	rows := func(sizes ...int) []upsertRef {
		var rs []authority.UpsertRow
		for i, n := range sizes {
			rs = append(rs, authority.UpsertRow{ID: string(rune('a' + i)), Payload: make([]byte, n)})
		}
		refs, _ := collectUpserts([]*authority.Write{upsertOp("n", 1, rs...)})
		return refs
	}
	many := make([]int, maxStmtRows+3)
	for _, tc := range []struct {
		name     string
		refs     []upsertRef
		maxBytes int
		want     [][2]int
	}{
		{"none", nil, 100, nil},
		{"all in one", rows(10, 10, 10), 100, [][2]int{{0, 3}}},
		// a chunk ends once its payload bytes reach the bound
		{"by bytes", rows(60, 60, 10, 200, 5), 100, [][2]int{{0, 2}, {2, 4}, {4, 5}}},
		// a row larger than the bound is a chunk of its own
		{"oversized row", rows(500, 1), 100, [][2]int{{0, 1}, {1, 2}}},
		{"by rows", rows(many...), 100, [][2]int{{0, maxStmtRows}, {maxStmtRows, maxStmtRows + 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, insertChunks(tc.refs, tc.maxBytes)); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanReadBack(t *testing.T) {
	// x is written twice, y once and new, z once and existed
	op := upsertOp("n", 7, authority.UpsertRow{ID: "x", Inc: 5}, authority.UpsertRow{ID: "y", Inc: 5},
		authority.UpsertRow{ID: "x", Inc: 5}, authority.UpsertRow{ID: "z", Inc: 5})
	other := upsertOp("m", 7, authority.UpsertRow{ID: "x", Inc: 6})
	refs, _ := collectUpserts([]*authority.Write{op, other})
	p := planReadBack(refs, map[taskKey]bool{{"n", "x"}: true, {"n", "z"}: true, {"m", "x"}: true})
	if diff := cmp.Diff(map[taskKey]final{{"n", "y"}: {gen: 1, inc: 5, create: 7}}, p.finals, cmp.AllowUnexported(final{})); diff != "" {
		t.Errorf("finals of new rows (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[taskKey]int{{"n", "x"}: 2, {"n", "y"}: 1, {"n", "z"}: 1, {"m", "x"}: 1}, p.count, cmp.AllowUnexported(taskKey{})); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]nsIDs{{"m", []string{"x"}}, {"n", []string{"x", "z"}}}, p.read, cmp.AllowUnexported(nsIDs{})); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}
}

func TestConditionRaced(t *testing.T) {
	k := taskKey{"n", "a"}
	for _, tc := range []struct {
		name   string
		expect map[taskKey]storage.Version
		finals map[taskKey]final
		want   bool
	}{
		{"no conditions", nil, map[taskKey]final{k: {gen: 4, inc: 1}}, false},
		{"as decided", map[taskKey]storage.Version{k: {Generation: 4, Incarnation: 1}}, map[taskKey]final{k: {gen: 4, inc: 1}}, false},
		{"another generation", map[taskKey]storage.Version{k: {Generation: 1, Incarnation: 1}}, map[taskKey]final{k: {gen: 4, inc: 1}}, true},
		{"another incarnation", map[taskKey]storage.Version{k: {Generation: 4, Incarnation: 1}}, map[taskKey]final{k: {gen: 4, inc: 2}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := conditionRaced(tc.expect, tc.finals); got != tc.want {
				t.Errorf("raced = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSetUpsertResults(t *testing.T) {
	// x written three times in one statement over a row that existed at
	// generation 2 (final 5); y created (final 1); z missing
	op := upsertOp("n", 9000, authority.UpsertRow{ID: "x", DueMS: 1000, Payload: []byte("p")},
		authority.UpsertRow{ID: "y", DueMS: 2000}, authority.UpsertRow{ID: "x", DueMS: 3000}, authority.UpsertRow{ID: "x", DueMS: 4000})
	refs, _ := collectUpserts([]*authority.Write{op})
	p := planReadBack(refs, map[taskKey]bool{{"n", "x"}: true})
	p.finals[taskKey{"n", "x"}] = final{gen: 5, inc: 3, create: 100}
	if err := setUpsertResults(refs, p); err != nil {
		t.Fatal(err)
	}
	type got struct {
		id      string
		gen     int64
		created bool
		due     int64
	}
	var out []got
	for _, r := range op.Upserts {
		out = append(out, got{r.Task.ID, r.Task.Generation, r.Created, r.Task.DueTime.UnixMilli()})
	}
	want := []got{{"x", 3, false, 1000}, {"y", 1, true, 2000}, {"x", 4, false, 3000}, {"x", 5, false, 4000}}
	if diff := cmp.Diff(want, out, cmp.AllowUnexported(got{})); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	if r := op.Upserts[0]; string(r.Task.Payload) != "p" || r.Task.Incarnation != 3 || !r.Task.CreateTime.Equal(time.UnixMilli(100)) ||
		!r.Task.UpdateTime.Equal(time.UnixMilli(9000)) || r.Task.State != storage.StateScheduled {
		t.Errorf("x's first result = %+v", r.Task)
	}
	if op.Upserts[1].Task.Payload != nil {
		t.Errorf("an empty payload = %q, want nil", op.Upserts[1].Task.Payload)
	}
	delete(p.finals, taskKey{"n", "y"})
	if err := setUpsertResults(refs, p); err == nil || errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("a task missing after the insert: err = %v, want an internal error", err)
	}
}
