package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Rule says when a schedule's slots are: a cron expression evaluated in a
// time zone, or a fixed rate in absolute time. Its methods are pure and
// safe for concurrent use.
//
// Cron slots are wall-clock times of the zone, resolved to instants by two
// rules (the table in docs/schedules.md):
//   - a wall-clock time that does not exist (the gap of a spring-forward
//     change) resolves to the first instant after the gap;
//   - a wall-clock time that exists twice (the repeated hour of a
//     fall-back change) resolves to its first occurrence.
//
// Several wall-clock times resolving to one instant are one slot, so a
// slot fires once. A rate's slots are anchor + k * every (k >= 0): absolute
// time, the zone plays no part.
type Rule struct {
	spec   *cron.SpecSchedule // nil for a rate
	every  time.Duration
	anchor time.Time
	loc    *time.Location
}

// MinEvery and MaxEvery bound a rate.
const (
	MinEvery = time.Second
	MaxEvery = 366 * 24 * time.Hour
)

// searchYears bounds how far a cron search looks for a slot: a rule with
// no slot within it never fires (Feb 30) and is refused.
const searchYears = 8

// parser reads the standard 5 fields (minute hour day-of-month month
// day-of-week) and the @ shorthands.
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseCron reads a 5-field cron expression or a shorthand (@yearly,
// @annually, @monthly, @weekly, @daily, @midnight, @hourly) to be
// evaluated in loc. The error says what is wrong and what is allowed; a
// zone prefix (TZ=, CRON_TZ=) and @every are refused with a pointer to the
// time zone and the rate fields.
func ParseCron(expr string, loc *time.Location) (Rule, error) {
	e := strings.TrimSpace(expr)
	switch {
	case e == "":
		return Rule{}, errors.New("is empty: give 5 fields (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly, @yearly")
	case strings.HasPrefix(e, "TZ=") || strings.HasPrefix(e, "CRON_TZ="):
		return Rule{}, errors.New("has a time zone prefix: set the schedule's time_zone instead")
	case strings.HasPrefix(e, "@every"):
		return Rule{}, errors.New("uses @every: set the schedule's every (a fixed rate) instead")
	}
	if !strings.HasPrefix(e, "@") {
		if n := len(strings.Fields(e)); n != 5 {
			return Rule{}, fmt.Errorf("has %d fields; give 5 (minute hour day-of-month month day-of-week), e.g. \"0 9 * * 1-5\"", n)
		}
	}
	s, err := parser.Parse(e)
	if err != nil {
		return Rule{}, fmt.Errorf("is not a valid cron expression: %v", err)
	}
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return Rule{}, errors.New("is not a calendar expression")
	}
	if loc == nil {
		loc = time.UTC
	}
	return Rule{spec: spec, loc: loc}, nil
}

// Rate is the rule of slots anchor + k * every, k >= 0. every is whole
// seconds within [MinEvery, MaxEvery]; a zero anchor is the Unix epoch (so
// "every 15m" falls on :00, :15, :30, :45 UTC). loc only names the zone
// slots are shown in.
func Rate(every time.Duration, anchor time.Time, loc *time.Location) (Rule, error) {
	switch {
	case every < MinEvery || every > MaxEvery:
		return Rule{}, fmt.Errorf("is %v; allowed: %v to %v", every, MinEvery, MaxEvery)
	case every%time.Second != 0:
		return Rule{}, fmt.Errorf("is %v; allowed: whole seconds", every)
	}
	if anchor.IsZero() {
		anchor = time.Unix(0, 0)
	}
	if loc == nil {
		loc = time.UTC
	}
	return Rule{every: every, anchor: anchor.Truncate(time.Second), loc: loc}, nil
}

// Location is the zone the rule's slots are shown (and, for cron,
// evaluated) in.
func (r Rule) Location() *time.Location { return r.loc }

// IsRate reports whether the rule is a fixed rate.
func (r Rule) IsRate() bool { return r.spec == nil }

// Every is a rate's interval; zero for cron.
func (r Rule) Every() time.Duration { return r.every }

// Next returns the first slot strictly after t, and false when there is
// none within the search bound (a cron rule that never fires).
func (r Rule) Next(t time.Time) (time.Time, bool) {
	if r.spec == nil {
		if t.Before(r.anchor) {
			return r.anchor, true
		}
		k := t.Sub(r.anchor)/r.every + 1
		return r.anchor.Add(k * r.every), true
	}
	return r.cronNext(t)
}

// Prev returns the latest slot at or before t, and false when there is
// none (before a rate's anchor, or no cron slot within the search bound).
func (r Rule) Prev(t time.Time) (time.Time, bool) {
	if r.spec == nil {
		if t.Before(r.anchor) {
			return time.Time{}, false
		}
		return r.anchor.Add(t.Sub(r.anchor) / r.every * r.every), true
	}
	return r.cronPrev(t)
}

// civil is a wall-clock minute of the rule's zone, as if it were UTC (so
// civil times compare and step without any zone in the way).
type civil = time.Time

// slack bounds how far an instant's wall-clock time can be from the
// resolved instant of a nearby wall-clock time: the largest change of a
// zone's offset (two hours of double summer time), with room to spare.
const slack = 3 * time.Hour

