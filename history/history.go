// Package history records what happens to the tasks of the namespaces
// whose policy keeps history (storage.Policy.HistoryRetentionBytes): Wrap
// decorates the task store the server and the dispatcher share, and after
// each call that changed a task it appends the events to the store's
// storage.History (a Redis stream per namespace, or MySQL in durable mode)
// in one write. A namespace that keeps no history costs a cached policy
// lookup per call and no store call.
//
// Recording happens after the store call returns, so a crash between the
// two loses that call's events (never a task), and a failed history write
// is logged and counted, never turned into a failed call: the history is
// an account of what happened, not part of it.
//
// Incarnations. Each life of a namespace (its create time) has a history
// of its own (storage.RecordParams.Incarnation): a call's events go to the
// incarnation the recorder looked the namespace up in before the store
// call, and the store drops them if a delete ended it meanwhile. So a
// namespace re-created under a deleted one's name never reads the old
// one's events, whenever the late ones are written; and Recent keeps the
// figures of one incarnation at a time.
//
// Order. A history's order is the store's (the Redis stream's ids, the
// MySQL rows' seq): the order the events were written, which readers keep.
// A call that changes a task takes its place in its namespace's order
// before its store call, and its events are written in that order (see
// sequencer): so any call that saw another's change — a GetTask showing
// the task dead, a delivery of a task an upsert made due — is written
// after it. Store calls overlap freely, except that a pop and a call that
// makes tasks due (upsert, nack, reap, requeue) never overlap theirs: a
// pop that took its place first could otherwise deliver a task the other
// made due and be written before it. Within a
// replica that is the order things happened. Calls on different replicas
// are not ordered: a pop on another replica in the instant between a
// call's store write and its history write (a task due at once) can still
// be written first.
//
// Time. The recorder leaves events' times to the store, which stamps them
// when it writes them with its clock (the one due times use), so a
// history's times follow its order for the events one replica wrote. In
// durable mode each replica stamps with its estimate of the index's
// clock, and estimates of two replicas can differ by a few ms: the order,
// not the times, says which came first.
package history

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/storage"
)

// Policies answers a namespace with its effective policy
// (*tenancy.Registry's Namespace, a cache read); history asks without
// create, so it never creates a namespace.
type Policies interface {
	Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error)
}

// Config is what Wrap needs.
type Config struct {
	// Policies tells which namespaces keep history, and how much. Required.
	Policies Policies
	// Sink keeps the events. Required.
	Sink storage.History
	// Replica names this replica in delivered events (the host name).
	Replica string
	// Logger receives failed history writes. If nil, slog.Default().
	Logger *slog.Logger
	// Recent, if set, is fed every namespace's deliveries (their lateness),
	// history kept or not: GetNamespaceStats' recent rate and percentiles.
	Recent *Recent
}

// Recorder is the decorated store; Failures counts history writes that
// failed (logged, never failing the call).
type Recorder struct {
	next     storage.Store
	cfg      Config
	failures atomic.Int64
	order    sync.Map // namespace -> *sequencer (see Order above)
}

// Wrap returns next recording the events of every call that changed a
// task of a namespace that keeps history.
func Wrap(next storage.Store, cfg Config) *Recorder {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Recorder{next: next, cfg: cfg}
}

// Failures is how many history writes failed since Wrap.
func (r *Recorder) Failures() int64 { return r.failures.Load() }

// life is what a call records for: how many events its namespace keeps
// (0 = none, or its policy is unknown) and the namespace incarnation (its
// create time, ms) the events belong to, both as the namespace was looked
// up before the store call. A call that ran against an incarnation that a
// delete ended meanwhile has its events dropped with it (storage.History),
// never seen by a namespace re-created under the name.
type life struct {
	keep, inc int64
}

// lookup is ns's life for a call about to be made.
func (r *Recorder) lookup(ctx context.Context, ns string) life {
	n, err := r.cfg.Policies.Namespace(ctx, ns, false)
	if err != nil {
		return life{}
	}
	return life{keep: storage.HistoryKeep(n.Policy.HistoryRetentionBytes), inc: n.Incarnation()}
}

// write keeps events of ns (recordInOrder calls it in order).
func (r *Recorder) write(ctx context.Context, ns string, l life, events []storage.Event) {
	p := storage.RecordParams{Incarnation: l.inc, Keep: l.keep, Events: events}
	if err := r.cfg.Sink.RecordEvents(context.WithoutCancel(ctx), ns, p); err != nil {
		r.failures.Add(1)
		r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "recording task history failed", slog.String("namespace", ns),
			slog.Int("events", len(events)), slog.String("err", err.Error()))
	}
}

