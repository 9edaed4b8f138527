package bench

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// TestSoakTimeoutCoversTheSoak: the whole-run bound grows to cover a soak
// when --timeout is left at its default (a 60-minute soak under the 1-hour
// default lost its last second of upserts to DeadlineExceeded), and an
// explicit --timeout too short for the soak is refused naming both flags.
func TestSoakTimeoutCoversTheSoak(t *testing.T) {
	parse := func(args ...string) (Config, error) {
		var cfg Config
		var w Workload
		fs := flag.NewFlagSet("delaybench", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs, &w)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return cfg, cfg.Finish(fs, &w)
	}
	cfg, err := parse("--soak", "60m")
	if err != nil {
		t.Fatal(err)
	}
	if want := 60*time.Minute + soakTimeoutMargin; cfg.Timeout != want {
		t.Errorf("--soak 60m: timeout %s, want %s", cfg.Timeout, want)
	}
	if cfg, err = parse("--soak", "3m"); err != nil || cfg.Timeout != time.Hour {
		t.Errorf("--soak 3m: timeout %s, %v; want the 1h default kept", cfg.Timeout, err)
	}
	if cfg, err = parse("--soak", "60m", "--timeout", "2h"); err != nil || cfg.Timeout != 2*time.Hour {
		t.Errorf("--soak 60m --timeout 2h: timeout %s, %v; want 2h", cfg.Timeout, err)
	}
	_, err = parse("--soak", "60m", "--timeout", "1h")
	if err == nil || !strings.Contains(err.Error(), "--timeout 1h0m0s") || !strings.Contains(err.Error(), "--soak 1h0m0s") {
		t.Errorf("--soak 60m --timeout 1h: err %v, want one naming --timeout and --soak", err)
	}
	if cfg, err = parse(); err != nil || cfg.Timeout != time.Hour {
		t.Errorf("no soak: timeout %s, %v; want 1h", cfg.Timeout, err)
	}
}
