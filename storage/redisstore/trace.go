package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// Trace contexts (Options.Traces). A traced upsert's W3C traceparent is kept
// beside the task record, in its own key (keys.go: traceKey), rather than in
// the record the Lua scripts rewrite: it is written after the upsert script
// in one pipelined round trip, read with one MGET per Pop, and expires a day
// after the task's due time, so acks, removes and purges need not touch it.
// It is best effort: a failure is logged and the task is delivered without
// it; it is never a reason to fail an upsert or a pop.

// traceRetention is how long past its due time a task's trace context is
// kept (retries after nacks and expired leases still find it).
const traceRetention = 24 * time.Hour

// writeTraces stores the trace context of every applied spec (of this
// shard) that has one, and deletes it for those that have none (an
// untraced upsert replaces the task, so its delivery must not link to the
// previous producer).
func (s shard) writeTraces(ctx context.Context, specs []storage.UpsertSpec, res []storage.UpsertResult) {
	traced := false
	for i := range specs {
		if specs[i].TraceParent != "" {
			traced = true
			break
		}
	}
	if !traced {
		// Nothing to keep; a previous context of a replaced task expires
		// on its own, so untraced traffic costs no round trip. (It can then
		// link a retry of the replaced task to the previous producer.)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range specs {
			if i >= len(res) || res[i].Stale || res[i].Refused != storage.NotRefused {
				continue
			}
			key := s.k.traceOf(specs[i].ID)
			if tp := specs[i].TraceParent; tp != "" {
				p.SetArgs(ctx, key, tp, redis.SetArgs{ExpireAt: res[i].Task.DueTime.Add(traceRetention)})
				res[i].Task.TraceParent = tp
			} else {
				p.Del(ctx, key)
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("keeping trace contexts failed; their deliveries will not link to the producer", "namespace", s.ns, "err", err)
	}
}

// restoreTraces keeps the trace context of re-indexed tasks (Restore: the
// authority, MySQL, keeps each task's traceparent), so a task rebuilt after
// Redis lost it still delivers linked to its producer. A trace key that
// exists is left as it is (SET NX): the index's own is as new as the
// authority's or newer.
func (s shard) restoreTraces(ctx context.Context, tasks []storage.Task) {
	n := 0
	for i := range tasks {
		if tasks[i].TraceParent != "" {
			n++
		}
	}
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range tasks {
			t := &tasks[i]
			if t.TraceParent == "" || t.State == storage.StateDead {
				continue
			}
			p.SetArgs(ctx, s.k.traceOf(t.ID), t.TraceParent, redis.SetArgs{Mode: "NX", ExpireAt: t.DueTime.Add(traceRetention)})
		}
		return nil
	})
	if err != nil {
		s.log.Warn("restoring trace contexts failed; their deliveries will not link to the producer", "namespace", s.ns, "err", err)
	}
}

// readTrace returns the trace context kept for task id ("" if none, or
// when it cannot be read: best effort, never an error).
func (s shard) readTrace(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tp, err := s.rdb.Get(ctx, s.k.traceOf(id)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		s.log.Warn("reading a trace context failed; answering without it", "key", s.k.meta, "err", err)
	}
	return tp
}

// readTraces sets the trace context of each delivery that has one.
func (s shard) readTraces(ctx context.Context, dels []storage.Delivery) {
	keys := make([]string, len(dels))
	for i := range dels {
		keys[i] = s.k.traceOf(dels[i].Task.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		s.log.Warn("reading trace contexts failed; delivering without them", "namespace", s.ns, "err", err)
		return
	}
	for i, v := range vals {
		if tp, ok := v.(string); ok && i < len(dels) {
			dels[i].Task.TraceParent = tp
		}
	}
}
