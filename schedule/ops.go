package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
)

// The operations ScheduleService runs. Each writes with compare-and-set on
// the schedule's version and, when the loop (on any replica) stepped the
// schedule meanwhile, reads it again and goes on from what it finds.
//
// Pause, a change of the definition and delete first remove the firings
// created ahead of their slots (within the lookahead) that are not due
// yet, by the store's clock with a second to spare, and move the cursor
// back before the earliest removed one: a pause then treats those slots as
// missed (catch-up decides them on resume), an update decides them again
// under the new definition. A firing due within the second is left to
// fire: it may be in a subscriber's hands already.

// QuotaError is a create refused by the namespace's max_schedules.
type QuotaError struct {
	Namespace string
	Max       int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("namespace %q has %d schedules, the most its policy allows (max_schedules); delete one or raise the quota", e.Namespace, e.Max)
}

// Unwrap makes a QuotaError a storage.ErrQuotaExceeded.
func (e *QuotaError) Unwrap() error { return storage.ErrQuotaExceeded }

// VersionError is a write whose if_version is not the stored version.
type VersionError struct {
	ID               string
	Stored, Expected int64
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("schedule %q is at version %d, not %d (if_version); nothing changed: read it again and decide", e.ID, e.Stored, e.Expected)
}

// Unwrap makes a VersionError a storage.ErrGenerationMismatch.
func (e *VersionError) Unwrap() error { return storage.ErrGenerationMismatch }

// Create validates sc's definition, stores it (its state starts at the
// store's clock: earlier slots never fire) and decides its first slots at
// once. The namespace is created when auto-create is on. Errors:
// *FieldError, *QuotaError, storage.ErrAlreadyExists, store errors.
func (s *Scheduler) Create(ctx context.Context, sc storage.Schedule, paused bool) (storage.Schedule, error) {
	n, err := s.cfg.Namespaces.Namespace(ctx, sc.Namespace, true)
	if err != nil {
		return storage.Schedule{}, err
	}
	if _, err := Validate(sc, s.cfg.Clock.Now()); err != nil {
		return storage.Schedule{}, err
	}
	if lim := n.Policy.MaxPayloadBytes; lim > 0 && len(sc.Template.Payload) > lim {
		return storage.Schedule{}, invalid("task.payload", "is %d bytes; at most %d bytes are allowed in this namespace", len(sc.Template.Payload), lim)
	}
	count, err := s.cfg.Schedules.CountSchedules(ctx, sc.Namespace)
	if err != nil {
		return storage.Schedule{}, err
	}
	if most := n.Policy.MaxSchedules; most > 0 && count >= int64(most) {
		if _, err := s.cfg.Schedules.GetSchedule(ctx, sc.Namespace, sc.ID); err == nil {
			return storage.Schedule{}, fmt.Errorf("create schedule %q: %w", sc.ID, storage.ErrAlreadyExists)
		}
		return storage.Schedule{}, &QuotaError{Namespace: sc.Namespace, Max: most}
	}
	state := storage.Schedule{Namespace: sc.Namespace, ID: sc.ID, Description: sc.Description, Cron: sc.Cron, Every: sc.Every,
		TimeZone: sc.TimeZone, Start: sc.Start, End: sc.End, MaxFirings: sc.MaxFirings, CatchUp: sc.CatchUp,
		CatchUpWindow: sc.CatchUpWindow, Overlap: sc.Overlap, Jitter: sc.Jitter, Template: sc.Template, Paused: paused}
	if !paused {
		state.Advance = s.cfg.Clock.Now()
	}
	stored, err := s.cfg.Schedules.CreateSchedule(ctx, state)
	if err != nil {
		return storage.Schedule{}, err
	}
	return s.stepNow(ctx, stored, stored.CreateTime), nil
}

