package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/storage"
)

// The Store's delivery calls (storage.Deliveries): pop, ack, nack, extend,
// reap and the next wake, fanned out over a namespace's shards to the
// shard's calls (shard_delivery.go).

// Pop leases at most p.Limit (and at most MaxBatch) due tasks of ns for
// p.LeaseFor, in due order, counting the attempt; with p.MaxRate, at most
// as many as the namespace's token bucket holds, with p.Kinds only tasks
// of those kinds (lua/pop.lua). Due-ness
// is decided by the Redis clock. Nothing is deleted: a task whose stored
// header is malformed is moved to dead (and logged) instead of delivered.
func (s *Store) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	if p.Limit <= 0 && p.RequestID == "" {
		return nil, nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("pop: %w", err)
	}
	switch {
	case n == 1:
		p.Limit = max(p.Limit, 0)
		r, err := s.shardOfN(ns, 0, n).pop(ctx, p)
		return r.Deliveries, err
	case p.Limit <= 0:
		return s.popAsked(ctx, ns, n, p)
	}
	return s.popSharded(ctx, ns, n, p)
}

// PopWake is Pop that also answers the Redis clock and the namespace's
// next wake (see storage.Deliveries): one script call for an unsharded
// namespace, whose pop.lua reads the heads of due and inflight after the
// move; a sharded namespace pops, then asks every shard's next wake. With
// p.Limit <= 0 it only asks the next wake, unless it asks a pop with
// p.RequestID again (storage.PopParams): then every shard is asked. A
// sharded pop with a request id of which some shards failed answers what
// the others leased with the error.
func (s *Store) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return storage.PopResult{}, fmt.Errorf("pop: %w", err)
	}
	if n == 1 {
		if p.Limit <= 0 {
			// the script pops nothing and answers the heads
			p.Limit, p.Kinds, p.MaxRate = 0, nil, 0
		}
		return s.shardOfN(ns, 0, n).pop(ctx, p)
	}
	var r storage.PopResult
	switch {
	case p.Limit > 0:
		if r.Deliveries, err = s.popSharded(ctx, ns, n, p); err != nil {
			// with a request id, what some shards leased comes with the
			// error of the others (popSharded): the caller asks again
			return storage.PopResult{Deliveries: r.Deliveries}, err
		}
	case p.RequestID != "":
		if r.Deliveries, err = s.popAsked(ctx, ns, n, p); err != nil {
			return storage.PopResult{Deliveries: r.Deliveries}, err
		}
	}
	r.Next, r.Now, r.HasNext, err = s.nextWakeSharded(ctx, ns, n)
	if err != nil && len(r.Deliveries) > 0 {
		// What was popped is leased: hand it over, and look again soon.
		r.Now = time.Now()
		r.Next, r.HasNext, err = r.Now.Add(shardRetry), true, nil
	}
	return r, err
}

// tokenArgs appends id, incarnation, generation, attempt, delivery per
// token (tokenArity values), the numbers in hexadecimal as headers hold them
// (appendHex: 0 is ""), so the scripts compare them as strings (see
// token_check in lua/lib.lua). A token of another namespace is sent with an
// id no task has, so it answers NOT_FOUND; so does one with delivery 0 (the
// scripts never match it).
func tokenArgs(args []any, ns string, tokens []storage.Token) []any {
	// one buffer for every token's numbers; each argument is a slice of it
	// (a full slice expression, so nothing appends into another's bytes)
	buf := make([]byte, 0, 48*len(tokens))
	for _, t := range tokens {
		if t.Namespace != "" && t.Namespace != ns {
			args = append(args, "", "", "", "", "")
			continue
		}
		a := len(buf)
		buf = appendHex(buf, t.Incarnation)
		b := len(buf)
		buf = appendHex(buf, t.Generation)
		c := len(buf)
		buf = appendHex(buf, int64(t.Attempt))
		d := len(buf)
		buf = appendHex(buf, t.Delivery)
		e := len(buf)
		args = append(args, t.ID, buf[a:b:b], buf[b:c:c], buf[c:d:d], buf[d:e:e])
	}
	return args
}

// tokenArity is how many ARGV values tokenArgs sends per token.
const tokenArity = 5

func tokenStatus(v any) storage.TokenStatus {
	n, _ := replyInt(v)
	switch n {
	case 1:
		return storage.TokenOK
	case 2:
		return storage.TokenStale
	default:
		return storage.TokenNotFound
	}
}

