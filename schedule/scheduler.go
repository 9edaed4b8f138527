// Package schedule owns schedules, delayd's recurring tasks: the rules as
// pure functions (rule.go: cron with its daylight-saving rules, rates;
// plan.go: which slots a step fires or skips, catch-up, overlap, jitter,
// bounds), the loop that fires the slots on every replica (loop.go) and
// the operations ScheduleService runs (this file).
//
// A slot becomes an ordinary task of the namespace (a firing) whose id is
// made of the schedule's id and the slot (storage.FiringID). The stores
// apply a step atomically (storage.Schedules.UpdateSchedule with Fire):
// the schedule's cursor moves past the slots in the same script or
// transaction that creates their firings create-only, so a slot fires
// exactly once however many replicas step the schedule at once; the
// replicas that lose the race change nothing. Every "now" a decision uses
// is the store's clock (DueSchedules.Now, a write's update time); the
// configured storage.Clock only paces the loop.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// Defaults of Config.
const (
	// DefaultLookahead is how long before its slot a firing is created.
	DefaultLookahead = 10 * time.Second
	// DefaultGrace is how late a slot may be decided and still be on time.
	DefaultGrace = 10 * time.Second
	// DefaultPoll is the longest the loop sleeps between two looks.
	DefaultPoll = time.Second
	// DefaultWorkers is how many schedules the loop steps at once.
	DefaultWorkers = 8
	// DefaultBatch is the most schedules of one namespace one look takes.
	DefaultBatch = 1000
	// unfireMargin: a firing due within it is left to fire rather than
	// removed by a pause, an update or a delete (it may be popped already).
	unfireMargin = time.Second
	// failBackoff is how long a replica leaves a schedule whose step
	// failed before trying it again.
	failBackoff = 10 * time.Second
	// maxUpdateTries bounds an operation's compare-and-set loop.
	maxUpdateTries = 16
)

// Tasks is what the scheduler asks of the task store: the previous
// firing's state (overlap) and the removal of firings not due yet (pause,
// update, delete). Pass the store the server uses (history-recording).
type Tasks interface {
	Get(ctx context.Context, ns, id string) (storage.Task, error)
	Remove(ctx context.Context, ns, id string, ifVersion storage.Version) (storage.State, error)
	// NextWake answers the store's clock (its second value): the "now"
	// the removal of firings not due yet is measured against.
	NextWake(ctx context.Context, ns string) (next time.Time, now time.Time, ok bool, err error)
}

// Namespaces answers a namespace with its effective policy (shards, max
// schedules, history); *tenancy.Registry.
type Namespaces interface {
	Namespace(ctx context.Context, ns string, create bool) (storage.Namespace, error)
}

// Metrics counts what the loop does; *metrics.Metrics implements it. May
// be nil.
type Metrics interface {
	// ScheduleStep reports one step applied: firings created (missed ones
	// among them: catch-ups) and slots skipped.
	ScheduleStep(ns string, fired, missed, skipped int)
	// ScheduleLost reports a step another replica applied first.
	ScheduleLost(ns string)
}

// Config is what New needs.
type Config struct {
	// Schedules stores the schedules and applies steps. Required.
	Schedules storage.Schedules
	// Tasks reads and removes firings. Required.
	Tasks Tasks
	// Namespaces gives each namespace's policy. Required.
	Namespaces Namespaces
	// History keeps the firings' upserted events (naming schedule and
	// slot) for namespaces that keep history. Required.
	History storage.History
	// Clock paces the loop (sleeps); decisions use the store's clock. If
	// nil, storage.SystemClock.
	Clock storage.Clock
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
	// Metrics; may be nil.
	Metrics Metrics
	// Lookahead is how long before its slot a firing is created (overlap
	// ALLOW). If zero, DefaultLookahead.
	Lookahead time.Duration
	// Grace is how late a slot may be decided and still fire as on time.
	// If zero, DefaultGrace.
	Grace time.Duration
	// Poll is the longest the loop sleeps. If zero, DefaultPoll.
	Poll time.Duration
	// Workers is how many schedules the loop steps at once. If zero,
	// DefaultWorkers.
	Workers int
	// Batch is the most due schedules of one namespace one look takes. If
	// zero, DefaultBatch.
	Batch int
}

// Scheduler runs the schedule loop and the ScheduleService operations.
// Build it with New, Start it once, Stop it once. Its methods are safe for
// concurrent use.
type Scheduler struct {
	cfg  Config
	log  *slog.Logger
	poke chan struct{}

	mu      sync.Mutex
	failing map[string]time.Time // ns/id -> when this replica tries it again
	cancel  context.CancelFunc
	done    chan struct{}
	hooks   hooks
	lead    lead
}

