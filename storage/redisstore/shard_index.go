package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/delayd/delayd/storage"
)

// A shard's calls for durable mode's index: restore, versions and ack
// markers, forget, and the "index is complete" marker (durable.go fans
// them out).

// restore is Restore of tasks of this shard.
func (sh shard) restore(ctx context.Context, tasks []storage.Task, p storage.RestoreParams) (int, error) {
	ns := sh.ns
	k := sh.k
	keys := []string{k.due, k.inflight, k.dead, k.meta, k.body, k.acked, k.life}
	written := 0
	size := func(i int) int {
		return len(tasks[i].ID) + len(tasks[i].Kind) + len(tasks[i].Payload) + len(tasks[i].LastError)
	}
	err := byteChunks(len(tasks), sh.maxArgs, size, func(lo, hi int) error {
		part := tasks[lo:hi]
		args := make([]any, 0, 4+7*len(part))
		args = append(args, sh.wakeChannel(), ns, luaBool(p.Repair), len(part))
		for i := range part {
			t := &part[i]
			dead := t.State == storage.StateDead
			r := recordOf(t, dead)
			state, score := 1, toMS(t.DueTime)
			if dead {
				at := t.DeadTime
				if at.IsZero() {
					at = t.UpdateTime
				}
				state, score = 3, toMS(at)
			}
			args = append(args, t.ID, t.Incarnation, t.Generation, state, score, r.header(), r.bodyValue())
		}
		v, err := sh.run(ctx, "restore", scripts.restore, keys, args...)
		if err != nil {
			return err
		}
		n, err := replyInt(v)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		written += int(n)
		return nil
	})
	if err == nil && sh.traces {
		sh.restoreTraces(ctx, tasks)
	}
	return written, err
}

// versions is Versions for ids of this shard.
func (sh shard) versions(ctx context.Context, ids []string) ([]storage.Version, []storage.Token, error) {
	ns := sh.ns
	k := sh.k
	vs := make([]storage.Version, 0, len(ids))
	marks := make([]storage.Token, 0, len(ids))
	err := chunks(len(ids), func(lo, hi int) error {
		args := make([]any, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			args = append(args, id)
		}
		rep, err := sh.runRows(ctx, "versions", scripts.generations, []string{k.meta, k.acked}, rowsOf(0, 3, hi-lo), args...)
		if err != nil {
			return err
		}
		for i, id := range ids[lo:hi] {
			row := rep.row(i)
			inc, err1 := replyInt(row[0])
			gen, err2 := replyInt(row[1])
			mark, err3 := replyString(row[2])
			if err := errors.Join(err1, err2, err3); err != nil {
				return fmt.Errorf("versions: %w", err)
			}
			vs = append(vs, storage.Version{ID: id, Incarnation: inc, Generation: gen})
			m := storage.Token{Namespace: ns, ID: id}
			if mark != "" {
				if m, err = parseMark(ns, id, mark); err != nil {
					return fmt.Errorf("versions: %w", err)
				}
			}
			marks = append(marks, m)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return vs, marks, nil
}

// clearAcked is ClearAcked for markers of this shard.
func (sh shard) clearAcked(ctx context.Context, marks []storage.Token) (int, error) {
	k := sh.k
	dropped := 0
	err := chunks(len(marks), func(lo, hi int) error {
		args := make([]any, 0, 2*(hi-lo))
		for _, m := range marks[lo:hi] {
			args = append(args, m.ID, markOf(m))
		}
		v, err := sh.run(ctx, "clear acked", scripts.clearAcked, []string{k.acked}, args...)
		if err != nil {
			return err
		}
		n, err := replyInt(v)
		dropped += int(n)
		return err
	})
	return dropped, err
}

// forget is Forget for versions of this shard.
func (sh shard) forget(ctx context.Context, vs []storage.Version) (int, error) {
	k := sh.k
	removed := 0
	err := chunks(len(vs), func(lo, hi int) error {
		args := make([]any, 0, 1+3*(hi-lo))
		args = append(args, hi-lo)
		for _, v := range vs[lo:hi] {
			args = append(args, v.ID, v.Incarnation, v.Generation)
		}
		v, err := sh.run(ctx, "forget", scripts.forget, []string{k.due, k.inflight, k.dead, k.meta, k.body}, args...)
		if err != nil {
			return err
		}
		n, err := replyInt(v)
		removed += int(n)
		return err
	})
	return removed, err
}

// indexed reports whether this shard carries the "index is complete"
// marker.
func (sh shard) indexed(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, sh.timeout)
	defer cancel()
	c, err := sh.rdb.Exists(ctx, sh.k.indexed).Result()
	if err != nil {
		return false, wrapErr("indexed", err)
	}
	return c == 1, nil
}

// markIndexed sets this shard's "index is complete" marker.
func (sh shard) markIndexed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sh.timeout)
	defer cancel()
	if err := sh.rdb.Set(ctx, sh.k.indexed, "1", 0).Err(); err != nil {
		return wrapErr("mark indexed", err)
	}
	return nil
}