// Ack deletes each task whose token still names the delivery in flight
// (same incarnation, generation, attempt and delivery): OK. A token whose
// task has since been upserted or redelivered answers STALE, one whose task
// is gone, re-created since (another incarnation) or not in flight
// NOT_FOUND; both change nothing. A token of another namespace answers
// NOT_FOUND. A call of fewer than CoalesceMax tokens settles in the next
// script call of its namespace shard (settle.go): at once on its own when
// none is in flight or coming, with the calls in flight's followers, or in
// the pop this replica said it makes soon (ExpectPop). Larger calls make
// one round trip per MaxBatch tokens (or Options.MaxScriptBytes of their
// ids).
func (s *Store) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	statuses, _, err := s.settleTokens(ctx, ns, tokens, settleCall{})
	return statuses, err
}

// AckMarked is Ack for durable mode: each acked task leaves an ack marker
// naming the acked delivery until ClearAcked drops it (once MySQL has
// deleted that version). While the marker is there, Restore never writes
// that version back, and a token that matches the marker answers OK again
// (an ack retried after its write-through failed).
func (s *Store) AckMarked(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	statuses, _, err := s.settleTokens(ctx, ns, tokens, settleCall{marks: true})
	return statuses, err
}

// Nack puts each delivery its token still names back to scheduled, due
// after opts.RetryAfter or the backoff for its attempt, or to dead when its
// attempt has reached opts.MaxAttempts (0 = no limit); opts.Reason becomes
// its last error. Statuses are as for Ack; Moved lists where each applied
// token's task went, in token order. Calls settle as Ack's do.
func (s *Store) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	return s.settleTokens(ctx, ns, tokens, settleCall{nack: true, opts: opts})
}

// ExpectPop implements storage.Deliveries: this replica's dispatcher pops
// ns within the given time, so the acks and nacks of ns that arrive until
// then wait for that pop and settle in its script call (0 or less: no pop
// soon; what waits for one goes out now).
func (s *Store) ExpectPop(ns string, within time.Duration) {
	s.settles.expect(ns, within)
}

