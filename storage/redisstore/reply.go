package redisstore

import (
	"context"
	"fmt"
	"strconv"
)

// The one reply decoder. Every script answers an array (each lua/*.lua
// file documents its own) of the same form: a few head values, then rows
// of a fixed width, one per item the call named or found. A shard call
// names that form (shape), and runRows checks the reply against it once;
// the call then reads the head and the rows and never counts values
// itself. The few replies of another form are named where they are read:
// upsert's "namespace ended" pair (endedReply), get's empty "not found"
// array, and the malformed-header tail of pop and reap (shape.badTail).

// shape is the form of a script's array reply.
type shape struct {
	head  int // values before the first row
	width int // values per row; 0: the reply is the head alone
	// rows is how many rows there must be; anyRows: as many as the
	// script found.
	rows int
	// badTail: the rows may end in a '' marker where a row's first value
	// (a task id, never empty) would be, followed by the ids of tasks the
	// script moved to dead because their header was malformed (pop, reap).
	badTail bool
}

// anyRows is shape.rows for a reply of as many rows as the script found.
const anyRows = -1

// fixed is the shape of a reply of exactly n values.
func fixed(n int) shape { return shape{head: n} }

// rowsOf is the shape of a reply of head values and then rows of width
// values, exactly n of them (or anyRows).
func rowsOf(head, width, n int) shape { return shape{head: head, width: width, rows: n} }

// reply is a script's answer checked against its shape.
type reply struct {
	head  []any
	body  []any // the rows, width values each
	width int
	bad   []string // ids after a badTail marker
}

// n is the number of rows.
func (r reply) n() int {
	if r.width == 0 {
		return 0
	}
	return len(r.body) / r.width
}

// row is row i's values.
func (r reply) row(i int) []any {
	o := i * r.width
	return r.body[o : o+r.width : o+r.width]
}

// decodeReply checks rep against s.
func decodeReply(op string, rep []any, s shape) (reply, error) {
	if len(rep) < s.head {
		return reply{}, fmt.Errorf("%s: reply has %d values, want at least %d", op, len(rep), s.head)
	}
	r := reply{head: rep[:s.head:s.head], body: rep[s.head:], width: s.width}
	if s.badTail && s.width > 0 {
		for i := 0; i < len(r.body); i += s.width {
			if sv, ok := r.body[i].(string); ok && sv == "" {
				for _, v := range r.body[i+1:] {
					id, _ := replyString(v)
					r.bad = append(r.bad, id)
				}
				r.body = r.body[:i]
				break
			}
		}
	}
	switch {
	case s.width == 0 && len(r.body) != 0:
		return reply{}, fmt.Errorf("%s: reply has %d values, want %d", op, len(rep), s.head)
	case s.width > 0 && len(r.body)%s.width != 0:
		return reply{}, fmt.Errorf("%s: reply has %d values, want %d and rows of %d", op, len(rep), s.head, s.width)
	case s.width > 0 && s.rows != anyRows && r.n() != s.rows:
		return reply{}, fmt.Errorf("%s: reply has %d rows, want %d", op, r.n(), s.rows)
	}
	return r, nil
}

// runRows runs a script and decodes its reply as s.
func (s *conn) runRows(ctx context.Context, op string, e *entry, keys []string, sh shape, args ...any) (reply, error) {
	rep, err := s.runSlice(ctx, op, e, keys, args...)
	if err != nil {
		return reply{}, err
	}
	return decodeReply(op, rep, sh)
}

// endedReply reports whether rep is upsert.lua's {now, -1}: the namespace
// incarnation the call named has ended.
func endedReply(rep []any) bool {
	if len(rep) != 2 {
		return false
	}
	code, _ := replyInt(rep[1])
	return code == -1
}

// The values inside a reply: scripts answer integers and strings.

func replyInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		if x == "" {
			return 0, nil
		}
		if n, err := strconv.ParseInt(x, 10, 64); err == nil {
			return n, nil
		}
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected reply %q", x)
		}
		return int64(f), nil
	case nil:
		return 0, nil
	default:
		return 0, fmt.Errorf("unexpected reply type %T", v)
	}
}

func replyString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case nil:
		return "", nil
	default:
		return "", fmt.Errorf("unexpected reply type %T", v)
	}
}

func replySlice(v any) ([]any, error) {
	s, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply type %T", v)
	}
	return s, nil
}
