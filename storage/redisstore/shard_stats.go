package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
)

// A shard's counts: stats and due kinds (Store.Stats and DueKinds add
// them up over the shards).

// stats is Stats of this shard.
func (sh shard) stats(ctx context.Context) (storage.Stats, error) {
	k := sh.k
	rep, err := sh.runRows(ctx, "stats", scripts.stats, []string{k.due, k.inflight, k.dead}, fixed(6))
	if err != nil {
		return storage.Stats{}, err
	}
	var n [6]int64
	for i, v := range rep.head {
		if n[i], err = replyInt(v); err != nil {
			return storage.Stats{}, fmt.Errorf("stats: %w", err)
		}
	}
	return storage.Stats{
		Now:       time.UnixMilli(n[0]),
		Scheduled: n[1],
		Delivered: n[2],
		Dead:      n[3],
		DueNow:    n[4],
		OldestDue: msTime(n[5]),
	}, nil
}

// dueKinds is DueKinds of this shard.
func (sh shard) dueKinds(ctx context.Context) (storage.DueKinds, error) {
	k := sh.k
	rep, err := sh.runRows(ctx, "due kinds", scripts.dueKinds, []string{k.due, k.meta}, rowsOf(1, 2, anyRows), storage.KindScanWindow)
	if err != nil {
		return storage.DueKinds{}, err
	}
	more, _ := replyInt(rep.head[0])
	out := storage.DueKinds{Counts: make(map[string]int64, rep.n()), Partial: more == 1}
	for i := range rep.n() {
		row := rep.row(i)
		kind, _ := replyString(row[0])
		n, _ := replyInt(row[1])
		out.Counts[kind] = n
	}
	return out, nil
}
