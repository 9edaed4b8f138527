package storagefake

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/delayd/delayd/storage"
)

// The fake's delivery calls (storage.Deliveries): pop, ack, nack, extend,
// reap and the next wake.

// Pop leases at most p.Limit due tasks, in due order; with p.MaxRate, at
// most the whole tokens of the namespace's bucket; with p.Kinds, only
// tasks of those kinds among the first KindScanWindow due ones, as pop.lua
// does.
func (s *Store) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	r, err := s.PopWake(ctx, ns, p)
	return r.Deliveries, err
}

// PopWake is Pop with the store's now and the namespace's next wake after
// the pop, in one step as pop.lua answers them.
func (s *Store) PopWake(_ context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dels := s.popAsked(ns, p)
	ms, _ := s.now()
	next, ok := s.nextWake(ns)
	r := storage.PopResult{Deliveries: dels, Now: time.UnixMilli(ms), Next: next, HasNext: ok, DueKnown: true}
	if due, ok := head(s.nss[ns]); ok {
		r.NextDue = time.UnixMilli(due)
	}
	return r, nil
}

// popAsked is pop for a pop that may carry a request id, as pop.lua: a
// record of the id answers what it recorded and leases nothing; otherwise
// the pop's deliveries (none for Limit 0) are recorded under the id for its
// window. Expired records are swept as the map grows (see below). s.mu is
// held.
func (s *Store) popAsked(ns string, p storage.PopParams) []storage.Delivery {
	if p.RequestID == "" {
		return s.pop(ns, p)
	}
	now, _ := s.now()
	key := popKey{ns, p.RequestID}
	if r, ok := s.pops[key]; ok && r.expires > now {
		return slices.Clone(r.dels)
	}
	dels := s.pop(ns, p)
	if len(dels) == 0 && p.Limit > 0 {
		return dels // nothing leased, nothing to record (pop.lua)
	}
	if len(s.pops) >= s.popsPruneAt {
		// Expired records go once the map has doubled since the last
		// sweep: a write costs O(1) on average, and the map holds at most
		// twice the live records (and 1,024).
		for k, r := range s.pops {
			if r.expires <= now {
				delete(s.pops, k)
			}
		}
		s.popsPruneAt = max(1024, 2*len(s.pops))
	}
	s.pops[key] = popRecord{dels: slices.Clone(dels), expires: now + max(p.RequestWindowOf().Milliseconds(), 1)}
	return dels
}

// pop is Pop with s.mu held.
func (s *Store) pop(ns string, p storage.PopParams) []storage.Delivery {
	now, nowUS := s.now()
	deadline := now + p.LeaseFor.Milliseconds()
	limit := min(p.Limit, 1000)
	var tokens float64
	if p.MaxRate > 0 {
		burst := float64(max(p.Burst, 1))
		tokens = burst
		if b, ok := s.buckets[ns]; ok {
			tokens = min(burst, b.tokens+float64(max(nowUS-b.atUS, 0))*p.MaxRate/1e6)
		}
		limit = min(limit, int(tokens))
	}
	var out []storage.Delivery
	for i, r := range sorted(s.nss[ns], storage.StateScheduled) {
		if len(out) >= limit || r.due > now || (len(p.Kinds) > 0 && i >= storage.KindScanWindow) {
			break
		}
		if len(p.Kinds) > 0 && !slices.Contains(p.Kinds, r.task.Kind) {
			continue
		}
		r.task.State = storage.StateDelivered
		r.task.Attempt++
		r.dseq = max(r.dseq+1, nowUS)
		r.lease = deadline
		r.told = 0
		if p.TellFor > p.LeaseFor {
			r.told = now + p.TellFor.Milliseconds()
		}
		r.task.UpdateTime = time.UnixMilli(now)
		t := r.view()
		out = append(out, storage.Delivery{Task: t, LeaseDeadline: time.UnixMilli(deadline), Token: r.token(ns)})
	}
	if p.MaxRate > 0 && len(out) > 0 {
		s.buckets[ns] = bucket{tokens: tokens - float64(len(out)), atUS: nowUS}
	}
	return out
}

// bucket is a namespace's dispatch-rate token bucket (PopParams.MaxRate).
type bucket struct {
	tokens float64
	atUS   int64
}

func (r *record) token(ns string) storage.Token {
	return storage.Token{Namespace: ns, ID: r.task.ID, Incarnation: r.task.Incarnation,
		Generation: r.task.Generation, Attempt: r.task.Attempt, Delivery: r.dseq}
}

// check compares a token with the task it names, as token_check in lib.lua.
func (s *Store) check(ns string, tok storage.Token) (*record, storage.TokenStatus) {
	r := s.nss[ns][tok.ID]
	if r == nil || tok.Namespace != ns || tok.Delivery == 0 || r.task.Incarnation != tok.Incarnation {
		return nil, storage.TokenNotFound
	}
	if r.task.Generation == tok.Generation && r.dseq == tok.Delivery {
		// The attempt is fenced too: a token naming this delivery with
		// another attempt was never issued.
		if r.task.State == storage.StateDelivered && r.task.Attempt == tok.Attempt {
			return r, storage.TokenOK
		}
		return nil, storage.TokenNotFound
	}
	if r.task.Generation > tok.Generation || (r.task.Generation == tok.Generation && r.dseq > tok.Delivery) {
		return nil, storage.TokenStale
	}
	return nil, storage.TokenNotFound
}