// stepNow steps a schedule just written (now: its write's store time) and
// pokes the loop; a failed step is left to the loop.
func (s *Scheduler) stepNow(ctx context.Context, sc storage.Schedule, now time.Time) storage.Schedule {
	defer s.Poke()
	if sc.Paused || sc.Done {
		return sc
	}
	next, err := s.step(ctx, sc, now)
	if err != nil {
		if !errors.Is(err, ErrLostRace) {
			s.log.Warn("first step of a schedule failed; the loop retries it", "namespace", sc.Namespace, "schedule", sc.ID, "err", err)
		}
		if got, gerr := s.cfg.Schedules.GetSchedule(ctx, sc.Namespace, sc.ID); gerr == nil {
			return got
		}
		return sc
	}
	return next
}

// Get returns a schedule.
func (s *Scheduler) Get(ctx context.Context, ns, id string) (storage.Schedule, error) {
	return s.cfg.Schedules.GetSchedule(ctx, ns, id)
}

// List returns one page of ns's schedules in id order.
func (s *Scheduler) List(ctx context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error) {
	return s.cfg.Schedules.ListSchedules(ctx, ns, after, limit)
}

// Update applies change to the schedule's definition (ifVersion 0: any
// version) and, when the change is more than its description, removes its
// firings not due yet and decides their slots again under the new
// definition. It answers the schedule as stored and how many firings it
// removed. change may be called more than once (after a race); it must
// only set definition fields.
func (s *Scheduler) Update(ctx context.Context, ns, id string, ifVersion int64, change func(*storage.Schedule)) (storage.Schedule, int64, error) {
	n, err := s.cfg.Namespaces.Namespace(ctx, ns, false)
	if err != nil {
		return storage.Schedule{}, 0, err
	}
	var removed int64
	var earliest time.Time
	for range maxUpdateTries {
		cur, err := s.cfg.Schedules.GetSchedule(ctx, ns, id)
		if err != nil {
			return storage.Schedule{}, removed, err
		}
		if ifVersion != 0 && cur.Version != ifVersion {
			return storage.Schedule{}, removed, &VersionError{ID: id, Stored: cur.Version, Expected: ifVersion}
		}
		next := cur
		change(&next)
		if _, err := Validate(next, s.cfg.Clock.Now()); err != nil {
			return storage.Schedule{}, removed, err
		}
		if lim := n.Policy.MaxPayloadBytes; lim > 0 && len(next.Template.Payload) > lim {
			return storage.Schedule{}, removed, invalid("task.payload", "is %d bytes; at most %d bytes are allowed in this namespace", len(next.Template.Payload), lim)
		}
		if sameDefinition(cur, next) {
			res, err := s.cfg.Schedules.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: cur.Version})
			if errors.Is(err, storage.ErrGenerationMismatch) && ifVersion == 0 {
				continue
			}
			return res.Schedule, removed, err
		}
		k, at, err := s.unfire(ctx, cur, n.Policy.Shards)
		if err != nil {
			return storage.Schedule{}, removed, err
		}
		removed += k
		if !at.IsZero() && (earliest.IsZero() || at.Before(earliest)) {
			earliest = at
		}
		rollBack(&next, earliest, k, n.Policy.Shards)
		// Decide from the cursor again: the new rule's next slot, a
		// schedule that was done may go on (a later end, more firings).
		next.Done, next.NextSlot, next.Advance = false, time.Time{}, s.cfg.Clock.Now()
		if next.Paused {
			next.Advance = time.Time{}
		}
		res, err := s.cfg.Schedules.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: cur.Version})
		if errors.Is(err, storage.ErrGenerationMismatch) && ifVersion == 0 {
			continue
		}
		if err != nil {
			return storage.Schedule{}, removed, err
		}
		return s.stepNow(ctx, res.Schedule, res.Schedule.UpdateTime), removed, nil
	}
	return storage.Schedule{}, removed, fmt.Errorf("update schedule %q: %w: too many concurrent changes", id, storage.ErrStale)
}

// sameDefinition reports whether a and b define the same slots and
// firings (the description and the pause aside).
func sameDefinition(a, b storage.Schedule) bool {
	return a.Cron == b.Cron && a.Every == b.Every && a.TimeZone == b.TimeZone && a.Start.Equal(b.Start) && a.End.Equal(b.End) &&
		a.MaxFirings == b.MaxFirings && a.CatchUp == b.CatchUp && a.CatchUpWindow == b.CatchUpWindow && a.Overlap == b.Overlap &&
		a.Jitter == b.Jitter && a.Template.Kind == b.Template.Kind && string(a.Template.Payload) == string(b.Template.Payload) &&
		a.Template.IDPrefix == b.Template.IDPrefix
}

