package redisstore

import (
	"slices"
	"strings"
	"testing"
)

func TestDecodeReply(t *testing.T) {
	vals := func(vs ...any) []any { return vs }
	cases := []struct {
		name    string
		rep     []any
		shape   shape
		err     string // "" = decodes
		rows    int
		bad     []string
		headLen int
	}{
		{name: "fixed", rep: vals(int64(1), int64(2), int64(3)), shape: fixed(3), headLen: 3},
		{name: "fixed short", rep: vals(int64(1), int64(2)), shape: fixed(3), err: "reply has 2 values, want at least 3"},
		{name: "fixed long", rep: vals(int64(1), int64(2), int64(3), int64(4)), shape: fixed(3), err: "reply has 4 values, want 3"},
		{name: "rows any", rep: vals(int64(9), "a", int64(1), "b", int64(2)), shape: rowsOf(1, 2, anyRows), rows: 2, headLen: 1},
		{name: "rows none", rep: vals(int64(9)), shape: rowsOf(1, 2, anyRows), rows: 0, headLen: 1},
		{name: "partial row", rep: vals(int64(9), "a", int64(1), "b"), shape: rowsOf(1, 2, anyRows), err: "want 1 and rows of 2"},
		{name: "rows exact", rep: vals("ok", "ok", "gone"), shape: rowsOf(0, 1, 3), rows: 3},
		{name: "rows too few", rep: vals("ok", "ok"), shape: rowsOf(0, 1, 3), err: "reply has 2 rows, want 3"},
		{name: "rows too many", rep: vals(int64(0), "ok", int64(1), int64(5), "ok", int64(1), int64(5)), shape: rowsOf(1, 3, 1), err: "reply has 2 rows, want 1"},
		{name: "bad tail", rep: vals(int64(1), "a", "h", "p", "", "x", "y"), shape: shape{head: 1, width: 3, rows: anyRows, badTail: true},
			rows: 1, bad: []string{"x", "y"}, headLen: 1},
		{name: "bad tail only", rep: vals(int64(1), "", "x"), shape: shape{head: 1, width: 3, rows: anyRows, badTail: true},
			rows: 0, bad: []string{"x"}, headLen: 1},
		// Without badTail an empty id is a value like any other: the
		// marker is only looked for where a script may send it.
		{name: "empty id without bad tail", rep: vals(int64(1), "", "h"), shape: rowsOf(1, 2, anyRows), rows: 1, headLen: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := decodeReply("op", c.rep, c.shape)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !strings.HasPrefix(err.Error(), "op: ") {
					t.Fatalf("err = %v, want one starting with the op and containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.n() != c.rows || len(r.head) != c.headLen || !slices.Equal(r.bad, c.bad) {
				t.Fatalf("rows %d head %d bad %q, want %d, %d, %q", r.n(), len(r.head), r.bad, c.rows, c.headLen, c.bad)
			}
			for i := range r.n() {
				if row := r.row(i); len(row) != c.shape.width || row[0] != c.rep[c.shape.head+i*c.shape.width] {
					t.Fatalf("row %d = %v", i, row)
				}
			}
		})
	}
}

func TestEndedReply(t *testing.T) {
	if !endedReply([]any{int64(5), int64(-1)}) {
		t.Fatal("{now, -1} is the ended reply")
	}
	for _, rep := range [][]any{{int64(5)}, {int64(5), int64(0)}, {int64(5), int64(-1), "x"}} {
		if endedReply(rep) {
			t.Fatalf("%v is not the ended reply", rep)
		}
	}
}
