package client

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// Lease extension timing, as fractions of the lease length L: a lease is
// extended when a third of it is left, together with every other lease that
// would need it within the next tenth; a failed extension is retried after
// a tenth (at least minRetry).
const (
	extendAtFraction = 2.0 / 3
	batchSlack       = 0.1
	minRetry         = 50 * time.Millisecond
)

// leaser extends the leases of running handlers before they end. Deadlines
// are tracked on the local clock: the lease length is taken from delayd's
// own clock (lease deadline minus the delivery's update time) and counted
// from when the delivery arrived, so a skewed local clock does not matter.
type leaser struct {
	line     *verdictLine
	extendBy time.Duration
	logger   *slog.Logger

	mu     sync.Mutex
	leases map[string]*lease
	kick   chan struct{}
}

type lease struct {
	id     string
	length time.Duration // L: how long the current lease (or extension) lasts
	next   time.Time     // when to extend it (or retry)
	cancel context.CancelCauseFunc
}

func newLeaser(line *verdictLine, extendBy time.Duration, logger *slog.Logger) *leaser {
	return &leaser{line: line, extendBy: extendBy, logger: logger, leases: map[string]*lease{}, kick: make(chan struct{}, 1)}
}

// add starts watching the lease of d, which arrived at recv. cancel is the
// handler's context cancel, called with ErrLeaseLost if delayd says the
// delivery is no longer this consumer's.
func (l *leaser) add(d *Delivery, recv time.Time, cancel context.CancelCauseFunc) {
	length := leaseLength(d, recv)
	ls := &lease{id: d.ID, length: length, cancel: cancel}
	ls.next = recv.Add(time.Duration(float64(length) * extendAtFraction))
	l.mu.Lock()
	l.leases[d.Token] = ls
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// leaseLength is how long d's lease lasts, by delayd's clock when it can
// tell, else by the local one.
func leaseLength(d *Delivery, recv time.Time) time.Duration {
	if !d.UpdateTime.IsZero() && !d.LeaseDeadline.IsZero() {
		if l := d.LeaseDeadline.Sub(d.UpdateTime); l > 0 && l <= 12*time.Hour {
			return l
		}
	}
	if l := d.LeaseDeadline.Sub(recv); l > 0 {
		return l
	}
	return time.Second
}

// remove stops watching a lease (the handler returned).
func (l *leaser) remove(token string) {
	l.mu.Lock()
	delete(l.leases, token)
	l.mu.Unlock()
}

// run extends leases until ctx is done.
func (l *leaser) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		var first time.Time
		for _, ls := range l.leases {
			if first.IsZero() || ls.next.Before(first) {
				first = ls.next
			}
		}
		l.mu.Unlock()
		if first.IsZero() {
			timer.Reset(time.Hour)
		} else {
			timer.Reset(max(time.Until(first), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
			continue
		case <-timer.C:
		}
		l.extendDue(ctx)
	}
}

// extendDue extends every lease whose time has come, in calls of up to
// MaxBatch tokens.
func (l *leaser) extendDue(ctx context.Context) {
	now := time.Now()
	var toks []string
	l.mu.Lock()
	for tok, ls := range l.leases {
		if !ls.next.After(now.Add(time.Duration(float64(ls.length) * batchSlack))) {
			toks = append(toks, tok)
		}
	}
	l.mu.Unlock()
	for start := 0; start < len(toks); start += MaxBatch {
		l.extend(ctx, toks[start:min(start+MaxBatch, len(toks))])
	}
}

func (l *leaser) extend(ctx context.Context, toks []string) {
	var extendBy *durationpb.Duration
	if l.extendBy > 0 {
		extendBy = durationpb.New(l.extendBy)
	}
	sent := time.Now()
	results, err := l.line.extend(ctx, toks, extendBy)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || len(results) != len(toks) {
		if ctx.Err() == nil {
			l.logger.Warn("delayd consumer: lease extension failed; retrying", "tasks", len(toks), "error", err)
		}
		for _, tok := range toks {
			if ls, ok := l.leases[tok]; ok {
				ls.next = time.Now().Add(max(time.Duration(float64(ls.length)*batchSlack), minRetry))
			}
		}
		return
	}
	for i, r := range results {
		ls, ok := l.leases[toks[i]]
		if !ok {
			continue // the handler returned meanwhile
		}
		switch r.GetStatus() {
		case delaydv1.TokenStatus_TOKEN_STATUS_OK:
			by := ls.length
			if l.extendBy > 0 {
				by = l.extendBy
			}
			ls.length = by
			ls.next = sent.Add(time.Duration(float64(by) * extendAtFraction))
		default:
			// STALE or NOT_FOUND: the task was upserted, removed or
			// redelivered; this handler's work no longer counts.
			l.logger.Info("delayd consumer: lease lost; cancelling the handler", "id", ls.id, "status", r.GetStatus().String())
			delete(l.leases, toks[i])
			ls.cancel(ErrLeaseLost)
		}
	}
}
