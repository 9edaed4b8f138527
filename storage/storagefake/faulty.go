package storagefake

import (
	"context"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// Op names a Deliveries call that Faulty can make fail or hang.
type Op string

// The Deliveries calls.
const (
	OpPop      Op = "pop"
	OpAck      Op = "ack"
	OpNack     Op = "nack"
	OpExtend   Op = "extend"
	OpReap     Op = "reap"
	OpNextWake Op = "next wake"
)

// Faulty wraps a storage.Deliveries (the fake, or a real store) and lets a
// test decide, per call, whether it fails, hangs until its context ends, or
// goes through, and counts the calls. The zero Fault lets everything
// through. Safe for concurrent use.
type Faulty struct {
	storage.Deliveries

	mu     sync.Mutex
	fault  func(op Op, ns string) Fault
	counts map[Op]int
}

// Fault is what one call does instead of (or before) reaching the store.
type Fault struct {
	// Err, if set, is returned without calling the store.
	Err error
	// Hang blocks the call until its context ends (then ctx.Err() wrapped
	// in storage.ErrUnavailable is returned), as a paused Redis would.
	Hang bool
	// Delay is slept before the call goes through (or fails with Err).
	Delay time.Duration
	// Skip answers the call as if there were nothing to do, without
	// reaching the store: Pop and Reap move nothing (another replica took
	// the tasks first), Ack, Nack and Extend answer NotFound for every token.
	// NextWake is never skipped.
	Skip bool
	// Lose lets a Pop or PopWake reach the store, then loses its answer:
	// the call returns storage.ErrUnavailable, as a store timeout after the
	// store did the work (a stalled Redis that runs the call late) does.
	// The other calls ignore it.
	Lose bool
}

// NewFaulty wraps d; every call goes through until SetFault says otherwise.
func NewFaulty(d storage.Deliveries) *Faulty {
	return &Faulty{Deliveries: d, counts: map[Op]int{}}
}

// SetFault installs f, consulted before every call (nil: no faults).
func (f *Faulty) SetFault(fn func(op Op, ns string) Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fault = fn
}

// Calls returns how many times op was called (faulted calls included).
func (f *Faulty) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[op]
}

// enter counts the call and applies its fault; a non-nil error ends it,
// skip says the call is to answer "nothing to do", and lose that its
// answer is to be lost (Fault.Lose).
func (f *Faulty) enter(ctx context.Context, op Op, ns string) (skip, lose bool, err error) {
	f.mu.Lock()
	f.counts[op]++
	fn := f.fault
	f.mu.Unlock()
	if fn == nil {
		return false, false, nil
	}
	ft := fn(op, ns)
	skip = ft.Skip && op != OpNextWake
	if ft.Delay > 0 {
		t := time.NewTimer(ft.Delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, false, unavailable(ctx)
		case <-t.C:
		}
	}
	if ft.Hang {
		<-ctx.Done()
		return false, false, unavailable(ctx)
	}
	return skip, ft.Lose && op == OpPop, ft.Err
}

func notFound(n int) []storage.TokenStatus {
	out := make([]storage.TokenStatus, n)
	for i := range out {
		out[i] = storage.TokenNotFound
	}
	return out
}

type unavailableErr struct{ cause error }

func (e unavailableErr) Error() string { return "fake store: " + e.cause.Error() }
func (e unavailableErr) Unwrap() []error {
	return []error{storage.ErrUnavailable, e.cause}
}

func unavailable(ctx context.Context) error { return unavailableErr{ctx.Err()} }

// lostAnswer is the error of a call whose answer Fault.Lose lost.
type lostAnswer struct{}

func (lostAnswer) Error() string { return "fake store: the answer was lost" }
func (lostAnswer) Unwrap() error { return storage.ErrUnavailable }

// Pop fails or hangs as told, else pops.
func (f *Faulty) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	skip, lose, err := f.enter(ctx, OpPop, ns)
	if err != nil || skip {
		return nil, err
	}
	if lose {
		_, _ = f.Deliveries.Pop(ctx, ns, p)
		return nil, lostAnswer{}
	}
	return f.Deliveries.Pop(ctx, ns, p)
}

// PopWake fails or hangs as told (as Pop: OpPop), else pops.
func (f *Faulty) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	skip, lose, err := f.enter(ctx, OpPop, ns)
	if err != nil {
		return storage.PopResult{}, err
	} else if skip {
		next, now, ok, err := f.Deliveries.NextWake(ctx, ns)
		return storage.PopResult{Now: now, Next: next, HasNext: ok}, err
	}
	if lose {
		_, _ = f.Deliveries.PopWake(ctx, ns, p)
		return storage.PopResult{}, lostAnswer{}
	}
	return f.Deliveries.PopWake(ctx, ns, p)
}

// Ack fails or hangs as told, else acks.
func (f *Faulty) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	if skip, _, err := f.enter(ctx, OpAck, ns); err != nil {
		return nil, err
	} else if skip {
		return notFound(len(tokens)), nil
	}
	return f.Deliveries.Ack(ctx, ns, tokens)
}

// Nack fails or hangs as told, else nacks.
func (f *Faulty) Nack(ctx context.Context, ns string, tokens []storage.Token, o storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	if skip, _, err := f.enter(ctx, OpNack, ns); err != nil {
		return nil, nil, err
	} else if skip {
		return notFound(len(tokens)), nil, nil
	}
	return f.Deliveries.Nack(ctx, ns, tokens, o)
}

// Extend fails or hangs as told, else extends.
func (f *Faulty) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	if skip, _, err := f.enter(ctx, OpExtend, ns); err != nil {
		return nil, err
	} else if skip {
		out := make([]storage.ExtendResult, len(tokens))
		for i := range out {
			out[i].Status = storage.TokenNotFound
		}
		return out, nil
	}
	return f.Deliveries.Extend(ctx, ns, tokens, by)
}

// Reap fails or hangs as told, else reaps.
func (f *Faulty) Reap(ctx context.Context, ns string, limit int, o storage.NackOptions) ([]storage.Moved, error) {
	if skip, _, err := f.enter(ctx, OpReap, ns); err != nil || skip {
		return nil, err
	}
	return f.Deliveries.Reap(ctx, ns, limit, o)
}

// NextWake fails or hangs as told, else answers.
func (f *Faulty) NextWake(ctx context.Context, ns string) (next, now time.Time, ok bool, err error) {
	if _, _, err := f.enter(ctx, OpNextWake, ns); err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	return f.Deliveries.NextWake(ctx, ns)
}
