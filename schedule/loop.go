package schedule

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// The loop runs on every replica: it asks the store for the schedules
// whose time to decide has come (DueSchedules), steps each of them (at most
// Workers at once, from a random offset so replicas spread), and sleeps
// until the earliest next one, at most Poll, or until Poke. Replicas race
// the same steps; the store applies one, the others change nothing
// (ErrLostRace), so a replica that dies costs nothing but its share of the
// work.

// hooks lets tests wait for what the loop did instead of sleeping.
type hooks struct {
	mu   sync.Mutex
	look func(storage.DueSchedules)
	step func(storage.Schedule, []Firing)
}

func (h *hooks) looked(d storage.DueSchedules) {
	h.mu.Lock()
	f := h.look
	h.mu.Unlock()
	if f != nil {
		f(d)
	}
}

func (h *hooks) stepped(s storage.Schedule, fire []Firing) {
	h.mu.Lock()
	f := h.step
	h.mu.Unlock()
	if f != nil {
		f(s, fire)
	}
}

// Start runs the loop until Stop. It fails if the loop runs already.
func (s *Scheduler) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done != nil {
		return errors.New("schedule: started twice")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go s.run(ctx)
	return nil
}

// Stop ends the loop and waits for the steps in progress (each is one
// store call at most), or for ctx. A step cut short changes nothing or
// everything: the store applies it atomically.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Scheduler) run(ctx context.Context) {
	defer close(s.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wait := s.look(ctx)
		if ctx.Err() != nil {
			return
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.poke:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

// look steps the due schedules once and says how long to sleep.
func (s *Scheduler) look(ctx context.Context) time.Duration {
	due, err := s.cfg.Schedules.DueSchedules(ctx, s.cfg.Batch)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reading due schedules failed", "err", err)
		}
		return s.cfg.Poll
	}
	s.hooks.looked(due)
	s.stepAll(ctx, due.Schedules, due.Now)
	wait := s.cfg.Poll
	if !due.Next.IsZero() {
		// The store's clock tells how far the next one is; the sleep is a
		// duration, so this replica's clock error does not enter it.
		wait = min(wait, max(due.Next.Sub(due.Now), 0))
	}
	return wait
}

// stepAll steps scs (Workers at once, from a random offset), skipping
// those whose step failed on this replica within failBackoff.
func (s *Scheduler) stepAll(ctx context.Context, scs []storage.Schedule, now time.Time) {
	if len(scs) == 0 {
		return
	}
	sem := make(chan struct{}, s.cfg.Workers)
	var wg sync.WaitGroup
	off := jitterStart(len(scs))
	local := s.cfg.Clock.Now()
	for i := range scs {
		sc := scs[(i+off)%len(scs)]
		if s.backingOff(sc.Key(), local) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if !sc.Advance.IsZero() {
				// The step's lag: the store's time of the look, plus
				// how long this pass has run, past the schedule's Advance.
				at := s.cfg.Clock.Now()
				s.lead.note(now.Add(at.Sub(local)).Sub(sc.Advance), at)
			}
			_, err := s.step(ctx, sc, now)
			switch {
			case err == nil, errors.Is(err, ErrLostRace), ctx.Err() != nil:
			default:
				s.fail(sc.Key(), local)
				s.log.Warn("schedule step failed; retrying later", "namespace", sc.Namespace, "schedule", sc.ID, "err", err)
			}
		})
	}
	wg.Wait()
}

func (s *Scheduler) backingOff(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.failing[key]
	if ok && now.Before(until) {
		return true
	}
	delete(s.failing, key)
	return false
}

func (s *Scheduler) fail(key string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[key] = now.Add(failBackoff)
}