// settleTokens acks or nacks (as like says) tokens of ns, per shard.
func (s *Store) settleTokens(ctx context.Context, ns string, tokens []storage.Token, like settleCall) ([]storage.TokenStatus, []storage.Moved, error) {
	op := like.op()
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	statuses := make([]storage.TokenStatus, len(tokens))
	movedOf := make([]*storage.Moved, len(tokens))
	err = byTokenShard(n, tokens, func(sh int, idx []int, part []storage.Token) error {
		c := like
		c.ctx, c.tokens = ctx, part
		err := s.settleOn(ctx, s.shardOfN(ns, sh, n), &c)
		m := 0
		for i, v := range c.statuses {
			statuses[idx[i]] = v
			if v == storage.TokenOK && m < len(c.moved) {
				movedOf[idx[i]] = &c.moved[m]
				m++
			}
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	var movedTasks []storage.Moved
	for _, m := range movedOf {
		if m != nil {
			movedTasks = append(movedTasks, *m)
		}
	}
	return statuses, movedTasks, nil
}

// settleOn settles c on shard sh: through the shard's settle queue unless
// Options.NoCoalesce says otherwise or c is too large to share a call.
func (s *Store) settleOn(ctx context.Context, sh shard, c *settleCall) error {
	if len(c.tokens) == 0 {
		return nil
	}
	if s.noCo || len(c.tokens) >= CoalesceMax {
		return sh.settleAlone(ctx, c)
	}
	return s.settles.do(ctx, sh, c)
}

// retryArgs are ARGV[8..15] of nack.lua and reap.lua.
func retryArgs(retryAfter *time.Duration, opts storage.NackOptions) []any {
	after := ""
	if retryAfter != nil {
		after = strconv.FormatInt(max(retryAfter.Milliseconds(), 0), 10)
	}
	b := opts.Backoff
	capMS := b.Max.Milliseconds()
	if capMS <= 0 {
		capMS = 1 << 50 // no cap given: a delay no task reaches
	}
	mult := b.Multiplier
	if mult < 1 {
		mult = 1
	}
	jitter := min(max(b.Jitter, 0), 1)
	return []any{
		after, max(opts.MaxAttempts, 0), max(b.Initial.Milliseconds(), 0), capMS,
		strconv.FormatFloat(mult, 'g', -1, 64), strconv.FormatFloat(jitter, 'g', -1, 64),
		strconv.FormatFloat(rand.Float64(), 'g', -1, 64), opts.Reason,
	}
}

// moved builds a storage.Moved from a script's state and time.
func moved(id string, inc, gen int64, attempt int32, state int64, at int64, reason string) storage.Moved {
	m := storage.Moved{ID: id, Incarnation: inc, Generation: gen, Attempt: attempt, State: stateOf(state), LastError: reason}
	if m.State == storage.StateDead {
		m.DeadTime = msTime(at)
	} else {
		m.DueTime = msTime(at)
	}
	return m
}

// Extend sets the lease of each delivery its token still names to the
// Redis clock's now + by. Statuses are as for Ack; LeaseDeadline is set for
// OK. One round trip per MaxBatch tokens (or Options.MaxScriptBytes of
// their ids).
func (s *Store) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("extend: %w", err)
	}
	out := make([]storage.ExtendResult, len(tokens))
	err = byTokenShard(n, tokens, func(sh int, idx []int, part []storage.Token) error {
		rs, err := s.shardOfN(ns, sh, n).extend(ctx, part, by)
		for i, r := range rs {
			out[idx[i]] = r
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Reap takes at most limit (and at most MaxBatch) expired leases of ns back
// to scheduled after the backoff for their attempt (or opts.RetryAfter), or
// to dead when their attempt has reached opts.MaxAttempts; opts.Reason
// becomes their last error. Atomic per call, so every replica may reap at
// once; each expired lease is moved by exactly one of them.
func (s *Store) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	if limit <= 0 {
		return nil, nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).reap(ctx, limit, opts)
	}
	return s.reapSharded(ctx, ns, n, limit, opts)
}

// NextWake returns the earlier of ns's first due time and first lease
// deadline, and the Redis clock's now; ok is false when ns has neither.
func (s *Store) NextWake(ctx context.Context, ns string) (next, now time.Time, ok bool, err error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return time.Time{}, time.Time{}, false, fmt.Errorf("next wake: %w", err)
	}
	if n == 1 {
		return s.shardOfN(ns, 0, n).nextWake(ctx)
	}
	return s.nextWakeSharded(ctx, ns, n)
}

// popSharded: see the file comment.
func (s *Store) popSharded(ctx context.Context, ns string, n int, p storage.PopParams) ([]storage.Delivery, error) {
	limit := min(p.Limit, MaxBatch)
	type head struct {
		id    string
		score int64
		shard int
	}
	heads := make([][]head, n)
	window := 0
	if len(p.Kinds) > 0 {
		window = storage.KindScanWindow
	}
	// A shard that cannot be read (its master failing over) is left out of
	// this pop: the shards on the other masters keep delivering.
	errs := fanOutEach(allShards(n), func(sh int) error {
		k := keysForN(ns, sh, n)
		args := []any{limit, window}
		if window > 0 {
			for _, kind := range p.Kinds {
				args = append(args, kind)
			}
		}
		rep, err := s.runRows(ctx, "pop", scripts.peekDue, []string{k.due, k.meta}, rowsOf(1, 2, anyRows), args...)
		if err != nil {
			return err
		}
		for i := range rep.n() {
			row := rep.row(i)
			id, _ := replyString(row[0])
			score, err := replyInt(row[1])
			if err != nil {
				return fmt.Errorf("pop: %w", err)
			}
			heads[sh] = append(heads[sh], head{id, score, sh})
		}
		return nil
	})
	if err, _ := partial(errs); err != nil {
		return nil, err
	}
	all := slices.Concat(heads...)
	if len(all) == 0 {
		return nil, nil
	}
	slices.SortFunc(all, func(a, b head) int {
		return cmp.Or(cmp.Compare(a.score, b.score), strings.Compare(a.id, b.id))
	})
	want := min(limit, len(all))
	// A rate cap: the namespace's one bucket (in shard 0) grants the
	// tokens first; what the shards do not use is given back.
	granted := want
	rateKey := keysForN(ns, 0, n).rate
	burst := max(p.Burst, 1)
	if p.MaxRate > 0 {
		v, err := s.run(ctx, "pop", scripts.rateTake, []string{rateKey}, strconv.FormatFloat(p.MaxRate, 'g', -1, 64), burst, want, 0)
		if err != nil {
			return nil, err
		}
		g, err := replyInt(v)
		if err != nil {
			return nil, fmt.Errorf("pop: %w", err)
		}
		granted = int(g)
		if granted == 0 {
			return nil, nil
		}
	}
	counts := make([]int, n)
	for _, h := range all[:granted] {
		counts[h.shard]++
	}
	var shards []int
	for sh, c := range counts {
		if c > 0 {
			shards = append(shards, sh)
		}
	}
	q := p
	q.MaxRate = 0
	out, err := s.popShards(ctx, ns, n, shards, q, func(sh int) int { return counts[sh] })
	if p.MaxRate > 0 && len(out) < granted {
		if _, rerr := s.run(ctx, "pop", scripts.rateTake, []string{rateKey},
			strconv.FormatFloat(p.MaxRate, 'g', -1, 64), burst, 0, granted-len(out)); rerr != nil {
			s.log.Warn("pop: giving unused dispatch tokens back failed; the namespace delivers a little under its cap for a moment", "namespace", ns, "err", rerr)
		}
	}
	if err != nil && (len(out) == 0 || p.RequestID != "") {
		// A pop with a request id returns the error beside what the other
		// shards leased: the failed shard's pop may have run, and its
		// caller asks again (Limit 0: every shard) to get it.
		return out, err
	}
	// Deliveries leased by the shards that answered are returned even when
	// another shard failed: dropping them would leave them leased until
	// their lease ends.
	return out, nil
}

// popAsked asks every shard of ns again for the pop of request id
// p.RequestID (a Pop of Limit 0 with an id, storage.PopParams): each
// answers what it leased under the id, or records that it leased nothing.
func (s *Store) popAsked(ctx context.Context, ns string, n int, p storage.PopParams) ([]storage.Delivery, error) {
	q := storage.PopParams{RequestID: p.RequestID, RequestWindow: p.RequestWindow, LeaseFor: p.LeaseFor, TellFor: p.TellFor}
	return s.popShards(ctx, ns, n, allShards(n), q, func(int) int { return 0 })
}

// popShards pops shards of ns's n with q, limit(sh) on shard sh, at once,
// and merges what they leased in due order; the error is the first
// shard's that failed, beside what the others leased.
func (s *Store) popShards(ctx context.Context, ns string, n int, shards []int, q storage.PopParams, limit func(sh int) int) ([]storage.Delivery, error) {
	got := make([][]storage.Delivery, n)
	err := fanOut(shards, func(sh int) error {
		qq := q
		qq.Limit = limit(sh)
		r, err := s.shardOfN(ns, sh, n).pop(ctx, qq)
		got[sh] = r.Deliveries
		return err
	})
	out := slices.Concat(got...)
	slices.SortFunc(out, func(a, b storage.Delivery) int {
		return cmp.Or(a.Task.DueTime.Compare(b.Task.DueTime), strings.Compare(a.Task.ID, b.Task.ID))
	})
	return out, err
}

// reapSharded splits limit evenly across the shards (the remainder goes to
// shards in turn, call after call) and reaps them concurrently.
func (s *Store) reapSharded(ctx context.Context, ns string, n, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	limit = min(limit, MaxBatch)
	start := int(s.reapTurn.Add(1)) % n
	counts := make([]int, n)
	for i := range n {
		sh := (start + i) % n
		counts[sh] = limit / n
		if i < limit%n {
			counts[sh]++
		}
	}
	var shards []int
	for sh, c := range counts {
		if c > 0 {
			shards = append(shards, sh)
		}
	}
	got := make([][]storage.Moved, n)
	err := fanOut(shards, func(sh int) error {
		var err error
		got[sh], err = s.shardOfN(ns, sh, n).reap(ctx, counts[sh], opts)
		return err
	})
	out := slices.Concat(got...)
	if err != nil && len(out) == 0 {
		return nil, err
	}
	return out, nil
}

// nextWakeSharded is the earliest next wake of any shard, with the latest
// now the shards answered.
func (s *Store) nextWakeSharded(ctx context.Context, ns string, n int) (next, now time.Time, ok bool, err error) {
	type ans struct {
		next, now time.Time
		ok        bool
	}
	as := make([]ans, n)
	errs := fanOutEach(allShards(n), func(sh int) error {
		a, b, c, err := s.shardOfN(ns, sh, n).nextWake(ctx)
		as[sh] = ans{a, b, c}
		return err
	})
	err, anyFailed := partial(errs)
	if err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	for i, a := range as {
		if errs[i] != nil {
			continue
		}
		if a.now.After(now) {
			now = a.now
		}
		if a.ok && (!ok || a.next.Before(next)) {
			next, ok = a.next, true
		}
	}
	// A shard that did not answer may have work at any time: look again
	// soon rather than sleep past it.
	if soon := now.Add(shardRetry); anyFailed && (!ok || next.After(soon)) {
		next, ok = soon, true
	}
	return next, now, ok, nil
}
