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
	rep, err := sh.runSlice(ctx, "stats", scripts.stats, []string{k.due, k.inflight, k.dead})
	if err != nil {
		return storage.Stats{}, err
	}
	if len(rep) != 6 {
		return storage.Stats{}, fmt.Errorf("stats: reply has %d values", len(rep))
	}
	var n [6]int64
	for i, v := range rep {
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
	rep, err := sh.runSlice(ctx, "due kinds", scripts.dueKinds, []string{k.due, k.meta}, storage.KindScanWindow)
	if err != nil {
		return storage.DueKinds{}, err
	}
	if len(rep)%2 != 1 {
		return storage.DueKinds{}, fmt.Errorf("due kinds: reply has %d values", len(rep))
	}
	more, _ := replyInt(rep[0])
	out := storage.DueKinds{Counts: make(map[string]int64, len(rep)/2), Partial: more == 1}
	for i := 1; i < len(rep); i += 2 {
		kind, _ := replyString(rep[i])
		n, _ := replyInt(rep[i+1])
		out.Counts[kind] = n
	}
	return out, nil
}
