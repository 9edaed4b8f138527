package redisstore

import (
	"context"

	"github.com/delayd/delayd/storage"
)

// A shard's dead-letter calls: requeue and purge (Store.Requeue, Purge and
// PurgeVersions run them over the shards in turn).

// requeue is Requeue of this shard.
func (sh shard) requeue(ctx context.Context, p storage.RequeueParams) ([]storage.Moved, error) {
	ns := sh.ns
	k := sh.k
	keys := sh.headKeys(k.due, k.dead, k.meta)
	var out []storage.Moved
	call := func(ids []string) error {
		// ARGV as documented in lua/requeue.lua.
		args := append(headArgs(5+len(ids)), sh.wakeChannel(), ns, max(p.Delay.Milliseconds(), 0), luaBool(p.All), min(max(p.Limit, 1), MaxBatch))
		for _, id := range ids {
			args = append(args, id)
		}
		rep, err := sh.runRows(ctx, "requeue", scripts.requeue, keys, rowsOf(1, 4, anyRows), args...)
		if err != nil {
			return err
		}
		for i := range rep.n() {
			row := rep.row(i)
			id, _ := replyString(row[0])
			inc, _ := replyInt(row[1])
			gen, _ := replyInt(row[2])
			due, _ := replyInt(row[3])
			out = append(out, storage.Moved{ID: id, Incarnation: inc, Generation: gen, State: storage.StateScheduled, DueTime: msTime(due)})
		}
		return nil
	}
	if err := eachChunk(p.All, p.IDs, call); err != nil {
		return nil, err
	}
	return out, nil
}

// purge is PurgeVersions of this shard.
func (sh shard) purge(ctx context.Context, p storage.PurgeParams) ([]storage.Version, error) {
	k := sh.k
	keys := sh.headKeys(k.dead, k.meta, k.body)
	var out []storage.Version
	call := func(ids []string) error {
		// ARGV as documented in lua/purge.lua.
		args := append(headArgs(2+len(ids)), luaBool(p.All), min(max(p.Limit, 1), MaxBatch))
		for _, id := range ids {
			args = append(args, id)
		}
		rep, err := sh.runRows(ctx, "purge", scripts.purge, keys, rowsOf(0, 3, anyRows), args...)
		if err != nil {
			return err
		}
		for i := range rep.n() {
			row := rep.row(i)
			id, _ := replyString(row[0])
			inc, _ := replyInt(row[1])
			gen, _ := replyInt(row[2])
			out = append(out, storage.Version{ID: id, Incarnation: inc, Generation: gen})
		}
		return nil
	}
	if err := eachChunk(p.All, p.IDs, call); err != nil {
		return nil, err
	}
	return out, nil
}
