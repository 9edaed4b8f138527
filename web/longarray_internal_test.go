package web

import (
	"strings"
	"testing"
)

func TestLongArray(t *testing.T) {
	for _, c := range []struct {
		json  string
		field string
	}{
		{`{"tasks": [{}, {}, {}]}`, ""},
		{`{"tasks": [{}, {}, {}, {}]}`, "tasks"},
		{`{"tokens": ["a", "b,c", "d\"]", "e"]}`, "tokens"},
		{`{"tokens": ["a", "b,c", "d\"]"]}`, ""},
		{`{"a": {"tasks": [1, 2, 3, 4, 5]}, "b": [[1, 2, 3, 4, 5]]}`, ""},
		{`{"x": "[1,2,3,4,5]", "n": [1, 2, [3, 4, 5, 6]]}`, ""},
		{`{"n": [1, 2, 3, 4]}`, "n"},
		{`{"n": [ ]}`, ""},
		{`[1, 2, 3, 4, 5]`, ""},
		{`{"tasks": [` + strings.Repeat(`{"id": "x", "payload": "aGk="},`, 100), "tasks"},
		{`{"unterminated": "`, ""},
	} {
		field, over := longArray([]byte(c.json), 3)
		if field != c.field || over != (c.field != "") {
			t.Errorf("longArray(%s, 3) = %q, %v; want %q", c.json, field, over, c.field)
		}
	}
}