// rollBack moves sc's cursor back before earliest (the earliest slot whose
// firing was removed) and takes k firings off its count; the last firing
// it names is then the slot before earliest (by sc's rule, in a namespace
// of shards shards), or none.
func rollBack(sc *storage.Schedule, earliest time.Time, k int64, shards int) {
	if earliest.IsZero() {
		return
	}
	if back := earliest.Add(-time.Millisecond); back.Before(sc.Cursor) {
		sc.Cursor = back
	}
	sc.Fired = max(sc.Fired-k, 0)
	if !sc.LastSlot.Before(earliest) {
		sc.LastSlot, sc.LastTaskID = time.Time{}, ""
		if r, err := RuleOf(*sc); err == nil && sc.Fired > 0 {
			if prev, ok := r.Prev(earliest.Add(-time.Nanosecond)); ok && !prev.Before(sc.CreateTime) && !prev.Before(sc.Start) {
				sc.LastSlot, sc.LastTaskID = prev, storage.FiringID(sc.Template.IDPrefix, sc.ID, prev, shards)
			}
		}
	}
}

// Pause stops a schedule's firings and removes those not due yet. A paused
// schedule is answered as it is.
func (s *Scheduler) Pause(ctx context.Context, ns, id string) (storage.Schedule, int64, error) {
	return s.setPaused(ctx, ns, id, true)
}

// Resume starts a paused schedule again; the slots that passed while it
// was paused are missed, and catch-up decides them at once.
func (s *Scheduler) Resume(ctx context.Context, ns, id string) (storage.Schedule, error) {
	sc, _, err := s.setPaused(ctx, ns, id, false)
	return sc, err
}

func (s *Scheduler) setPaused(ctx context.Context, ns, id string, paused bool) (storage.Schedule, int64, error) {
	n, err := s.cfg.Namespaces.Namespace(ctx, ns, false)
	if err != nil {
		return storage.Schedule{}, 0, err
	}
	var removed int64
	var earliest time.Time
	for range maxUpdateTries {
		cur, err := s.cfg.Schedules.GetSchedule(ctx, ns, id)
		if err != nil {
			return storage.Schedule{}, removed, err
		}
		if cur.Paused == paused {
			return cur, removed, nil
		}
		next := cur
		next.Paused = paused
		if paused {
			k, at, err := s.unfire(ctx, cur, n.Policy.Shards)
			if err != nil {
				return storage.Schedule{}, removed, err
			}
			removed += k
			if !at.IsZero() && (earliest.IsZero() || at.Before(earliest)) {
				earliest = at
			}
			rollBack(&next, earliest, k, n.Policy.Shards)
			next.Advance = time.Time{}
		} else if !next.Done {
			next.Advance = s.cfg.Clock.Now()
		}
		res, err := s.cfg.Schedules.UpdateSchedule(ctx, next, storage.UpdateScheduleParams{IfVersion: cur.Version})
		if errors.Is(err, storage.ErrGenerationMismatch) {
			continue
		}
		if err != nil {
			return storage.Schedule{}, removed, err
		}
		if paused {
			return res.Schedule, removed, nil
		}
		return s.stepNow(ctx, res.Schedule, res.Schedule.UpdateTime), removed, nil
	}
	return storage.Schedule{}, removed, fmt.Errorf("pause schedule %q: %w: too many concurrent changes", id, storage.ErrStale)
}

