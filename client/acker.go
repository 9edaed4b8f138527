package client

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// verdict is a handler's outcome for one delivery.
type verdict struct {
	token, id     string
	nack          bool
	retryAfter    time.Duration
	hasRetryAfter bool
	reason        string
}

// nackKey groups nacks that can share one NackTasks call.
type nackKey struct {
	retryAfter    time.Duration
	hasRetryAfter bool
	reason        string
}

// acker batches verdicts: acks into batches of up to size tokens, and nacks
// with the same retry delay and reason into one batch each, sent on the
// consumer's StreamDeliveries stream (or AckTasks / NackTasks calls when it
// has none: verdictLine). A batch
// is sent when it is full or when its oldest verdict has waited interval.
// One goroutine (run) owns the batches; add blocks while a send is in
// progress and the input is full, which is the backpressure on handlers.
type acker struct {
	line     *verdictLine
	size     int
	interval time.Duration
	logger   *slog.Logger
	in       chan verdict
}

func newAcker(line *verdictLine, size int, interval time.Duration, logger *slog.Logger) *acker {
	return &acker{line: line, size: size, interval: interval, logger: logger, in: make(chan verdict, size)}
}

// add queues a verdict. It must not be called after close.
func (a *acker) add(v verdict) { a.in <- v }

// close makes run flush what it holds and return.
func (a *acker) close() { close(a.in) }

// run sends batches until close; ctx is for the calls (each also has the
// Client's timeout).
func (a *acker) run(ctx context.Context) {
	var (
		acks    []verdict
		nacks   = map[nackKey][]verdict{}
		pending int
		timer   = time.NewTimer(time.Hour)
		armed   bool
	)
	timer.Stop()
	defer timer.Stop()
	flush := func() {
		if len(acks) > 0 {
			a.ack(ctx, acks)
			acks = nil
		}
		for k, vs := range nacks {
			a.nack(ctx, k, vs)
			delete(nacks, k)
		}
		pending = 0
		if armed {
			timer.Stop()
			armed = false
		}
	}
	for {
		select {
		case v, ok := <-a.in:
			if !ok {
				flush()
				return
			}
			if v.nack {
				k := nackKey{v.retryAfter, v.hasRetryAfter, v.reason}
				nacks[k] = append(nacks[k], v)
			} else {
				acks = append(acks, v)
			}
			pending++
			if pending >= a.size {
				flush()
			} else if !armed {
				timer.Reset(a.interval)
				armed = true
			}
		case <-timer.C:
			armed = false
			flush()
		}
	}
}

func (a *acker) ack(ctx context.Context, vs []verdict) {
	results, err := a.line.ack(ctx, tokens(vs))
	if err != nil {
		a.logger.Warn("delayd consumer: ack failed; the tasks will be delivered again when their leases end",
			"tasks", len(vs), "error", err)
		return
	}
	a.report("ack", vs, results)
}

func (a *acker) nack(ctx context.Context, k nackKey, vs []verdict) {
	var retryAfter *durationpb.Duration
	if k.hasRetryAfter {
		retryAfter = durationpb.New(k.retryAfter)
	}
	results, err := a.line.nack(ctx, tokens(vs), retryAfter, k.reason)
	if err != nil {
		a.logger.Warn("delayd consumer: nack failed; the tasks will be delivered again when their leases end",
			"tasks", len(vs), "error", err)
		return
	}
	a.report("nack", vs, results)
}

// report logs the tokens delayd did not apply. STALE and NOT_FOUND are not
// failures of this consumer: the task was upserted, removed or redelivered
// since it was delivered here.
func (a *acker) report(op string, vs []verdict, results []*delaydv1.TokenResult) {
	for i, r := range results {
		if i >= len(vs) || r.GetStatus() == delaydv1.TokenStatus_TOKEN_STATUS_OK {
			continue
		}
		a.logger.Info("delayd consumer: "+op+" not applied", "id", vs[i].id, "status", r.GetStatus().String())
	}
}

func tokens(vs []verdict) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.token
	}
	return out
}
