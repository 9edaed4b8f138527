package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSystemdUnit runs systemd-analyze verify on deploy/systemd/delayd.service
// (with ExecStart pointed at an executable that exists here, since verify
// checks it) and checks the hardening the unit promises, that it stops
// later than delayd's shutdown bound, and that delayd.env.example sets
// only variables delayd knows.
func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is not installed (Debian: apt-get install -y systemd): %v", err)
	}
	raw, err := os.ReadFile("systemd/delayd.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(raw)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "delayd.service")
	if err := os.WriteFile(copied, []byte(strings.Replace(unit, "ExecStart=/usr/local/bin/delayd", "ExecStart="+self, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", copied).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	settings := map[string]string{}
	for _, line := range strings.Split(unit, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			settings[k] = v
		}
	}
	for k, want := range map[string]string{
		"User": "delayd", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"Restart": "on-failure", "EnvironmentFile": "/etc/delayd/delayd.env", "CapabilityBoundingSet": "",
	} {
		if got, ok := settings[k]; !ok || got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}

	envRaw, err := os.ReadFile("systemd/delayd.env.example")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(envRaw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = v
		}
	}
	help(t).checkEnv(t, "delayd.env.example", env)
	shutdown, err1 := time.ParseDuration(env["DELAYD_SHUTDOWN_TIMEOUT"])
	stop, err2 := time.ParseDuration(settings["TimeoutStopSec"])
	if err1 != nil || err2 != nil || stop <= shutdown {
		t.Errorf("TimeoutStopSec %q must exceed DELAYD_SHUTDOWN_TIMEOUT %q, or systemd kills delayd mid-shutdown", settings["TimeoutStopSec"], env["DELAYD_SHUTDOWN_TIMEOUT"])
	}
}
