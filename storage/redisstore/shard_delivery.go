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

// pop is PopWake of this shard. It carries the acks and nacks that wait
// on the shard (settle.go) and settles them first, in the same script call.
func (sh shard) pop(ctx context.Context, p storage.PopParams) (storage.PopResult, error) {
	batch, done := sh.settles.forPop(settleKey{sh.ns, sh.i})
	res, err := sh.popWith(ctx, p, newSection(batch))
	done(err)
	return res, err
}

// popWith runs pop.lua with settle section sec.
func (sh shard) popWith(ctx context.Context, p storage.PopParams, sec section) (storage.PopResult, error) {
	ns := sh.ns
	k := sh.k
	// ARGV as documented in lua/pop.lua.
	rate := max(p.MaxRate, 0)
	window := 0
	if len(p.Kinds) > 0 {
		window = storage.KindScanWindow
	}
	args := append(headArgs(9+len(p.Kinds)+sec.arity()), min(p.Limit, MaxBatch), max(p.LeaseFor.Milliseconds(), 0),
		strconv.FormatFloat(rate, 'g', -1, 64), max(p.Burst, 1), window, max(p.TellFor.Milliseconds(), 0),
		sh.wakeChannel(), ns, len(p.Kinds))
	for _, kind := range p.Kinds {
		args = append(args, kind)
	}
	args = sec.encode(args, ns)
	keys := sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body, k.acked, k.rate, k.hwm)
	if p.RequestID != "" {
		// a pop that can be asked again (lua/pop.lua): its record, and how
		// long it is kept
		keys[0], args[0], args[1] = k.requestKey(p.RequestID), p.RequestID, max(p.RequestWindowOf().Milliseconds(), 1)
	}
	raw, err := sh.runSlice(ctx, "pop", scripts.pop, keys, args...)
	if err != nil {
		return storage.PopResult{}, err
	}
	// {now, deadline, next due, next lease, s, s settle answers, rows...}
	if len(raw) < popHead+1 {
		return storage.PopResult{}, fmt.Errorf("pop: reply has %d values, want at least %d", len(raw), popHead+1)
	}
	s, err := replyInt(raw[popHead])
	if err != nil || s < 0 || int(s) > len(raw)-popHead-1 {
		return storage.PopResult{}, fmt.Errorf("pop: reply's %v settle answers do not fit its %d values", raw[popHead], len(raw))
	}
	if err := sec.decode(raw[popHead+1 : popHead+1+int(s)]); err != nil {
		return storage.PopResult{}, err
	}
	rep, err := decodeReply("pop", raw[popHead+1+int(s):], shape{width: 3, rows: anyRows, badTail: true})
	if err != nil {
		return storage.PopResult{}, err
	}
	rep.head = raw[:popHead]
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

// popHead is how many values open pop.lua's reply before the settle
// answers' count: now, lease deadline, next due, next lease deadline.
const popHead = 4

// logBad logs tasks a script moved to dead because their header was
// malformed.
func (s shard) logBad(op string, ids []string) {
	if len(ids) > 0 {
		s.log.Error(op+": malformed task headers; the tasks were moved to dead letters (inspect, then purge or re-upsert them)",
			"namespace", s.ns, "ids", ids)
	}
}

// settle runs settle.lua for batch: one script call, its calls' tokens
// under MaxBatch and CoalesceMax (settler.take); each call gets its
// answers.
func (sh shard) settle(ctx context.Context, batch []*settleCall) error {
	k := sh.k
	sec := newSection(batch)
	args := sec.encode(append(headArgs(2+sec.arity()), sh.wakeChannel(), sh.ns), sh.ns)
	vals, err := sh.runSlice(ctx, sec.op(), scripts.settle, sh.headKeys(k.due, k.inflight, k.dead, k.meta, k.body, k.acked), args...)
	if err != nil {
		return err
	}
	return sec.decode(vals)
}

