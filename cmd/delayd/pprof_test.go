package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestPprofCmdlineHidesSecrets (issue 42 item 7): a delayd process started
// with --admin-key as a flag and --pprof serves /debug/pprof/cmdline with
// the flags' names and none of their values. Before, it served the command
// line as given, admin key and all, to whoever reached the ops port.
func TestPprofCmdlineHidesSecrets(t *testing.T) {
	t.Parallel()
	const secret = "pprof-cmdline-admin-key-0123456789abcdef"
	r := startReplica(t, buildBinary(t), "--admin-key", secret, "--pprof", "--log-level=info")
	out, err := os.ReadFile(r.log)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg="delayd serving" .* ops=(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no ops address in the log:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+string(m[1])+"/debug/pprof/cmdline", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	shown := strings.ReplaceAll(string(body), "\x00", " ")
	t.Logf("/debug/pprof/cmdline: %s", shown)
	if resp.StatusCode != http.StatusOK || strings.Contains(shown, secret) || !strings.Contains(shown, "--admin-key REDACTED") ||
		!strings.Contains(shown, "--log-level=REDACTED") || !strings.Contains(shown, " --pprof") {
		t.Errorf("/debug/pprof/cmdline: HTTP %d %q; want the flags' names with every value REDACTED, the admin key nowhere", resp.StatusCode, shown)
	}
}