// Ack deletes the tasks whose delivery the tokens name.
func (s *Store) Ack(_ context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]storage.TokenStatus, len(tokens))
	for i, tok := range tokens {
		r, st := s.check(ns, tok)
		if st == storage.TokenOK {
			delete(s.nss[ns], r.task.ID)
		}
		out[i] = st
	}
	return out, nil
}

// settle moves an in-flight record to scheduled after its retry delay, or to
// dead when its attempts are used up (settle in lib.lua). k spreads the
// jitter of one call's tasks.
func settle(r *record, now int64, o storage.NackOptions, k int, seed float64) storage.Moved {
	r.task.UpdateTime = time.UnixMilli(now)
	r.task.LastError = o.Reason
	mv := storage.Moved{ID: r.task.ID, Incarnation: r.task.Incarnation, Generation: r.task.Generation,
		Attempt: r.task.Attempt, LastError: o.Reason}
	if o.MaxAttempts > 0 && r.task.Attempt >= o.MaxAttempts {
		r.task.State, r.died = storage.StateDead, now
		mv.State, mv.DeadTime = storage.StateDead, time.UnixMilli(now)
		return mv
	}
	r.task.State, r.due = storage.StateScheduled, now+delayFor(o, r.task.Attempt, k, seed)
	mv.State, mv.DueTime = storage.StateScheduled, time.UnixMilli(r.due)
	return mv
}

// delayFor is the retry delay after failed attempt n (delay_for in lib.lua).
func delayFor(o storage.NackOptions, n int32, k int, seed float64) int64 {
	if o.RetryAfter != nil {
		return max(o.RetryAfter.Milliseconds(), 0)
	}
	n = max(n, 1)
	b := o.Backoff
	d := float64(b.Initial.Milliseconds()) * math.Pow(b.Multiplier, float64(n-1))
	d = min(d, float64(b.Max.Milliseconds()))
	u := math.Mod(seed+float64(k)*0.6180339887498949, 1)
	return int64(math.Floor(d - d*b.Jitter*u))
}

// Nack puts the deliveries back per opts.
func (s *Store) Nack(_ context.Context, ns string, tokens []storage.Token, o storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	first, hasFirst := head(s.nss[ns])
	seed := rand.Float64()
	out := make([]storage.TokenStatus, len(tokens))
	var moved []storage.Moved
	wake := false
	for i, tok := range tokens {
		r, st := s.check(ns, tok)
		out[i] = st
		if st != storage.TokenOK {
			continue
		}
		if o.Unsent && r.task.Attempt > 0 {
			r.task.Attempt--
		}
		mv := settle(r, now, o, i, seed)
		moved = append(moved, mv)
		if mv.State == storage.StateScheduled && (!hasFirst || r.due < first) {
			first, hasFirst, wake = r.due, true, true
		}
	}
	if wake {
		s.publish(ns)
	}
	return out, moved, nil
}

// Extend sets the leases of the deliveries to store-now + by; a lease is
// never shortened (ZADD GT in extend.lua).
func (s *Store) Extend(_ context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	deadline := now + by.Milliseconds()
	out := make([]storage.ExtendResult, len(tokens))
	for i, tok := range tokens {
		r, st := s.check(ns, tok)
		out[i].Status = st
		if st == storage.TokenOK {
			r.lease = max(r.lease, deadline)
			out[i].LeaseDeadline = time.UnixMilli(deadline)
		}
	}
	return out, nil
}

// Reap takes at most limit expired leases back.
func (s *Store) Reap(_ context.Context, ns string, limit int, o storage.NackOptions) ([]storage.Moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, _ := s.now()
	upto := now
	if !o.ExpiredBy.IsZero() {
		upto = min(upto, o.ExpiredBy.UnixMilli())
	}
	first, hasFirst := head(s.nss[ns])
	seed := rand.Float64()
	var moved []storage.Moved
	wake := false
	for k, r := range sorted(s.nss[ns], storage.StateDelivered) {
		if len(moved) == limit || r.lease > upto {
			break
		}
		mv := settle(r, now, o, k, seed)
		moved = append(moved, mv)
		if mv.State == storage.StateScheduled && (!hasFirst || r.due < first) {
			first, hasFirst, wake = r.due, true, true
		}
	}
	if wake {
		s.publish(ns)
	}
	return moved, nil
}

// NextWake returns the earliest due time or lease deadline and the store's now.
func (s *Store) NextWake(_ context.Context, ns string) (next, now time.Time, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms, _ := s.now()
	next, ok = s.nextWake(ns)
	return next, time.UnixMilli(ms), ok, nil
}

// ExpectPop does nothing: the fake settles every ack and nack at once.
func (s *Store) ExpectPop(string, time.Duration) {}

// nextWake is NextWake's answer with s.mu held.
func (s *Store) nextWake(ns string) (time.Time, bool) {
	var best int64
	ok := false
	for _, r := range s.nss[ns] {
		if r.task.State == storage.StateDead {
			continue
		}
		if sc := r.score(); !ok || sc < best {
			best, ok = sc, true
		}
	}
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(best), true
}
