package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/delayd/delayd/storage"
)

// A shard's delivery calls: pop, ack, nack, extend, reap and the next wake
// (Store.Pop, PopWake, Ack, AckMarked, Nack, Extend, Reap and NextWake fan
// them out).

// pop is PopWake of this shard.
func (sh shard) pop(ctx context.Context, p storage.PopParams) (storage.PopResult, error) {
	ns := sh.ns
	k := sh.k
	// ARGV as documented in lua/pop.lua.
	rate := max(p.MaxRate, 0)
	args := append(headArgs(6+len(p.Kinds)), min(p.Limit, MaxBatch), max(p.LeaseFor.Milliseconds(), 0),
		strconv.FormatFloat(rate, 'g', -1, 64), max(p.Burst, 1), 0, max(p.TellFor.Milliseconds(), 0))
	if len(p.Kinds) > 0 {
		args[headArity+4] = storage.KindScanWindow
		for _, kind := range p.Kinds {
			args = append(args, kind)
		}
	}
	rep, err := sh.runRows(ctx, "pop", scripts.pop, sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body, k.rate, k.hwm),
		shape{head: popHead, width: 3, rows: anyRows, badTail: true}, args...)
	if err != nil {
		return storage.PopResult{}, err
	}
	sh.logBad("pop", rep.bad)
	nowMS, _ := replyInt(rep.head[0])
	res := storage.PopResult{Now: time.UnixMilli(nowMS), DueKnown: true}
	for i, v := range rep.head[2:] {
		if sv, _ := replyString(v); sv == "" {
			continue
		}
		at, err := replyInt(v)
		if err != nil {
			return storage.PopResult{}, fmt.Errorf("pop: %w", err)
		}
		t := time.UnixMilli(at)
		if i == 0 { // rep[2], the head of due; rep[3] is the first lease deadline
			res.NextDue = t
		}
		if !res.HasNext || t.Before(res.Next) {
			res.Next, res.HasNext = t, true
		}
	}
	deadline, _ := replyInt(rep.head[1])
	out := make([]storage.Delivery, 0, rep.n())
	for i := range rep.n() {
		row := rep.row(i)
		id, _ := replyString(row[0])
		h, _ := replyString(row[1])
		payload, _ := replyString(row[2])
		r, err := decodeRecord(h, payload)
		if err != nil {
			// The script checked the header; this cannot happen unless the
			// two layouts disagree. The task is leased; its lease will
			// expire and the reaper will put it back. Report the rest.
			sh.log.Error("pop: undecodable task record", "namespace", ns, "id", id, "err", err)
			continue
		}
		out = append(out, storage.Delivery{
			Task: r.task(ns, id, storage.StateDelivered, deadline),
			Token: storage.Token{Namespace: ns, ID: id, Incarnation: r.inc, Generation: r.gen,
				Attempt: r.attempt, Delivery: r.dseq},
			LeaseDeadline: msTime(deadline),
		})
	}
	if sh.traces && len(out) > 0 {
		sh.readTraces(ctx, out)
	}
	res.Deliveries = out
	return res, nil
}

// popHead is how many values precede the tasks in pop.lua's reply: now,
// lease deadline, next due, next lease deadline.
const popHead = 4

// logBad logs tasks a script moved to dead because their header was
// malformed.
func (s shard) logBad(op string, ids []string) {
	if len(ids) > 0 {
		s.log.Error(op+": malformed task headers; the tasks were moved to dead letters (inspect, then purge or re-upsert them)",
			"namespace", s.ns, "ids", ids)
	}
}