// New returns a Scheduler; it does nothing until Start.
func New(cfg Config) (*Scheduler, error) {
	switch {
	case cfg.Schedules == nil:
		return nil, errors.New("schedule: Config.Schedules is required")
	case cfg.Tasks == nil:
		return nil, errors.New("schedule: Config.Tasks is required")
	case cfg.Namespaces == nil:
		return nil, errors.New("schedule: Config.Namespaces is required")
	case cfg.History == nil:
		return nil, errors.New("schedule: Config.History is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = storage.SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Lookahead <= 0 {
		cfg.Lookahead = DefaultLookahead
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	return &Scheduler{cfg: cfg, log: cfg.Logger, poke: make(chan struct{}, 1), failing: map[string]time.Time{},
		lead: lead{base: cfg.Lookahead}}, nil
}

// options are the plan options for a namespace of shards shards: the
// lookahead widened while steps come late (lead.go).
func (s *Scheduler) options(shards int) Options {
	return Options{Lookahead: s.lead.lookahead(s.cfg.Clock.Now()), Grace: s.cfg.Grace, Shards: max(shards, 1)}
}

// Poke makes the loop look at once (a schedule was created, resumed or
// changed on this replica). It never blocks.
func (s *Scheduler) Poke() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// ErrLostRace is what step answers when another replica (or an operation)
// changed the schedule since it was read: nothing was written.
var ErrLostRace = errors.New("schedule changed since it was read")

// step decides the schedule's slots up to now (the store's clock) and
// applies the decision with its firings in one store call; it answers the
// schedule as stored after it. A schedule that needs no change is returned
// as it is, without a write.
func (s *Scheduler) step(ctx context.Context, sc storage.Schedule, now time.Time) (storage.Schedule, error) {
	r, err := RuleOf(sc)
	if err != nil {
		return sc, fmt.Errorf("schedule %s: %w", sc.Key(), err)
	}
	n, err := s.cfg.Namespaces.Namespace(ctx, sc.Namespace, false)
	if errors.Is(err, storage.ErrNotFound) {
		// The namespace was deleted after the schedule was read: its
		// schedules go with it.
		if err := s.cfg.Schedules.DeleteSchedule(ctx, sc.Namespace, sc.ID, sc.Version); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return sc, err
		}
		return sc, fmt.Errorf("schedule %s: namespace deleted: %w", sc.Key(), ErrLostRace)
	}
	if err != nil {
		return sc, err
	}
	if sc.Cursor.IsZero() {
		sc.Cursor = sc.CreateTime
	}
	prev := false
	if sc.Overlap == storage.OverlapSkip && sc.LastTaskID != "" {
		t, err := s.cfg.Tasks.Get(ctx, sc.Namespace, sc.LastTaskID)
		switch {
		case err == nil:
			prev = t.State == storage.StateScheduled || t.State == storage.StateDelivered
		case !errors.Is(err, storage.ErrNotFound):
			return sc, err
		}
	}
	st := Plan(sc, r, now, prev, s.options(n.Policy.Shards))
	if len(st.Fire) == 0 && sameState(sc, st.Next) {
		return sc, nil
	}
	specs := make([]storage.UpsertSpec, len(st.Fire))
	for i, f := range st.Fire {
		specs[i] = storage.UpsertSpec{ID: f.ID, Kind: sc.Template.Kind, Payload: sc.Template.Payload, DueTime: f.Due,
			CreateOnly: true, NamespaceIncarnation: n.CreateTime.UnixMilli()}
	}
	res, err := s.cfg.Schedules.UpdateSchedule(ctx, st.Next, storage.UpdateScheduleParams{IfVersion: sc.Version, Fire: specs})
	if errors.Is(err, storage.ErrGenerationMismatch) || errors.Is(err, storage.ErrNotFound) {
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.ScheduleLost(sc.Namespace)
		}
		return sc, fmt.Errorf("schedule %s: %w", sc.Key(), ErrLostRace)
	}
	if err != nil {
		return sc, err
	}
	s.recordFirings(ctx, n, sc.ID, st.Fire, res.Fired)
	if s.cfg.Metrics != nil {
		missed := 0
		for _, f := range st.Fire {
			if f.Missed {
				missed++
			}
		}
		s.cfg.Metrics.ScheduleStep(sc.Namespace, len(st.Fire), missed, int(st.Next.Skipped-sc.Skipped))
	}
	s.hooks.stepped(res.Schedule, st.Fire)
	return res.Schedule, nil
}

// sameState reports whether b moves nothing of a's state.
func sameState(a, b storage.Schedule) bool {
	return a.Cursor.Equal(b.Cursor) && a.Fired == b.Fired && a.Skipped == b.Skipped && a.NextSlot.Equal(b.NextSlot) &&
		a.Done == b.Done && a.Advance.Equal(b.Advance) && a.LastTaskID == b.LastTaskID
}

// recordFirings appends the upserted event of each firing created, naming
// the schedule and the slot, when the namespace keeps history. A failure
// is logged: the history is an account, not part of the firing.
func (s *Scheduler) recordFirings(ctx context.Context, n storage.Namespace, id string, fire []Firing, res []storage.UpsertResult) {
	keep := storage.HistoryKeep(n.Policy.HistoryRetentionBytes)
	if keep <= 0 {
		return
	}
	events := make([]storage.Event, 0, len(fire))
	for i, f := range fire {
		if i < len(res) && res[i].Created {
			events = append(events, storage.Event{Kind: storage.EventUpserted, ID: f.ID, Generation: res[i].Task.Generation,
				Due: f.Due, Schedule: id, Slot: f.Slot})
		}
	}
	if len(events) == 0 {
		return
	}
	p := storage.RecordParams{Incarnation: n.CreateTime.UnixMilli(), Keep: keep, Events: events}
	if err := s.cfg.History.RecordEvents(context.WithoutCancel(ctx), n.Name, p); err != nil {
		s.log.Warn("recording firings' history failed", "namespace", n.Name, "schedule", id, "err", err)
	}
}

// jitterStart is a random offset into a look's schedules, so replicas that
// look at once start their steps at different schedules.
func jitterStart(n int) int {
	if n <= 1 {
		return 0
	}
	return rand.IntN(n)
}