// Upsert records an upserted (created) or rescheduled (replaced) event per
// applied spec.
func (r *Recorder) Upsert(ctx context.Context, ns string, specs []storage.UpsertSpec) ([]storage.UpsertResult, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderMakesDue)(&events)
	res, err := r.next.Upsert(ctx, ns, specs)
	if l.keep > 0 && err == nil {
		key := storage.KeyIDOf(ctx)
		events = make([]storage.Event, 0, len(res))
		for _, x := range res {
			if x.Stale || x.Refused != storage.NotRefused {
				continue
			}
			kind := storage.EventRescheduled
			if x.Created {
				kind = storage.EventUpserted
			}
			events = append(events, storage.Event{Kind: kind, ID: x.Task.ID, KeyID: key, Generation: x.Task.Generation, Due: x.Task.DueTime})
		}
	}
	return res, err
}

// Remove records a removed event when it removed the task.
func (r *Recorder) Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderOther)(&events)
	st, err := r.next.Remove(ctx, ns, id, ifVersion)
	if l.keep > 0 && err == nil {
		events = []storage.Event{{Kind: storage.EventRemoved, ID: id, KeyID: storage.KeyIDOf(ctx)}}
	}
	return st, err
}

// RemoveTasks records a removed event per id the store says it removed
// (RemoveTasksResult.States; a filter walk's removals are not named and
// are not recorded).
func (r *Recorder) RemoveTasks(ctx context.Context, ns string, p storage.RemoveTasksParams) (storage.RemoveTasksResult, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderOther)(&events)
	res, err := r.next.RemoveTasks(ctx, ns, p)
	if l.keep > 0 && res.Removed > 0 && len(res.States) == len(p.IDs) {
		key := storage.KeyIDOf(ctx)
		events = make([]storage.Event, 0, res.Removed)
		for i, id := range p.IDs {
			if res.States[i] != storage.StateUnspecified {
				events = append(events, storage.Event{Kind: storage.EventRemoved, ID: id, KeyID: key})
			}
		}
	}
	return res, err
}

// Get passes through.
func (r *Recorder) Get(ctx context.Context, ns, id string) (storage.Task, error) {
	return r.next.Get(ctx, ns, id)
}

// List passes through.
func (r *Recorder) List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error) {
	return r.next.List(ctx, ns, p)
}

// Pop records a delivered event per delivery: its attempt, this replica,
// and its lateness (the pop's store time, Task.UpdateTime, minus
// storage.LateFrom). Its time, like every event's, is the store's when it
// writes the event (before the delivery is handed out), so all of a
// history's times come from one clock.
func (r *Recorder) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	res, err := r.PopWake(ctx, ns, p)
	return res.Deliveries, err
}

// PopWake is Pop that also answers the next wake (the dispatcher's call).
func (r *Recorder) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderPop)(&events)
	res, err := r.next.PopWake(ctx, ns, p)
	ds := res.Deliveries
	if r.cfg.Recent != nil && len(ds) > 0 {
		late := make([]time.Duration, len(ds))
		for i, d := range ds {
			late[i] = lateness(d.Task)
		}
		r.cfg.Recent.observe(ns, l.inc, late)
	}
	if l.keep > 0 && len(ds) > 0 {
		events = make([]storage.Event, len(ds))
		for i, d := range ds {
			t := d.Task
			events[i] = storage.Event{Kind: storage.EventDelivered, ID: t.ID, Generation: t.Generation,
				Attempt: t.Attempt, Replica: r.cfg.Replica, Lateness: lateness(t).Truncate(time.Millisecond)}
		}
	}
	return res, err
}

// lateness is how late a popped task t was delivered: from
// storage.LateFrom (its due time, or its creation when it was created
// already due) to the pop (its UpdateTime after the pop).
func lateness(t storage.Task) time.Duration {
	return max(0, t.UpdateTime.Sub(storage.LateFrom(t)))
}

// Ack records an acked event per settled token.
func (r *Recorder) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderOther)(&events)
	sts, err := r.next.Ack(ctx, ns, tokens)
	if l.keep > 0 && err == nil {
		key := storage.KeyIDOf(ctx)
		for i, st := range sts {
			if st == storage.TokenOK && i < len(tokens) {
				t := tokens[i]
				events = append(events, storage.Event{Kind: storage.EventAcked, ID: t.ID, KeyID: key, Generation: t.Generation, Attempt: t.Attempt})
			}
		}
	}
	return sts, err
}

