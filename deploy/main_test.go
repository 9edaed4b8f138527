// Package deploy_test checks the deployment files under deploy/ (compose,
// Kubernetes, systemd) and, behind the shipimage build tag (make
// test-image), the container image: every DELAYD_* variable and flag they
// set is one `delayd --help` lists, probe ports match the listeners they
// configure, and the Kubernetes PrometheusRule is deploy/prometheus/alerts.yml.
package deploy_test

import (
	"bytes"
	"context"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// delaydHelp is what `delayd --help` prints (daemon.Main is the command's
// whole body), parsed into its flags and their environment variables.
type delaydHelp struct {
	flags map[string]bool // "listen", "ops-listen", ...
	envs  map[string]bool // "DELAYD_LISTEN", ...
}

var reHelpLine = regexp.MustCompile(`(?m)^  --([a-z0-9-]+)  \((DELAYD_[A-Z0-9_]+)\)$`)

func help(t *testing.T) delaydHelp {
	t.Helper()
	var out bytes.Buffer
	if code := daemon.Main(context.Background(), []string{"--help"}, &out); code != 0 {
		t.Fatalf("delayd --help: exit %d\n%s", code, out.String())
	}
	h := delaydHelp{flags: map[string]bool{}, envs: map[string]bool{}}
	for _, m := range reHelpLine.FindAllStringSubmatch(out.String(), -1) {
		h.flags[m[1]], h.envs[m[2]] = true, true
	}
	if len(h.flags) < 20 || !h.envs["DELAYD_OPS_LISTEN"] {
		t.Fatalf("delayd --help lists %d flags, none or too few parsed (format changed?):\n%s", len(h.flags), out.String())
	}
	return h
}

// checkEnv fails t for every DELAYD_* name in env that delayd does not know.
func (h delaydHelp) checkEnv(t *testing.T, where string, env map[string]string) {
	t.Helper()
	for _, k := range sortedKeys(env) {
		if strings.HasPrefix(k, "DELAYD_") && !h.envs[k] {
			t.Errorf("%s sets %s, which `delayd --help` does not list", where, k)
		}
	}
}

// checkArgs fails t for every --flag in args that delayd does not know.
func (h delaydHelp) checkArgs(t *testing.T, where string, args []string) {
	t.Helper()
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !h.flags[name] {
			t.Errorf("%s passes --%s, which `delayd --help` does not list", where, name)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
