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
// incarnation (nsKeys.historyOf, on the namespace's first shard's slot),
// one entry per event, appended with XADD MAXLEN ~ keep so the stream
// stays about as long as the namespace's policy allows. The entry id's
// milliseconds are the Redis server's clock when the event was written,
// the clock due times use; an event that carries its own Time keeps it in
// field "ts".
//
// Two indexes follow the stream: historyIDsOf holds each task id that has
// events in it, scored by the entry time (ms) of its latest one, and
// historyFirstOf the entry time of its first event since it was indexed.
// So a task with none costs GetTaskHistory one ZSCORE, not a walk of the
// whole stream, and a walk covers only the span from the task's first
// event to its last. They are written from the XADDs' replies (exact
// entry times: no replica's clock is trusted), after them: a read in
// between misses the events of a write still in flight, never those of
// one that returned. Their trim follows the stream's: scores older than
// the oldest entry kept go. A task whose events were all trimmed until
// the next trim costs a walk of its old span and finds none; a task whose
// first events were trimmed while later ones are kept has no first score
// any more and is walked from the stream's start, where its kept events
// are.
//
// The tenant boundary: an incarnation's events are written after the call
// that made them, so a call that changed a task just before a forced
// delete writes them after DropNamespace removed the stream. The stream
// of an ended incarnation is read by nobody (a namespace re-created under
// the name is another incarnation, another stream; TaskHistory of an ended
// one reads nothing), and its writer removes it: RecordEvents reads the
// life key (which DropNamespace marks before it removes the stream) in the
// pipeline after its XADDs, and again after its index write, and UNLINKs
// what it wrote when the incarnation has ended. Either the writes ran
// before the drop marked life (and the drop's UNLINK, after the mark,
// takes them) or the GET after them sees the mark. Only a writer that dies
// between the two leaves keys behind: one late batch, under keys nothing
// reads.
//
// Fields, each left out when zero: k kind (number), i task id, u key id,
// g generation, d due ms, a attempt, r replica, l lateness ms, e reason,
// t retry_after ms, ts event time ms, sc schedule id, sl slot ms.

// historyScanChunk is how many stream entries one XRANGE of TaskHistory
// reads.
const historyScanChunk = 500

// RecordEvents appends p.Events to the stream of incarnation p.Incarnation
// of ns, trimming it to about p.Keep entries, then writes the indexes (two
// pipelines); when life (read after each) says the incarnation has ended,
// all three are removed again.
func (s *Store) RecordEvents(ctx context.Context, ns string, p storage.RecordParams) error {
	if p.Keep <= 0 || len(p.Events) == 0 {
		return nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	k := keysForN(ns, 0, n)
	key, ids, first := k.historyOf(p.Incarnation), k.historyIDsOf(p.Incarnation), k.historyFirstOf(p.Incarnation)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tasks := taskIDs(p.Events)
	adds := make([]*redis.StringCmd, len(p.Events))
	var indexed *redis.FloatSliceCmd
	var oldest *redis.XMessageSliceCmd
	var life *redis.StringCmd
	_, err = s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, e := range p.Events {
			adds[i] = pl.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: p.Keep, Approx: true, ID: "*", Values: eventFields(e)})
		}
		indexed = pl.ZMScore(ctx, ids, tasks...)
		oldest = pl.XRangeN(ctx, key, "-", "+", 1)
		life = pl.Get(ctx, k.life)
		return nil
	})
	if done, err := s.historyWritten(ctx, "record events", err, life, p.Incarnation, key, ids, first); done {
		return err
	}
	last, firsts := indexEntries(p.Events, adds, tasks, indexed.Val())
	_, err = s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		pl.ZAddGT(ctx, ids, last...)
		if len(firsts) > 0 {
			pl.ZAddLT(ctx, first, firsts...)
		}
		if m := oldest.Val(); len(m) == 1 {
			cut := "(" + strconv.FormatInt(entryMS(m[0].ID), 10)
			pl.ZRemRangeByScore(ctx, ids, "-inf", cut)
			pl.ZRemRangeByScore(ctx, first, "-inf", cut)
		}
		life = pl.Get(ctx, k.life)
		return nil
	})
	_, err = s.historyWritten(ctx, "record events: index", err, life, p.Incarnation, key, ids, first)
	return err
}

// historyWritten checks a pipeline that wrote history keys of incarnation
// inc and read life after them: done with the pipeline's error, or done
// once the keys are removed again when life says inc has ended; not done
// (and nil) otherwise.
func (s *Store) historyWritten(ctx context.Context, op string, err error, life *redis.StringCmd, inc int64, keys ...string) (bool, error) {
	if err != nil && !errors.Is(err, redis.Nil) {
		s.reloadOnFailure(err)
		return true, wrapErr(op, err)
	}
	if historyEnded(life.Val(), inc) {
		return true, s.unlink(ctx, op, keys...)
	}
	return false, nil
}

