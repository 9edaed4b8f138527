package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// Task history (storage.History) in Redis: one stream per namespace
// (nsKeys.history, on the namespace's first shard's slot), one entry per
// event, appended with XADD MAXLEN ~ keep so the stream stays about as
// long as the namespace's policy allows. The entry id's milliseconds are
// the Redis server's clock when the event was written, the clock due times
// use; an event that carries its own Time keeps it in field "ts".
//
// Fields, each left out when zero: k kind (number), i task id, u key id,
// g generation, d due ms, a attempt, r replica, l lateness ms, e reason,
// t retry_after ms, ts event time ms.

// historyScanChunk is how many stream entries one XRANGE of TaskHistory
// reads.
const historyScanChunk = 500

// RecordEvents appends events to ns's history stream in one pipeline,
// trimming it to about keep entries.
func (s *Store) RecordEvents(ctx context.Context, ns string, keep int64, events []storage.Event) error {
	if keep <= 0 || len(events) == 0 {
		return nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	key := keysForN(ns, 0, n).history
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, e := range events {
			p.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: keep, Approx: true, ID: "*", Values: eventFields(e)})
		}
		return nil
	})
	if err != nil {
		s.reloadOnFailure(err)
		return wrapErr("record events", err)
	}
	return nil
}

// eventFields is e's stream entry (see the package comment above).
func eventFields(e storage.Event) []any {
	f := make([]any, 0, 20)
	add := func(name string, v int64) {
		if v != 0 {
			f = append(f, name, strconv.FormatInt(v, 10))
		}
	}
	addS := func(name, v string) {
		if v != "" {
			f = append(f, name, v)
		}
	}
	add("k", int64(e.Kind))
	addS("i", e.ID)
	addS("u", e.KeyID)
	add("g", e.Generation)
	if !e.Due.IsZero() {
		add("d", storage.DueMilli(e.Due))
	}
	add("a", int64(e.Attempt))
	addS("r", e.Replica)
	add("l", e.Lateness.Milliseconds())
	addS("e", e.Reason)
	add("t", e.RetryAfter.Milliseconds())
	if !e.Time.IsZero() {
		add("ts", e.Time.UnixMilli())
	}
	return f
}

// eventOf decodes one stream entry.
func eventOf(m redis.XMessage) storage.Event {
	num := func(name string) int64 {
		v, _ := m.Values[name].(string)
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	str := func(name string) string {
		v, _ := m.Values[name].(string)
		return v
	}
	e := storage.Event{
		Kind:       storage.EventKind(num("k")),
		ID:         str("i"),
		KeyID:      str("u"),
		Generation: num("g"),
		Attempt:    int32(num("a")),
		Replica:    str("r"),
		Lateness:   time.Duration(num("l")) * time.Millisecond,
		Reason:     str("e"),
		RetryAfter: time.Duration(num("t")) * time.Millisecond,
	}
	if d := num("d"); d != 0 {
		e.Due = time.UnixMilli(d)
	}
	if ts := num("ts"); ts != 0 {
		e.Time = time.UnixMilli(ts)
	} else if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		n, _ := strconv.ParseInt(ms, 10, 64)
		e.Time = time.UnixMilli(n)
	}
	return e
}

// TaskHistory walks ns's history stream from p.Cursor (an entry id,
// exclusive) and returns the events of task p.ID, looking at no more than
// storage.HistoryScanWindow entries per call.
func (s *Store) TaskHistory(ctx context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, "", fmt.Errorf("task history: %w", err)
	}
	limit := min(max(p.Limit, 1), MaxBatch)
	start := "-"
	if p.Cursor != "" {
		if !validStreamID(p.Cursor) {
			return nil, "", storage.ErrInvalidCursor
		}
		start = "(" + p.Cursor
	}
	key := keysForN(ns, 0, n).history
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var out []storage.Event
	size, scanned := 0, 0
	for scanned < storage.HistoryScanWindow {
		msgs, err := s.rdb.XRangeN(ctx, key, start, "+", historyScanChunk).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			s.reloadOnFailure(err)
			return nil, "", wrapErr("task history", err)
		}
		for _, m := range msgs {
			scanned++
			start = "(" + m.ID
			if id, _ := m.Values["i"].(string); id != p.ID {
				continue
			}
			e := eventOf(m)
			size += storage.EventSize(e)
			if len(out) > 0 && p.MaxBytes > 0 && size > p.MaxBytes {
				// This entry starts the next page.
				return out, prevID(m.ID), nil
			}
			out = append(out, e)
			if len(out) == limit {
				return out, m.ID, nil
			}
		}
		if len(msgs) < historyScanChunk {
			return out, "", nil // the end of the stream
		}
	}
	return out, strings.TrimPrefix(start, "("), nil
}

// validStreamID reports whether c has the form of a stream entry id
// ("ms-seq"), the cursor TaskHistory hands out.
func validStreamID(c string) bool {
	ms, seq, ok := strings.Cut(c, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}

// prevID is the stream id just before id, so a walk that resumes after it
// starts at id.
func prevID(id string) string {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	n, _ := strconv.ParseUint(seq, 10, 64)
	if n > 0 {
		return strconv.FormatUint(m, 10) + "-" + strconv.FormatUint(n-1, 10)
	}
	return strconv.FormatUint(m-1, 10) + "-18446744073709551615"
}

// Forecast counts ns's scheduled tasks due per minute over the next hour
// and per hour over the next day (lua/forecast.lua on each shard, summed).
func (s *Store) Forecast(ctx context.Context, ns string) (storage.Forecast, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.Forecast{}, fmt.Errorf("forecast: %w", err)
	}
	out := storage.Forecast{
		PerMinute: make([]int64, storage.ForecastMinutes),
		PerHour:   make([]int64, storage.ForecastHours),
	}
	reps := make([][]any, n)
	err = fanOut(allShards(n), func(sh int) error {
		rep, err := s.runRows(ctx, "forecast", scripts.forecast, []string{keysForN(ns, sh, n).due},
			fixed(1+storage.ForecastMinutes+storage.ForecastHours), storage.ForecastMinutes, storage.ForecastHours)
		if err != nil {
			return err
		}
		reps[sh] = rep.head
		return nil
	})
	if err != nil {
		return storage.Forecast{}, err
	}
	for _, rep := range reps {
		vs := make([]int64, len(rep))
		for i, v := range rep {
			if vs[i], err = replyInt(v); err != nil {
				return storage.Forecast{}, fmt.Errorf("forecast: %w", err)
			}
		}
		if now := time.UnixMilli(vs[0]); now.After(out.Now) {
			out.Now = now // the shards' clocks (one per Redis master) differ a little
		}
		for i := range out.PerMinute {
			out.PerMinute[i] += vs[1+i]
		}
		for i := range out.PerHour {
			out.PerHour[i] += vs[1+storage.ForecastMinutes+i]
		}
	}
	return out, nil
}

// unlink deletes keys (UNLINK: freed in the background).
func (s *Store) unlink(ctx context.Context, op string, keys ...string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Unlink(ctx, keys...).Err(); err != nil {
		s.reloadOnFailure(err)
		return wrapErr(op, err)
	}
	return nil
}