// ack runs ack.lua for tokens of this shard (split by byteChunks).
func (sh shard) ack(ctx context.Context, tokens []storage.Token, marks bool) ([]storage.TokenStatus, error) {
	ns := sh.ns
	k := sh.k
	out := make([]storage.TokenStatus, 0, len(tokens))
	err := byteChunks(len(tokens), sh.maxArgs, tokenBytes(tokens), func(lo, hi int) error {
		args := append(headArgs(2+tokenArity*(hi-lo)), luaBool(marks), hi-lo)
		args = tokenArgs(args, ns, tokens[lo:hi])
		rep, err := sh.runRows(ctx, "ack", scripts.ack, sh.headKeys(k.inflight, k.meta, k.body, k.acked), rowsOf(0, 1, hi-lo), args...)
		if err != nil {
			return err
		}
		for _, v := range rep.body {
			out = append(out, tokenStatus(v))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// nack is Nack for tokens of this shard.
func (sh shard) nack(ctx context.Context, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	ns := sh.ns
	k := sh.k
	keys := sh.headKeys(k.due, k.inflight, k.dead, k.meta)
	statuses := make([]storage.TokenStatus, 0, len(tokens))
	var movedTasks []storage.Moved
	err := byteChunks(len(tokens), sh.maxArgs, tokenBytes(tokens), func(lo, hi int) error {
		part := tokens[lo:hi]
		args := append(headArgs(12+tokenArity*len(part)), sh.wake, ns)
		args = append(args, retryArgs(opts.RetryAfter, opts)...)
		args = append(args, luaBool(opts.Unsent), len(part))
		args = tokenArgs(args, ns, part)
		rep, err := sh.runRows(ctx, "nack", scripts.nack, keys, rowsOf(1, 3, len(part)), args...)
		if err != nil {
			return err
		}
		for i, t := range part {
			row := rep.row(i)
			st := tokenStatus(row[0])
			statuses = append(statuses, st)
			if st == storage.TokenOK {
				state, _ := replyInt(row[1])
				at, _ := replyInt(row[2])
				attempt := t.Attempt
				if opts.Unsent && attempt > 0 {
					attempt-- // the pop's count was given back
				}
				movedTasks = append(movedTasks, moved(t.ID, t.Incarnation, t.Generation, attempt, state, at, opts.Reason))
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return statuses, movedTasks, nil
}

// extend is Extend for tokens of this shard.
func (sh shard) extend(ctx context.Context, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	ns := sh.ns
	k := sh.k
	out := make([]storage.ExtendResult, 0, len(tokens))
	err := byteChunks(len(tokens), sh.maxArgs, tokenBytes(tokens), func(lo, hi int) error {
		args := append(headArgs(2+tokenArity*(hi-lo)), max(by.Milliseconds(), 0), hi-lo)
		args = tokenArgs(args, ns, tokens[lo:hi])
		rep, err := sh.runRows(ctx, "extend", scripts.extend, sh.headKeys(k.inflight, k.meta), rowsOf(1, 1, hi-lo), args...)
		if err != nil {
			return err
		}
		deadline, _ := replyInt(rep.head[0])
		for _, v := range rep.body {
			r := storage.ExtendResult{Status: tokenStatus(v)}
			if r.Status == storage.TokenOK {
				r.LeaseDeadline = msTime(deadline)
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// reap is Reap of this shard.
func (sh shard) reap(ctx context.Context, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	ns := sh.ns
	k := sh.k
	args := append(headArgs(12), sh.wake, ns)
	args = append(args, retryArgs(opts.RetryAfter, opts)...)
	by := ""
	if !opts.ExpiredBy.IsZero() {
		by = strconv.FormatInt(opts.ExpiredBy.UnixMilli(), 10)
	}
	args = append(args, min(limit, MaxBatch), by)
	rep, err := sh.runRows(ctx, "reap", scripts.reap, sh.headKeys(k.due, k.inflight, k.dead, k.meta),
		shape{head: 1, width: 6, rows: anyRows, badTail: true}, args...)
	if err != nil {
		return nil, err
	}
	sh.logBad("reap", rep.bad)
	var out []storage.Moved
	for i := range rep.n() {
		row := rep.row(i)
		id, _ := replyString(row[0])
		inc, _ := replyInt(row[1])
		gen, _ := replyInt(row[2])
		attempt, _ := replyInt(row[3])
		state, _ := replyInt(row[4])
		at, _ := replyInt(row[5])
		out = append(out, moved(id, inc, gen, int32(attempt), state, at, opts.Reason))
	}
	return out, nil
}

// nextWake is NextWake of this shard.
func (sh shard) nextWake(ctx context.Context) (next, now time.Time, ok bool, err error) {
	k := sh.k
	rep, err := sh.runRows(ctx, "next wake", scripts.nextWake, []string{k.due, k.inflight}, fixed(3))
	if err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	nowMS, _ := replyInt(rep.head[0])
	var best int64
	for _, v := range rep.head[1:] {
		if sv, _ := replyString(v); sv == "" {
			continue
		}
		at, err := replyInt(v)
		if err != nil {
			return time.Time{}, time.Time{}, false, fmt.Errorf("next wake: %w", err)
		}
		if !ok || at < best {
			best, ok = at, true
		}
	}
	if !ok {
		return time.Time{}, time.UnixMilli(nowMS), false, nil
	}
	return time.UnixMilli(best), time.UnixMilli(nowMS), true, nil
}
