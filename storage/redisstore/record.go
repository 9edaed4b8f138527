package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// A task record is the value of a task in the namespace's task HASH. It is
// laid out so the Lua scripts can read and change the counters and times
// with a few string operations, without decoding the payload, and so it
// costs few bytes per task:
//
//	gen,attempt,created,updated,due,kindlen,errlen|<kind><last error><payload>
//
// Every header number is a hexadecimal integer (lower case, '-' for
// negative) and an empty field means 0. Times are Unix milliseconds; updated is stored
// as the difference from created (empty while equal). due is the task's due
// time and is stored only while the task is not in the due ZSET (whose score
// holds it then): in flight it is the due time the task was popped at, when
// dead the due time of its last delivery. kindlen and errlen are the byte
// lengths of the kind and the last error that follow the '|'; the payload is
// the rest. The same layout is implemented in lua/lib.lua.
type record struct {
	gen     int64
	attempt int32
	created int64 // Unix ms
	updated int64 // Unix ms
	due     int64 // Unix ms; 0 = not stored
	kind    string
	lastErr string
	payload []byte
}

var errBadRecord = errors.New("malformed task record")

// encode returns the record in its stored form.
func (r *record) encode() []byte {
	b := make([]byte, 0, 32+len(r.kind)+len(r.lastErr)+len(r.payload))
	b = appendHex(b, r.gen)
	b = append(b, ',')
	b = appendHex(b, int64(r.attempt))
	b = append(b, ',')
	b = appendHex(b, r.created)
	b = append(b, ',')
	b = appendHex(b, r.updated-r.created)
	b = append(b, ',')
	b = appendHex(b, r.due)
	b = append(b, ',')
	b = appendHex(b, int64(len(r.kind)))
	b = append(b, ',')
	b = appendHex(b, int64(len(r.lastErr)))
	b = append(b, '|')
	b = append(b, r.kind...)
	b = append(b, r.lastErr...)
	b = append(b, r.payload...)
	return b
}

func appendHex(b []byte, n int64) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(b, n, 16)
}

// decodeRecord parses a stored record.
func decodeRecord(s string) (record, error) {
	head, body, ok := strings.Cut(s, "|")
	if !ok {
		return record{}, errBadRecord
	}
	var f [7]int64
	for i := range f {
		var field string
		if i < len(f)-1 {
			field, head, ok = strings.Cut(head, ",")
			if !ok {
				return record{}, errBadRecord
			}
		} else {
			field = head
		}
		if field == "" {
			continue
		}
		n, err := strconv.ParseInt(field, 16, 64)
		if err != nil {
			return record{}, errBadRecord
		}
		f[i] = n
	}
	kl, el := f[5], f[6]
	if kl < 0 || el < 0 || kl+el > int64(len(body)) || f[1] < 0 || f[1] > 1<<31-1 {
		return record{}, errBadRecord
	}
	var payload []byte
	if rest := body[kl+el:]; rest != "" {
		payload = []byte(rest)
	}
	return record{
		gen:     f[0],
		attempt: int32(f[1]),
		created: f[2],
		updated: f[2] + f[3],
		due:     f[4],
		kind:    body[:kl],
		lastErr: body[kl : kl+el],
		payload: payload,
	}, nil
}

// task builds the domain task from a record, the state it is in and its
// score in that state's ZSET.
func (r *record) task(ns, id string, state storage.State, score int64) storage.Task {
	t := storage.Task{
		Namespace:  ns,
		ID:         id,
		Kind:       r.kind,
		Payload:    r.payload,
		State:      state,
		Attempt:    r.attempt,
		Generation: r.gen,
		CreateTime: msTime(r.created),
		UpdateTime: msTime(r.updated),
		LastError:  r.lastErr,
		DueTime:    msTime(r.due),
	}
	switch state {
	case storage.StateScheduled:
		t.DueTime = msTime(score)
	case storage.StateDelivered:
		t.LeaseDeadline = msTime(score)
	case storage.StateDead:
		t.DeadTime = msTime(score)
	}
	return t
}

// recordOf is the stored form of t (for Restore): t's state decides whether
// the due time goes into the record or into the due ZSET.
func recordOf(t *storage.Task, dueInRecord bool) record {
	r := record{
		gen:     t.Generation,
		attempt: t.Attempt,
		created: toMS(t.CreateTime),
		updated: toMS(t.UpdateTime),
		kind:    t.Kind,
		lastErr: t.LastError,
		payload: t.Payload,
	}
	if r.updated == 0 {
		r.updated = r.created
	}
	if dueInRecord {
		r.due = toMS(t.DueTime)
	}
	return r
}

// msTime converts Unix milliseconds to a time; 0 is the zero time.
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// toMS converts a time to Unix milliseconds; the zero time is 0.
func toMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// Reply decoding helpers. Scripts answer arrays of integers and strings.

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
