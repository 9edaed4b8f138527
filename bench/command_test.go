package bench

import (
	"strings"
	"testing"
)

// TestCommandReproducesNoOps: a row measured with --no-ops names it in its
// reproduction command (a delayd row only: the baseline has no ops
// listener), so the metrics-overhead A/B pairs can be re-run from the report.
func TestCommandReproducesNoOps(t *testing.T) {
	cfg := Config{Server: "child", OwnRedis: true, NoOps: true, BaselineBatch: 200}
	if got := command(cfg, "unary", "delayd"); !strings.Contains(got, " --no-ops") {
		t.Errorf("delayd row with --no-ops: %q lacks --no-ops", got)
	}
	if got := command(cfg, "spread", "baseline-1s"); strings.Contains(got, "--no-ops") {
		t.Errorf("baseline row: %q names --no-ops", got)
	}
	cfg.NoOps = false
	if got := command(cfg, "unary", "delayd"); strings.Contains(got, "--no-ops") {
		t.Errorf("row without --no-ops: %q names it", got)
	}
}

// TestCommandReproducesFixedWindows: a raw delayd row measured with
// --fixed-windows names it in its reproduction command; the SDK's and the
// baseline's rows, which it does not change, do not.
func TestCommandReproducesFixedWindows(t *testing.T) {
	cfg := Config{Server: "child", OwnRedis: true, FixedWindows: true, BaselineBatch: 200}
	if got := command(cfg, "steady-500", "delayd"); !strings.Contains(got, " --fixed-windows") {
		t.Errorf("delayd row with --fixed-windows: %q lacks it", got)
	}
	for _, sys := range []string{"delayd-sdk", "baseline-10ms"} {
		if got := command(cfg, "steady-500", sys); strings.Contains(got, "--fixed-windows") {
			t.Errorf("%s row: %q names --fixed-windows", sys, got)
		}
	}
}
