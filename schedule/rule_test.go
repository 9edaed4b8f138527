package schedule

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := LoadZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCronNextAcrossDST walks a cron rule from an instant and checks the
// slots it yields, in UTC, across both changes of four zones: New York and
// Berlin (1 h), Lord Howe (30 min) and Chatham (1 h at :45). A wall-clock
// time in the gap fires once at the first instant after it; one that
// occurs twice fires once, at its first occurrence.
func TestCronNextAcrossDST(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, zone, expr, from string
		want                   []string
	}{
		{"NY spring: 02:30 is in the gap, fires at 03:00 EDT", "America/New_York", "30 2 * * *", "2026-03-06T12:00:00Z",
			[]string{"2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"NY spring: every 30 min, the gap's times are one slot", "America/New_York", "*/30 * * * *", "2026-03-08T06:00:00Z",
			[]string{"2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z", "2026-03-08T08:00:00Z"}},
		{"NY spring: 02:00 itself does not exist", "America/New_York", "0 2 * * *", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"}},
		{"NY fall: 01:30 occurs twice, fires at the first (EDT)", "America/New_York", "30 1 * * *", "2026-10-31T12:00:00Z",
			[]string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"NY fall: every 30 min skips the repeated hour", "America/New_York", "*/30 * * * *", "2026-11-01T04:15:00Z",
			[]string{"2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"}},
		{"NY fall: from inside the repeated hour (second pass)", "America/New_York", "30 1 * * *", "2026-11-01T06:10:00Z",
			[]string{"2026-11-02T06:30:00Z"}},
		{"Berlin spring: 02:30 fires at 03:00 CEST", "Europe/Berlin", "30 2 * * *", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"Berlin fall: 02:30 fires once, at CEST", "Europe/Berlin", "30 2 * * *", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"Berlin weekdays 09:00 across the spring change", "Europe/Berlin", "0 9 * * 1-5", "2026-03-26T12:00:00Z",
			[]string{"2026-03-27T08:00:00Z", "2026-03-30T07:00:00Z"}},
		{"Lord Howe spring (+30 min): 02:15 is in the gap", "Australia/Lord_Howe", "15 2 * * *", "2026-10-02T12:00:00Z",
			[]string{"2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"}},
		{"Lord Howe fall (-30 min): 01:45 occurs twice", "Australia/Lord_Howe", "45 1 * * *", "2026-04-03T12:00:00Z",
			[]string{"2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"}},
		{"Chatham spring: 03:00 is in the gap (02:45-03:45)", "Pacific/Chatham", "0 3 * * *", "2026-09-25T12:00:00Z",
			[]string{"2026-09-25T14:15:00Z", "2026-09-26T14:00:00Z", "2026-09-27T13:15:00Z"}},
		{"Chatham fall: 03:00 occurs twice", "Pacific/Chatham", "0 3 * * *", "2026-04-03T12:00:00Z",
			[]string{"2026-04-03T13:15:00Z", "2026-04-04T13:15:00Z", "2026-04-05T14:15:00Z"}},
		{"29 February: every leap year only", "UTC", "0 12 29 2 *", "2026-01-01T00:00:00Z",
			[]string{"2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"}},
		{"the 31st skips the short months", "UTC", "0 0 31 * *", "2026-03-31T00:00:00Z",
			[]string{"2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z", "2026-08-31T00:00:00Z", "2026-10-31T00:00:00Z"}},
		{"@monthly at midnight in New York", "America/New_York", "@monthly", "2026-01-15T00:00:00Z",
			[]string{"2026-02-01T05:00:00Z", "2026-03-01T05:00:00Z", "2026-04-01T04:00:00Z"}},
		{"day-of-month or day-of-week when both are given", "UTC", "0 0 1 * 1", "2026-06-01T00:00:00Z",
			[]string{"2026-06-08T00:00:00Z", "2026-06-15T00:00:00Z", "2026-06-22T00:00:00Z", "2026-06-29T00:00:00Z", "2026-07-01T00:00:00Z"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := ParseCron(tc.expr, mustZone(t, tc.zone))
			if err != nil {
				t.Fatal(err)
			}
			at := utc(tc.from)
			for i, w := range tc.want {
				got, ok := r.Next(at)
				if !ok || !got.Equal(utc(w)) {
					t.Fatalf("slot %d after %s: got %s (ok %v), want %s", i, at.Format(time.RFC3339), got.UTC().Format(time.RFC3339), ok, w)
				}
				// Prev is Next's inverse: the latest slot at or before it.
				if p, ok := r.Prev(got); !ok || !p.Equal(got) {
					t.Fatalf("Prev(%s) = %s, want the slot itself", got.UTC().Format(time.RFC3339), p.UTC().Format(time.RFC3339))
				}
				if i > 0 {
					if p, ok := r.Prev(got.Add(-time.Nanosecond)); !ok || !p.Equal(utc(tc.want[i-1])) {
						t.Fatalf("Prev just before %s = %s, want %s", w, p.UTC().Format(time.RFC3339), tc.want[i-1])
					}
				}
				at = got
			}
		})
	}
}

// TestRateIsAbsoluteTime: a rate's slots keep their spacing in absolute
// time across a change, and anchor on the epoch or the start.
func TestRateIsAbsoluteTime(t *testing.T) {
	t.Parallel()
	ny := mustZone(t, "America/New_York")
	cases := []struct {
		name   string
		every  time.Duration
		anchor time.Time
		from   string
		want   []string
	}{
		{"hourly across NY spring forward", time.Hour, time.Time{}, "2026-03-08T05:30:00Z",
			[]string{"2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"every 15m on the quarter hours", 15 * time.Minute, time.Time{}, "2026-05-01T10:07:00Z",
			[]string{"2026-05-01T10:15:00Z", "2026-05-01T10:30:00Z"}},
		{"anchored at the start, before it", 90 * time.Second, utc("2026-05-01T10:00:10Z"), "2026-05-01T09:00:00Z",
			[]string{"2026-05-01T10:00:10Z", "2026-05-01T10:01:40Z", "2026-05-01T10:03:10Z"}},
		{"a slot exactly at from is not after it", time.Minute, time.Time{}, "2026-05-01T10:00:00Z",
			[]string{"2026-05-01T10:01:00Z"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := Rate(tc.every, tc.anchor, ny)
			if err != nil {
				t.Fatal(err)
			}
			at := utc(tc.from)
			for _, w := range tc.want {
				got, ok := r.Next(at)
				if !ok || !got.Equal(utc(w)) {
					t.Fatalf("after %s: got %s, want %s", at.Format(time.RFC3339), got.UTC().Format(time.RFC3339), w)
				}
				if p, _ := r.Prev(got); !p.Equal(got) {
					t.Fatalf("Prev(%s) = %s", w, p)
				}
				at = got
			}
		})
	}
}

// TestParseCronRefuses: what is not a 5-field expression or a shorthand
// is refused with a message that says what to do.
func TestParseCronRefuses(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"":                   "is empty",
		"0 9 * *":            "has 4 fields",
		"0 0 9 * * *":        "has 6 fields",
		"TZ=UTC 0 9 * * *":   "time_zone",
		"@every 5m":          "every",
		"61 * * * *":         "not a valid cron expression",
		"0 9 * * mon-xyz":    "not a valid cron expression",
		"@fortnightly":       "not a valid cron expression",
		"CRON_TZ=Asia/Tokyo": "time_zone",
	}
	for expr, want := range cases {
		_, err := ParseCron(expr, time.UTC)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCron(%q) = %v, want an error containing %q", expr, err, want)
		}
	}
	if r, err := ParseCron("0 0 30 2 *", time.UTC); err != nil {
		t.Fatal(err)
	} else if _, ok := r.Next(utc("2026-01-01T00:00:00Z")); ok {
		t.Error("30 February has a next slot")
	}
}