// settleAlone settles c on its own, in script calls of at most MaxBatch
// tokens and Options.MaxScriptBytes (a call too large to share one, or
// Options.NoCoalesce).
func (sh shard) settleAlone(ctx context.Context, c *settleCall) error {
	return byteChunks(len(c.tokens), sh.maxArgs, tokenBytes(c.tokens), func(lo, hi int) error {
		part := *c
		part.tokens, part.statuses, part.moved = c.tokens[lo:hi], nil, nil
		if err := sh.settle(ctx, []*settleCall{&part}); err != nil {
			return err
		}
		c.statuses = append(c.statuses, part.statuses...)
		c.moved = append(c.moved, part.moved...)
		return nil
	})
}

// section is the settle section (lib.lua settle_deliveries) of a batch of
// calls: their acks in two groups by mode (in call order), then one nack
// group per nack call.
type section struct {
	acks  [2][]*settleCall // without, with ack markers
	nacks []*settleCall
}

func newSection(batch []*settleCall) section {
	var sec section
	for _, c := range batch {
		switch {
		case c.nack:
			sec.nacks = append(sec.nacks, c)
		case c.marks:
			sec.acks[1] = append(sec.acks[1], c)
		default:
			sec.acks[0] = append(sec.acks[0], c)
		}
	}
	return sec
}

// empty reports whether the section settles nothing.
func (sec section) empty() bool {
	return len(sec.acks[0]) == 0 && len(sec.acks[1]) == 0 && len(sec.nacks) == 0
}

// op names the section's script call in errors.
func (sec section) op() string {
	if len(sec.acks[0]) == 0 && len(sec.acks[1]) == 0 {
		return "nack"
	}
	return "ack"
}

// arity is about how many ARGV values encode appends.
func (sec section) arity() int {
	n := 2 + 4 + 10*len(sec.nacks)
	for _, cs := range append(sec.acks[:], sec.nacks) {
		for _, c := range cs {
			n += tokenArity * len(c.tokens)
		}
	}
	return n
}

// encode appends the section to args, in the layout lib.lua documents.
func (sec section) encode(args []any, ns string) []any {
	groups := 0
	for _, cs := range sec.acks {
		if len(cs) > 0 {
			groups++
		}
	}
	args = append(args, groups)
	for marks, cs := range sec.acks {
		if len(cs) == 0 {
			continue
		}
		n := 0
		for _, c := range cs {
			n += len(c.tokens)
		}
		args = append(args, luaBool(marks == 1), n)
		for _, c := range cs {
			args = tokenArgs(args, ns, c.tokens)
		}
	}
	args = append(args, len(sec.nacks))
	for _, c := range sec.nacks {
		args = append(args, retryArgs(c.opts.RetryAfter, c.opts)...)
		args = append(args, luaBool(c.opts.Unsent), len(c.tokens))
		args = tokenArgs(args, ns, c.tokens)
	}
	return args
}

// decode sets each call's answers from the section's answers vals: a
// status per ack token, then status, state and time per nack token.
func (sec section) decode(vals []any) error {
	want := 0
	for _, cs := range append(sec.acks[:], sec.nacks) {
		for _, c := range cs {
			if c.nack {
				want += 3 * len(c.tokens)
			} else {
				want += len(c.tokens)
			}
		}
	}
	if len(vals) != want {
		return fmt.Errorf("%s: %d answers for the settled tokens, want %d", sec.op(), len(vals), want)
	}
	k := 0
	for _, cs := range sec.acks {
		for _, c := range cs {
			for range c.tokens {
				c.statuses = append(c.statuses, tokenStatus(vals[k]))
				k++
			}
		}
	}
	for _, c := range sec.nacks {
		for _, t := range c.tokens {
			st := tokenStatus(vals[k])
			c.statuses = append(c.statuses, st)
			if st == storage.TokenOK {
				state, _ := replyInt(vals[k+1])
				at, _ := replyInt(vals[k+2])
				attempt := t.Attempt
				if c.opts.Unsent && attempt > 0 {
					attempt-- // the pop's count was given back
				}
				c.moved = append(c.moved, moved(t.ID, t.Incarnation, t.Generation, attempt, state, at, c.opts.Reason))
			}
			k += 3
		}
	}
	return nil
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
	args := append(headArgs(12), sh.wakeChannel(), ns)
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
