package redisstore

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// A task is stored as a header field in the meta HASH of its namespace
// (under its hash tag), in one of two forms:
//
//	split:  inc,gen,attempt,dseq,created,updated,due,kindlen|<kind><last error>
//	        and the payload, if any, in the body HASH under the same id
//	inline: inc,gen,attempt,dseq,created,updated,due,kindlen,errlen|<kind><last error><payload>
//	        and no body entry
//
// A payload of 1..inlineMax bytes is written inline, so a small task costs
// one HASH entry (close to the memory of a bare ZSET + HASH design); a
// larger one apart, so scripts that need only counters and times (ack,
// nack, extend, reap, requeue, the reconciler's version reads) never copy
// a large payload. Both forms are read everywhere; every write of a
// payload (upsert, restore, migrate) picks the form anew, so records
// written before the inline form existed (all split) stay valid as they
// are. The header is laid out so the Lua scripts can read and change it
// with a few string operations, and costs few bytes.
//
// Every number is a hexadecimal integer (lower case, '-' for negative) and
// an empty field means 0. inc is the incarnation (the Redis clock in
// microseconds when the task was created, or the one MySQL decided in
// durable mode), dseq the sequence number of the last delivery (see
// lua/lib.lua's repop). Times are Unix milliseconds; created is stored as
// the difference from the incarnation's millisecond (inc / 1000, rounded
// down; empty in Redis-only mode, where the incarnation is the create time
// in microseconds) and updated as the difference from created (empty while
// equal). due is the task's due
// time and is stored only while the task is not in the due ZSET (whose score
// holds it then): in flight it is the due time the task was popped at, when
// dead the due time of its last delivery. kindlen is the byte length of the
// kind that follows the '|'; in the split form the last error is the rest,
// in the inline form errlen is its length and the payload the rest. In
// flight, ';told' may follow the numbers (before the '|'): the deadline the
// subscriber was told (Unix ms, storage.PopParams.TellFor), which only
// lua/pop.lua writes and every other write drops. The same layout is
// implemented in lua/lib.lua.
type record struct {
	inc     int64
	gen     int64
	attempt int32
	dseq    int64
	created int64 // Unix ms
	updated int64 // Unix ms
	due     int64 // Unix ms; 0 = not stored
	told    int64 // Unix ms; 0 = none (only read, never written: see above)
	kind    string
	lastErr string
	payload []byte // inline in the header, or apart in the body HASH
}

// inlineMax is the largest payload stored inline in the header (lua/lib.lua's
// INLINE_MAX).
const inlineMax = 256

// inline reports whether the record's payload goes into its header.
func (r *record) inline() bool { return len(r.payload) > 0 && len(r.payload) <= inlineMax }

// bodyValue is what the body HASH holds for the record: its payload in the
// split form, nil (no entry) when it is inline or empty.
func (r *record) bodyValue() []byte {
	if r.inline() {
		return nil
	}
	return r.payload
}

var errBadRecord = errors.New("malformed task record")

// header returns the record's header in its stored form: inline when the
// payload is (see inline), else split (the payload goes to the body HASH:
// bodyValue).
func (r *record) header() []byte {
	inl := r.inline()
	n := 48 + len(r.kind) + len(r.lastErr)
	if inl {
		n += 17 + len(r.payload)
	}
	b := make([]byte, 0, n)
	for i, n := range [...]int64{r.inc, r.gen, int64(r.attempt), r.dseq, r.created - floorDiv(r.inc, 1000), r.updated - r.created, r.due, int64(len(r.kind))} {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendHex(b, n)
	}
	if inl {
		b = append(b, ',')
		b = appendHex(b, int64(len(r.lastErr)))
	}
	b = append(b, '|')
	b = append(b, r.kind...)
	b = append(b, r.lastErr...)
	if inl {
		b = append(b, r.payload...)
	}
	return b
}

func appendHex(b []byte, n int64) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(b, n, 16)
}

