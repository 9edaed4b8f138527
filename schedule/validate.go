package schedule

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/delayd/delayd/storage"
)

// Definition bounds (the proto's comments say the same).
const (
	// MaxJitter bounds Schedule.Jitter.
	MaxJitter = time.Hour
	// MaxCatchUpWindow bounds Schedule.CatchUpWindow.
	MaxCatchUpWindow = 7 * 24 * time.Hour
	// MaxDescriptionLen bounds Schedule.Description, in characters.
	MaxDescriptionLen = 256
)

// FieldError is a definition that is not allowed: Field names the
// Schedule message's field ("cron", "task.id_prefix"), Msg says what is
// wrong and what is allowed.
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Field + " " + e.Msg }

func invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// RuleOf compiles a schedule's rule: its cron expression in its zone, or
// its rate anchored at its start. Errors are *FieldError.
func RuleOf(s storage.Schedule) (Rule, error) {
	loc, err := LoadZone(s.TimeZone)
	if err != nil {
		return Rule{}, &FieldError{Field: "time_zone", Msg: err.Error()}
	}
	switch {
	case s.Cron != "" && s.Every != 0:
		return Rule{}, invalid("every", "is set together with cron; give exactly one of cron and every")
	case s.Cron != "":
		r, err := ParseCron(s.Cron, loc)
		if err != nil {
			return Rule{}, &FieldError{Field: "cron", Msg: err.Error()}
		}
		return r, nil
	case s.Every != 0:
		r, err := Rate(s.Every, s.Start, loc)
		if err != nil {
			return Rule{}, &FieldError{Field: "every", Msg: err.Error()}
		}
		return r, nil
	default:
		return Rule{}, invalid("cron", "and every are both empty; give exactly one: a cron expression (\"0 9 * * 1-5\", @daily) or a rate (15m)")
	}
}

// Validate checks a schedule's definition (not its state) and returns its
// compiled rule; now is used to refuse a schedule that could never fire.
// Errors are *FieldError. The payload's size is the caller's to check
// against the namespace's limit.
func Validate(s storage.Schedule, now time.Time) (Rule, error) {
	if err := storage.ValidateScheduleID(s.ID); err != nil {
		return Rule{}, &FieldError{Field: "id", Msg: err.Error()}
	}
	if n := utf8.RuneCountInString(s.Description); n > MaxDescriptionLen || !utf8.ValidString(s.Description) {
		return Rule{}, invalid("description", "is %d characters of UTF-8; at most %d are allowed", n, MaxDescriptionLen)
	}
	r, err := RuleOf(s)
	if err != nil {
		return Rule{}, err
	}
	switch {
	case !s.Start.IsZero() && !s.End.IsZero() && !s.End.After(s.Start):
		return Rule{}, invalid("end_time", "is %s, not after start_time %s", s.End.UTC().Format(time.RFC3339), s.Start.UTC().Format(time.RFC3339))
	case !s.End.IsZero() && !s.End.After(now):
		return Rule{}, invalid("end_time", "is %s, in the past; give a later one, or none", s.End.UTC().Format(time.RFC3339))
	case s.MaxFirings < 0:
		return Rule{}, invalid("max_firings", "is %d; allowed: 0 (no limit) or more", s.MaxFirings)
	case s.CatchUp > storage.CatchUpAll:
		return Rule{}, invalid("catch_up", "is %d; allowed: NONE, LATEST, ALL", s.CatchUp)
	case s.CatchUpWindow != 0 && (s.CatchUpWindow < time.Second || s.CatchUpWindow > MaxCatchUpWindow):
		return Rule{}, invalid("catch_up_window", "is %v; allowed: 1s to 7 days, or unset", s.CatchUpWindow)
	case s.CatchUp == storage.CatchUpAll && s.CatchUpWindow == 0:
		return Rule{}, invalid("catch_up_window", "is unset; catch_up ALL needs one (1s to 7 days): how far back missed slots still fire")
	case s.Overlap > storage.OverlapSkip:
		return Rule{}, invalid("overlap", "is %d; allowed: ALLOW, SKIP", s.Overlap)
	case s.Jitter < 0 || s.Jitter > MaxJitter:
		return Rule{}, invalid("jitter", "is %v; allowed: 0 to 1h", s.Jitter)
	case s.Every != 0 && s.Jitter >= s.Every:
		return Rule{}, invalid("jitter", "is %v; with every %v it must be less than it, so firings keep their order", s.Jitter, s.Every)
	}
	if p := s.Template.IDPrefix; p != "" {
		if len(p) > storage.MaxFiringPrefixLen || storage.ValidateTaskID(p) != nil {
			return Rule{}, invalid("task.id_prefix", "is %q; allowed: 0-%d characters of [A-Za-z0-9._-]", p, storage.MaxFiringPrefixLen)
		}
	}
	from := now
	if s.Start.After(from) {
		from = s.Start.Add(-time.Millisecond)
	}
	if t, ok := r.Next(from); !ok || (!s.End.IsZero() && t.After(s.End)) {
		field := "cron"
		if r.IsRate() {
			field = "every"
		}
		return Rule{}, invalid(field, "never fires between start_time and end_time (none in the next %d years); check the day and month", searchYears)
	}
	return r, nil
}
