package schedule

import (
	"context"
	"time"

	"github.com/delayd/delayd/storage"
)

// forecastSchedules is how many schedules of a namespace a forecast
// counts (in id order), and forecastBudget how many cron slots it walks
// one by one at most (a rate's are counted in O(1)).
const (
	forecastSchedules = 1000
	forecastBudget    = 200_000
)

// Forecast counts the firings ns's active schedules will create, but have
// not created yet (their slots after each cursor), per minute over the
// hour after now and per hour over the day after, in the buckets of
// storage.Forecast: element i counts (now+i, now+i+1]. Together with the
// index's forecast of the tasks that exist (firings already created
// among them), it is what will fall due. partial is true when the
// namespace has more schedules than a forecast counts, or the walk of
// cron slots ran out of budget.
func (s *Scheduler) Forecast(ctx context.Context, ns string, now time.Time) (storage.Forecast, bool, error) {
	f := storage.Forecast{Now: now, PerMinute: make([]int64, storage.ForecastMinutes), PerHour: make([]int64, storage.ForecastHours)}
	scs, more, err := s.cfg.Schedules.ListSchedules(ctx, ns, "", forecastSchedules)
	if err != nil {
		return storage.Forecast{}, false, err
	}
	budget := forecastBudget
	for _, sc := range scs {
		if sc.Paused || sc.Done {
			continue
		}
		r, err := RuleOf(sc)
		if err != nil {
			continue
		}
		left := int64(-1) // firings MaxFirings still allows; -1: no limit
		if sc.MaxFirings > 0 {
			left = max(sc.MaxFirings-sc.Fired, 0)
		}
		take := func(n int64) int64 {
			if left < 0 {
				return n
			}
			n = min(n, left)
			left -= n
			return n
		}
		for i := range storage.ForecastMinutes {
			a := now.Add(time.Duration(i) * time.Minute)
			f.PerMinute[i] += take(countIn(sc, r, a, a.Add(time.Minute), &budget))
		}
		for i := 1; i < storage.ForecastHours; i++ {
			a := now.Add(time.Duration(i) * time.Hour)
			f.PerHour[i] += take(countIn(sc, r, a, a.Add(time.Hour), &budget))
		}
	}
	var sum int64
	for _, n := range f.PerMinute {
		sum += n
	}
	f.PerHour[0] = sum
	return f, more || budget <= 0, nil
}