// Delete removes a schedule's firings not due yet, then the schedule
// (ifVersion 0: at any version). It answers how many firings it removed.
func (s *Scheduler) Delete(ctx context.Context, ns, id string, ifVersion int64) (int64, error) {
	shards := 1
	if n, err := s.cfg.Namespaces.Namespace(ctx, ns, false); err == nil {
		shards = n.Policy.Shards
	} else if !errors.Is(err, storage.ErrNotFound) {
		return 0, err
	}
	var removed int64
	for range maxUpdateTries {
		cur, err := s.cfg.Schedules.GetSchedule(ctx, ns, id)
		if err != nil {
			return removed, err
		}
		if ifVersion != 0 && cur.Version != ifVersion {
			return removed, &VersionError{ID: id, Stored: cur.Version, Expected: ifVersion}
		}
		k, _, err := s.unfire(ctx, cur, shards)
		removed += k
		if err != nil {
			return removed, err
		}
		err = s.cfg.Schedules.DeleteSchedule(ctx, ns, id, cur.Version)
		if errors.Is(err, storage.ErrGenerationMismatch) && ifVersion == 0 {
			continue
		}
		return removed, err
	}
	return removed, fmt.Errorf("delete schedule %q: %w: too many concurrent changes", id, storage.ErrStale)
}

// unfire removes sc's firings created ahead of their slots that are still
// scheduled and due more than unfireMargin after the store's clock, and
// answers how many it removed and the earliest slot among them.
func (s *Scheduler) unfire(ctx context.Context, sc storage.Schedule, shards int) (int64, time.Time, error) {
	if sc.Cursor.IsZero() || sc.Overlap == storage.OverlapSkip {
		return 0, time.Time{}, nil // nothing is created ahead
	}
	r, err := RuleOf(sc)
	if err != nil {
		return 0, time.Time{}, nil // an undecodable rule created nothing to remove
	}
	_, now, _, err := s.cfg.Tasks.NextWake(ctx, sc.Namespace)
	if err != nil {
		return 0, time.Time{}, err
	}
	after := now.Add(unfireMargin)
	var removed int64
	var earliest time.Time
	t, ok := firstAfter(sc, r, after)
	for n := 0; ok && !t.After(sc.Cursor) && n < storage.MaxFiringsPerStep; n++ {
		id := storage.FiringID(sc.Template.IDPrefix, sc.ID, t, shards)
		task, err := s.cfg.Tasks.Get(ctx, sc.Namespace, id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return removed, earliest, err
		case task.State == storage.StateScheduled && task.DueTime.After(after):
			_, err := s.cfg.Tasks.Remove(ctx, sc.Namespace, id, storage.Version{ID: id, Incarnation: task.Incarnation, Generation: task.Generation})
			var ce *storage.ConflictError
			switch {
			case err == nil:
				removed++
				if earliest.IsZero() {
					earliest = t
				}
			case errors.Is(err, storage.ErrNotFound), errors.As(err, &ce):
			default:
				return removed, earliest, err
			}
		}
		t, ok = r.Next(t)
	}
	return removed, earliest, nil
}

// Drop deletes every schedule of ns (a namespace being deleted; its
// firings' tasks are the namespace's to drop) and says how many.
func (s *Scheduler) Drop(ctx context.Context, ns string) (int64, error) {
	return s.cfg.Schedules.DropSchedules(ctx, ns)
}

// Preview returns the next count firings of sc (stored or only a
// definition) after `after` (zero: the store's clock now), bounded by its
// start, end and max firings.
func (s *Scheduler) Preview(ctx context.Context, sc storage.Schedule, after time.Time, count int) ([]Firing, Rule, error) {
	r, err := RuleOf(sc)
	if err != nil {
		return nil, Rule{}, err
	}
	shards := 1
	if n, err := s.cfg.Namespaces.Namespace(ctx, sc.Namespace, false); err == nil {
		shards = n.Policy.Shards
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, Rule{}, err
	}
	if after.IsZero() {
		if _, after, _, err = s.cfg.Tasks.NextWake(ctx, sc.Namespace); err != nil {
			return nil, Rule{}, err
		}
	}
	var out []Firing
	for _, slot := range Upcoming(sc, r, after, count) {
		out = append(out, Firing{Slot: slot, Due: slot.Add(JitterOf(sc.Namespace, sc.ID, slot, sc.Jitter)),
			ID: storage.FiringID(sc.Template.IDPrefix, sc.ID, slot, shards)})
	}
	return out, r, nil
}
