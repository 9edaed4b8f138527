package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Render merges saved reports: a later row of the same workload and system
// replaces the earlier one, and ratios are computed over the merged rows.
func TestRenderMergesReportsAndComputesRatios(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, r Report) string {
		var b bytes.Buffer
		if err := r.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first := write("a.json", Report{Results: []Result{
		{Workload: "backlog", System: SystemDelayd, DeliveredAckedSec: 10, Command: "old"},
		{Workload: "backlog", System: SystemBaseline10ms, DeliveredAckedSec: 20, Command: "base"},
	}})
	second := write("b.json", Report{Results: []Result{
		{Workload: "backlog", System: SystemDelayd, DeliveredAckedSec: 40, Command: "new"},
	}})
	var out bytes.Buffer
	if err := Render([]string{first, second}, &out); err != nil {
		t.Fatal(err)
	}
	md := out.String()
	for _, want := range []string{"`new`", "`base`", "| backlog | delayd | baseline-10ms | - | 2.00x |"} {
		if !strings.Contains(md, want) {
			t.Errorf("rendered report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "`old`") {
		t.Errorf("the replaced row is still there:\n%s", md)
	}
}