// cronNext walks the matching wall-clock minutes from the day before t's
// (so a minute that resolves later, out of a gap, is seen) and returns the
// first whose resolved instant is after t. Resolution keeps wall-clock
// order (it is monotone), so the first one found is the next slot.
func (r Rule) cronNext(t time.Time) (time.Time, bool) {
	floor := asCivil(t.In(r.loc)).Add(-slack)
	day := floor.Truncate(24 * time.Hour)
	end := day.AddDate(searchYears, 0, 0)
	for ; day.Before(end); day = day.AddDate(0, 0, 1) {
		if !r.monthMatches(day) {
			day = time.Date(day.Year(), day.Month()+1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, -1)
			continue
		}
		if !r.dayMatches(day) {
			continue
		}
		for h := 0; h < 24; h++ {
			if r.spec.Hour&(1<<uint(h)) == 0 {
				continue
			}
			for m := 0; m < 60; m++ {
				if r.spec.Minute&(1<<uint(m)) == 0 {
					continue
				}
				c := day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
				if c.Before(floor) {
					continue
				}
				if s := resolve(c, r.loc); s.After(t) {
					return s, true
				}
			}
		}
	}
	return time.Time{}, false
}

// cronPrev is cronNext backwards: the last matching wall-clock minute whose
// resolved instant is at or before t.
func (r Rule) cronPrev(t time.Time) (time.Time, bool) {
	ceil := asCivil(t.In(r.loc)).Add(slack)
	day := ceil.Truncate(24 * time.Hour)
	end := day.AddDate(-searchYears, 0, 0)
	for ; !day.Before(end); day = day.AddDate(0, 0, -1) {
		if !r.monthMatches(day) {
			day = time.Date(day.Year(), day.Month(), 1, 0, 0, 0, 0, time.UTC)
			continue
		}
		if !r.dayMatches(day) {
			continue
		}
		for h := 23; h >= 0; h-- {
			if r.spec.Hour&(1<<uint(h)) == 0 {
				continue
			}
			for m := 59; m >= 0; m-- {
				if r.spec.Minute&(1<<uint(m)) == 0 {
					continue
				}
				c := day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
				if c.After(ceil) {
					continue
				}
				if s := resolve(c, r.loc); !s.After(t) {
					return s, true
				}
			}
		}
	}
	return time.Time{}, false
}

func (r Rule) monthMatches(day civil) bool {
	return r.spec.Month&(1<<uint(day.Month())) != 0
}

// dayMatches is cron's day rule (as robfig/cron and Vixie cron read it):
// when day-of-month or day-of-week is *, both must match; when both are
// restricted, either may.
func (r Rule) dayMatches(day civil) bool {
	const star = 1 << 63
	dom := r.spec.Dom&(1<<uint(day.Day())) != 0
	dow := r.spec.Dow&(1<<uint(day.Weekday())) != 0
	if r.spec.Dom&star != 0 || r.spec.Dow&star != 0 {
		return dom && dow
	}
	return dom || dow
}

// asCivil is t's wall-clock reading in its own zone, as a UTC time.
func asCivil(t time.Time) civil {
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	return time.Date(y, mo, d, h, mi, s, t.Nanosecond(), time.UTC)
}

// resolve returns the instant wall-clock time c (read in loc) stands for:
// its first occurrence when it occurs twice (a fall-back change), the first
// instant after the gap when it does not occur (a spring-forward change).
func resolve(c civil, loc *time.Location) time.Time {
	// The zone periods around c (offsets are within -12h..+14h, so a
	// candidate instant is within a day of c read as UTC), in order.
	type period struct {
		start, end time.Time // zero: unbounded
		offset     time.Duration
	}
	var ps []period
	p := c.Add(-26 * time.Hour)
	limit := c.Add(26 * time.Hour)
	for range 8 {
		in := p.In(loc)
		_, off := in.Zone()
		start, end := in.ZoneBounds()
		ps = append(ps, period{start, end, time.Duration(off) * time.Second})
		if end.IsZero() || end.After(limit) {
			break
		}
		p = end
	}
	for _, q := range ps {
		i := c.Add(-q.offset)
		if (q.start.IsZero() || !i.Before(q.start)) && (q.end.IsZero() || i.Before(q.end)) {
			return i.In(loc) // the earliest period that holds c: its first occurrence
		}
	}
	// In a gap: the transition whose wall clock jumps over c.
	for j := 0; j+1 < len(ps); j++ {
		t := ps[j].end
		if !t.Add(ps[j].offset).After(c) && t.Add(ps[j+1].offset).After(c) {
			return t.In(loc)
		}
	}
	return c.Add(-ps[0].offset).In(loc) // unreachable for real zones
}

// LoadZone resolves an IANA zone name; "" is UTC. "Local" is refused (it
// would mean a different zone on each replica).
func LoadZone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, errors.New(`is "Local", which differs per host; give an IANA name, e.g. "Europe/Berlin", or "UTC"`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("is %q, not an IANA time zone name the tz database (%s) knows; e.g. \"America/New_York\", \"Europe/Berlin\", \"UTC\"", name, TZDataVersion())
	}
	return loc, nil
}