// taskIDs is the distinct task ids of events, in order.
func taskIDs(events []storage.Event) []string {
	seen := make(map[string]bool, len(events))
	var out []string
	for _, e := range events {
		if !seen[e.ID] {
			seen[e.ID] = true
			out = append(out, e.ID)
		}
	}
	return out
}

// indexEntries is what the indexes get for events, whose XADDs adds
// answered: per task, the entry time (ms) of its latest event (ZADD GT),
// and, for the tasks (of tasks) that indexed says were not indexed yet
// (ZMSCORE: 0 for none), that of its first (ZADD LT: concurrent writers
// keep the earliest).
func indexEntries(events []storage.Event, adds []*redis.StringCmd, tasks []string, indexed []float64) (last, firsts []redis.Z) {
	latest := make(map[string]int64, len(tasks))
	earliest := make(map[string]int64, len(tasks))
	for i, e := range events {
		ms := entryMS(adds[i].Val())
		latest[e.ID] = max(latest[e.ID], ms)
		if f, ok := earliest[e.ID]; !ok || ms < f {
			earliest[e.ID] = ms
		}
	}
	for i, id := range tasks {
		last = append(last, redis.Z{Score: float64(latest[id]), Member: id})
		if i >= len(indexed) || indexed[i] == 0 {
			firsts = append(firsts, redis.Z{Score: float64(earliest[id]), Member: id})
		}
	}
	return last, firsts
}

// entryMS is the milliseconds part of a stream entry id ("ms-seq").
func entryMS(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}

// historyEnded reports whether life (the value of a namespace's life key,
// "live,ended"; "" when there is none) says that DropNamespace ended
// incarnation inc, so its history must not be read or kept.
func historyEnded(life string, inc int64) bool {
	_, e, ok := strings.Cut(life, ",")
	if !ok {
		return false
	}
	ended, err := strconv.ParseInt(e, 10, 64)
	return err == nil && ended > 0 && inc <= ended
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
	addS("sc", e.Schedule)
	if !e.Slot.IsZero() {
		add("sl", e.Slot.UnixMilli())
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
	e.Schedule = str("sc")
	if sl := num("sl"); sl != 0 {
		e.Slot = time.UnixMilli(sl)
	}
	if ts := num("ts"); ts != 0 {
		e.Time = time.UnixMilli(ts)
	} else if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		n, _ := strconv.ParseInt(ms, 10, 64)
		e.Time = time.UnixMilli(n)
	}
	return e
}

// TaskHistory walks the stream of incarnation p.Incarnation of ns from
// p.Cursor (an entry id, exclusive; without one, from task p.ID's first
// event) to its latest event (the indexes' scores) and returns the task's
// events, looking at no more than
// storage.HistoryScanWindow entries per call. A task the index does not
// hold has none: one round trip. Each read is followed, in its pipeline,
// by a read of the life key: an incarnation found ended has no history to
// show (a stream written after its drop may exist for an instant, until
// its writer removes it).
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
	k := keysForN(ns, 0, n)
	key := k.historyOf(p.Incarnation)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var last, first *redis.FloatCmd
	var life *redis.StringCmd
	_, err = s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		last = pl.ZScore(ctx, k.historyIDsOf(p.Incarnation), p.ID)
		first = pl.ZScore(ctx, k.historyFirstOf(p.Incarnation), p.ID)
		life = pl.Get(ctx, k.life)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		s.reloadOnFailure(err)
		return nil, "", wrapErr("task history", err)
	}
	if historyEnded(life.Val(), p.Incarnation) || errors.Is(last.Err(), redis.Nil) {
		return nil, "", nil
	}
	end := strconv.FormatInt(int64(last.Val()), 10) // every entry of that ms
	if p.Cursor == "" && first.Err() == nil {
		start = strconv.FormatInt(int64(first.Val()), 10) // from the first entry of that ms
	}
	var out []storage.Event
	size, scanned := 0, 0
	for scanned < storage.HistoryScanWindow {
		var rng *redis.XMessageSliceCmd
		_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			rng = pl.XRangeN(ctx, key, start, end, historyScanChunk)
			life = pl.Get(ctx, k.life)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			s.reloadOnFailure(err)
			return nil, "", wrapErr("task history", err)
		}
		if historyEnded(life.Val(), p.Incarnation) {
			return nil, "", nil
		}
		msgs := rng.Val()
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
			return out, "", nil // the task's last event, or the end of the stream
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