// Nack records a nacked event per task it moved (and dead-lettered for
// those that used up their attempts). A hand-back of deliveries never sent
// (opts.Unsent) is not an event: the pop's attempt is given back.
func (r *Recorder) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderMakesDue)(&events)
	sts, moved, err := r.next.Nack(ctx, ns, tokens, opts)
	if l.keep > 0 && err == nil && !opts.Unsent {
		key := storage.KeyIDOf(ctx)
		var after time.Duration
		if opts.RetryAfter != nil {
			after = *opts.RetryAfter
		}
		events = make([]storage.Event, 0, len(moved))
		for _, m := range moved {
			events = append(events, storage.Event{Kind: storage.EventNacked, ID: m.ID, KeyID: key, Generation: m.Generation,
				Attempt: m.Attempt, Reason: opts.Reason, RetryAfter: after, Due: scheduledDue(m)})
			if m.State == storage.StateDead {
				events = append(events, storage.Event{Kind: storage.EventDeadLettered, ID: m.ID, Generation: m.Generation, Attempt: m.Attempt, Reason: opts.Reason})
			}
		}
	}
	return sts, moved, err
}

// scheduledDue is the retry's due time of a moved task that went back to
// scheduled; zero for one that died.
func scheduledDue(m storage.Moved) time.Time {
	if m.State == storage.StateScheduled {
		return m.DueTime
	}
	return time.Time{}
}

// Extend passes through (a lease extension is not an event).
func (r *Recorder) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	return r.next.Extend(ctx, ns, tokens, by)
}

// Reap records a lease-expired event per task taken back (and
// dead-lettered for those that used up their attempts).
func (r *Recorder) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderMakesDue)(&events)
	moved, err := r.next.Reap(ctx, ns, limit, opts)
	if l.keep > 0 && len(moved) > 0 {
		events = make([]storage.Event, 0, len(moved))
		for _, m := range moved {
			events = append(events, storage.Event{Kind: storage.EventLeaseExpired, ID: m.ID, Generation: m.Generation, Attempt: m.Attempt, Due: scheduledDue(m)})
			if m.State == storage.StateDead {
				events = append(events, storage.Event{Kind: storage.EventDeadLettered, ID: m.ID, Generation: m.Generation, Attempt: m.Attempt, Reason: "lease expired"})
			}
		}
	}
	return moved, err
}

// NextWake passes through.
func (r *Recorder) NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error) {
	return r.next.NextWake(ctx, ns)
}

// ExpectPop passes through.
func (r *Recorder) ExpectPop(ns string, within time.Duration) {
	r.next.ExpectPop(ns, within)
}

// Requeue records a requeued event per task it moved back.
func (r *Recorder) Requeue(ctx context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderMakesDue)(&events)
	moved, err := r.next.Requeue(ctx, ns, p)
	if l.keep > 0 && err == nil {
		key := storage.KeyIDOf(ctx)
		events = make([]storage.Event, len(moved))
		for i, m := range moved {
			events[i] = storage.Event{Kind: storage.EventRequeued, ID: m.ID, KeyID: key, Generation: m.Generation, Due: m.DueTime}
		}
	}
	return moved, err
}

// Purge records a removed event (reason "purged") per dead task deleted.
func (r *Recorder) Purge(ctx context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	l := r.lookup(ctx, ns)
	var events []storage.Event
	defer r.recordInOrder(ctx, ns, l, orderOther)(&events)
	ids, err := r.next.Purge(ctx, ns, p)
	if l.keep > 0 && err == nil {
		key := storage.KeyIDOf(ctx)
		events = make([]storage.Event, len(ids))
		for i, id := range ids {
			events[i] = storage.Event{Kind: storage.EventRemoved, ID: id, KeyID: key, Reason: "purged"}
		}
	}
	return ids, err
}

// Stats passes through.
func (r *Recorder) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	return r.next.Stats(ctx, ns)
}

// DueKinds passes through.
func (r *Recorder) DueKinds(ctx context.Context, ns string) (storage.DueKinds, error) {
	return r.next.DueKinds(ctx, ns)
}

// DropNamespace passes through.
func (r *Recorder) DropNamespace(ctx context.Context, ns string, incarnation int64) (int64, error) {
	return r.next.DropNamespace(ctx, ns, incarnation)
}
