package duration

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0}, {"0s", 0}, {"30s", 30 * time.Second}, {"1.5h", 90 * time.Minute}, {"500ms", 500 * time.Millisecond},
		{"400d", 400 * Day}, {"1d12h", 36 * time.Hour}, {"1d", Day}, {"0d", 0}, {"-2d", -2 * Day}, {"-30s", -30 * time.Second},
		{"1d30m", Day + 30*time.Minute},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "d", "400", "1.5d", "d5", "2d-3h", "1w", "abc", "2dd", "99999999d"} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), "400d") || !strings.Contains(err.Error(), in) {
			t.Errorf("Parse(%q): %v; want an error naming it and the formats", in, err)
		}
	}
}

func TestFormatRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{366 * Day, "366d"}, {30 * time.Second, "30s"}, {36 * time.Hour, "1d12h0m0s"}, {0, "0s"}, {-Day, "-1d"}, {10 * time.Minute, "10m0s"},
	} {
		if got := Format(tc.d); got != tc.want {
			t.Errorf("Format(%v) = %q, want %q", tc.d, got, tc.want)
		}
		if back, err := Parse(Format(tc.d)); err != nil || back != tc.d {
			t.Errorf("Parse(Format(%v)) = %v, %v", tc.d, back, err)
		}
	}
}