// floorDiv is a / b rounded down (as Lua's math.floor(a / b)).
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// headerFields is the number of comma-separated numbers of a split
// header; an inline one has one more (the last error's length).
const headerFields = 8

// decodeRecord parses a stored header and takes payload as the task's
// payload ("" = none) unless the header is inline (then the header holds
// it and payload is ignored).
func decodeRecord(h, payload string) (record, error) {
	head, body, ok := strings.Cut(h, "|")
	if !ok {
		return record{}, errBadRecord
	}
	var told int64
	if nums, toldHex, ok := strings.Cut(head, ";"); ok {
		var f [1]int64
		if err := parseHexFields(toldHex, f[:]); err != nil {
			return record{}, err
		}
		head, told = nums, f[0]
	}
	var f [headerFields + 1]int64
	inl := strings.Count(head, ",") == headerFields
	nf := headerFields
	if inl {
		nf++
	}
	if err := parseHexFields(head, f[:nf]); err != nil {
		return record{}, err
	}
	kl := f[7]
	if kl < 0 || kl > int64(len(body)) || f[2] < 0 || f[2] > 1<<31-1 {
		return record{}, errBadRecord
	}
	lastErr := body[kl:]
	if inl {
		el := f[8]
		if el < 0 || el > int64(len(body))-kl {
			return record{}, errBadRecord
		}
		lastErr, payload = body[kl:kl+el], body[kl+el:]
	}
	var p []byte
	if payload != "" {
		p = []byte(payload)
	}
	return record{
		inc:     f[0],
		gen:     f[1],
		attempt: int32(f[2]),
		dseq:    f[3],
		created: floorDiv(f[0], 1000) + f[4],
		updated: floorDiv(f[0], 1000) + f[4] + f[5],
		due:     f[6],
		told:    told,
		kind:    body[:kl],
		lastErr: lastErr,
		payload: p,
	}, nil
}

// parseHexFields parses exactly len(f) comma-separated hexadecimal numbers
// (empty = 0) into f.
func parseHexFields(s string, f []int64) error {
	for i := range f {
		var field string
		if i < len(f)-1 {
			var ok bool
			field, s, ok = strings.Cut(s, ",")
			if !ok {
				return errBadRecord
			}
		} else {
			field = s
		}
		if field == "" {
			f[i] = 0
			continue
		}
		n, err := strconv.ParseInt(field, 16, 64)
		if err != nil {
			return errBadRecord
		}
		f[i] = n
	}
	return nil
}

// legacyRecord parses a record of the one-value layout delayd stored before
// the header/payload split ("gen,attempt,created,updated,due,kindlen,errlen|
// <kind><last error><payload>"), for Migrate. Its incarnation is 0 (the
// durable schema gives pre-incarnation rows 0 as well, so both stores agree)
// and its delivery sequence 0 (the next pop takes the clock's).
func legacyRecord(s string) (record, error) {
	head, body, ok := strings.Cut(s, "|")
	if !ok {
		return record{}, errBadRecord
	}
	var f [7]int64
	if err := parseHexFields(head, f[:]); err != nil {
		return record{}, err
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
		Namespace:   ns,
		ID:          id,
		Kind:        r.kind,
		Payload:     r.payload,
		State:       state,
		Attempt:     r.attempt,
		Generation:  r.gen,
		Incarnation: r.inc,
		CreateTime:  msTime(r.created),
		UpdateTime:  msTime(r.updated),
		LastError:   r.lastErr,
		DueTime:     msTime(r.due),
	}
	switch state {
	case storage.StateScheduled:
		t.DueTime = msTime(score)
	case storage.StateDelivered:
		t.LeaseDeadline = msTime(max(score, r.told))
	case storage.StateDead:
		t.DeadTime = msTime(score)
	}
	return t
}

// recordOf is the stored form of t (for Restore): t's state decides whether
// the due time goes into the record or into the due ZSET.
func recordOf(t *storage.Task, dueInRecord bool) record {
	r := record{
		inc:     t.Incarnation,
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