// TestRateRefuses: out-of-range and fractional rates.
func TestRateRefuses(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 400 * 24 * time.Hour} {
		if _, err := Rate(d, time.Time{}, nil); err == nil {
			t.Errorf("Rate(%v) accepted", d)
		}
	}
}

// TestLoadZone: IANA names resolve from the embedded database; Local and
// unknown names are refused.
func TestLoadZone(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "UTC", "Europe/Berlin", "Pacific/Chatham", "Australia/Lord_Howe"} {
		if _, err := LoadZone(ok); err != nil {
			t.Errorf("LoadZone(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"Local", "Mars/Olympus", "../etc/passwd"} {
		if _, err := LoadZone(bad); err == nil {
			t.Errorf("LoadZone(%q) accepted", bad)
		}
	}
}

// TestEmbeddedTZDataIsTheToolchains: EmbeddedTZData names the release of
// time/tzdata in the Go toolchain that builds this binary.
func TestEmbeddedTZDataIsTheToolchains(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(runtime.GOROOT(), "lib", "time", "update.bash"))
	if err != nil {
		t.Fatalf("reading the toolchain's tz release: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "DATA="); ok {
			if v != EmbeddedTZData {
				t.Fatalf("EmbeddedTZData = %q, the toolchain embeds %q: update the constant", EmbeddedTZData, v)
			}
			return
		}
	}
	t.Fatal("no DATA= line in lib/time/update.bash")
}
