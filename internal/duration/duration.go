// Package duration parses and prints the durations delayd's command lines
// take (delayd's flags and DELAYD_* variables, delayctl's flags): Go's
// time.ParseDuration units (ns, us, ms, s, m, h) plus d for days of 24
// hours, so a horizon of 400 days is "400d" rather than "9600h". Format
// prints whole days the same way, so a duration reads alike everywhere a
// person sees it ("366d", not 8784h0m0s).
package duration

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Day is the length of the unit d: 24 hours (no calendar, no time zones).
const Day = 24 * time.Hour

// Formats says what Parse accepts, for error messages and help text.
const Formats = "a number with a unit: ms, s, m, h or d (days of 24 h), e.g. 500ms, 30s, 15m, 2h, 400d, or 1d12h"

// Parse reads a duration: anything time.ParseDuration reads, with days
// ("d") allowed in front of the rest: "400d", "1d12h", "-2d". Its error
// says what was given and which format is wanted.
func Parse(s string) (time.Duration, error) {
	in := strings.TrimSpace(s)
	rest, neg := in, false
	if r, ok := strings.CutPrefix(rest, "-"); ok {
		rest, neg = r, true
	} else {
		rest = strings.TrimPrefix(rest, "+")
	}
	var days time.Duration
	hasDays := false
	if i := strings.IndexByte(rest, 'd'); i >= 0 {
		hasDays = true
		n, err := strconv.ParseUint(rest[:i], 10, 32)
		if err != nil || n > uint64(maxDays) {
			return 0, invalid(s)
		}
		days, rest = time.Duration(n)*Day, rest[i+1:]
	}
	var d time.Duration
	if rest != "" || !hasDays {
		var err error
		if d, err = time.ParseDuration(rest); err != nil || d < 0 || strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			return 0, invalid(s)
		}
	}
	if days > 0 && d > maxDuration-days {
		return 0, invalid(s)
	}
	d += days
	if neg {
		d = -d
	}
	return d, nil
}

// maxDays keeps a duration of days within time.Duration (about 106,751).
const maxDays = int64(1<<63-1) / int64(Day)

const maxDuration = time.Duration(1<<63 - 1)

func invalid(s string) error {
	return fmt.Errorf("%q is not a duration; want %s", s, Formats)
}

// Format prints d as Parse reads it: whole days as "400d", days and a rest
// as "1d12h0m0s", anything shorter than a day as time.Duration does.
func Format(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	if d < Day {
		return sign + d.String()
	}
	days, rest := d/Day, d%Day
	if rest == 0 {
		return fmt.Sprintf("%s%dd", sign, days)
	}
	return fmt.Sprintf("%s%dd%s", sign, days, rest)
}

// Value is a flag.Value (and pflag.Value) bound to a time.Duration that
// Parse reads and Format prints.
type Value struct{ P *time.Duration }

// String prints the bound duration (Format).
func (v Value) String() string {
	if v.P == nil {
		return "0s"
	}
	return Format(*v.P)
}

// Set parses s (Parse) into the bound duration.
func (v Value) Set(s string) error {
	d, err := Parse(s)
	if err != nil {
		return err
	}
	*v.P = d
	return nil
}

// Type names the value in pflag's help ("duration").
func (Value) Type() string { return "duration" }
